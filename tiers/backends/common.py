"""Checks shared by every KV backend, so each refuses bad input the same way."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tiers.backends.base import Check, DeleteSpace, Put, Write
from tiers.errors import InvalidInputError, ValueTooLargeError


def check_text(value: object, field: str) -> None:
    """Refuse a space, key or key bound that is not text every backend can store.

    Keys sort by their UTF-8 bytes, so a string that has no UTF-8 form (one
    holding a lone surrogate, e.g. from ``os.fsdecode`` of a bad file name)
    cannot be stored or compared.

    Raises:
        InvalidInputError: ``value`` is not a ``str``, or holds a lone surrogate.
    """
    if not isinstance(value, str):
        raise InvalidInputError(
            f"a storage {field} must be a str, got {type(value).__name__}", field=field
        )
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"storage {field} {value!r} has a lone surrogate at index {exc.start} and cannot be "
            "encoded as UTF-8 (decode the text with errors='replace' first)",
            field=field,
        ) from exc


def check_reads(space: str, keys: Iterable[str] = ()) -> None:
    """Refuse a read whose space or keys are not storable text (see :func:`check_text`).

    Raises:
        InvalidInputError: The space or a key is not a valid string.
    """
    check_text(space, "space")
    for key in keys:
        check_text(key, "key")


def check_scan(space: str, prefix: str, start_after: str | None) -> None:
    """Refuse a scan whose space, prefix or ``start_after`` bound is not storable text.

    Raises:
        InvalidInputError: One of them is not a valid string.
    """
    check_reads(space)
    check_text(prefix, "prefix")
    if start_after is not None:
        check_text(start_after, "start_after")


def _check_space(space: object) -> None:
    if not space:
        raise InvalidInputError("a storage space must not be empty", field="space")
    check_text(space, "space")


def _check_address(space: object, key: object) -> None:
    _check_space(space)
    # A key of None is refused by check_text like any non-str: only a DeleteSpace has
    # no key, and it is checked by _check_space alone.
    if key is not None and not key:
        raise InvalidInputError("a storage key must not be empty", field="key")
    check_text(key, "key")


def check_writes(writes: Sequence[Write], max_value_bytes: int) -> None:
    """Refuse a batch before anything is written.

    Raises:
        InvalidInputError: An empty or non-string space or key, a key that is not
            valid Unicode text, or a value that is not bytes.
        ValueTooLargeError: A value is larger than ``max_value_bytes``.
    """
    for write in writes:
        if type(write) is Put:
            # The common case (every commit's puts) in one expression; anything it does
            # not pass (non-ASCII text included) takes the full checks and their errors.
            space, key, value = write.space, write.key, write.value
            if (
                type(space) is str
                and type(key) is str
                and type(value) is bytes
                and space
                and key
                and space.isascii()
                and key.isascii()
                and len(value) <= max_value_bytes
            ):
                continue
        _check_write(write, max_value_bytes)


def _check_write(write: Write, max_value_bytes: int) -> None:
    if isinstance(write, DeleteSpace):
        _check_space(write.space)
        return
    _check_address(write.space, write.key)
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


def check_checks(checks: Sequence[Check]) -> None:
    """Refuse malformed commit preconditions before anything is read or written.

    Raises:
        InvalidInputError: An empty or invalid space or key, or an ``expected``
            that is neither bytes nor ``None``.
    """
    for check in checks:
        space, key, expected = check.space, check.key, check.expected
        if (
            type(space) is str
            and type(key) is str
            and (expected is None or type(expected) is bytes)
            and space
            and key
            and space.isascii()
            and key.isascii()
        ):
            continue  # the common case, as in check_writes
        _check_address(space, key)
        if expected is not None and not isinstance(expected, bytes):
            raise InvalidInputError(
                f"a check expects bytes or None, got {type(expected).__name__}",
                field="expected",
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
