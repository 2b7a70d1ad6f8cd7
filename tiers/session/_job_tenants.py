"""The tenants with summary jobs to run: one shared list every replica's workers take in turn.

``_system:job-tenants`` maps each tenant that may have unfinished jobs to a
token. It lives in a placement of its own (on Redis Cluster, another hash slot
than any tenant's jobs), so no commit can both queue a job and list its
tenant. What keeps a queued job from being left unlisted is the order of the
steps on both sides:

- a submission makes sure the tenant is listed before it commits its job
  (:func:`ensure_listed`: a read, and a write only when the tenant is not
  listed) and again after (so a crash between the steps leaves at worst a
  listed tenant with no job, which the next worker retires);
- a retirement (:func:`retire_tenant`) deletes the entry only while the
  tenant's queue is empty and the token is the one the worker read, then looks
  at the queue once more and lists the tenant again if a job came meanwhile.

Whatever the interleaving, a job committed before a retirement's second look
is seen by it, and one committed after that look is committed after the
delete, so its submitter's second :func:`ensure_listed` finds the tenant
unlisted and lists it.
"""

from __future__ import annotations

import secrets

from tiers import keys
from tiers.backends.base import Check, Delete, KVStore, Put
from tiers.errors import ConflictError

__all__ = ["ensure_listed", "job_tenants", "retire_tenant", "unfinished_jobs"]


def job_tenants(kv: KVStore) -> list[tuple[str, bytes]]:
    """Tenants that may have unfinished jobs, with their current tokens, sorted."""
    return kv.scan(keys.job_tenants_space())


def ensure_listed(kv: KVStore, tenant: str) -> None:
    """List ``tenant`` in :func:`job_tenants` unless it is listed already (one read, usually)."""
    (token,) = kv.get_many(keys.job_tenants_space(), [tenant])
    if token is None:
        _list(kv, tenant)


def _list(kv: KVStore, tenant: str) -> None:
    kv.commit([Put(keys.job_tenants_space(), tenant, secrets.token_hex(8).encode())])


def retire_tenant(kv: KVStore, tenant: str, token: bytes) -> bool:
    """Drop ``tenant`` from :func:`job_tenants` if its queue is empty and its entry still holds ``token``.

    A job queued meanwhile (seen in the queue after the delete) lists the tenant again.

    Returns:
        Whether it was dropped (and stays so).
    """
    queue = keys.job_queue_space(tenant)
    if kv.scan(queue, limit=1):
        return False
    try:
        kv.commit(
            [Delete(keys.job_tenants_space(), tenant)],
            [Check(keys.job_tenants_space(), tenant, token)],
        )
    except ConflictError:
        return False  # listed again meanwhile
    if kv.scan(queue, limit=1):
        # A job committed between the first look and the delete: its submitter may have
        # found the tenant still listed, so this retirement must undo itself.
        _list(kv, tenant)
        return False
    return True


def unfinished_jobs(kv: KVStore) -> int:
    """Unfinished jobs of every tenant (for a gauge)."""
    return sum(len(kv.scan(keys.job_queue_space(t))) for t, _ in job_tenants(kv))
