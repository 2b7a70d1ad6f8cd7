"""Worker process of the task tier's crash test (run as a script; the test SIGKILLs it).

Usage::

    python crash_worker.py STORE RUN_ID EFFECT_LOG

``STORE`` is a SQLite file path or a ``redis://`` URL. The worker starts or
resumes run ``RUN_ID`` of 6 steps. Each step's side effect, appending the line
``s<i>`` to ``EFFECT_LOG``, happens only inside the step's function, between two
short sleeps that widen the windows a kill can land in (before the effect, and
between the effect and its checkpoint's commit).

Prints ``ready`` once it holds the run's lease, and ``done <JSON outputs>`` when
the run is complete (also when it was already complete).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

from tiers.backends.base import KVStore
from tiers.errors import RunStateError
from tiers.task import TaskTier

STEPS = 6
USER = "crash-user"


def open_store(spec: str) -> KVStore:
    """The store named on the command line."""
    if spec.startswith("redis://"):
        from tiers.backends.redis_kv import RedisKVStore

        return RedisKVStore(spec, max_value_bytes=64 * 1024)
    from tiers.backends.sqlite_kv import SqliteKVStore

    return SqliteKVStore(spec, max_value_bytes=64 * 1024)


def effect(log_path: str, i: int) -> dict[str, int]:
    """Step ``i``'s side effect and output."""
    time.sleep(0.004)
    # One O_APPEND write: a kill cannot leave half a line.
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"s{i}\n".encode())
    finally:
        os.close(fd)
    time.sleep(0.008)
    return {"step": i, "value": i * i + 7}


def main(argv: list[str]) -> int:
    """Run or resume the run to completion."""
    spec, run_id, log_path = argv[1:4]
    kv = open_store(spec)
    tier = TaskTier(kv)
    try:
        handle = tier.start_run(USER, run_id)
    except RunStateError:
        outputs = [c.output for c in tier.history(run_id)]
        print("done", json.dumps(outputs), flush=True)
        return 0
    print("ready", flush=True)
    outputs = [
        handle.step(f"s{i}", functools.partial(effect, log_path, i), input={"i": i})
        for i in range(STEPS)
    ]
    handle.complete(result=outputs)
    print("done", json.dumps(outputs), flush=True)
    kv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
