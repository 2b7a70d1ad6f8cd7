"""Graph threads: the checkpoint DAGs of graph frameworks (LangGraph), addressed by their own ids.

A *thread* (any string id) holds *namespaces* (any string; ``""`` is the root
graph, others are subgraphs). A namespace holds checkpoints, each with the id
the framework gave it, a parent id (or none), JSON metadata, the version of
every channel it has, and an opaque payload; checkpoints form a DAG (forks
and time travel branch it). Channel values are stored once per
``(channel, version)`` and shared by every checkpoint that has that version,
so a step stores only the channels it changed. *Pending writes* are recorded
against a checkpoint per ``(task, index)``. This is the storage model of
LangGraph's savers, kept framework-neutral: values are bytes the adapter
serialises (``memory.integrations.langgraph`` does LangGraph's part).

Storage (key formats in :mod:`tiers.keys`): everything of a thread is one
space, ``thread_space(tenant, thread_key)``, so deleting a thread is one
``DeleteSpace`` and a Redis Cluster keeps a thread on one slot:

- ``h:<ns>`` -> id of the namespace's newest checkpoint, the *head*: a put
  names the head it built on and is refused (:class:`~tiers.errors.ConflictError`)
  if another writer moved it meanwhile. This is the thread's fencing: two
  writers that read the same head cannot both append after it.
- ``c:<ns>:<checkpoint id>`` -> the checkpoint record; ids of one namespace
  sort as the framework's ids do (LangGraph's are time-ordered UUIDs), so the
  newest is one reverse scan and paging newest-first costs the page, not the thread.
- ``b:<ns>:<channel>:<version>`` -> a channel value (a :class:`Blob`); a blob
  may depend on older versions of its channel (the adapter stores a list that
  grew by appending as the new tail only), which it names in ``deps``.
- ``w:<ns>:<checkpoint id>:<task>:<idx>`` -> one pending write.
- ``r:<run>:<ns>:<checkpoint id>`` marks checkpoints written by a framework run
  (with ``thread_runs_space``, the tenant-wide run -> threads index) so
  :meth:`ThreadTier.delete_runs` finds them without reading every thread.
- ``e:<key>`` -> an effect ledger entry of a node (:meth:`ThreadTier.begin_effect`).
- ``x:<key>#<n>`` -> chunk ``n`` of a value over the store's per-value limit:
  values of any size are stored transparently as a manifest plus chunks.

Every value is a frame: a tag byte (0 = frame, 1 = manifest), a 4-byte header
length, a JSON header and the payload bytes, so the payload is never
re-encoded (no base64, no JSON escaping of serialised bytes).

**Threads.** :class:`ThreadTier` is stateless beyond its store: share it.
"""

from __future__ import annotations

from tiers.threads._format import (
    Blob,
    EffectEntry,
    NewCheckpoint,
    StoredCheckpoint,
    StoredWrite,
    thread_key,
    unframe,
)
from tiers.threads._tier import ThreadTier

__all__ = [
    "Blob",
    "EffectEntry",
    "NewCheckpoint",
    "StoredCheckpoint",
    "StoredWrite",
    "ThreadTier",
    "thread_key",
]

# The frame decoder, under the name the LangGraph tests read stored values with.
_unframe = unframe
