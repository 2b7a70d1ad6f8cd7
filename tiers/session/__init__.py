"""The session tier: structured summaries and transcripts of finished sessions, and recall.

The public face of the package; the modules beside it are private. Where to look:

- ``_tier.py``: :class:`SessionTier` (save, end, delete, recall, reindex);
- ``_recall.py``: how recall ranks (dense, BM25 and recency fused);
- ``_index.py``: the vector index kept in line with the KV store (outbox, fingerprints);
- ``_view.py``, ``_keyword.py``: the per-user view and its BM25 index;
- ``_chunking.py``, ``_transcripts.py``: transcript windows and stored transcripts;
- ``_jobs.py``: durable summary jobs.
"""

from tiers.session._chunking import (
    keyword_text,
    session_windows,
    summary_text,
    transcript_text,
    windows,
)
from tiers.session._index import (
    FINGERPRINT_KEY,
    Ref,
    session_fingerprint,
    users_of,
)
from tiers.session._jobs import (
    Claim,
    JobState,
    SummaryJob,
    SummaryJobs,
    job_tenants,
    retire_tenant,
    unfinished_jobs,
)
from tiers.session._keyword import (
    BM25Index,
    tokenize,
)
from tiers.session._recall import (
    FusionWeights,
    fuse,
)
from tiers.session._tier import (
    MAX_TOP_K,
    RecalledSession,
    ReindexProgress,
    SessionSummary,
    SessionTier,
    check_top_k,
)
from tiers.session._transcripts import (
    decode_header,
    decode_transcript,
    header_key,
    page_key,
    parse_messages,
    transcript_writes,
)
from tiers.session._view import (
    UserView,
    ViewCache,
)

__all__ = [
    "FINGERPRINT_KEY",
    "MAX_TOP_K",
    "BM25Index",
    "Claim",
    "FusionWeights",
    "JobState",
    "RecalledSession",
    "Ref",
    "ReindexProgress",
    "SessionSummary",
    "SessionTier",
    "SummaryJob",
    "SummaryJobs",
    "UserView",
    "ViewCache",
    "check_top_k",
    "decode_header",
    "decode_transcript",
    "fuse",
    "header_key",
    "job_tenants",
    "keyword_text",
    "page_key",
    "parse_messages",
    "retire_tenant",
    "session_fingerprint",
    "session_windows",
    "summary_text",
    "tokenize",
    "transcript_text",
    "transcript_writes",
    "unfinished_jobs",
    "users_of",
    "windows",
]
