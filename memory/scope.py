"""Scope manager: the in-process state of one agent run.

A run sees three scopes, kept apart because they live for different spans:

- :class:`SystemContext` — read-only instructions, tool list, policies; fixed
  for the whole run.
- :class:`WorkingMemory` — phase-local notes under a token budget; a write
  that does not fit is refused, never truncated; cleared at each phase
  handoff.
- :class:`Trace` — the append-only execution trace: steps, tool calls,
  handoffs, notes.

:class:`ScopeManager` owns one of each, assembles them into a prompt context
that never exceeds a token budget (:meth:`ScopeManager.build_prompt_context`),
and snapshots them as plain JSON for task checkpoints, so a resumed run gets
its scopes back exactly: ``run.step(name, fn, scope=scopes.snapshot)`` stores
the snapshot taken after ``fn``, and a resumed worker calls
``ScopeManager.restore(run.latest_scope())`` before replaying (replayed steps
do not run their functions, so the scopes stay as the last committed step left
them). Tokens are counted with tiktoken, offline.

Assembled prompt layout (empty sections are left out)::

    ## System
    <system context>

    ## Working memory (phase: <phase>)
    [N older working-memory entries omitted to fit the context budget]
    - <key>: <value>

    ## Trace
    [N earlier trace entries omitted to fit the context budget]
    #<seq> [<phase>] <kind>: <text>
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final, NoReturn, Self

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from memory.errors import (
    InvalidScopeInputError,
    InvalidScopeSnapshotError,
    PromptBudgetTooSmallError,
    ReadOnlyScopeError,
    TokenBudgetExceededError,
)
from summarizer.errors import SummarizerError
from summarizer.tokens import count_tokens, get_encoding
from tiers.redaction import OFF, Redactor

SCOPE_SCHEMA_VERSION: Final = 1
DEFAULT_ENCODING: Final = "cl100k_base"
DEFAULT_WORKING_BUDGET_TOKENS: Final = 2000
DEFAULT_FIRST_PHASE: Final = "phase-1"
HANDOFF_KIND: Final = "handoff"

SYSTEM_HEADER: Final = "## System"
WORKING_HEADER: Final = "## Working memory (phase: {phase})"
TRACE_HEADER: Final = "## Trace"
SECTION_SEPARATOR: Final = "\n\n"

MAX_KEY_CHARS: Final = 256
MAX_PHASE_CHARS: Final = 128
KIND_PATTERN: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")


# --- argument checks -------------------------------------------------------------------------


def _check_str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidScopeInputError(
            f"{field} must be a string, got {type(value).__name__}", field=field
        )
    return value


def _check_name(value: object, field: str, max_chars: int) -> str:
    text = _check_str(value, field)
    if not text or len(text) > max_chars or not text.isprintable():
        raise InvalidScopeInputError(
            f"{field} {text[:80]!r} is invalid: use 1-{max_chars} printable characters "
            "(no newlines or control characters)",
            field=field,
        )
    return text


def _check_kind(value: object) -> str:
    kind = _check_str(value, "kind")
    if KIND_PATTERN.fullmatch(kind) is None:
        raise InvalidScopeInputError(
            f"trace kind {kind[:80]!r} is invalid: use a letter followed by up to 63 of "
            "A-Z a-z 0-9 _ . - (e.g. 'step', 'tool', 'note')",
            field="kind",
        )
    return kind


def _check_count(value: object, field: str, unit: str = "tokens") -> int:
    # bool is an int subclass; True as a budget is a bug, not one token.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidScopeInputError(
            f"{field} must be a non-negative integer number of {unit}, got {value!r}",
            field=field,
        )
    return value


def _check_encoding(value: object) -> str:
    name = _check_str(value, "encoding")
    try:
        get_encoding(name)
    except SummarizerError as exc:
        raise InvalidScopeInputError(str(exc), field="encoding") from exc
    return name


# --- system context --------------------------------------------------------------------------


def _render_system(sections: Mapping[str, str]) -> str:
    # The untitled section "" (a plain-string system context) renders without a title.
    return SECTION_SEPARATOR.join(
        body if not name else f"[{name}]\n{body}" for name, body in sections.items()
    )


class SystemContext(Mapping[str, str]):
    """Read-only system context of a run: named sections of text, fixed at construction.

    A plain string becomes one untitled section under the key ``""``; a
    mapping keeps its sections in order, each rendered as ``[name]`` followed
    by its text. Every mutation attempt — item assignment, ``del``, attribute
    assignment, ``update``/``pop``/``popitem``/``clear``/``setdefault``,
    ``|=`` — raises :class:`~memory.errors.ReadOnlyScopeError` and changes
    nothing. Copying returns the same object.

    Args:
        source: The system text, a mapping of section name to text, or
            another :class:`SystemContext`.

    Raises:
        InvalidScopeInputError: ``source`` is not text or a mapping of str to
            str, or a section name holds a newline or control character.
    """

    __slots__ = ("_sections", "_text")

    _sections: Mapping[str, str]
    _text: str

    def __init__(self, source: Mapping[str, str] | str) -> None:
        if isinstance(source, SystemContext):
            sections = dict(source._sections)
        elif isinstance(source, str):
            sections = {"": source}
        elif isinstance(source, Mapping):
            sections = {}
            for name, body in source.items():
                if not isinstance(name, str) or not isinstance(body, str):
                    raise InvalidScopeInputError(
                        "system context sections must map str names to str text, got "
                        f"{type(name).__name__} -> {type(body).__name__}",
                        field="system",
                    )
                if name and not name.isprintable():
                    raise InvalidScopeInputError(
                        f"system section name {name[:80]!r} holds a newline or control "
                        "character; use a one-line name",
                        field="system",
                    )
                sections[name] = body
        else:
            raise InvalidScopeInputError(
                "system context must be text or a mapping of section name to text, got "
                f"{type(source).__name__}",
                field="system",
            )
        # object.__setattr__ because our own __setattr__ refuses every assignment.
        object.__setattr__(self, "_sections", MappingProxyType(sections))
        object.__setattr__(self, "_text", _render_system(sections))

    @property
    def sections(self) -> Mapping[str, str]:
        """An immutable view of the sections, in order (a ``MappingProxyType``)."""
        return self._sections

    @property
    def text(self) -> str:
        """The rendered system context, as it appears in the prompt."""
        return self._text

    def __getitem__(self, name: str) -> str:
        return self._sections[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sections)

    def __len__(self) -> int:
        return len(self._sections)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SystemContext):
            # Order matters: it changes the rendered text.
            return tuple(self._sections.items()) == tuple(other._sections.items())
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash(tuple(self._sections.items()))

    def __repr__(self) -> str:
        return f"SystemContext({dict(self._sections)!r})"

    def __copy__(self) -> Self:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Self:
        return self

    def __reduce__(self) -> tuple[type[SystemContext], tuple[dict[str, str]]]:
        return (SystemContext, (dict(self._sections),))

    def _refuse(self, what: str) -> NoReturn:
        raise ReadOnlyScopeError(
            f"the system context is read-only ({what} refused); start a new ScopeManager "
            "with the system context you need, or keep changing state in working memory"
        )

    def __setitem__(self, name: str, value: str) -> NoReturn:
        self._refuse(f"setting section {name!r}")

    def __delitem__(self, name: str) -> NoReturn:
        self._refuse(f"deleting section {name!r}")

    def __setattr__(self, name: str, value: object) -> NoReturn:
        self._refuse(f"setting attribute {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        self._refuse(f"deleting attribute {name!r}")

    def __ior__(self, other: object) -> NoReturn:
        self._refuse("|=")

    def update(self, *args: object, **kwargs: object) -> NoReturn:
        """Refused: the system context is read-only.

        Raises:
            ReadOnlyScopeError: Always.
        """
        self._refuse("update()")

    def pop(self, *args: object) -> NoReturn:
        """Refused: the system context is read-only.

        Raises:
            ReadOnlyScopeError: Always.
        """
        self._refuse("pop()")

    def popitem(self) -> NoReturn:
        """Refused: the system context is read-only.

        Raises:
            ReadOnlyScopeError: Always.
        """
        self._refuse("popitem()")

    def clear(self) -> NoReturn:
        """Refused: the system context is read-only.

        Raises:
            ReadOnlyScopeError: Always.
        """
        self._refuse("clear()")

    def setdefault(self, *args: object) -> NoReturn:
        """Refused: the system context is read-only.

        Raises:
            ReadOnlyScopeError: Always.
        """
        self._refuse("setdefault()")


# --- working memory --------------------------------------------------------------------------


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


# --- trace -----------------------------------------------------------------------------------


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


# --- prompt assembly -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptContext:
    """An assembled prompt context and what went into it.

    Attributes:
        text: The prompt context.
        tokens: Tokens of ``text`` (always ``<= max_tokens``).
        max_tokens: The budget it was assembled for.
        working_keys: Working-memory keys included, oldest write first.
        omitted_working: Working-memory entries left out for lack of room.
        trace_seqs: Sequence numbers of the trace entries included.
        omitted_trace: Trace entries left out for lack of room (the oldest).
    """

    text: str
    tokens: int
    max_tokens: int
    working_keys: tuple[str, ...]
    omitted_working: int
    trace_seqs: tuple[int, ...]
    omitted_trace: int


def _omitted_marker(count: int, what: str) -> str:
    noun = "entry" if count == 1 else "entries"
    return f"[{count} {what} {noun} omitted to fit the context budget]"


def _fit_newest(
    head: Sequence[str],
    header: str,
    lines: Sequence[str],
    what: str,
    max_tokens: int,
    count: Callable[[str], int],
) -> tuple[str | None, int]:
    """The section holding the most recent ``lines`` that fit after ``head``.

    Returns ``(section, kept)``; ``section`` is ``None`` when not even the
    header and the omitted-marker fit. The kept lines are a suffix of
    ``lines``: the whole assembled text fits with them, and would not with one
    more.
    """
    total = len(lines)
    if total == 0:
        return None, 0

    def section(kept: int) -> str:
        omitted = total - kept
        parts = [header]
        if omitted:
            parts.append(_omitted_marker(omitted, what))
        parts.extend(lines[omitted:])
        return "\n".join(parts)

    def fits(kept: int) -> bool:
        return count(SECTION_SEPARATOR.join([*head, section(kept)])) <= max_tokens

    # Estimate from per-line counts, then settle on exact counts of the whole
    # text: BPE tokens are not additive across the joins.
    room = max_tokens - count(SECTION_SEPARATOR.join([*head, section(0)]))
    kept = 0
    for line in reversed(lines):
        cost = count(line) + 1
        if cost > room:
            break
        room -= cost
        kept += 1
    if fits(kept):
        while kept < total and fits(kept + 1):
            kept += 1
    else:
        while kept > 0 and not fits(kept):
            kept -= 1
        if kept == 0 and not fits(0):
            return None, 0
    return section(kept), kept


# --- snapshot schema -------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _SectionSnapshot(_Strict):
    name: str
    text: str


class _WorkingSnapshot(_Strict):
    key: str
    value: JsonValue


class _TraceSnapshot(_Strict):
    seq: int
    kind: str
    text: str
    phase: str
    timestamp: str


class _ScopeSnapshot(_Strict):
    schema_version: int
    encoding: str
    system: list[_SectionSnapshot]
    phase: str
    phase_index: int = Field(ge=1)
    working_budget_tokens: int = Field(ge=0)
    working: list[_WorkingSnapshot]
    trace: list[_TraceSnapshot]


def _parse_timestamp(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidScopeInputError(
            f"timestamp {value[:64]!r} is not ISO 8601", field="timestamp"
        ) from exc
    if parsed.tzinfo is None:
        raise InvalidScopeInputError(
            f"timestamp {value[:64]!r} has no timezone; snapshots hold UTC times",
            field="timestamp",
        )
    return parsed.astimezone(UTC)


# --- scope manager ---------------------------------------------------------------------------


class ScopeManager:
    """System context, working memory and trace of one agent run.

    Thread-safe: the manager, its working memory and its trace share one
    lock, so an agent may record from several threads and a handoff or
    snapshot sees a consistent state.

    Args:
        system: The read-only system context: text, a mapping of section
            name to text, or a :class:`SystemContext`.
        working_budget_tokens: Token budget of the working memory.
        encoding: tiktoken encoding used to count tokens (shipped offline:
            ``cl100k_base``, ``o200k_base``, ``p50k_base``).
        phase: Name of the first phase.
        redactor: Applied to everything the scopes take in (system sections,
            working-memory values, trace texts) before it is held, so budgets
            count, prompts show and snapshots store the redacted text. Default
            ``Redactor("secrets")``, the :class:`~memory.Memory` default; pass
            ``memory.redactor`` so the scopes and the run's checkpoints agree
            (``Redactor("off")``: keep everything).

    Raises:
        InvalidScopeInputError: A bad argument.
    """

    def __init__(
        self,
        system: Mapping[str, str] | str,
        *,
        working_budget_tokens: int = DEFAULT_WORKING_BUDGET_TOKENS,
        encoding: str = DEFAULT_ENCODING,
        phase: str = DEFAULT_FIRST_PHASE,
        redactor: Redactor | None = None,
    ) -> None:
        self._encoding = _check_encoding(encoding)
        if redactor is not None and not isinstance(redactor, Redactor):
            raise InvalidScopeInputError(
                f"redactor must be a Redactor, got {type(redactor).__name__}", field="redactor"
            )
        self._redactor = redactor if redactor is not None else Redactor()
        context = system if isinstance(system, SystemContext) else SystemContext(system)
        redacted = {n: self._redactor.redact(t) for n, t in context.sections.items()}
        if redacted != dict(context.sections):
            context = SystemContext(redacted)
        self._system = context
        self._lock = threading.RLock()
        self._working = WorkingMemory(
            working_budget_tokens, encoding=self._encoding, lock=self._lock, redactor=self._redactor
        )
        self._trace = Trace(lock=self._lock, redactor=self._redactor)
        self._phase = _check_name(phase, "phase", MAX_PHASE_CHARS)
        self._phase_index = 1

    @property
    def system(self) -> SystemContext:
        """The read-only system context."""
        return self._system

    @system.setter
    def system(self, value: object) -> NoReturn:
        raise ReadOnlyScopeError(
            "the system context of a ScopeManager cannot be replaced; start a new "
            "ScopeManager with the system context you need"
        )

    @property
    def working(self) -> WorkingMemory:
        """The working memory of the current phase."""
        return self._working

    @property
    def trace(self) -> Trace:
        """The append-only execution trace."""
        return self._trace

    @property
    def phase(self) -> str:
        """Name of the current phase."""
        with self._lock:
            return self._phase

    @property
    def phase_index(self) -> int:
        """1-based number of the current phase."""
        with self._lock:
            return self._phase_index

    @property
    def encoding(self) -> str:
        """The tiktoken encoding tokens are counted in."""
        return self._encoding

    def record(self, kind: str, text: str) -> TraceEntry:
        """Append ``text`` to the trace as an entry of ``kind`` in the current phase.

        Args:
            kind: E.g. ``"step"``, ``"tool"``, ``"note"``. ``"handoff"`` is
                reserved for :meth:`phase_handoff`.
            text: What happened.

        Returns:
            The new trace entry.

        Raises:
            InvalidScopeInputError: Bad kind (or ``"handoff"``) or text.
        """
        kind = _check_kind(kind)
        if kind == HANDOFF_KIND:
            raise InvalidScopeInputError(
                "trace kind 'handoff' is reserved; call phase_handoff(summary) to end a phase",
                field="kind",
            )
        with self._lock:
            return self._trace.append(kind, text, phase=self._phase)

    def phase_handoff(self, summary: str, next_phase: str | None = None) -> TraceEntry:
        """End the current phase: trace the handoff, clear working memory, start the next phase.

        The summary is what the next phase carries over; it stays in the
        trace (as a ``"handoff"`` entry of the ending phase) while the working
        memory starts empty.

        Args:
            summary: Non-empty summary of the phase that ends.
            next_phase: Name of the next phase; ``phase-<n>`` (its 1-based
                number) when ``None``.

        Returns:
            The handoff trace entry.

        Raises:
            InvalidScopeInputError: Empty summary or bad phase name; nothing changed.
        """
        summary = _check_str(summary, "summary")
        if not summary.strip():
            raise InvalidScopeInputError(
                "summary must not be empty: say what the next phase needs to know",
                field="summary",
            )
        if next_phase is not None:
            next_phase = _check_name(next_phase, "next_phase", MAX_PHASE_CHARS)
        with self._lock:
            entry = self._trace.append(HANDOFF_KIND, summary, phase=self._phase)
            self._working.clear()
            self._phase_index += 1
            self._phase = next_phase if next_phase is not None else f"phase-{self._phase_index}"
        return entry

    def assemble(self, max_tokens: int) -> PromptContext:
        """Assemble the prompt context within ``max_tokens`` and report what went in.

        The system context comes first and whole; then working memory, then
        the trace. When working memory or the trace does not fit, their most
        recent entries are kept, the oldest dropped, and a marker line says
        how many were omitted. The whole text, headers and separators
        included, is counted with tiktoken and never exceeds ``max_tokens``.

        Args:
            max_tokens: Token budget of the whole prompt context.

        Returns:
            The assembled :class:`PromptContext`.

        Raises:
            PromptBudgetTooSmallError: The system context alone (with its
                header) needs more than ``max_tokens``.
            InvalidScopeInputError: ``max_tokens`` is negative or not an integer.
        """
        max_tokens = _check_count(max_tokens, "max_tokens")
        with self._lock:
            working = self._working._lines()
            trace = self._trace.entries()
            phase = self._phase

        # Counting happens outside the lock so recorders are not held up.
        def count(text: str) -> int:
            return count_tokens(text, self._encoding)

        head: list[str] = []
        if self._system.text:
            head.append(f"{SYSTEM_HEADER}\n{self._system.text}")
            needed = count(head[0])
            if needed > max_tokens:
                raise PromptBudgetTooSmallError(
                    f"the system context needs {needed} tokens (with its header) but "
                    f"max_tokens is {max_tokens}; allow at least {needed} tokens or shorten "
                    "the system context",
                    needed=needed,
                    remaining=max_tokens,
                    budget=max_tokens,
                )
        working_section, kept_working = _fit_newest(
            head,
            WORKING_HEADER.format(phase=phase),
            [line for _, line in working],
            "older working-memory",
            max_tokens,
            count,
        )
        if working_section is not None:
            head.append(working_section)
        trace_section, kept_trace = _fit_newest(
            head,
            TRACE_HEADER,
            [entry.render() for entry in trace],
            "earlier trace",
            max_tokens,
            count,
        )
        if trace_section is not None:
            head.append(trace_section)
        text = SECTION_SEPARATOR.join(head)
        return PromptContext(
            text=text,
            tokens=count(text),
            max_tokens=max_tokens,
            working_keys=tuple(key for key, _ in working[len(working) - kept_working :])
            if kept_working
            else (),
            omitted_working=len(working) - kept_working,
            trace_seqs=tuple(entry.seq for entry in trace[len(trace) - kept_trace :])
            if kept_trace
            else (),
            omitted_trace=len(trace) - kept_trace,
        )

    def build_prompt_context(self, max_tokens: int) -> str:
        """The prompt context within ``max_tokens``; see :meth:`assemble`.

        Raises:
            PromptBudgetTooSmallError: The system context alone does not fit.
            InvalidScopeInputError: ``max_tokens`` is negative or not an integer.
        """
        return self.assemble(max_tokens).text

    def snapshot(self) -> dict[str, Any]:
        """The whole scope state as a JSON-serialisable dict, for a task checkpoint.

        Lists, not objects, hold ordered things (system sections, working
        entries, trace), so the order survives any JSON store.

        Returns:
            A new dict with ``schema_version``; :meth:`restore` takes it back.
        """
        with self._lock:
            return {
                "schema_version": SCOPE_SCHEMA_VERSION,
                "encoding": self._encoding,
                "system": [
                    {"name": name, "text": text} for name, text in self._system.sections.items()
                ],
                "phase": self._phase,
                "phase_index": self._phase_index,
                "working_budget_tokens": self._working.budget_tokens,
                "working": [{"key": key, "value": value} for key, value in self._working.items()],
                "trace": [
                    {
                        "seq": entry.seq,
                        "kind": entry.kind,
                        "text": entry.text,
                        "phase": entry.phase,
                        "timestamp": entry.timestamp.isoformat(),
                    }
                    for entry in self._trace.entries()
                ],
            }

    @classmethod
    def restore(cls, snapshot: Mapping[str, Any], *, redactor: Redactor | None = None) -> Self:
        """Rebuild a manager from :meth:`snapshot` output, exactly.

        The restored manager has an equal snapshot and assembles the same
        prompt context.

        Args:
            snapshot: A dict from :meth:`snapshot` (possibly after a JSON round trip).
            redactor: Applied to what the restored manager takes in from now on
                (see :class:`ScopeManager`); the snapshot itself is restored as it is.

        Returns:
            A new manager.

        Raises:
            InvalidScopeSnapshotError: The snapshot is not a mapping, has an
                unknown ``schema_version``, a missing/extra/mistyped field, or
                inconsistent content (gaps in trace sequence numbers,
                duplicate working keys, working memory over its budget, ...).
        """
        if not isinstance(snapshot, Mapping):
            raise InvalidScopeSnapshotError(
                "a scope snapshot must be the dict ScopeManager.snapshot() returned, got "
                f"{type(snapshot).__name__}"
            )
        version = snapshot.get("schema_version")
        if version != SCOPE_SCHEMA_VERSION or isinstance(version, bool):
            newer = isinstance(version, int) and version > SCOPE_SCHEMA_VERSION
            fix = "upgrade tiermem to restore it" if newer else "it is not a scope snapshot"
            raise InvalidScopeSnapshotError(
                f"scope snapshot schema_version {version!r} is not supported (this tiermem "
                f"reads {SCOPE_SCHEMA_VERSION}); {fix}",
                field="schema_version",
            )
        try:
            parsed = _ScopeSnapshot.model_validate(dict(snapshot))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "snapshot"
            raise InvalidScopeSnapshotError(
                f"scope snapshot field {where} is invalid: {error['msg']}; restore the "
                "unmodified dict from ScopeManager.snapshot()",
                field=where,
            ) from exc
        return cls._from_parsed(parsed, redactor)

    @classmethod
    def _from_parsed(cls, parsed: _ScopeSnapshot, redactor: Redactor | None = None) -> Self:
        where = "system"
        try:
            sections = {section.name: section.text for section in parsed.system}
            if len(sections) != len(parsed.system):
                raise InvalidScopeInputError("duplicate system section names")
            where = "snapshot"
            manager = cls(
                SystemContext(sections),
                working_budget_tokens=parsed.working_budget_tokens,
                encoding=parsed.encoding,
                phase=parsed.phase,
                redactor=OFF,  # restored exactly; the redactor applies to what comes next
            )
            manager._phase_index = parsed.phase_index
            for index, item in enumerate(parsed.working):
                where = f"working.{index}"
                if item.key in manager._working:
                    raise InvalidScopeInputError(f"duplicate working-memory key {item.key!r}")
                manager._working.put(item.key, item.value)
            entries = []
            for index, raw in enumerate(parsed.trace):
                where = f"trace.{index}"
                if raw.seq != index + 1:
                    raise InvalidScopeInputError(
                        f"trace seq {raw.seq} where {index + 1} was expected (gap or reorder)"
                    )
                entries.append(
                    TraceEntry(
                        seq=raw.seq,
                        kind=_check_kind(raw.kind),
                        text=raw.text,
                        phase=_check_name(raw.phase, "phase", MAX_PHASE_CHARS),
                        timestamp=_parse_timestamp(raw.timestamp),
                    )
                )
            manager._trace._load(entries)
        except (InvalidScopeInputError, TokenBudgetExceededError) as exc:
            raise InvalidScopeSnapshotError(
                f"scope snapshot is inconsistent at {where}: {exc}", field=where
            ) from exc
        manager._use_redactor(redactor if redactor is not None else Redactor())
        return manager

    def _use_redactor(self, redactor: Redactor) -> None:
        if not isinstance(redactor, Redactor):
            raise InvalidScopeInputError(
                f"redactor must be a Redactor, got {type(redactor).__name__}", field="redactor"
            )
        self._redactor = self._working._redactor = self._trace._redactor = redactor

    def __repr__(self) -> str:
        return (
            f"ScopeManager(phase={self.phase!r}, working={self._working!r}, trace={self._trace!r})"
        )
