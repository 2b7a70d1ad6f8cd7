"""Property-based fuzz of the OpenAPI document with schemathesis, against a real uvicorn server.

For every operation, schemathesis generates requests from the schema (valid
ones, and invalid ones that must be refused) and checks each answer: never a
5xx, a documented status code and content type, and a body that matches the
documented schema (problem+json for every failure).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api import create_app
from memory.settings import Settings
from tests.conftest import free_port

# Per operation and mode: a few hundred requests in all. TIERMEM_FUZZ_EXAMPLES=200 fuzzes deeper.
MAX_EXAMPLES = int(os.environ.get("TIERMEM_FUZZ_EXAMPLES", "5"))

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


class LiveServer:
    """The app under uvicorn in a background thread (lifespan included)."""

    def __init__(self, data_dir: Path) -> None:
        self.app = create_app(
            Settings(data_dir=data_dir, durable=False, allow_volatile=True, access_log=False)
        )
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                pytest.fail("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


SEEDED = {"user_id": "a", "key": "a", "session_id": "a", "run_id": "a"}


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, dict[str, str], dict[str, str]]]:
    """The server, a key, and the ids of data stored for that key's tenant."""
    with LiveServer(tmp_path_factory.mktemp("fuzz")) as server:
        key, _ = server.app.state.tiermem.keys.create("fuzz")
        memory = server.app.state.tiermem.memory.for_tenant("fuzz")
        memory.set_fact("a", "a", {"nested": [1, "two", None]})
        memory.save_session({"user_id": "a", "session_id": "a", "task_description": "fuzzing"})
        run = memory.start_run("a", "a")
        ckpt = run.append_checkpoint("step", {"out": 1}, scope={"k": "v"})
        memory.save_transcript("a", "b", [{"role": "user", "content": "fuzzing"}])
        job = server.app.state.tiermem.jobs.submit(memory, user_id="a", session_id="b")
        ids = {**SEEDED, "checkpoint_id": ckpt.checkpoint_id, "job_id": job.job_id}
        yield server.base_url, {"Authorization": f"Bearer {key}"}, ids


def operations(base_url: str) -> list[Any]:
    """Every operation of the served OpenAPI document."""
    api_schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    return [result.ok() for result in api_schema.get_all_operations()]


def fuzz(operation: Any, strategy: Any, base_url: str, headers: dict[str, str]) -> None:
    @given(case=strategy)
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS)

    check()


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_every_operation_answers_within_its_schema(
    live: tuple[str, dict[str, str], dict[str, str]], mode: GenerationMode
) -> None:
    base_url, headers, _ = live
    ops = operations(base_url)
    assert len(ops) >= 25  # every route is in the document
    for operation in ops:
        try:
            fuzz(operation, operation.as_strategy(generation_mode=mode), base_url, headers)
        except Unsatisfiable:
            # Nothing to make invalid (no parameters and no body), e.g. GET /healthz.
            assert mode is GenerationMode.NEGATIVE, operation.label


def test_reads_of_stored_data_answer_within_their_schema(
    live: tuple[str, dict[str, str], dict[str, str]],
) -> None:
    # Random ids almost never exist; here the path names stored data, so 200 bodies are checked.
    base_url, headers, ids = live
    reads = [
        op
        for op in operations(base_url)
        if op.method.upper() == "GET" or op.path.endswith((":recall", "/context"))
    ]
    for operation in reads:
        names = re.findall(r"{(\w+)}", operation.path)
        if names:
            strategy = operation.as_strategy(path_parameters={n: ids[n] for n in names})
            fuzz(operation, strategy, base_url, headers)
