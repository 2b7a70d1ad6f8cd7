"""Checks shared by every KV backend, so each refuses bad writes the same way."""

from __future__ import annotations

from collections.abc import Sequence

from tiers.backends.base import DeleteSpace, Put, Write
from tiers.errors import InvalidInputError, ValueTooLargeError


def check_writes(writes: Sequence[Write], max_value_bytes: int) -> None:
    """Refuse a batch before anything is written.

    Raises:
        InvalidInputError: An empty space or key, or a value that is not bytes.
        ValueTooLargeError: A value is larger than ``max_value_bytes``.
    """
    for write in writes:
        if not write.space:
            raise InvalidInputError("a storage space must not be empty", field="space")
        if isinstance(write, DeleteSpace):
            continue
        if not write.key:
            raise InvalidInputError("a storage key must not be empty", field="key")
        if isinstance(write, Put):
            if not isinstance(write.value, bytes):
                raise InvalidInputError(
                    f"values are bytes, got {type(write.value).__name__}", field="value"
                )
            if len(write.value) > max_value_bytes:
                raise ValueTooLargeError(
                    f"value of {len(write.value)} bytes for {write.key!r} exceeds the limit of "
                    f"{max_value_bytes} bytes (raise max_value_bytes to store it)",
                    field="value",
                )


def prefix_upper_bound(prefix: str) -> str | None:
    """Smallest string greater than every string starting with ``prefix`` (None if unbounded)."""
    chars = list(prefix)
    while chars:
        last = ord(chars[-1])
        if last < 0x10FFFF:
            nxt = last + 1
            # Surrogates cannot be encoded; the next encodable code point is U+E000.
            chars[-1] = chr(0xE000 if 0xD800 <= nxt <= 0xDFFF else nxt)
            return "".join(chars)
        chars.pop()
    return None
