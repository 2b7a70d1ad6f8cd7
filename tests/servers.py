"""Real servers the tests start on loopback and stop by pid (redis-server is in conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import chromadb
import pytest
from chromadb.config import Settings

from tests.conftest import free_port


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
