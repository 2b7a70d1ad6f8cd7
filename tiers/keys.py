"""Every storage space and key format of the tiers, in one place.

A space groups what is read in order or written together. Each starts with the
tenant, so one tenant's data can never be addressed by another's ids (ids are
validated by :mod:`tiers.ids` and cannot contain ``:``).
"""

from __future__ import annotations

SEQ_WIDTH = 12


def runs_space(tenant: str) -> str:
    """Index of a tenant's runs: key run_id -> RunInfo."""
    return f"{tenant}:runs"


def run_space(tenant: str, run_id: str) -> str:
    """Everything of one run: its checkpoints and idempotency index."""
    return f"{tenant}:run:{run_id}"


def checkpoint_key(seq: int) -> str:
    """Zero-padded so key order is sequence order."""
    return f"ckpt:{seq:0{SEQ_WIDTH}d}"


CHECKPOINT_PREFIX = "ckpt:"


def idempotency_key(key: str) -> str:
    """Maps an idempotency key to the checkpoint that committed it."""
    return f"idem:{key}"


IDEMPOTENCY_PREFIX = "idem:"


def event_key(seq: int) -> str:
    """One event of a run's append-only log; zero-padded so key order is seq order."""
    return f"ev:{seq:0{SEQ_WIDTH}d}"


EVENT_PREFIX = "ev:"


def effect_key(key: str) -> str:
    """The ledger entry of one external effect, by its idempotency key."""
    return f"eff:{key}"


EFFECT_PREFIX = "eff:"


def snapshot_key(seq: int) -> str:
    """The run's state as of checkpoint ``seq`` (written every K events and at branch roots)."""
    return f"snap:{seq:0{SEQ_WIDTH}d}"


SNAPSHOT_PREFIX = "snap:"


def approval_key(key: str) -> str:
    """One approval gate of a run, by its key."""
    return f"appr:{key}"


APPROVAL_PREFIX = "appr:"


def sessions_space(tenant: str, user_id: str) -> str:
    """One user's session summaries: key session_id -> SessionSummary."""
    return f"{tenant}:user:{user_id}:sessions"


def facts_space(tenant: str, user_id: str) -> str:
    """One user's current facts: key fact key -> UserFact."""
    return f"{tenant}:user:{user_id}:facts"


def fact_history_space(tenant: str, user_id: str) -> str:
    """Every earlier version of a user's facts: key ``<fact key>/<epoch micros>``."""
    return f"{tenant}:user:{user_id}:fact-history"


def users_space(tenant: str) -> str:
    """Index of a tenant's users that have anything stored: key user_id -> b"1"."""
    return f"{tenant}:users"


def session_outbox_space(tenant: str) -> str:
    """Session index work not yet confirmed done: key :func:`session_outbox_key` -> a write token."""
    return f"{tenant}:session-outbox"


def session_outbox_key(user_id: str, session_id: str) -> str:
    """Outbox key of one session (ids cannot contain ``/``, so this is unambiguous)."""
    return f"{user_id}/{session_id}"


def session_vector_id(tenant: str, user_id: str, session_id: str) -> str:
    """Id of a session's document in the vector index: deterministic, so re-saves replace it."""
    return f"{tenant}/{user_id}/{session_id}"


def api_keys_space() -> str:
    """API keys of every tenant: key key_id -> the key's record (a SHA-256 of the secret, never the secret).

    Not under a tenant: a key is looked up before its tenant is known. Tenants are
    ids, which start with a letter or digit, so ``_system`` can never be a tenant's space.
    """
    return "_system:api-keys"


def transcripts_space(tenant: str, user_id: str) -> str:
    """One user's raw session transcripts: a header per session id plus ``<session_id>/<page>``."""
    return f"{tenant}:user:{user_id}:transcripts"


def session_vectors_space(tenant: str, user_id: str) -> str:
    """How many window vectors each session of a user may have in the index (an upper bound).

    Key session_id -> the count as ASCII digits; vector ids are
    :func:`session_vector_id` and :func:`session_chunk_vector_id` 1..count.
    """
    return f"{tenant}:user:{user_id}:session-vectors"


def session_revisions_space(tenant: str) -> str:
    """A token per user, replaced in the same commit as any change of the user's sessions.

    Lets a process tell whether what it cached about a user's sessions is still current.
    """
    return f"{tenant}:session-revisions"


def session_chunk_vector_id(tenant: str, user_id: str, session_id: str, n: int) -> str:
    """Id of the ``n``-th extra window vector of a session (``n`` >= 1)."""
    return f"{session_vector_id(tenant, user_id, session_id)}#{n}"
