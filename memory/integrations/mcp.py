"""tiermem as an MCP server: memory tools for any Model Context Protocol client.

:func:`build_server` makes an :class:`mcp.server.mcpserver.MCPServer` whose
tools call the :class:`~memory.facade.Memory` facade (its public API only):

=============================  ======  ==================================================
tool                           writes  what it does
=============================  ======  ==================================================
``build_continuation_context``         prompt-ready facts + relevant earlier sessions
``recall_relevant``                    the user's earlier sessions most relevant to a query
``save_session``               yes     store a structured session summary
``end_session``                yes     store a transcript, summarize it, save the summary
``get_fact``                           one user fact
``get_facts``                          every current fact of a user
``set_fact``                   yes     set a user fact (the old value goes to its history)
``delete_fact``                yes     delete a user fact (its history keeps a tombstone)
``fact_history``                       every version of a fact, oldest first
``get_run``                            status and head of a task run
``list_runs``                          the tenant's runs, filtered by user and status
``pending_approvals``                  runs paused at an approval gate: gate key, plan hash
``approve_run``                yes     approve the plan a paused run waits on
``reject_run``                 yes     reject it
``set_budget``                 yes     raise (or lift) the token/cost budget of a run
=============================  ======  ==================================================

Every tool acts in one tenant, decided per call by a :data:`CallerResolver`
from the transport's request: over stdio the tenant of the ``Memory`` given
(``TIERMEM_TENANT``), over HTTP the tenant of the caller's API key (see
``api/mcp_http.py``). A caller that may not write gets an error from a writing
tool. A caller bound to one user (an API key made with ``--user``) gets an
error from a tool given another ``user_id``, "not found" for a run of another
user, and only its user's runs from ``list_runs`` and ``pending_approvals``
(see :mod:`memory.binding`). tiermem's typed errors become tool errors (``isError`` results) whose
text names the error and the offending field; nothing stored changes.

``tiermem mcp`` runs it over stdio (default) or streamable HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, JsonValue, StrictInt

from memory.binding import allowed, owned_run, refusal, user_filter
from memory.errors import ScopeError
from memory.facade import DEFAULT_TOP_K, Memory
from memory.integrations import require
from memory.integrations._mcp_results import (
    approval_result,
    fact_result,
    package_version,
    recalled_result,
    run_result,
    summary_result,
)
from memory.integrations._mcp_results import (
    describe_error as _describe,  # the name tests of error hygiene import from here
)
from memory.settings import Settings
from summarizer.errors import SummarizerError
from tiers.errors import InvalidInputError, TierError
from tiers.ids import ID_RULE
from tiers.models import RunInfo, RunStatus
from tiers.task import MAX_NOTE, UNSET

require("mcp", "mcp")

from mcp.server.mcpserver import Context, MCPServer  # noqa: E402 (after the extra check)
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp_types import ToolAnnotations  # noqa: E402

__all__ = ["TOOL_NAMES", "CallerResolver", "McpCaller", "build_server", "run_stdio"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class McpCaller:
    """Who calls a tool, and the memory the call may reach.

    Attributes:
        memory: The caller's tenant view of the memory; every tool call uses only it.
        principal: The credential the call came with (``"api-key:<id>"``), or
            ``None`` for a local (stdio) client. Recorded with the MCP
            client's name as ``by`` of an approval.
        can_write: Whether writing tools may run (``False`` for a read-only API key).
        user_id: The one user the caller may act for (an API key bound to a
            user), or ``None`` for every user of the tenant.
    """

    memory: Memory
    principal: str | None = None
    can_write: bool = True
    user_id: str | None = None


CallerResolver = Callable[[Any], McpCaller]
"""Maps the transport's request of a tool call (a Starlette request over HTTP,
``None`` over stdio) to the :class:`McpCaller` it acts as. Called in a worker
thread; may do I/O; raises to refuse the call."""

INSTRUCTIONS = """\
tiermem is long-term memory for this user. At the start of a task call
build_continuation_context (user_id, and what the task is about) and put its text in
your context. When a session ends, call end_session with its transcript (or
save_session with your own summary). Keep standing preferences with set_fact.
Runs paused for a human decision are listed by pending_approvals; approve_run or
reject_run decides one, only when the user told you to. set_budget raises the budget
of a run that spent it, also only when the user told you to."""

# Argument types: each carries the description a client shows the model. Ids are not
# constrained in the schema on purpose: the facade checks them and its error names the field.
UserId = Annotated[str, Field(description=f"The user's id: {ID_RULE}.")]
SessionId = Annotated[str, Field(description=f"The session's id: {ID_RULE}.")]
FactKey = Annotated[
    str, Field(description=f"The fact's key, e.g. 'preferred_language': {ID_RULE}.")
]
RunId = Annotated[str, Field(description="The task run's id.")]
PlanHash = Annotated[
    str,
    Field(
        description="SHA-256 of the plan being decided (64 lowercase hex characters), as "
        "pending_approvals or get_run reports it: the decision binds to exactly that plan."
    ),
]
Note = Annotated[
    str | None,
    Field(description=f"Optional comment kept with the decision (at most {MAX_NOTE} characters)."),
]
CreatedAt = Annotated[
    datetime | None,
    Field(description="When the session ended (ISO 8601; no offset means UTC). Default: now."),
]
Items = Annotated[list[str] | None, Field(description="Short items, one sentence each.")]
# Strict: a budget of true or "5" is refused, not coerced. None leaves the limit as it is.
TokenBudget = Annotated[
    StrictInt | Literal["unlimited"] | None,
    Field(description="The run's new token budget; 'unlimited' removes it. Default: unchanged."),
]
CostBudget = Annotated[
    Annotated[float, Field(strict=True, allow_inf_nan=False)] | Literal["unlimited"] | None,
    Field(description="The run's new cost budget; 'unlimited' removes it. Default: unchanged."),
]

_READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_WRITE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
_DELETE = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)

# Every tool, registered in this order, with the hints a client shows before calling it.
_TOOLS: dict[str, ToolAnnotations] = {
    "build_continuation_context": _READ,
    "recall_relevant": _READ,
    "save_session": _WRITE,
    "end_session": _WRITE,
    "get_fact": _READ,
    "get_facts": _READ,
    "set_fact": _WRITE,
    "delete_fact": _DELETE,
    "fact_history": _READ,
    "get_run": _READ,
    "list_runs": _READ,
    "pending_approvals": _READ,
    "approve_run": _WRITE,
    "reject_run": _WRITE,
    "set_budget": _WRITE,
}

TOOL_NAMES: tuple[str, ...] = tuple(_TOOLS)
"""Every tool :func:`build_server` registers (a test pins the set)."""

_LOG_LEVELS: dict[str, Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]] = {
    "debug": "DEBUG",
    "info": "INFO",
    "warning": "WARNING",
    "error": "ERROR",
    "critical": "CRITICAL",
}

# A client names itself in `initialize`; only a tame, bounded form of it is recorded.
_CLIENT_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._@+\- ]+")
_CLIENT_NAME_MAX = 64


def build_server(
    memory: Memory | None = None,
    *,
    resolve: CallerResolver | None = None,
    name: str = "tiermem",
    log_level: str = "warning",
) -> MCPServer[Any]:
    """The MCP server of tiermem's tools over one memory (see the module docstring).

    Args:
        memory: Serve this memory's tenant to every caller, with write access
            (a local client over stdio).
        resolve: Or decide the caller per tool call from the transport's
            request (multi-tenant HTTP); exactly one of ``memory`` and
            ``resolve`` is given.
        name: The server's name, shown to clients.
        log_level: Level of the SDK's own log (it goes to stderr): debug, info,
            warning, error or critical.

    Returns:
        The server; run it with ``.run("stdio")``, or serve its streamable HTTP
        app (``api/mcp_http.py``).

    Raises:
        InvalidInputError: Not exactly one of ``memory`` and ``resolve`` was
            given, or ``log_level`` is not a level.
    """
    if (memory is None) == (resolve is None):
        raise InvalidInputError(
            "give exactly one of memory and resolve",
            field="memory" if memory is None else "resolve",
        )
    if memory is not None:
        local = McpCaller(memory)

        def resolve_local(request: Any) -> McpCaller:
            return local

        resolve = resolve_local
    assert resolve is not None
    tools = _Tools(resolve)
    level = _LOG_LEVELS.get(log_level.lower()) if isinstance(log_level, str) else None
    if level is None:
        raise InvalidInputError(
            f"log_level must be one of {', '.join(_LOG_LEVELS)}", field="log_level"
        )
    server: MCPServer[Any] = MCPServer(
        name, instructions=INSTRUCTIONS, version=package_version(), log_level=level
    )
    for tool, hints in _TOOLS.items():
        server.add_tool(getattr(tools, tool), annotations=hints)
    return server


def run_stdio(settings: Settings | None = None) -> None:
    """Serve the memory ``settings`` name (default: ``TIERMEM_*``) over stdio until stdin closes.

    The tenant is ``settings.tenant``. Stdout carries only the protocol; logs
    go to stderr. The stores are closed (queued index work finished) on exit.

    Raises:
        InvalidInputError: A setting is invalid (``field`` names it).
    """
    memory = Memory.from_settings(settings)
    try:
        level = settings.log_level if settings is not None else "warning"
        build_server(memory, log_level=level).run("stdio")
    finally:
        memory.close()


class _Tools:
    """The tool functions. Sync on purpose: the SDK runs them in worker threads,
    so the sync, thread-safe facade never blocks the event loop."""

    def __init__(self, resolve: CallerResolver) -> None:
        self._resolve = resolve

    def _call(
        self,
        ctx: Context[Any, Any],
        op: Callable[[McpCaller], T],
        *,
        writes: bool,
        user_id: str | None = None,
        run_id: str | None = None,
    ) -> T:
        """``op`` as the caller of this tool call, with tiermem's typed errors as tool errors.

        ``user_id`` (the user the call names) and ``run_id`` (the run it
        addresses) are checked against a caller bound to one user first.
        """
        caller = self._resolve(ctx.request_context.request)
        if writes and not caller.can_write:
            raise ToolError(
                f"this tool writes, and the caller ({caller.principal}) may only read: "
                "use an API key created without --read-only"
            )
        if not allowed(caller.user_id, user_id):
            assert caller.user_id is not None
            raise ToolError(refusal(caller.user_id, caller.principal))
        try:
            if run_id is not None and caller.user_id is not None:
                owned_run(caller.memory, run_id, caller.user_id)
            return op(caller)
        except (TierError, SummarizerError, ScopeError) as exc:
            raise ToolError(_describe(exc)) from exc

    @staticmethod
    def _by(ctx: Context[Any, Any], caller: McpCaller) -> str:
        """Who decides an approval: the MCP client's own name, and the credential it came with."""
        params = ctx.session.client_params
        client = params.client_info.name if params is not None else ""
        client = _CLIENT_NAME_UNSAFE.sub("", client).strip()[:_CLIENT_NAME_MAX] or "client"
        return f"mcp:{client}" if caller.principal is None else f"mcp:{client} ({caller.principal})"

    # -- context and sessions -----------------------------------------------------------------

    def build_continuation_context(
        self,
        user_id: UserId,
        ctx: Context[Any, Any],
        query: Annotated[
            str,
            Field(
                description="What the new session is about; earlier sessions are ranked by "
                "relevance to it. Empty: the most recent sessions."
            ),
        ] = "",
        max_tokens: Annotated[
            int | None,
            Field(description="Token budget of the whole text (positive). Default: the server's."),
        ] = None,
    ) -> str:
        """Prompt-ready context for a new session of the user: their standing facts and the most
        relevant earlier sessions (the most recent always, when it fits), within a token budget.
        Call this at the start of a task and put the text in your context."""
        return self._call(
            ctx,
            lambda c: c.memory.build_continuation_context(user_id, query, max_tokens),
            writes=False,
            user_id=user_id,
        )

    def recall_relevant(
        self,
        user_id: UserId,
        query: Annotated[str, Field(description="What to look for in earlier sessions.")],
        ctx: Context[Any, Any],
        top_k: Annotated[
            int, Field(description="How many sessions at most (1-100).")
        ] = DEFAULT_TOP_K,
    ) -> dict[str, Any]:
        """The user's earlier sessions most relevant to a query, best first, each with its
        structured summary and a relevance score in [0, 1]."""
        hits = self._call(
            ctx,
            lambda c: c.memory.recall_relevant(user_id, query, top_k),
            writes=False,
            user_id=user_id,
        )
        return {"user_id": user_id, "query": query, "sessions": [recalled_result(h) for h in hits]}

    def save_session(
        self,
        user_id: UserId,
        session_id: SessionId,
        ctx: Context[Any, Any],
        task_description: Annotated[
            str, Field(description="What the session was about, in one or two sentences.")
        ] = "",
        decisions_made: Items = None,
        work_completed: Items = None,
        open_questions: Items = None,
        next_recommended_steps: Items = None,
        created_at: CreatedAt = None,
    ) -> dict[str, Any]:
        """Store a structured summary of a finished session, so later sessions can recall it.
        Saving the same session id again replaces it."""
        fields: dict[str, Any] = {
            "user_id": user_id,
            "session_id": session_id,
            "task_description": task_description,
            "decisions_made": decisions_made or [],
            "work_completed": work_completed or [],
            "open_questions": open_questions or [],
            "next_recommended_steps": next_recommended_steps or [],
        }
        if created_at is not None:
            fields["created_at"] = created_at
        saved = self._call(
            ctx, lambda c: c.memory.save_session(fields), writes=True, user_id=user_id
        )
        return summary_result(saved)

    def end_session(
        self,
        user_id: UserId,
        session_id: SessionId,
        transcript: Annotated[
            list[dict[str, Any]],
            Field(
                description="The session's messages in order, OpenAI style: "
                '[{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}] '
                "(role: system, user, assistant or tool)."
            ),
        ],
        ctx: Context[Any, Any],
        created_at: CreatedAt = None,
    ) -> dict[str, Any]:
        """End a session: store its transcript, summarize it into a structured summary (and the
        user facts it reveals), and save the summary for recall. Ending the same session id
        again replaces it. If summarizing fails the transcript is kept for a later retry."""
        saved = self._call(
            ctx,
            lambda c: c.memory.end_session(user_id, session_id, transcript, created_at=created_at),
            writes=True,
            user_id=user_id,
        )
        return summary_result(saved)

    # -- user facts ---------------------------------------------------------------------------

    def get_fact(self, user_id: UserId, key: FactKey, ctx: Context[Any, Any]) -> dict[str, Any]:
        """One standing fact or preference of the user, with where it came from."""
        return fact_result(
            self._call(
                ctx, lambda c: c.memory.get_fact(user_id, key), writes=False, user_id=user_id
            )
        )

    def get_facts(self, user_id: UserId, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Every current fact and preference of the user, sorted by key."""
        facts = self._call(
            ctx, lambda c: c.memory.get_facts(user_id), writes=False, user_id=user_id
        )
        return {"user_id": user_id, "facts": [fact_result(f) for f in facts]}

    def set_fact(
        self,
        user_id: UserId,
        key: FactKey,
        value: Annotated[
            JsonValue, Field(description="The value: any JSON (string, number, list, object...).")
        ],
        ctx: Context[Any, Any],
        evidence: Annotated[
            str, Field(description="What the fact is based on, e.g. the user's own words.")
        ] = "",
        confidence: Annotated[float, Field(description="How sure you are, 0 to 1.")] = 1.0,
        source: Annotated[
            str, Field(description="Where the fact comes from (kept as provenance).")
        ] = "mcp",
    ) -> dict[str, Any]:
        """Set a standing fact or preference of the user; the old value goes to its history."""
        fact = self._call(
            ctx,
            lambda c: c.memory.set_fact(
                user_id, key, value, source=source, confidence=confidence, evidence=evidence
            ),
            writes=True,
            user_id=user_id,
        )
        return fact_result(fact)

    def delete_fact(self, user_id: UserId, key: FactKey, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Delete a fact of the user (its history keeps a tombstone). Says whether it existed."""
        deleted = self._call(
            ctx, lambda c: c.memory.delete_fact(user_id, key), writes=True, user_id=user_id
        )
        return {"user_id": user_id, "key": key, "deleted": deleted}

    def fact_history(self, user_id: UserId, key: FactKey, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Every version a fact of the user had, oldest first; a deletion is a version with a
        null value and source 'deleted'."""
        history = self._call(
            ctx, lambda c: c.memory.fact_history(user_id, key), writes=False, user_id=user_id
        )
        return {"user_id": user_id, "key": key, "history": [fact_result(f) for f in history]}

    # -- task runs ----------------------------------------------------------------------------

    def get_run(self, run_id: RunId, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Status and head of a task run (and the approval gate it waits at, if paused)."""
        return run_result(
            self._call(ctx, lambda c: c.memory.get_run(run_id), writes=False, run_id=run_id)
        )

    def list_runs(
        self,
        ctx: Context[Any, Any],
        user_id: Annotated[str | None, Field(description="Only this user's runs.")] = None,
        status: Annotated[RunStatus | None, Field(description="Only runs in this status.")] = None,
    ) -> dict[str, Any]:
        """The tenant's task runs, optionally only one user's and/or one status."""
        runs = self._call(
            ctx,
            lambda c: c.memory.list_runs(user_id=user_filter(c.user_id, user_id), status=status),
            writes=False,
            user_id=user_id,
        )
        return {"runs": [run_result(r) for r in runs]}

    def pending_approvals(
        self,
        ctx: Context[Any, Any],
        user_id: Annotated[str | None, Field(description="Only this user's runs.")] = None,
    ) -> dict[str, Any]:
        """Runs paused at a human-approval gate, oldest request first: the run, the gate's key,
        the plan awaiting a decision (secrets redacted) and its hash (pass it to approve_run /
        reject_run)."""

        def read(c: McpCaller) -> list[dict[str, Any]]:
            runs = c.memory.list_runs(
                user_id=user_filter(c.user_id, user_id), status=RunStatus.PAUSED
            )
            waiting = [(run.pending_approval, run) for run in runs if run.pending_approval]
            # Oldest request first, by the time itself (its text does not sort).
            waiting.sort(key=lambda gate: (gate[0].requested_at, gate[1].run_id))
            gates = []
            for pending, run in waiting:
                record = c.memory.tasks.approval(run.run_id, pending.key)
                gates.append(
                    {
                        "run_id": run.run_id,
                        "user_id": run.user_id,
                        "approval_key": pending.key,
                        "plan_hash": pending.plan_hash,
                        "plan": record.plan if record is not None else None,
                        # Written as get_run writes it (``...Z``), like every time the tools return.
                        "requested_at": pending.model_dump(mode="json")["requested_at"],
                    }
                )
            return gates

        gates = self._call(ctx, read, writes=False, user_id=user_id)
        return {"approvals": gates}

    def approve_run(
        self, run_id: RunId, plan_hash: PlanHash, ctx: Context[Any, Any], note: Note = None
    ) -> dict[str, Any]:
        """Approve the plan a paused run waits on: the run becomes resumable and passes its gate.
        The decision is recorded as made by this MCP client. Only on the user's instruction."""
        decided = self._call(
            ctx,
            lambda c: c.memory.approve_run(run_id, plan_hash, by=self._by(ctx, c), note=note),
            writes=True,
            run_id=run_id,
        )
        return approval_result(run_id, decided)

    def reject_run(
        self, run_id: RunId, plan_hash: PlanHash, ctx: Context[Any, Any], note: Note = None
    ) -> dict[str, Any]:
        """Reject the plan a paused run waits on: its worker sees the rejection at the gate.
        The decision is recorded as made by this MCP client. Only on the user's instruction."""
        decided = self._call(
            ctx,
            lambda c: c.memory.reject_run(run_id, plan_hash, by=self._by(ctx, c), note=note),
            writes=True,
            run_id=run_id,
        )
        return approval_result(run_id, decided)

    def set_budget(
        self,
        run_id: RunId,
        ctx: Context[Any, Any],
        tokens: TokenBudget = None,
        cost: CostBudget = None,
    ) -> dict[str, Any]:
        """Raise (or lower, or lift) the token and/or cost budget of a run: a run that spent its
        budget starts no new step until then. The change is recorded as made by this MCP client.
        Only on the user's instruction."""

        def change(c: McpCaller) -> RunInfo:
            if tokens is None and cost is None:
                # The library's advice ("None: unlimited") is wrong here: null leaves a limit as is.
                raise InvalidInputError(
                    "give the new budget: tokens, cost or both ('unlimited' removes a limit)",
                    field="tokens",
                )
            return c.memory.set_budget(
                run_id, tokens=_limit(tokens), cost=_limit(cost), by=self._by(ctx, c)
            )

        return run_result(self._call(ctx, change, writes=True, run_id=run_id))


def _limit(value: float | str | None) -> Any:
    """A tool's budget argument as ``Memory.set_budget`` takes it (``None``: leave it as it is)."""
    if value is None:
        return UNSET
    return None if value == "unlimited" else value
