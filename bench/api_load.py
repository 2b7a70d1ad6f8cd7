"""Load test of ``tiermem serve`` on loopback: requests/s and p50/p99 latency.

Starts ``tiermem serve`` as a subprocess on a free loopback port over a fresh
embedded data directory (SQLite + embedded Chroma + the local embedder), with
auth on and an API key made by ``tiermem keys create``. Seeds one user with
facts and session summaries, then drives each route with N concurrent
keep-alive connections for a fixed time:

- ``GET  /v1/users/{user}/facts``   (preferences read; target >= 1,500 req/s)
- ``POST /v1/users/{user}/context`` (continuation context with recall; target >= 200 req/s)

The load generator is ``wrk`` when installed (``apt-get install wrk``), else a
small asyncio HTTP/1.1 client in this file (one connection per simulated
client; it costs the server some CPU on a small machine, so wrk reads higher).
Every non-2xx answer and every socket error counts as an error.

Usage::

    python bench/api_load.py [--duration 10] [--concurrency 50] [--tool auto|wrk|python]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

USER = "bench-user"
TARGETS = {"facts": 1500.0, "context": 200.0}
QUERY = "how did the database migration go and what is left to do"
TOPICS = [
    "migrate the billing database from MySQL to Postgres",
    "set up nightly backups with point-in-time recovery",
    "tune the search ranking for product queries",
    "write the onboarding guide for new support agents",
    "fix flaky integration tests in the payments service",
    "plan the Kubernetes upgrade for the staging cluster",
    "add rate limiting to the public API gateway",
    "investigate slow checkout pages on mobile",
]


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux), or NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    # utime and stime are fields 14 and 15 of /proc/<pid>/stat, counted from 1 with pid.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def seed(base: str, key: str, facts: int, sessions: int) -> None:
    values = {f"pref{i:03d}": f"value {i}" for i in range(facts)}
    values.update(language="fr", tone="short answers with code samples")
    http("PUT", f"{base}/v1/users/{USER}/facts", key, {"facts": values, "source": "bench"})
    for i in range(sessions):
        topic = TOPICS[i % len(TOPICS)]
        summary = {
            "task_description": f"Session {i}: {topic}",
            "decisions_made": [f"Decided to {topic} in phases"],
            "work_completed": [f"Finished step {i} of: {topic}"],
            "open_questions": [f"Who owns the follow-up on {topic}?"],
            "next_recommended_steps": [f"Review the results of {topic}"],
        }
        status, _ = http(
            "POST",
            f"{base}/v1/users/{USER}/sessions",
            key,
            {"session_id": f"s{i:03d}", "summary": summary},
        )
        assert status == 201, status


# -- python load generator --------------------------------------------------------------------


async def _client(
    host: str, port: int, request: bytes, stop_at: float, latencies: list[float], errors: list[int]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            writer.write(request)
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
    host: str, port: int, request: bytes, duration: float, concurrency: int
) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    errors = [0]
    start = time.perf_counter()
    stop_at = start + duration
    await asyncio.gather(
        *(_client(host, port, request, stop_at, latencies, errors) for _ in range(concurrency))
    )
    return latencies, errors[0], time.perf_counter() - start


def python_load(
    name: str,
    port: int,
    method: str,
    path: str,
    key: str,
    body: bytes | None,
    duration: float,
    concurrency: int,
) -> Result:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Authorization: Bearer {key}",
        "Connection: keep-alive",
    ]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    latencies, errors, seconds = runner(
        _python_load("127.0.0.1", port, request, duration, concurrency)
    )
    latencies.sort()

    def pct(q: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
            if latencies
            else float("nan")
        )

    return Result(name, len(latencies), errors, seconds, pct(0.50), pct(0.99))


# -- wrk --------------------------------------------------------------------------------------

_WRK_SCRIPT = """
wrk.method = "{method}"
wrk.headers["Authorization"] = "Bearer {key}"
wrk.headers["Content-Type"] = "application/json"
{body}
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %f %f\\n", summary.requests,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50.0), latency:percentile(99.0)))
  io.write(string.format("DURATION %d\\n", summary.duration))
end
"""


def wrk_load(
    name: str,
    port: int,
    method: str,
    path: str,
    key: str,
    body: bytes | None,
    duration: float,
    concurrency: int,
    workdir: Path,
) -> Result:
    script = workdir / f"{name}.lua"
    body_line = f"wrk.body = {json.dumps(body.decode())}" if body is not None else ""
    script.write_text(textwrap.dedent(_WRK_SCRIPT.format(method=method, key=key, body=body_line)))
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
            f"http://127.0.0.1:{port}{path}",
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
        name,
        requests,
        socket_errors + status_errors,
        int(seconds.group(1)) / 1e6,
        float(match.group(4)) / 1000,
        float(match.group(5)) / 1000,
    )


# -- main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per route")
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds of unmeasured load per route first"
    )
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--tool", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--sessions", type=int, default=20, help="session summaries seeded")
    parser.add_argument("--facts", type=int, default=20, help="facts seeded")
    parser.add_argument(
        "--no-access-log", action="store_true", help="run the server without access logs"
    )
    args = parser.parse_args()
    tool = args.tool if args.tool != "auto" else ("wrk" if shutil.which("wrk") else "python")

    binary = tiermem_bin()
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
                [binary, "serve", "--port", str(port)], env=env, stdout=log, stderr=log
            )
        try:
            wait_ready(base, server)
            seed(base, key, args.facts, args.sessions)
            context_body = json.dumps({"query": QUERY, "max_tokens": 1500}).encode()
            routes = [
                ("facts", "GET", f"/v1/users/{USER}/facts", None),
                ("context", "POST", f"/v1/users/{USER}/context", context_body),
            ]
            print(
                f"tiermem serve on {base}, {os.cpu_count()} cores, load: {tool}, "
                f"{args.concurrency} clients, {args.duration:.0f} s per route"
            )
            failed = False
            for name, method, path, body in routes:

                def run(
                    seconds: float,
                    name: str = name,
                    method: str = method,
                    path: str = path,
                    body: bytes | None = body,
                ) -> Result:
                    if tool == "wrk":
                        return wrk_load(
                            name, port, method, path, key, body, seconds, args.concurrency, workdir
                        )
                    return python_load(
                        name, port, method, path, key, body, seconds, args.concurrency
                    )

                if args.warmup > 0:
                    run(args.warmup)
                cpu_before = cpu_seconds(server.pid)
                result = run(args.duration)
                result.server_cpu_s = cpu_seconds(server.pid) - cpu_before
                target = TARGETS[name]
                ok = result.errors == 0 and result.rps >= target
                failed |= not ok
                cpu_ms = (
                    result.server_cpu_s / result.requests * 1000
                    if result.requests
                    else float("nan")
                )
                print(
                    f"{method:4} {path:32} {result.rps:8.0f} req/s  p50 {result.p50_ms:7.2f} ms  "
                    f"p99 {result.p99_ms:7.2f} ms  errors {result.errors}  "
                    f"server CPU {cpu_ms:.2f} ms/req  "
                    f"(target >= {target:.0f} req/s: {'ok' if ok else 'MISSED'})"
                )
            print(
                f"load average now: {os.getloadavg()[0]:.1f} (other processes on this machine skew the numbers)"
            )
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
