"""The scope manager: one system context, working memory and trace per run."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, NoReturn, Self

from pydantic import ValidationError

from memory.errors import (
    InvalidScopeInputError,
    InvalidScopeSnapshotError,
    PromptBudgetTooSmallError,
    ReadOnlyScopeError,
    ScopeError,
    TokenBudgetExceededError,
)
from memory.scope._base import (
    DEFAULT_ENCODING,
    DEFAULT_FIRST_PHASE,
    DEFAULT_WORKING_BUDGET_TOKENS,
    HANDOFF_KIND,
    MAX_PHASE_CHARS,
    SCOPE_SCHEMA_VERSION,
    SECTION_SEPARATOR,
    SYSTEM_HEADER,
    TRACE_HEADER,
    WORKING_HEADER,
    _check_count,
    _check_encoding,
    _check_kind,
    _check_name,
    _check_str,
)
from memory.scope._prompt import PromptContext, _fit_newest
from memory.scope._snapshot import _parse_timestamp, _ScopeSnapshot
from memory.scope._system import SystemContext, reporting_to
from memory.scope._trace import Trace, TraceEntry
from memory.scope._violations import ScopeViolations, report, reported
from memory.scope._working import WorkingMemory
from summarizer.tokens import count_tokens
from tiers.redaction import OFF, Redactor


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
        metrics: Where each refusal of the scopes is counted, by kind
            (``metrics.scope_violation(kind)``: ``read_only``, ``token_budget``,
            ``prompt_budget``, ``invalid_input``, ``invalid_snapshot``); e.g. the
            memory's :class:`~memory.metrics.TiermemMetrics`. The system context is
            then the manager's own copy, so that its refusals are counted too.

    Raises:
        InvalidScopeInputError: A bad argument.
    """

    @reported
    def __init__(
        self,
        system: Mapping[str, str] | str,
        *,
        working_budget_tokens: int = DEFAULT_WORKING_BUDGET_TOKENS,
        encoding: str = DEFAULT_ENCODING,
        phase: str = DEFAULT_FIRST_PHASE,
        redactor: Redactor | None = None,
        metrics: ScopeViolations | None = None,
    ) -> None:
        self._violations = metrics  # first: a refused argument is counted too
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
        self._report_to(metrics)

    def _report_to(self, metrics: ScopeViolations | None) -> None:
        """Count the refusals of the manager and of its three scopes in ``metrics``."""
        self._violations = self._working._violations = self._trace._violations = metrics
        if metrics is not None:
            self._system = reporting_to(self._system, metrics)

    @property
    def system(self) -> SystemContext:
        """The read-only system context."""
        return self._system

    @system.setter
    @reported
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

    @reported
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

    @reported
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

    @reported
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
    def restore(
        cls,
        snapshot: Mapping[str, Any],
        *,
        redactor: Redactor | None = None,
        metrics: ScopeViolations | None = None,
    ) -> Self:
        """Rebuild a manager from :meth:`snapshot` output, exactly.

        The restored manager has an equal snapshot and assembles the same
        prompt context.

        Args:
            snapshot: A dict from :meth:`snapshot` (possibly after a JSON round trip).
            redactor: Applied to what the restored manager takes in from now on
                (see :class:`ScopeManager`); the snapshot itself is restored as it is.
            metrics: Where refusals are counted (see :class:`ScopeManager`), a
                refused snapshot included (``invalid_snapshot``).

        Returns:
            A new manager.

        Raises:
            InvalidScopeSnapshotError: The snapshot is not a mapping, has an
                unknown ``schema_version``, a missing/extra/mistyped field, or
                inconsistent content (gaps in trace sequence numbers,
                duplicate working keys, working memory over its budget, ...).
        """
        try:
            manager = cls._restore(snapshot, redactor)
        except ScopeError as error:
            report(metrics, error)
            raise
        # Only now: a snapshot's inconsistency counts once, as the refused snapshot it is.
        manager._report_to(metrics)
        return manager

    @classmethod
    def _restore(cls, snapshot: Mapping[str, Any], redactor: Redactor | None) -> Self:
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
