"""What the MCP tools answer: typed errors as tool-error text, and records as JSON objects.

No I/O and nothing of the MCP SDK: :mod:`memory.integrations.mcp` registers the tools and
calls these on what the facade returns.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from memory.errors import ScopeError
from summarizer.errors import SummarizerError, SummaryGenerationError
from tiers.errors import BackendUnavailableError, CorruptRecordError, TierError
from tiers.models import RunInfo, SessionSummary, UserFact
from tiers.session import RecalledSession
from tiers.task import Approval

# The MCP server's log, where a server-side fault's detail goes instead of the tool error.
logger = logging.getLogger("tiermem.mcp")


def describe_error(exc: TierError | SummarizerError | ScopeError) -> str:
    """The text of a tool error: the error's kind, the field at fault, the message."""
    kind = type(exc).__name__
    if isinstance(exc, CorruptRecordError) or type(exc) in (TierError, SummarizerError):
        # Server-side faults: their detail is for the operator's log, not the caller.
        logger.error("tool failed: %s: %s", kind, exc)
        return f"{kind}: the server failed; its log has the detail"
    if isinstance(exc, BackendUnavailableError | SummaryGenerationError):
        # A store's, embedder's or model's failure names its host, port or file: log it.
        logger.error("tool failed: %s: %s", kind, exc)
        return (
            f"{kind}: a backend of the server is unavailable or failed; retry later (its log "
            "has the detail)"
        )
    field = getattr(exc, "field", None)
    where = f" (field {field!r})" if isinstance(field, str) and field else ""
    return f"{kind}{where}: {exc}"


def package_version() -> str:
    try:
        return version("tiermem")
    except PackageNotFoundError:
        return "0.0.0"


def fact_result(fact: UserFact) -> dict[str, Any]:
    return fact.model_dump(mode="json", exclude={"schema_version"})


def summary_result(summary: SessionSummary) -> dict[str, Any]:
    return summary.model_dump(mode="json", exclude={"schema_version"})


def recalled_result(hit: RecalledSession) -> dict[str, Any]:
    return {
        "score": hit.score,
        "similarity": hit.similarity,
        "keyword": hit.keyword,
        "summary": summary_result(hit.summary),
    }


# What a caller needs of a run's head; the rest (lease epochs, snapshot and event
# bookkeeping) is for workers.
_RUN_FIELDS = {
    "run_id",
    "user_id",
    "status",
    "head_seq",
    "head_checkpoint_id",
    "error",
    "result",
    "created_at",
    "updated_at",
    "finished_at",
    "pending_approval",
    "parent_run_id",
    "parent_checkpoint_id",
    "budget_tokens",
    "budget_cost",
    "spent_tokens",
    "spent_cost",
    "unknown_effects",
}


def run_result(info: RunInfo) -> dict[str, Any]:
    return info.model_dump(mode="json", include=_RUN_FIELDS)


def approval_result(run_id: str, approval: Approval) -> dict[str, Any]:
    return {"run_id": run_id, **approval.model_dump(mode="json", exclude={"schema_version"})}
