"""Phase-local working memory under a token budget."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from pydantic import JsonValue

from memory.errors import InvalidScopeInputError, TokenBudgetExceededError
from memory.scope._base import (
    DEFAULT_ENCODING,
    DEFAULT_WORKING_BUDGET_TOKENS,
    MAX_KEY_CHARS,
    _check_count,
    _check_encoding,
    _check_name,
)
from memory.scope._violations import ScopeViolations, reported
from summarizer.tokens import count_tokens
from tiers.redaction import OFF, Redactor


def _render_working_line(key: str, text: str) -> str:
    return f"- {key}: {text}"


@dataclass(frozen=True, slots=True)
class _WorkingEntry:
    # The value is kept as JSON so no caller-held object can change it (and its cost) later.
    value_json: str
    line: str
    tokens: int


class WorkingMemory:
    """Phase-local ``key -> value`` notes under a token budget.

    A value is text, or any JSON-serialisable value (rendered as
    ``json.dumps(value, ensure_ascii=False)``). An entry costs the tokens of
    its rendered line ``- <key>: <text>``; the sum over entries
    (:attr:`used_tokens`) never exceeds :attr:`budget_tokens`. Entries are kept in write order: writing a key
    again moves it to the end (it is the newest).

    Thread-safe. Pass ``lock`` to share one lock with an owner (the
    :class:`ScopeManager`) so its compound operations stay atomic.

    Args:
        budget_tokens: Token budget of all entries together.
        encoding: tiktoken encoding used to count tokens.
        lock: Lock guarding the entries; a private one if ``None``.

    Raises:
        InvalidScopeInputError: The budget is negative or the encoding is not
            available offline.
    """

    def __init__(
        self,
        budget_tokens: int = DEFAULT_WORKING_BUDGET_TOKENS,
        *,
        encoding: str = DEFAULT_ENCODING,
        lock: threading.RLock | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self._budget = _check_count(budget_tokens, "budget_tokens")
        self._encoding = _check_encoding(encoding)
        self._lock = lock if lock is not None else threading.RLock()
        self._redactor = redactor if redactor is not None else OFF
        self._entries: dict[str, _WorkingEntry] = {}
        self._used = 0
        # Where refusals are counted: set by the owning ScopeManager (its ``metrics``).
        self._violations: ScopeViolations | None = None

    @property
    def budget_tokens(self) -> int:
        """Token budget of all entries together."""
        return self._budget

    @property
    def used_tokens(self) -> int:
        """Tokens used by the current entries."""
        with self._lock:
            return self._used

    @property
    def remaining_tokens(self) -> int:
        """Tokens still free: ``budget_tokens - used_tokens``."""
        with self._lock:
            return self._budget - self._used

    def _make_entry(self, key: str, value: JsonValue) -> _WorkingEntry:
        try:
            value_json = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidScopeInputError(
                f"working-memory value for {key!r} is not JSON-serialisable ({exc}); pass "
                "text or plain dict/list/str/int/float/bool/None values",
                field="value",
            ) from exc
        if self._redactor.enabled:
            # Redacted before its tokens are counted: the budget holds for what is stored.
            plain = value if isinstance(value, str) else json.loads(value_json)
            redacted = self._redactor.redact_json(plain, key=key)
            if redacted is not plain:
                value = redacted
                value_json = json.dumps(value, ensure_ascii=False)
        text = value if isinstance(value, str) else value_json
        line = _render_working_line(key, text)
        return _WorkingEntry(value_json, line, count_tokens(line, self._encoding))

    @reported
    def put(self, key: str, value: JsonValue) -> int:
        """Set ``key`` to ``value``, replacing (and freeing the tokens of) any old value.

        Args:
            key: 1-256 printable characters, no newlines.
            value: Text, or a JSON-serialisable value. It is stored as JSON:
                :meth:`get` returns a decoded copy (tuples come back as lists).

        Returns:
            Tokens the entry costs.

        Raises:
            TokenBudgetExceededError: The write would push the total over the
                budget; nothing was changed (the old value, if any, stays).
            InvalidScopeInputError: Bad key, or a value that is not JSON-serialisable.
        """
        key = _check_name(key, "key", MAX_KEY_CHARS)
        entry = self._make_entry(key, value)
        with self._lock:
            old = self._entries.get(key)
            freed = old.tokens if old is not None else 0
            remaining = self._budget - self._used + freed
            if entry.tokens > remaining:
                replacing = " (counting the tokens its old value frees)" if old else ""
                raise TokenBudgetExceededError(
                    f"working-memory entry {key!r} needs {entry.tokens} tokens but only "
                    f"{remaining} of {self._budget} remain{replacing}; remove or shorten "
                    "entries, hand off to the next phase, or raise working_budget_tokens",
                    needed=entry.tokens,
                    remaining=remaining,
                    budget=self._budget,
                )
            self._entries.pop(key, None)
            self._entries[key] = entry
            self._used += entry.tokens - freed
        return entry.tokens

    def get(self, key: str, default: JsonValue = None) -> JsonValue:
        """The value of ``key`` (a fresh copy), or ``default`` when absent."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            return default
        decoded: JsonValue = json.loads(entry.value_json)
        return decoded

    def remove(self, key: str) -> bool:
        """Remove ``key``, freeing its tokens.

        Returns:
            ``True`` if the key was there; a missing key is not an error.
        """
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return False
            self._used -= entry.tokens
            return True

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._entries.clear()
            self._used = 0

    def keys(self) -> tuple[str, ...]:
        """The keys, oldest write first."""
        with self._lock:
            return tuple(self._entries)

    def items(self) -> tuple[tuple[str, JsonValue], ...]:
        """``(key, value)`` pairs (decoded copies), oldest write first."""
        with self._lock:
            pairs = [(key, entry.value_json) for key, entry in self._entries.items()]
        return tuple((key, json.loads(value_json)) for key, value_json in pairs)

    def render(self) -> str:
        """The entries as prompt lines ``- <key>: <text>``, oldest write first."""
        with self._lock:
            return "\n".join(entry.line for entry in self._entries.values())

    def _lines(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(key, entry.line) for key, entry in self._entries.items()]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __repr__(self) -> str:
        return (
            f"WorkingMemory(entries={len(self)}, used_tokens={self.used_tokens}, "
            f"budget_tokens={self._budget})"
        )
