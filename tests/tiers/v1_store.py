"""A store written by the release before task layout versions, loaded into any backend.

``tests/data/task_store_v1.json`` holds every row that release's code wrote
(made by ``tests/data/make_task_store_v1.py`` at commit ce5f218), byte for byte.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from tiers import keys
from tiers.backends.base import KVStore, Put

V1_STORE = Path(__file__).resolve().parent.parent / "data" / "task_store_v1.json"
V1_WRITTEN_AT = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
"""The fixed clock the rows were written at (the leases of the file count from it)."""


def v1_rows() -> list[tuple[str, str, bytes]]:
    """Every stored row of the v1 store: space, key, value bytes."""
    rows = json.loads(V1_STORE.read_text())
    return [(space, key, value.encode()) for space, key, value in rows]


def load_v1_store(kv: KVStore) -> None:
    """Write the v1 store's rows into ``kv`` (an empty store), exactly as they were stored."""
    by_placement: dict[str, list[Put]] = {}
    for space, key, value in v1_rows():
        by_placement.setdefault(keys.placement(space), []).append(Put(space, key, value))
    # One placement per commit, as a store that shards (Redis Cluster) requires.
    for puts in by_placement.values():
        for start in range(0, len(puts), 32):
            kv.commit(puts[start : start + 32])


def dump(kv: KVStore, spaces: set[str]) -> dict[str, list[tuple[str, bytes]]]:
    """Every row of ``spaces``, for comparing a store before and after."""
    return {space: kv.scan(space) for space in sorted(spaces)}
