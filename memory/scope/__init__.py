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

The implementation is private: ``_system``, ``_working`` and ``_trace`` hold
the three scopes, ``_prompt`` the budgeted assembly, ``_snapshot`` the JSON
schema of a snapshot and ``_manager`` the :class:`ScopeManager` over them.
"""

from __future__ import annotations

from memory.scope._base import (
    DEFAULT_ENCODING,
    DEFAULT_FIRST_PHASE,
    DEFAULT_WORKING_BUDGET_TOKENS,
    HANDOFF_KIND,
    KIND_PATTERN,
    MAX_KEY_CHARS,
    MAX_PHASE_CHARS,
    SCOPE_SCHEMA_VERSION,
    SECTION_SEPARATOR,
    SYSTEM_HEADER,
    TRACE_HEADER,
    WORKING_HEADER,
)
from memory.scope._manager import ScopeManager
from memory.scope._prompt import PromptContext
from memory.scope._system import SystemContext
from memory.scope._trace import Trace, TraceEntry
from memory.scope._working import WorkingMemory

__all__ = [
    "DEFAULT_ENCODING",
    "DEFAULT_FIRST_PHASE",
    "DEFAULT_WORKING_BUDGET_TOKENS",
    "HANDOFF_KIND",
    "KIND_PATTERN",
    "MAX_KEY_CHARS",
    "MAX_PHASE_CHARS",
    "SCOPE_SCHEMA_VERSION",
    "SECTION_SEPARATOR",
    "SYSTEM_HEADER",
    "TRACE_HEADER",
    "WORKING_HEADER",
    "PromptContext",
    "ScopeManager",
    "SystemContext",
    "Trace",
    "TraceEntry",
    "WorkingMemory",
]
