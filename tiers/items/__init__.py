"""Namespaced items: JSON documents under string-tuple namespaces, with TTL and vector search.

What LangGraph's ``BaseStore`` holds (the adapter lives in
``memory.integrations.langgraph_store``), in plain terms: an item is a JSON
object stored under ``(namespace, key)``, where a namespace is a tuple of
arbitrary strings such as ``("memories", "alice")``.

Storage (every format in :mod:`tiers.keys`):

- ``items_space``: one record per item at ``<namespace code>#<key>``. The
  namespace code percent-encodes each label and ends each with ``/``, so two
  namespaces never share a code, the code of a namespace is a string prefix of
  exactly its descendants' codes (a prefix search is one ordered scan), and
  nothing a caller puts in a label or key can reach another tenant's space.
- ``item_vectors_space``: the item's embeddings, authoritative. The vector
  index is derived from them, so it can always be repaired or rebuilt without
  the embedder that made them (which may be the caller's own).
- ``item_outbox_space``: items whose vectors the index may not reflect yet,
  with an upper bound of how many it may hold. Set in the commit that changes
  an item, cleared (compare-and-set) once the index matches, replayed by
  :meth:`ItemStore.repair` and before each vector search: whatever crashes
  where, no vector of a deleted item lingers and no item stays unsearchable.
- ``item_namespaces_space``: the namespaces that hold items, each with a token
  every write replaces, so a namespace emptied by a delete is dropped from the
  index only if nothing was written to it meanwhile.
- ``item_expiry_space``: items with a TTL by expiry time, for :meth:`ItemStore.sweep`.
- ``user_item_namespaces_space``: namespaces holding items owned by a user
  (``user_id`` on write), so forgetting the user deletes them and the user's
  continuation context sees them (:meth:`ItemStore.user_facts`).

Expired items are treated as absent by every read, before a sweep deletes
them. Search results are always read from the KV store, never from the index:
a stale vector can cost ranking quality, never return a deleted item or an
old value.
"""

from __future__ import annotations

from tiers.items._outbox import outbox_bound, outbox_entry
from tiers.items._records import (
    ITEM_FACT_SOURCE,
    ItemRecord,
    ItemWrite,
    Namespace,
    NamespacePattern,
    StoredItem,
)
from tiers.items._rules import check_value, matches_filter
from tiers.items._store import ItemStore

__all__ = [
    "ITEM_FACT_SOURCE",
    "ItemRecord",
    "ItemStore",
    "ItemWrite",
    "Namespace",
    "NamespacePattern",
    "StoredItem",
    "check_value",
    "matches_filter",
    "outbox_bound",
    "outbox_entry",
]
