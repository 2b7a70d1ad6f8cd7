"""Worker of the task tier's crash and race tests (run as a script; the tests SIGKILL it).

Usage::

    python crash_worker.py run STORE RUN_ID EFFECT_LOG      # run or resume, print "done <JSON>"
    python crash_worker.py serve                            # fork server, see below
    python crash_worker.py race STORE RUN_ID EFFECT_LOG NAME GO_FILE RELEASE_FILE TTL

``STORE`` is a SQLite file path or a ``redis://`` URL. :func:`script` is the
run: six units mixing plain steps, top-level effects and effects inside
steps. Every effect appends its idempotency key as one line to ``EFFECT_LOG``
(one ``O_APPEND`` write, so a kill never leaves half a line), between short
sleeps that widen the windows a kill can land in: before the effect, and
between the effect and the commit of its result. :func:`probe` is the
reconcile callback: it looks the key up in the log, as a real one would ask
the external system.

``serve`` is a fork server: it imports everything once, then for each line
``run STORE RUN_ID LOG`` on stdin forks a child that runs the script and
answers ``pid <pid>``; for ``wait <pid>`` it reaps the child and answers
``exit <status>`` (negative: killed by that signal). Forking a warm,
single-threaded process takes about a millisecond, so hundreds of kill
trials fit in seconds.

``freeze STORE RUN_ID LOG TTL POINT`` forks a worker that takes the run with
a TTL lease and runs the script against a *deduplicating* external system
(:func:`external` with ``dedupe``: an effect whose key is in the log is not
executed again, as the task tier requires of systems a zombie may call), and
stops itself with SIGSTOP at ``POINT``: ``unit:N`` (after N units),
``before:NAME`` / ``after:NAME`` (inside effect NAME's function, before or
after the external call), or ``none`` (the test stops it from outside). Once
continued it finishes the script, or, fenced out, tries every kind of write
on its stale handle; :func:`freeze_worker` writes what happened to
``LOG.outcome`` as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from tiers.backends.base import KVStore
from tiers.errors import LeaseHeldError, RunStateError, StaleWriterError
from tiers.task import NOT_DONE, Charged, RunHandle, TaskTier

USER = "crash-user"
EFFECT_SLEEP = 0.002
STEPS = ["plan", "charge", "notify", "ship", "bookkeeping", "summary"]


def open_store(spec: str) -> KVStore:
    """The store named on the command line."""
    if spec.startswith("redis://"):
        from tiers.backends.redis_kv import RedisKVStore

        return RedisKVStore(spec, max_value_bytes=64 * 1024)
    from tiers.backends.sqlite_kv import SqliteKVStore

    return SqliteKVStore(spec, max_value_bytes=64 * 1024)


def _append(log_path: str, line: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def _claim(log_path: str, key: str) -> bool:
    """Whether this call is the first with ``key``: an atomic check-and-set, as a real
    deduplicating system's is. (Reading the log, then appending, let a worker frozen between
    the two execute again after a taker had executed the key.)"""
    claims = Path(f"{log_path}.claims")
    claims.mkdir(exist_ok=True)
    try:
        os.close(os.open(claims / hashlib.sha256(key.encode()).hexdigest(), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def effects_done(log_path: str | Path) -> list[str]:
    """Every effect executed so far, one idempotency key per execution."""
    path = Path(log_path)
    return path.read_text().split() if path.exists() else []


def receipt(key: str) -> JsonValue:
    """The output of the effect with idempotency key ``key`` (what the external system returns)."""
    return {"receipt": f"R-{key.rsplit('/', 2)[-2]}", "key": key}


Hook = Callable[[str, str], None]
"""Called at the script's freeze points: ``hook(where, name)``."""


def _effect_name(key: str) -> str:
    return key.rsplit("/", 2)[-2].split(":", 1)[1]


def external(
    log_path: str, key: str, *, dedupe: bool = False, hook: Hook | None = None
) -> JsonValue:
    """An external side effect, identified by its idempotency key.

    With ``dedupe`` it is a system that checks the key: a call whose key was
    executed already returns the same receipt without executing again; every
    call is counted in ``LOG.attempts``.
    """
    time.sleep(EFFECT_SLEEP)
    if hook is not None:
        hook("before", _effect_name(key))
    if dedupe:
        _append(f"{log_path}.attempts", key)
    if not dedupe or _claim(log_path, key):
        _append(log_path, key)
    if hook is not None:
        hook("after", _effect_name(key))
    time.sleep(EFFECT_SLEEP)
    return receipt(key)


def probe(log_path: str, key: str) -> object:
    """Reconcile: did the effect with this idempotency key happen? Its output if so, else NOT_DONE."""
    return receipt(key) if key in effects_done(log_path) else NOT_DONE


def _units(
    run: RunHandle,
    log_path: str,
    outputs: list[JsonValue],
    dedupe: bool = False,
    hook: Hook | None = None,
) -> list[Any]:
    """The six units of the run, as thunks (plain step, effects, effects inside steps)."""

    def effect(name: str, n: int) -> JsonValue:
        return run.effect(
            name,
            lambda key: external(log_path, key, dedupe=dedupe, hook=hook),
            input={"n": n},
            reconcile=lambda key: probe(log_path, key),
        )

    return [
        lambda: run.step("plan", lambda: Charged({"items": 3}, tokens=10, state={"plan": 3})),
        lambda: effect("charge", 1),
        lambda: run.step("notify", lambda: {"mail": effect("email", 2), "sms": effect("sms", 3)}),
        lambda: effect("ship", 4),
        lambda: run.step(
            "bookkeeping", lambda: Charged({"ledger": effect("ledger", 5)}, state={"booked": 1})
        ),
        lambda: run.step("summary", lambda: {"done": len(outputs)}),
    ]


def script(
    run: RunHandle,
    log_path: str,
    start: int = 0,
    stop: int = 6,
    outputs: list[JsonValue] | None = None,
    *,
    dedupe: bool = False,
    hook: Hook | None = None,
) -> list[JsonValue]:
    """The run: what a worker executes from the start, on a fresh run or a resume."""
    done: list[JsonValue] = [] if outputs is None else outputs
    for i, unit in enumerate(_units(run, log_path, done, dedupe, hook)[start:stop], start + 1):
        done.append(unit())
        if hook is not None:
            hook("unit", str(i))
    return done


def effect_keys(run_id: str) -> list[str]:
    """The idempotency key of every effect the script performs (each must run exactly once)."""
    return [
        f"{run_id}/effect:charge/0",
        f"{run_id}/notify/0/effect:email/0",
        f"{run_id}/notify/0/effect:sms/0",
        f"{run_id}/effect:ship/0",
        f"{run_id}/bookkeeping/0/effect:ledger/0",
    ]


def run_to_end(
    tier: TaskTier, run_id: str, log_path: str, *, dedupe: bool = False, **lease: object
) -> list[JsonValue]:
    """Start or resume the run and finish it; returns the outputs."""
    try:
        handle = tier.start_run(USER, run_id, **lease)  # type: ignore[arg-type]
    except RunStateError:
        info = tier.get_run(run_id)
        result = info.result
        assert isinstance(result, list)
        return result
    outputs = script(handle, log_path, dedupe=dedupe)
    handle.complete(result=outputs)
    return outputs


def _stale_writes(handle: RunHandle, zombie_log: str) -> dict[str, str]:
    """Every kind of write a fenced-out handle might try, and the error each raised."""

    def zombie(*_: object) -> JsonValue:
        _append(zombie_log, "called")  # must never happen: nothing runs on a stale lease
        return None

    writes: dict[str, Callable[[], object]] = {
        "step": lambda: handle.step("zombie-step", zombie),
        "effect": lambda: handle.effect("zombie-effect", zombie),
        "begin_effect": lambda: handle.begin_effect("zombie", idempotency_key="zombie-key"),
        "record_effect": lambda: handle.record_effect(f"{handle.run_id}/effect:ship/0", None),
        "append_checkpoint": lambda: handle.append_checkpoint("zombie", 1),
        "await_approval": lambda: handle.await_approval({"zombie": 1}),
        "compensate": handle.compensate,
        "heartbeat": handle.heartbeat,
        "release": handle.release,
        "complete": lambda: handle.complete("zombie"),
        "fail": lambda: handle.fail("zombie"),
    }
    seen: dict[str, str] = {}
    for name, write in writes.items():
        try:
            write()
        except Exception as exc:
            seen[name] = type(exc).__name__
        else:
            seen[name] = "written"
    return seen


def freeze_worker(spec: str, run_id: str, log_path: str, ttl: float, point: str) -> int:
    """The worker of a fencing trial (see the module docstring): its outcome goes to LOG.outcome."""

    def hook(where: str, name: str) -> None:
        if f"{where}:{name}" == point:
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen here until the test sends SIGCONT

    kv = open_store(spec)
    outcome: dict[str, Any] = {}
    try:
        tier = TaskTier(kv)
        try:
            handle = tier.start_run(USER, run_id, worker_id="frozen", lease_ttl=ttl)
        except RunStateError:
            outcome["first"] = "finished"  # the other worker finished it first
            return 0
        try:
            outputs = script(handle, log_path, dedupe=True, hook=hook)
            handle.complete(result=outputs)
            outcome["first"] = "completed"
        except StaleWriterError:
            outcome["first"] = "StaleWriterError"
            outcome["stale_writes"] = _stale_writes(handle, f"{log_path}.zombie")
    finally:
        Path(f"{log_path}.outcome").write_text(json.dumps(outcome))
        kv.close()
    return 0


def crash_when_stopped(*args: str, what: str) -> int:
    """Run ``python *args`` from the repository root and crash it where it stops itself.

    Waits (60 s at most) until the process has stopped itself with SIGSTOP, then SIGKILLs
    it: a real crash, its lease still live. Called by the tests, not by a worker.

    Args:
        args: The interpreter's arguments (``-m module ...`` or ``-c code ...``).
        what: The stop waited for, as a failure names it.

    Returns:
        The process's exit status (``-SIGKILL``).
    """
    root = Path(__file__).resolve().parents[2]
    worker = subprocess.Popen(
        [sys.executable, *args], cwd=root, env={**os.environ, "PYTHONPATH": str(root)}
    )
    try:
        deadline = time.monotonic() + 60
        # The kernel's state letter: T when stopped, Z when exited and not yet reaped.
        while Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "TZ":
            assert time.monotonic() < deadline, f"gave up waiting: {what}"
            time.sleep(0.01)
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(30)
    return worker.returncode


def crash_frozen_worker(spec: str, run_id: str, log_path: str | Path, point: str) -> int:
    """Run :func:`freeze_worker` with a 600 s lease and crash it where it stops at ``point``.

    The lease is long because a loaded machine can take most of a minute to get to a
    takeover; nothing waits it out. See :func:`crash_when_stopped`.

    Returns:
        The worker's exit status (``-SIGKILL``).
    """
    return crash_when_stopped(
        "-c",
        "import sys; from tests.tiers.crash_worker import freeze_worker; "
        "sys.exit(freeze_worker(sys.argv[1], sys.argv[2], sys.argv[3], 600.0, sys.argv[4]))",
        spec,
        run_id,
        str(log_path),
        point,
        what=f"the worker to stop at {point}",
    )


def _child(spec: str, run_id: str, log_path: str) -> int:
    kv = open_store(spec)
    try:
        run_to_end(TaskTier(kv), run_id, log_path)
    finally:
        kv.close()
    return 0


def serve() -> int:
    """The fork server loop (see the module docstring)."""
    # Import both backends now, so a forked child starts warm.
    import tiers.backends.redis_kv
    import tiers.backends.sqlite_kv  # noqa: F401

    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "run":
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    code = _child(parts[1], parts[2], parts[3])
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            print(f"pid {pid}", flush=True)
        elif parts[0] == "freeze":
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    code = freeze_worker(parts[1], parts[2], parts[3], float(parts[4]), parts[5])
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            print(f"pid {pid}", flush=True)
        elif parts[0] == "wait":
            _, status = os.waitpid(int(parts[1]), 0)
            print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)
        elif parts[0] == "quit":
            break
    return 0


def race(argv: list[str]) -> int:
    """One of two racing workers: wait for GO_FILE, then take the run and work.

    With a TTL lease, a loser prints ``lease-held``. The winner runs the first
    two units, prints ``holding``, then waits for RELEASE_FILE (without
    heartbeating, so its lease can expire and another worker take over),
    then tries to finish: ``fenced`` if it was taken over, else ``done``.
    """
    spec, run_id, log_path, name, go_file, release_file, ttl = argv
    kv = open_store(spec)
    tier = TaskTier(kv)
    while not Path(go_file).exists():
        time.sleep(0.001)
    try:
        handle = tier.start_run(USER, run_id, worker_id=name, lease_ttl=float(ttl))
    except LeaseHeldError:
        print("lease-held", flush=True)
        return 0
    except RunStateError:
        print("finished", flush=True)
        return 0
    print("holding", flush=True)
    outputs = script(handle, log_path, 0, 2)
    print("paused", flush=True)
    while not Path(release_file).exists():
        time.sleep(0.005)
    try:
        outputs = script(handle, log_path, 2, 6, outputs)
        handle.complete(result=outputs)
    except StaleWriterError:
        print("fenced", flush=True)
        return 0
    print("done", json.dumps(outputs), flush=True)
    kv.close()
    return 0


def main(argv: list[str]) -> int:
    """Dispatch on the first argument."""
    if argv[1] == "serve":
        return serve()
    if argv[1] == "race":
        return race(argv[2:])
    spec, run_id, log_path = argv[2:5]
    kv = open_store(spec)
    outputs = run_to_end(TaskTier(kv), run_id, log_path)
    print("done", json.dumps(outputs), flush=True)
    kv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
