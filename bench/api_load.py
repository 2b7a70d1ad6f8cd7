"""Load test of ``tiermem serve`` on loopback: requests/s and p50/p99 latency.

Starts ``tiermem serve`` as a subprocess on a free loopback port over a fresh
embedded data directory (SQLite + embedded Chroma + the local embedder), with
auth on and an API key made by ``tiermem keys create``. Seeds 20 users (each
with facts and session summaries on rotating topics), checks one answer per
user, then drives each route with N concurrent keep-alive connections for a
fixed time, every request picking a user (and for context a query) at random:

- ``GET  /v1/users/{user}/facts``   (preferences read; target >= 1,500 req/s)
- ``POST /v1/users/{user}/context`` (continuation context with recall over 120
  distinct realistic queries x 20 users; target >= 200 req/s)

Nothing in the server caches answers or query embeddings, so the rotation is
what a real mix of users costs, not a replay of one request.

The load generator is ``wrk`` when installed (``apt-get install wrk``), else a
small asyncio HTTP/1.1 client in this file (one connection per simulated
client; it costs the server some CPU on a small machine, so wrk reads higher).
Every non-2xx answer and every socket error counts as an error.

Usage::

    python bench/api_load.py [--duration 10] [--concurrency 50] [--tool auto|wrk|python]
    python bench/api_load.py --serve-arg=--host --serve-arg=127.0.0.1  # arguments of tiermem serve
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

TARGETS = {"facts": 1500.0, "context": 200.0}
TOPICS = [
    "migrate the billing database from MySQL to Postgres",
    "set up nightly backups with point-in-time recovery",
    "tune the search ranking for product queries",
    "write the onboarding guide for new support agents",
    "fix flaky integration tests in the payments service",
    "plan the Kubernetes upgrade for the staging cluster",
    "add rate limiting to the public API gateway",
    "investigate slow checkout pages on mobile",
    "rotate the TLS certificates before they expire",
    "move the analytics jobs to a cheaper instance type",
    "clean up unused feature flags in the web app",
    "design the schema for multi-currency invoices",
]
# Each question is asked about each topic: len(QUESTIONS) * len(TOPICS) distinct queries.
QUESTIONS = [
    "how did the work to {t} go and what is left to do",
    "what did we decide last time about how to {t}",
    "remind me of the open questions on the plan to {t}",
    "which next steps did you recommend to {t}",
    "who was going to follow up on the effort to {t}",
    "summarize where we are with the project to {t}",
    "what went wrong when we tried to {t}",
    "can you pick up where we stopped on the task to {t}",
    "list the risks we found while trying to {t}",
    "what is blocking us from finishing the work to {t}",
]


def queries() -> list[str]:
    """Every distinct query of the context load (question x topic)."""
    return [q.format(t=topic) for q in QUESTIONS for topic in TOPICS]


@dataclass
class Result:
    """Outcome of one route's run."""

    name: str
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    server_cpu_s: float = float("nan")

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def server_cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and its descendants (Linux), else NaN.

    Descendants count too: with ``--workers`` the requests are served by children.
    """
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
    family = {pid}
    grew = True
    while grew:
        more = {child for child, parent in parents.items() if parent in family} - family
        family |= more
        grew = bool(more)
    total = 0.0
    for member in family:
        fields = _stat(member)
        if fields is None:
            if member == pid:
                return float("nan")
            continue
        # utime and stime are fields 14 and 15 of /proc/<pid>/stat, counted from 1 with pid.
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tiermem_bin() -> str:
    found = shutil.which("tiermem", path=str(Path(sys.executable).parent)) or shutil.which(
        "tiermem"
    )
    if found is None:
        sys.exit("tiermem is not installed: run ./run test once (it installs the package)")
    return found


def http(method: str, url: str, key: str, body: object = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        raw = response.read()
        return response.status, (json.loads(raw) if raw else None)


def wait_ready(base: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"tiermem serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("tiermem serve did not become ready")


def user_ids(count: int) -> list[str]:
    """The seeded users' ids."""
    return [f"user-{n:03d}" for n in range(count)]


def seed_user(base: str, key: str, user: int, facts: int, sessions: int) -> None:
    """One user's facts and sessions (topics rotate, so users differ)."""
    user_id = user_ids(user + 1)[user]
    values: dict[str, object] = {f"pref{i:03d}": f"value {i} of {user_id}" for i in range(facts)}
    values.update(language=["fr", "en", "de"][user % 3], tone="short answers with code samples")
    http("PUT", f"{base}/v1/users/{user_id}/facts", key, {"facts": values, "source": "bench"})
    for i in range(sessions):
        topic = TOPICS[(user + i) % len(TOPICS)]
        summary = {
            "task_description": f"Session {i} of {user_id}: {topic}",
            "decisions_made": [f"Decided to {topic} in {2 + i % 3} phases"],
            "work_completed": [f"Finished step {i} of the plan to {topic}"],
            "open_questions": [f"Who owns the follow-up on the work to {topic}?"],
            "next_recommended_steps": [f"Review the results of the effort to {topic}"],
        }
        status, _ = http(
            "POST",
            f"{base}/v1/users/{user_id}/sessions",
            key,
            {"session_id": f"s{i:03d}", "summary": summary},
        )
        expect(status == 201, f"saving session {i} of {user_id}: {status}")


def seed(base: str, key: str, users: int, facts: int, sessions: int) -> None:
    """Seed every user, a few at a time."""
    with ThreadPoolExecutor(4) as pool:
        for done in pool.map(lambda n: seed_user(base, key, n, facts, sessions), range(users)):
            del done


def expect(condition: object, problem: str) -> None:
    """Stop the benchmark (not an ``assert``: those vanish under ``python -O``)."""
    if not condition:
        sys.exit(f"bench/api_load.py: {problem}")


def check_answers(base: str, key: str, users: list[str], query: str) -> None:
    """One context and one facts read per user, checked, before any load is measured."""
    for user_id in users:
        status, body = http(
            "POST", f"{base}/v1/users/{user_id}/context", key, {"query": query, "max_tokens": 1500}
        )
        expect(status == 200 and isinstance(body, dict), f"context of {user_id}: {status}")
        assert isinstance(body, dict)
        expect(body["user_id"] == user_id and user_id in body["text"], f"wrong context: {body}")
        names = [section["name"] for section in body["sections"]]
        expect(names == ["user_facts", "sessions"], f"context sections of {user_id}: {names}")
        status, facts = http("GET", f"{base}/v1/users/{user_id}/facts", key)
        expect(status == 200 and isinstance(facts, dict), f"facts of {user_id}: {status}")
        assert isinstance(facts, dict)
        expect(len(facts["facts"]) >= 2, f"facts of {user_id}: {facts}")


@dataclass(frozen=True)
class Route:
    """One measured route and the requests that rotate over it."""

    name: str
    method: str
    template: str
    requests: list[tuple[str, bytes | None]]  # (path, body)


# -- python load generator --------------------------------------------------------------------


async def _client(
    host: str,
    port: int,
    requests: list[bytes],
    first: int,
    stop_at: float,
    latencies: list[float],
    errors: list[int],
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    n = first
    try:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            writer.write(requests[n % len(requests)])
            n += 7919  # a prime stride: clients do not march through the list in step
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            match = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            if match is None:
                raise RuntimeError("response without content-length")
            await reader.readexactly(int(match.group(1)))
            latencies.append(time.perf_counter() - start)
            if not 200 <= status < 300:
                errors[0] += 1
    except (OSError, asyncio.IncompleteReadError, RuntimeError):
        errors[0] += 1
    finally:
        writer.close()


async def _python_load(
    host: str, port: int, requests: list[bytes], duration: float, concurrency: int
) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    errors = [0]
    start = time.perf_counter()
    stop_at = start + duration
    await asyncio.gather(
        *(
            _client(host, port, requests, n * 31, stop_at, latencies, errors)
            for n in range(concurrency)
        )
    )
    return latencies, errors[0], time.perf_counter() - start


def python_load(route: Route, port: int, key: str, duration: float, concurrency: int) -> Result:
    wire: list[bytes] = []
    for path, body in route.requests:
        lines = [
            f"{route.method} {path} HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            f"Authorization: Bearer {key}",
            "Connection: keep-alive",
        ]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        wire.append(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
    load = _python_load("127.0.0.1", port, wire, duration, concurrency)
    try:
        import uvloop
    except ImportError:
        latencies, errors, seconds = asyncio.run(load)
    else:
        latencies, errors, seconds = uvloop.run(load)
    latencies.sort()

    def pct(q: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
            if latencies
            else float("nan")
        )

    return Result(route.name, len(latencies), errors, seconds, pct(0.50), pct(0.99))


# -- wrk --------------------------------------------------------------------------------------

# Every request picks one of the prepared (path, body) pairs at random, so the load spreads
# over all users and queries and no single-answer cache can serve it.
_WRK_SCRIPT = """
local paths = {{{paths}}}
local bodies = {{{bodies}}}
local headers = {{["Authorization"] = "Bearer {key}", ["Content-Type"] = "application/json"}}
math.randomseed(os.time())
request = function()
  local n = math.random(#paths)
  local body = bodies[n]
  if body == "" then body = nil end
  return wrk.format("{method}", paths[n], headers, body)
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %f %f\\n", summary.requests,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50.0), latency:percentile(99.0)))
  io.write(string.format("DURATION %d\\n", summary.duration))
end
"""


def _lua(text: str) -> str:
    return json.dumps(text)  # a JSON string of ASCII text is a valid Lua string literal


def wrk_load(
    route: Route, port: int, key: str, duration: float, concurrency: int, workdir: Path
) -> Result:
    script = workdir / f"{route.name}.lua"
    script.write_text(
        _WRK_SCRIPT.format(
            method=route.method,
            key=key,
            paths=", ".join(_lua(path) for path, _ in route.requests),
            bodies=", ".join(_lua((body or b"").decode()) for _, body in route.requests),
        )
    )
    out = subprocess.run(
        [
            "wrk",
            "-t",
            "1",
            "-c",
            str(concurrency),
            "-d",
            f"{max(1, round(duration))}s",
            "--timeout",
            "10s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}/",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"RESULT (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+)", out)
    seconds = re.search(r"DURATION (\d+)", out)
    if match is None or seconds is None:
        raise RuntimeError(f"could not parse wrk output:\n{out}")
    requests, socket_errors, status_errors = (int(match.group(i)) for i in (1, 2, 3))
    return Result(
        route.name,
        requests,
        socket_errors + status_errors,
        int(seconds.group(1)) / 1e6,
        float(match.group(4)) / 1000,
        float(match.group(5)) / 1000,
    )


# -- main -------------------------------------------------------------------------------------


def routes(users: list[str], max_tokens: int) -> list[Route]:
    """The measured routes; the context route pairs every user with every query."""
    facts = Route(
        "facts", "GET", "/v1/users/{u}/facts", [(f"/v1/users/{u}/facts", None) for u in users]
    )
    pairs: list[tuple[str, bytes | None]] = [
        (
            f"/v1/users/{user}/context",
            json.dumps({"query": query, "max_tokens": max_tokens}).encode(),
        )
        for user in users
        for query in queries()
    ]
    return [facts, Route("context", "POST", "/v1/users/{u}/context", pairs)]


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per route")
    parser.add_argument(
        "--warmup", type=float, default=3.0, help="seconds of unmeasured load per route first"
    )
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--tool", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--users", type=int, default=20, help="users seeded and queried")
    parser.add_argument("--sessions", type=int, default=10, help="session summaries per user")
    parser.add_argument("--facts", type=int, default=20, help="facts per user")
    parser.add_argument("--max-tokens", type=int, default=1500, help="context budget")
    parser.add_argument("--only", choices=sorted(TARGETS), help="measure one route only")
    parser.add_argument(
        "--no-access-log", action="store_true", help="run the server without access logs"
    )
    parser.add_argument(
        "--serve-command",
        default=None,
        help="command that runs the server instead of `tiermem serve` (e.g. under a profiler); "
        "it gets --port N appended",
    )
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="extra argument of `tiermem serve`"
    )
    args = parser.parse_args()
    tool = args.tool if args.tool != "auto" else ("wrk" if shutil.which("wrk") else "python")

    binary = tiermem_bin()
    serve = shlex.split(args.serve_command) if args.serve_command else [binary, "serve"]
    with tempfile.TemporaryDirectory(prefix="tiermem-bench-") as tmp:
        workdir = Path(tmp)
        env = {
            **os.environ,
            "TIERMEM_DATA_DIR": str(workdir / "data"),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        if args.no_access_log:
            env["TIERMEM_ACCESS_LOG"] = "false"
        key = subprocess.run(
            [binary, "keys", "create", "--tenant", "bench", "--name", "api_load"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        with (workdir / "server.log").open("wb") as log:
            server = subprocess.Popen(
                [*serve, "--port", str(port), *args.serve_arg], env=env, stdout=log, stderr=log
            )
        try:
            wait_ready(base, server)
            users = user_ids(args.users)
            started = time.perf_counter()
            seed(base, key, args.users, args.facts, args.sessions)
            check_answers(base, key, users, queries()[0])
            print(
                f"tiermem serve on {base} ({shlex.join(args.serve_arg) or 'defaults'}), "
                f"{os.cpu_count()} cores, load: {tool}, {args.concurrency} clients, "
                f"{args.duration:.0f} s per route; seeded {args.users} users x "
                f"({args.facts} facts, {args.sessions} sessions) in "
                f"{time.perf_counter() - started:.0f} s; {len(queries())} distinct queries"
            )
            print(f"load average before: {load_average()}")
            print(
                f"{'route':34} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} "
                f"{'CPU ms/req':>10} {'target':>7}  met?"
            )
            failed = False
            for route in routes(users, args.max_tokens):
                if args.only and route.name != args.only:
                    continue

                def run(seconds: float, route: Route = route) -> Result:
                    if tool == "wrk":
                        return wrk_load(route, port, key, seconds, args.concurrency, workdir)
                    return python_load(route, port, key, seconds, args.concurrency)

                if args.warmup > 0:
                    run(args.warmup)
                cpu_before = server_cpu_seconds(server.pid)
                result = run(args.duration)
                result.server_cpu_s = server_cpu_seconds(server.pid) - cpu_before
                target = TARGETS[route.name]
                ok = result.errors == 0 and result.rps >= target
                failed |= not ok
                cpu_ms = (
                    result.server_cpu_s / result.requests * 1000
                    if result.requests
                    else float("nan")
                )
                print(
                    f"{route.method:4} {route.template:29} {result.rps:7.0f} {result.p50_ms:8.2f} "
                    f"{result.p99_ms:8.2f} {result.errors:6d} {cpu_ms:10.2f} {target:7.0f}  "
                    f"{'yes' if ok else 'NO'}"
                )
            print(f"load average after: {load_average()} (other processes skew the figures)")
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
