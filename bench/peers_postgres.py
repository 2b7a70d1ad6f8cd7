"""tiermem on PostgreSQL in the peers harness (/work/shared/peers/bench.py), beside PostgresSaver.

The harness is read-only here, so this script adds one system to it and then runs the
harness's own ``main``: ``tiermem_postgres`` is the harness's ``TierMem`` adapter (tiermem's
public facade, one durable checkpoint per ``run.step``) with ``TIERMEM_KV_URL`` pointing at the
harness's PostgreSQL server (``PG_URL``). Every other system name goes to the harness
unchanged, so ``lg_saver_postgres`` (LangGraph's PostgresSaver) runs on the same server with the
same workload. The patch is applied at import, so the harness's spawned 2-process phase (which
re-imports this file as ``__mp_main__``) sees it too.

Run (the harness starts and stops PostgreSQL by pid; LangGraph's saver needs
``langgraph-checkpoint-postgres`` and ``psycopg-pool`` importable)::

    PEERS=/work/shared/peers PERF=/tmp/perf PG_PORT=5433
    source $PEERS/servers.sh && start_postgres
    export PG_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
    for s in lg_saver_postgres tiermem_postgres; do
      python bench/peers_postgres.py --system $s --size 5000 --runs 10 --steps 100 --out /tmp/$s.json
    done
    stop_servers
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

PEERS = os.environ.get("PEERS", "/work/shared/peers")
sys.path.insert(0, PEERS)

# The harness's bench.py, found through PEERS: an untyped script outside this repo (and, by
# name, not this repo's bench/ folder, which is what a plain ``import bench`` means to mypy).
bench: Any = importlib.import_module("bench")

# Separate tables, so the harness's reset of PostgresSaver's tables and ours never meet.
TABLE_NOTE = "tiermem_kv (space bytea, key bytea, value bytea, primary key (space, key))"


class TierMemPostgres(bench.TierMem):  # type: ignore[misc]  # the harness's class is untyped
    """The harness's tiermem adapter with its KV store on the harness's PostgreSQL server."""

    def __init__(self, a: Any, ns: str) -> None:
        super().__init__(a, ns, "postgres")
        import psycopg

        self.admin = psycopg.connect(bench.PG_URL, autocommit=True)

    def _open(self) -> None:
        from memory import Memory

        data_dir = self.dir
        if self.ns.startswith("c"):  # 2-process phase: one Chroma folder per process
            data_dir = os.path.join(self.dir, f"proc-{os.getpid()}")
        self.m = Memory.open(data_dir, kv_url=bench.PG_URL)

    def reset(self) -> None:
        self.close()
        self.handles: dict[str, Any] = {}
        bench.shutil.rmtree(self.dir, ignore_errors=True)
        self.admin.execute("DROP TABLE IF EXISTS tiermem_kv, tiermem_kv_migrations")
        self.admin.execute("DROP FUNCTION IF EXISTS tiermem_kv_commit")
        self.admin.execute("CHECKPOINT")
        self._open()

    @property
    def durability(self) -> str:
        s = bench.pg_settings(self.admin)
        return (
            f"tiermem PostgresKVStore ({TABLE_NOTE}; a commit is one call of a plpgsql function: "
            "advisory locks per key, checks, writes; one round trip, one transaction), "
            f"PostgreSQL {s.get('server_version')} fsync={s.get('fsync')}, "
            f"synchronous_commit={s.get('synchronous_commit')}, "
            f"wal_sync_method={s.get('wal_sync_method')}"
        )

    def storage(self) -> tuple[int, str]:
        self.admin.execute("CHECKPOINT")
        row = self.admin.execute(
            "SELECT pg_total_relation_size('tiermem_kv'), count(*), sum(length(value)) "
            "FROM tiermem_kv"
        ).fetchone()
        assert row is not None
        self.extra_storage = {"kv_rows": row[1], "value_bytes": int(row[2] or 0)}
        return int(row[0]), "pg_total_relation_size(tiermem_kv) incl. TOAST+indexes"

    def versions(self) -> dict[str, Any]:
        v: dict[str, Any] = bench.ver("tiermem", "pydantic", "psycopg", "psycopg-binary")
        v["postgresql"] = bench.pg_settings(self.admin).get("server_version")
        return v

    def close(self) -> None:
        super().close()


_harness_make_adapter = bench.make_adapter


def make_adapter(system: str, a: Any, ns: str) -> Any:
    """The harness's registry plus ``tiermem_postgres``."""
    if system == "tiermem_postgres":
        return TierMemPostgres(a, ns)
    return _harness_make_adapter(system, a, ns)


bench.make_adapter = make_adapter

if __name__ == "__main__":
    bench.main()
