"""The append-only execution trace of a run."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from memory.scope._base import MAX_PHASE_CHARS, _check_count, _check_kind, _check_name, _check_str
from memory.scope._violations import ScopeViolations, reported
from tiers.redaction import OFF, Redactor


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One immutable entry of the execution trace.

    Attributes:
        seq: Position in the trace: 1, 2, 3, ... with no gaps.
        kind: What happened, e.g. ``"step"``, ``"tool"``, ``"handoff"``, ``"note"``.
        text: What was recorded.
        phase: The phase the entry was recorded in (for a handoff: the phase it ended).
        timestamp: When it was recorded (UTC, timezone-aware).
    """

    seq: int
    kind: str
    text: str
    phase: str
    timestamp: datetime

    def render(self) -> str:
        """The entry as a prompt line ``#<seq> [<phase>] <kind>: <text>``."""
        return f"#{self.seq} [{self.phase}] {self.kind}: {self.text}"


class Trace:
    """Append-only execution trace of a run.

    There is no API to remove or edit an entry: every trace read later holds
    every earlier one as a prefix. Entries are immutable. Thread-safe; pass
    ``lock`` to share one lock with an owner.

    Args:
        lock: Lock guarding the entries; a private one if ``None``.
    """

    def __init__(
        self, *, lock: threading.RLock | None = None, redactor: Redactor | None = None
    ) -> None:
        self._lock = lock if lock is not None else threading.RLock()
        self._redactor = redactor if redactor is not None else OFF
        self._entries: list[TraceEntry] = []
        # Where refusals are counted: set by the owning ScopeManager (its ``metrics``).
        self._violations: ScopeViolations | None = None

    @reported
    def append(self, kind: str, text: str, *, phase: str) -> TraceEntry:
        """Append an entry stamped with the next sequence number and the current UTC time.

        Args:
            kind: A letter then up to 63 of ``A-Z a-z 0-9 _ . -``.
            text: What happened.
            phase: The phase it happened in.

        Returns:
            The new entry.

        Raises:
            InvalidScopeInputError: Bad kind, text or phase; nothing was appended.
        """
        kind = _check_kind(kind)
        text = self._redactor.redact(_check_str(text, "text"))
        phase = _check_name(phase, "phase", MAX_PHASE_CHARS)
        with self._lock:
            entry = TraceEntry(len(self._entries) + 1, kind, text, phase, datetime.now(UTC))
            self._entries.append(entry)
        return entry

    def entries(self) -> tuple[TraceEntry, ...]:
        """Every entry, oldest first."""
        with self._lock:
            return tuple(self._entries)

    @reported
    def tail(self, n: int) -> tuple[TraceEntry, ...]:
        """The last ``n`` entries, oldest first (fewer if the trace is shorter).

        Raises:
            InvalidScopeInputError: ``n`` is negative or not an integer.
        """
        n = _check_count(n, "n", "entries")
        with self._lock:
            return tuple(self._entries[len(self._entries) - n :]) if n else ()

    def _load(self, entries: Sequence[TraceEntry]) -> None:
        # Restore only: a fresh trace takes validated entries from a snapshot.
        with self._lock:
            if self._entries:
                raise RuntimeError("Trace._load is for an empty trace only")
            self._entries.extend(entries)

    def __iter__(self) -> Iterator[TraceEntry]:
        return iter(self.entries())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __repr__(self) -> str:
        return f"Trace(entries={len(self)})"
