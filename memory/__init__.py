"""tiermem: three-tier memory for LLM agents.

What an app imports::

    from memory import Memory, SessionSummary

    with Memory.open(".tiermem") as memory:
        memory.set_fact("alice", "language", "fr")
        print(memory.build_continuation_context("alice", "where were we?"))
"""

from memory.context import ContextSection, ContinuationContext
from memory.errors import (
    InvalidScopeInputError,
    InvalidScopeSnapshotError,
    PromptBudgetTooSmallError,
    ReadOnlyScopeError,
    ScopeError,
    TokenBudgetExceededError,
)
from memory.facade import AsyncMemory, Memory
from memory.scope import (
    PromptContext,
    ScopeManager,
    SystemContext,
    Trace,
    TraceEntry,
    WorkingMemory,
)
from memory.settings import Settings
from summarizer import (
    ExtractiveSummarizer,
    InvalidTranscriptError,
    LiteLLMSummarizer,
    Summarization,
    Summarizer,
    SummarizerError,
    SummarizerUnavailableError,
    SummaryGenerationError,
)
from tiers.errors import (
    ApprovalPendingError,
    BackendUnavailableError,
    BudgetExceededError,
    CheckpointNotFoundError,
    CompensationError,
    ConflictError,
    CorruptRecordError,
    EffectOutcomeUnknownError,
    EmbedderError,
    FactNotFoundError,
    InputMismatchError,
    InvalidInputError,
    LeaseHeldError,
    NotFoundError,
    PlanMismatchError,
    RunCancelledError,
    RunNotFoundError,
    RunPausedError,
    RunStateError,
    SessionNotFoundError,
    StaleWriterError,
    TierError,
    ValueTooLargeError,
)
from tiers.ids import run_id_for
from tiers.index_check import IndexRepair, IndexReport
from tiers.models import (
    Checkpoint,
    FactCandidate,
    Message,
    RunInfo,
    RunStatus,
    SessionSummary,
    SummaryUsage,
    UserFact,
)
from tiers.redaction import Redactor
from tiers.retention import RetentionPolicy, SweepReport
from tiers.session import RecalledSession
from tiers.task import NOT_DONE, Approval, Charged, RunHandle

__all__ = [
    "NOT_DONE",
    "Approval",
    "ApprovalPendingError",
    "AsyncMemory",
    "BackendUnavailableError",
    "BudgetExceededError",
    "Charged",
    "Checkpoint",
    "CheckpointNotFoundError",
    "CompensationError",
    "ConflictError",
    "ContextSection",
    "ContinuationContext",
    "CorruptRecordError",
    "EffectOutcomeUnknownError",
    "EmbedderError",
    "ExtractiveSummarizer",
    "FactCandidate",
    "FactNotFoundError",
    "IndexRepair",
    "IndexReport",
    "InputMismatchError",
    "InvalidInputError",
    "InvalidScopeInputError",
    "InvalidScopeSnapshotError",
    "InvalidTranscriptError",
    "LeaseHeldError",
    "LiteLLMSummarizer",
    "Memory",
    "Message",
    "NotFoundError",
    "PlanMismatchError",
    "PromptBudgetTooSmallError",
    "PromptContext",
    "ReadOnlyScopeError",
    "RecalledSession",
    "Redactor",
    "RetentionPolicy",
    "RunCancelledError",
    "RunHandle",
    "RunInfo",
    "RunNotFoundError",
    "RunPausedError",
    "RunStateError",
    "RunStatus",
    "ScopeError",
    "ScopeManager",
    "SessionNotFoundError",
    "SessionSummary",
    "Settings",
    "StaleWriterError",
    "Summarization",
    "Summarizer",
    "SummarizerError",
    "SummarizerUnavailableError",
    "SummaryGenerationError",
    "SummaryUsage",
    "SweepReport",
    "SystemContext",
    "TierError",
    "TokenBudgetExceededError",
    "Trace",
    "TraceEntry",
    "UserFact",
    "ValueTooLargeError",
    "WorkingMemory",
    "run_id_for",
]
