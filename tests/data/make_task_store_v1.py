"""Write ``task_store_v1.json``: a store as the release before task layout versions wrote it.

Run with the *previous* release's code on the path (this was run at commit
ce5f218, before ``tiers/task/_format.py`` existed)::

    git archive ce5f218 | tar -x -C /tmp/v1
    PYTHONPATH=/tmp/v1 python tests/data/make_task_store_v1.py tests/data/task_store_v1.json

The file lists every stored row as ``[space, key, value]`` (the value's exact
bytes as UTF-8 text), so tests/tiers/test_task_migration.py loads the same
bytes into any backend. The clock is fixed at :data:`T0`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.task import Charged, TaskTier

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def main(out: Path) -> None:
    """Run the scenario on a fresh SQLite store and dump its rows to ``out``."""
    ticks = iter(range(1_000_000))

    def clock() -> datetime:
        return T0 + timedelta(milliseconds=next(ticks))

    with tempfile.TemporaryDirectory() as tmp:
        kv = SqliteKVStore(Path(tmp) / "v1.db")
        tasks = TaskTier(kv, clock=clock, snapshot_every=4)
        done = tasks.start_run("alice", "r-done", worker_id="w-old")
        done.step("plan", lambda: Charged({"plan": [1, 2]}, tokens=10, state={"goal": "x"}))
        done.step("act", lambda: "acted", input={"n": 1})
        done.complete({"ok": True})
        tasks.compact("r-done")

        mid = tasks.start_run("alice", "r-mid", worker_id="w-old", lease_ttl=60)
        mid.step("plan", lambda: Charged("p", tokens=5, state={"k": 1}))
        mid.effect("pay", lambda: {"paid": 5}, input={"amount": 5})
        mid.step("draft", lambda: Charged("d", state={"k": 2, "draft": "v1"}))
        mid.step("review", lambda: "r", scope={"phase": "review"})
        mid.step("polish", lambda: "pol")
        mid.release()

        tasks.fork("r-mid", tasks.history("r-mid")[1].checkpoint_id, "r-fork")

        edited = tasks.start_run("bob", "r-edited", worker_id="w-old")
        for name in ("a", "b", "c"):
            edited.step(name, lambda name=name: Charged(name, state={name: True}))
        first = tasks.history("r-edited")[0].checkpoint_id
        edited.release()
        tasks.update_state("r-edited", first, {"edited": 1}, by="ops")

        # A worker of the old release still holds this lease (no TTL: it never expires).
        leased = tasks.start_run("bob", "r-leased", worker_id="w-live")
        leased.step("one", lambda: 1)

        other = TaskTier(kv, tenant="acme", clock=clock)
        idle = other.start_run("carol", "r-acme", worker_id="w-old")
        idle.step("only", lambda: "o")
        idle.release()

        rows = [
            [space, key, value.decode()] for space in kv.spaces() for key, value in kv.scan(space)
        ]
        kv.close()
    lines = ",\n".join(json.dumps(row, ensure_ascii=False) for row in rows)
    out.write_text(f"[\n{lines}\n]\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
