"""TiermemSession vs the OpenAI Agents SDK's own SQLiteSession (on a file): items/s.

The same workload on both, in the same process, one after the other, each on
a fresh file in a temporary folder, both durable (the SDK's SQLiteSession
runs WAL with SQLite's default ``synchronous=FULL``; tiermem's embedded store
fsyncs every commit by default). Each simulated turn does what ``Runner.run``
does with a session whose ``session_settings.limit`` is set:

- ``get_items(limit)``: the latest ``limit`` items as model input;
- ``add_items([user message])``: the turn's input;
- ``add_items([function_call, function_call_output, assistant message])``:
  the turn's output (realistic sizes: a 2 KB tool result, a 600-character answer).

Several sessions are interleaved, so reads are not all of one hot session.
Printed: items written per second, items read per second (through
``get_items(limit)``), turns per second, and tiermem's ratio to the SDK's
(above 1: tiermem faster). A final ``get_items()`` of every session's whole
history is timed too.

``--head-window`` also runs tiermem with ``head_fresh_ms=0`` (every
``add_items`` reads the run head before its commit, as before the head window
covered ``append_checkpoint``) beside the default window, in the same run;
``--redis`` runs tiermem's KV store on a local ``redis-server`` (``appendfsync
always``) as well as on the embedded SQLite file.

Usage::

    python bench/agents_session_bench.py [--sessions 4] [--turns 100] [--limit 20] [--rounds 2]
        [--head-window] [--redis]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from agents.memory import SessionSettings, SQLiteSession  # noqa: E402

from memory import Memory  # noqa: E402
from memory.integrations.openai_agents import TiermemSession  # noqa: E402
from tiers.task import DEFAULT_HEAD_FRESH_MS  # noqa: E402


class AnySession(Protocol):
    async def get_items(self, limit: int | None = None) -> list[Any]: ...
    async def add_items(self, items: list[Any]) -> None: ...


def turn_items(session: int, turn: int) -> tuple[list[Any], list[Any]]:
    """One turn's input and output items, of realistic sizes."""
    order = f"A-{session:02d}{turn:04d}"
    question = {
        "role": "user",
        "content": (
            f"Hi, I ordered a standing desk last week (order {order}) and the tracking page has "
            "not moved for three days. Can you check where it is and whether it will arrive "
            "before Friday? I need it for a new hire."
        ),
    }
    call = {
        "type": "function_call",
        "id": f"fc_{session}_{turn}",
        "call_id": f"call_{session}_{turn}",
        "name": "lookup_order",
        "arguments": json.dumps({"order_id": order, "include": ["shipments", "events", "eta"]}),
        "status": "completed",
    }
    events = [
        {
            "at": f"2026-11-{10 + n:02d}T0{n % 10}:15:00Z",
            "where": f"Depot {n} - Rotterdam distribution centre, bay {n * 7}",
            "what": "Parcel scanned at sorting facility; next leg booked with regional carrier",
        }
        for n in range(12)
    ]
    result = {
        "type": "function_call_output",
        "call_id": f"call_{session}_{turn}",
        "output": json.dumps({"order_id": order, "status": "in_transit", "events": events}),
    }
    answer = {
        "id": f"msg_{session}_{turn}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [
            {
                "type": "output_text",
                "annotations": [],
                "text": (
                    f"I checked order {order}. It left our Rotterdam distribution centre on "
                    "Tuesday and is with the regional carrier now; the last scan was at their "
                    "sorting facility this morning. The carrier's estimate is Thursday between "
                    "9:00 and 13:00, so it should arrive before Friday. If it has not arrived by "
                    "Thursday evening, reply here and I will open a trace with the carrier and "
                    "arrange a replacement to ship the same day. Is there anything else I can "
                    "help you with for the new hire's setup?"
                ),
            }
        ],
    }
    return [question], [call, result, answer]


@dataclass
class Figures:
    written: int = 0
    write_s: float = 0.0
    read: int = 0
    read_s: float = 0.0
    turns: int = 0
    wall_s: float = 0.0
    full_items: int = 0
    full_s: float = 0.0


async def conversation(session: AnySession, index: int, turns: int, limit: int, f: Figures) -> None:
    for turn in range(turns):
        await conversation_turn(session, index, turn, limit, f)


async def workload(sessions: list[AnySession], turns: int, limit: int, concurrent: bool) -> Figures:
    f = Figures()
    start = time.perf_counter()
    if concurrent:  # every conversation at once, as a service serves them
        await asyncio.gather(*(conversation(s, n, turns, limit, f) for n, s in enumerate(sessions)))
    else:  # one turn of each conversation after the other
        for turn in range(turns):
            for n, session in enumerate(sessions):
                await conversation_turn(session, n, turn, limit, f)
    f.wall_s = time.perf_counter() - start
    start = time.perf_counter()
    for session in sessions:
        f.full_items += len(await session.get_items(-1))
    f.full_s = time.perf_counter() - start
    return f


async def conversation_turn(
    session: AnySession, index: int, turn: int, limit: int, f: Figures
) -> None:
    start = time.perf_counter()
    history = await session.get_items(limit)
    f.read_s += time.perf_counter() - start
    f.read += len(history)
    given, produced = turn_items(index, turn)
    start = time.perf_counter()
    await session.add_items(given)
    await session.add_items(produced)
    f.write_s += time.perf_counter() - start
    f.written += len(given) + len(produced)
    f.turns += 1


async def run_sdk(folder: Path, count: int, turns: int, limit: int, concurrent: bool) -> Figures:
    db = folder / "sdk_sessions.sqlite3"
    sessions = [
        SQLiteSession(f"session-{n}", db, session_settings=SessionSettings(limit=limit))
        for n in range(count)
    ]
    try:
        return await workload(list(sessions), turns, limit, concurrent)
    finally:
        for session in sessions:
            session.close()


async def run_tiermem(
    folder: Path,
    count: int,
    turns: int,
    limit: int,
    concurrent: bool,
    *,
    head_fresh_ms: float = DEFAULT_HEAD_FRESH_MS,
    kv_url: str | None = None,
) -> Figures:
    if kv_url is not None:
        import redis

        redis.Redis.from_url(kv_url).flushdb()  # every run starts on an empty store
    with Memory.open(folder / "tiermem", head_fresh_ms=head_fresh_ms, kv_url=kv_url) as memory:
        sessions = [
            TiermemSession(
                memory,
                f"user:{n}/session",
                user_id=f"user-{n}",
                session_settings=SessionSettings(limit=limit),
            )
            for n in range(count)
        ]
        return await workload(list(sessions), turns, limit, concurrent)


def show(name: str, f: Figures, concurrent: bool) -> None:
    if concurrent:
        print(
            f"  {name:9s} write {f.written / f.wall_s:8.0f} items/s   "
            f"read(limit) {f.read / f.wall_s:9.0f} items/s   turns {f.turns / f.wall_s:7.1f}/s   "
            "(all per wall-clock second)"
        )
        return
    print(
        f"  {name:9s} write {f.written / f.write_s:8.0f} items/s   "
        f"read(limit) {f.read / f.read_s:9.0f} items/s   turns {f.turns / f.wall_s:7.1f}/s   "
        f"full history {f.full_items / f.full_s:9.0f} items/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--head-window", action="store_true", help="also run tiermem with head_fresh_ms=0"
    )
    parser.add_argument("--redis", action="store_true", help="also run tiermem on redis-server")
    args = parser.parse_args()
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    server = None
    if args.redis:
        from task_bench import RedisAlways

        server = RedisAlways(Path(tempfile.mkdtemp(prefix="agents-bench-redis-")))
    try:
        compare(args, None if server is None else server.url)
    finally:
        if server is not None:
            server.stop()
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


Runner = Callable[[Path, int, int, int, bool], Coroutine[Any, Any, Figures]]


def compare(args: argparse.Namespace, redis_url: str | None) -> None:
    """Run every system ``args`` asks for, in turns, and print each one's figures and ratios."""
    window = DEFAULT_HEAD_FRESH_MS
    systems: dict[str, Runner] = {"sdk": run_sdk, "tiermem": run_tiermem}
    if args.head_window:
        systems["tm-w0"] = functools.partial(run_tiermem, head_fresh_ms=0)
    if redis_url is not None:
        systems["tm-redis"] = functools.partial(run_tiermem, kv_url=redis_url)
        if args.head_window:
            systems["tm-r-w0"] = functools.partial(run_tiermem, kv_url=redis_url, head_fresh_ms=0)
    print(
        f"tiermem: head_fresh_ms={window:g}; tm-w0: head_fresh_ms=0; tm-redis / tm-r-w0: the same "
        "on redis-server (appendfsync always)"
    )
    sample = json.dumps(turn_items(0, 0))
    print(
        f"{args.sessions} sessions x {args.turns} turns (4 items, {len(sample)} bytes of JSON per "
        f"turn), get_items(limit={args.limit}) per turn, durable, best of {args.rounds} rounds"
    )
    for concurrent in (False, True):
        mode = "concurrent conversations" if concurrent else "one conversation at a time"
        print(f"{mode}:")
        best: dict[str, Figures] = {}
        names = list(systems)
        for round_ in range(args.rounds):
            # Rotated each round, so no system always runs right after the same one.
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                run = systems[name]
                with tempfile.TemporaryDirectory(prefix="agents-bench-") as tmp:
                    figures = asyncio.run(
                        run(Path(tmp), args.sessions, args.turns, args.limit, concurrent)
                    )
                show(name, figures, concurrent)
                if name not in best or figures.wall_s < best[name].wall_s:
                    best[name] = figures
        sdk = best["sdk"]
        for name in list(systems)[1:]:
            ours = best[name]
            turns = (ours.turns / ours.wall_s) / (sdk.turns / sdk.wall_s)
            if concurrent:
                print(f"  best: {name} / SDK SQLiteSession turns/s x{turns:.2f}")
                continue
            write = (ours.written / ours.write_s) / (sdk.written / sdk.write_s)
            read = (ours.read / ours.read_s) / (sdk.read / sdk.read_s)
            full = (ours.full_items / ours.full_s) / (sdk.full_items / sdk.full_s)
            print(
                f"  best: {name} / SDK SQLiteSession write x{write:.2f}, read(limit) "
                f"x{read:.2f}, turns x{turns:.2f}, full history x{full:.2f}"
            )
    print("target: tiermem at least as fast (x >= 1.00)")


if __name__ == "__main__":
    main()
