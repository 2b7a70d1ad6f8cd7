"""Request and response bodies of the HTTP API, kept apart from the domain models.

The domain records (``tiers.models``) are storage formats; these are the wire
contract, so either can change without silently changing the other.
"""

from api.schemas.context import ContextOut, ContextRequest, ContextSectionOut
from api.schemas.facts import FactList, FactOut, FactPut, FactsPut
from api.schemas.health import Health, Readiness
from api.schemas.problems import FieldError, Problem
from api.schemas.runs import (
    ApprovalDecision,
    ApprovalOut,
    CheckpointCreate,
    CheckpointList,
    CheckpointOut,
    PendingApprovalOut,
    RunComplete,
    RunCreate,
    RunFail,
    RunFork,
    RunLease,
    RunList,
    RunOut,
)
from api.schemas.sessions import (
    JobOut,
    JobStatus,
    MessageIn,
    RecalledOut,
    RecallRequest,
    RecallResponse,
    SessionCreate,
    SessionList,
    SessionOut,
    SummaryIn,
)

__all__ = [
    "ApprovalDecision",
    "ApprovalOut",
    "CheckpointCreate",
    "CheckpointList",
    "CheckpointOut",
    "ContextOut",
    "ContextRequest",
    "ContextSectionOut",
    "FactList",
    "FactOut",
    "FactPut",
    "FactsPut",
    "FieldError",
    "Health",
    "JobOut",
    "JobStatus",
    "MessageIn",
    "PendingApprovalOut",
    "Problem",
    "Readiness",
    "RecallRequest",
    "RecallResponse",
    "RecalledOut",
    "RunComplete",
    "RunCreate",
    "RunFail",
    "RunFork",
    "RunLease",
    "RunList",
    "RunOut",
    "SessionCreate",
    "SessionList",
    "SessionOut",
    "SummaryIn",
]
