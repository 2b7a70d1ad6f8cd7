"""Real servers the tests start on loopback and stop by pid (a single redis-server is in
conftest.py; a Redis Cluster and `chroma run` are here, and the wait for a tiermem server's
readiness)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import chromadb
import httpx
import pytest
import redis
from chromadb.config import Settings

from tests.conftest import free_port


def wait_ready(
    url: str, process: subprocess.Popen[bytes], log: Path, *, what: str, timeout: float = 60
) -> None:
    """Return once ``url`` (a started server's ``/readyz``) answers 200.

    Fails the test with the server's log when the process exits first or ``timeout``
    seconds pass; a process still running then is killed, so no test leaves it behind.

    Args:
        url: The readiness URL.
        process: The server process.
        log: The file its output goes to.
        what: The command, as the failure names it (``tiermem serve``).
        timeout: Seconds to wait at most.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            pytest.fail(f"{what} did not start:\n{log.read_text()}")
        time.sleep(0.1)


class ChromaServer:
    """`chroma run` on a loopback port (a free one unless given), stopped by pid."""

    def __init__(self, binary: str, data: Path, port: int | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (data.parent / "chroma-server.log").open("wb")
        self.process = subprocess.Popen(
            [binary, "run", "--host", "127.0.0.1", "--port", str(self.port), "--path", str(data)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
        )
        client = None
        deadline = time.monotonic() + 60
        while client is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"chroma run did not start; see {self.log.name}")
            try:
                client = chromadb.HttpClient(
                    host="127.0.0.1", port=self.port, settings=Settings(anonymized_telemetry=False)
                )
                client.heartbeat()
            except Exception:
                client = None
                time.sleep(0.1)
        client.close()  # type: ignore[attr-defined]  # Client has it, ClientAPI omits it

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def chroma_binary() -> str:
    """The `chroma` CLI of this environment (the test is skipped without one)."""
    binary = shutil.which("chroma", path=str(Path(sys.executable).parent)) or shutil.which("chroma")
    if binary is None:
        pytest.skip("the `chroma` CLI is not installed in this environment (pip install chromadb)")
    return binary


class RedisClusterNodes:
    """A real Redis Cluster on loopback: ``primaries`` primaries with ``replicas`` replicas each.

    Every node is a ``redis-server --cluster-enabled yes`` on free ports (client and bus
    port both chosen, since ``port + 10000`` may be past 65535), durable like
    :class:`~tests.conftest.RedisServer` (AOF, fsync always), created with ``redis-cli
    --cluster create`` and waited for until every node reports ``cluster_state:ok`` and
    every replica is in sync. ``node_timeout_ms`` is how long a silent primary has until
    its replica takes over. Nodes are stopped by pid.
    """

    def __init__(
        self, workdir: Path, *, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 1000
    ) -> None:
        self.binary = shutil.which("redis-server")
        cli = shutil.which("redis-cli")
        if self.binary is None or cli is None:
            pytest.fail("redis-server is not installed: run the README's test command")
        self.workdir = workdir
        self.node_timeout_ms = node_timeout_ms
        # Every client and bus port distinct, chosen before any node starts: a bus port drawn
        # later could be a port chosen for a node not started yet, which then failed to bind.
        count = primaries * (1 + replicas)
        chosen: list[int] = []
        while len(chosen) < 2 * count:
            port = free_port()
            if port not in chosen:
                chosen.append(port)
        self.ports = chosen[:count]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._bus_ports = dict(zip(self.ports, chosen[count:], strict=True))
        for port in self.ports:
            self.start(port)
        created = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            self.stop()
            pytest.fail(f"redis-cli --cluster create failed: {created.stdout}{created.stderr}")
        self.wait_healthy(self.ports)
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:3]) + "/"

    def start(self, port: int) -> None:
        """Start (or restart, keeping its files) the node on ``port``; wait until it answers."""
        assert self.binary is not None
        folder = self.workdir / str(port)
        folder.mkdir(parents=True, exist_ok=True)
        bus = self._bus_ports[port]
        self.processes[port] = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(port),
                "--cluster-port",
                str(bus),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(folder),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(self.node_timeout_ms),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 60  # a loaded machine may take seconds to start it
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.processes[port].poll() is not None:
                        self.stop()
                        pytest.fail(f"redis-server (cluster node {port}) did not start")
                    time.sleep(0.05)
        finally:
            client.close()

    def wait_healthy(self, ports: list[int], timeout: float = 60) -> None:
        """Wait until each node on ``ports`` reports ``cluster_state:ok`` and in-sync replicas,
        and lists every replica among ``ports`` in its ``CLUSTER SLOTS``.

        A node lists a replica there only once gossip has brought it the replica's
        replication offset, a while after the replica is in sync: clients (and the store's
        ``describe()``) that read the topology sooner see fewer replicas.
        """
        deadline = time.monotonic() + timeout
        pending = list(ports)
        while pending:
            port = pending[0]
            client = redis.Redis(port=port, decode_responses=True)
            try:
                state = client.cluster("info")["cluster_state"]
                replication = client.info("replication")
                linked = replication["role"] == "master" or (
                    replication.get("master_link_status") == "up"
                    and replication.get("master_sync_in_progress") == 0
                )
                if state == "ok" and linked:
                    pending.pop(0)
                    continue
            except redis.RedisError:
                pass
            finally:
                client.close()
            if time.monotonic() > deadline:
                pytest.fail(f"Redis Cluster node {port} did not become healthy")
            time.sleep(0.1)
        replicas = {port for port in ports if self._role(port) == "slave"}
        pending = list(ports)
        while pending:
            port = pending[0]
            try:
                listed = self._listed_replicas(port)
            except redis.RedisError:
                listed = set()
            if replicas <= listed:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                pytest.fail(
                    f"Redis Cluster node {port} lists replicas {sorted(listed)}, "
                    f"not all of {sorted(replicas)}"
                )
            time.sleep(0.1)

    def _role(self, port: int) -> str:
        client = redis.Redis(port=port, decode_responses=True)
        try:
            return str(client.info("replication")["role"])
        finally:
            client.close()

    def _listed_replicas(self, port: int) -> set[int]:
        """The ports of the replicas the node on ``port`` lists in ``CLUSTER SLOTS``."""
        client = redis.Redis(port=port)
        try:
            return {
                int(replica[1])
                for _low, _high, _primary, *replicas in client.cluster("slots")
                for replica in replicas
            }
        finally:
            client.close()

    def primary_of(self, key: str) -> int:
        """The port of the primary that holds the slot of Redis key ``key`` now."""
        client = redis.Redis(port=self.live_ports()[0])
        try:
            slot = int(client.cluster("keyslot", key))
            for low, high, primary, *_ in client.cluster("slots"):
                if low <= slot <= high:
                    return int(primary[1])
        finally:
            client.close()
        raise AssertionError(f"no primary holds slot {slot}")

    def wait_promoted(self, key: str, old_primary: int, timeout: float = 60) -> int:
        """Wait until a node other than ``old_primary`` holds the slot of ``key``; its port.

        Right after a kill the survivors still report ``cluster_state:ok`` and the old
        primary, until they have missed it for ``node_timeout_ms``.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                primary = self.primary_of(key)
            except redis.RedisError:
                primary = old_primary
            if primary != old_primary:
                return primary
            if time.monotonic() > deadline:
                pytest.fail(f"no replica took over the slot of {key!r} from {old_primary}")
            time.sleep(0.1)

    def replicas_of(self, primary: int) -> list[int]:
        """The ports of the replicas of the primary on port ``primary``."""
        client = redis.Redis(port=primary, decode_responses=True)
        try:
            info = client.info("replication")
        finally:
            client.close()
        count = int(info.get("connected_slaves", 0))
        return [int(info[f"slave{n}"]["port"]) for n in range(count)]

    def live_ports(self) -> list[int]:
        """Ports of the nodes whose process runs."""
        return [port for port, process in self.processes.items() if process.poll() is None]

    def kill(self, port: int) -> None:
        """Crash the node on ``port``: SIGKILL, no shutdown."""
        process = self.processes[port]
        process.kill()
        process.wait()

    def flush(self) -> None:
        """Empty every primary (replicas follow)."""
        for port in self.live_ports():
            client = redis.Redis(port=port, decode_responses=True)
            try:
                if client.info("replication")["role"] == "master":
                    client.flushall()
            finally:
                client.close()

    def stop(self) -> None:
        """Stop every node by pid."""
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
