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
