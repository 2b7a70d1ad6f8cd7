"""The session tier: structured summaries and transcripts of finished sessions, and recall.

The public face of the package; the modules beside it are private. Where to look:

- ``_tier.py``: :class:`SessionTier`, whose docstrings hold every contract of the tier;
  it composes the parts below around one store core;
- ``_store.py``: that core (KV store, index, embedder, outbox entries, revisions, views);
- ``_writes.py``: save, replace and delete summaries and transcripts (the commits);
- ``_reads.py``: stored summaries and transcripts, listing, and recall's read path;
- ``_recall.py``: how recall ranks: dense similarity per session, BM25, recency priors,
  dates named in the query, fusion weights and tie-breaks, all in one file;
- ``_temporal.py``: the times a query names ("last March", "two weeks ago") as windows;
- ``_retention.py``: sessions and transcripts expiring after a cutoff;
- ``_reindex.py``: rebuilding the vector index from the KV store;
- ``_index.py``: the vector index kept in line with the KV store (outboxes, fingerprints,
  repair, the background worker's two passes);
- ``_plans.py``: what the index should hold for a session, read from the KV store; the embed cache;
- ``_view.py``: the per-user cache of what recall and listing read;
- ``_keyword.py``: the tokenizer keyword search matches on;
- ``_chunking.py``, ``_transcripts.py``: transcript windows and stored transcripts;
- ``_jobs.py``: durable summary jobs (submitting, claiming, erasure); ``_job_records.py``:
  the job record and a worker's claim; ``_job_tenants.py``: the shared list of tenants with jobs.
"""

from tiers.models import SessionSummary
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
)
from tiers.session._job_records import Claim, JobState, SummaryJob
from tiers.session._job_tenants import job_tenants, retire_tenant, unfinished_jobs
from tiers.session._jobs import SummaryJobs
from tiers.session._keyword import tokenize
from tiers.session._plans import users_of
from tiers.session._reads import MAX_TOP_K, RecalledSession, check_top_k
from tiers.session._recall import BM25Index, FusionWeights, fuse
from tiers.session._reindex import ReindexProgress
from tiers.session._tier import SessionTier
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
