"""ChromaVectorIndex on a real embedded PersistentClient, and on a real `chroma run` server."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import chromadb
import numpy as np
import pytest
from chromadb.config import Settings

from tests.conftest import free_port
from tiers.backends.base import VectorIndex, VectorItem
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.errors import BackendUnavailableError, InvalidInputError

DIM = 4
NAME = "test-embedder"


def unit(*values: float) -> list[float]:
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def item(id_: str, vector: list[float], user: str, tenant: str = "t1") -> VectorItem:
    return VectorItem(
        id=id_,
        embedding=vector,
        document=f"doc {id_}",
        metadata={"tenant": tenant, "user_id": user, "n": 1, "ok": True, "at": 1.5},
    )


@pytest.fixture
def index(tmp_path: Path) -> Iterator[ChromaVectorIndex]:
    ix = ChromaVectorIndex(tmp_path / "chroma", dimension=DIM, embedder_name=NAME)
    yield ix
    ix.close()


def test_nearest_first_with_cosine_distance(index: ChromaVectorIndex) -> None:
    assert isinstance(index, VectorIndex)
    index.upsert(
        [
            item("far", unit(0, 0, 1, 0), "alice"),
            item("near", unit(1, 0.1, 0, 0), "alice"),
            item("mid", unit(1, 1, 0, 0), "alice"),
        ]
    )
    hits = index.query(unit(1, 0, 0, 0), where={"user_id": "alice"}, top_k=3)
    assert [h.id for h in hits] == ["near", "mid", "far"]
    assert hits[0].distance == pytest.approx(1 - unit(1, 0.1, 0, 0)[0], abs=1e-4)
    assert hits[2].distance == pytest.approx(1.0, abs=1e-4)
    assert hits[0].document == "doc near"
    assert hits[0].metadata == {"tenant": "t1", "user_id": "alice", "n": 1, "ok": True, "at": 1.5}


def test_where_filters_isolate_users_and_tenants(index: ChromaVectorIndex) -> None:
    target = unit(1, 0, 0, 0)
    index.upsert(
        [
            item("b-exact", target, "bob"),  # the best match overall belongs to bob
            item("a-1", unit(1, 1, 1, 0), "alice"),
            item("a-2", unit(0, 1, 1, 1), "alice"),
            item("a-other-tenant", target, "alice", tenant="t2"),
        ]
    )
    alice = index.query(target, where={"tenant": "t1", "user_id": "alice"}, top_k=10)
    assert [h.id for h in alice] == ["a-1", "a-2"]
    assert all(h.metadata["user_id"] == "alice" and h.metadata["tenant"] == "t1" for h in alice)
    bob = index.query(target, where={"tenant": "t1", "user_id": "bob"}, top_k=10)
    assert [h.id for h in bob] == ["b-exact"]
    assert sorted(index.ids(where={"user_id": "alice"})) == ["a-1", "a-2", "a-other-tenant"]
    assert index.ids(where={"tenant": "t2", "user_id": "alice"}) == ["a-other-tenant"]
    assert sorted(index.ids(where={})) == ["a-1", "a-2", "a-other-tenant", "b-exact"]


def test_empty_results_are_lists_not_errors(index: ChromaVectorIndex) -> None:
    assert index.query(unit(1, 0, 0, 0), where={"user_id": "x"}, top_k=5) == []
    assert index.ids(where={"user_id": "x"}) == []
    index.upsert([item("a", unit(1, 0, 0, 0), "alice")])
    assert index.query(unit(1, 0, 0, 0), where={"user_id": "nobody"}, top_k=5) == []
    assert [h.id for h in index.query(unit(1, 0, 0, 0), where={}, top_k=100)] == ["a"]


def test_upsert_is_idempotent_by_id_and_the_last_write_wins(index: ChromaVectorIndex) -> None:
    index.upsert([item("a", unit(1, 0, 0, 0), "alice")])
    index.upsert([item("a", unit(1, 0, 0, 0), "alice")])
    replaced = VectorItem("a", unit(0, 1, 0, 0), "second", {"user_id": "alice"})
    index.upsert([replaced])
    assert index.count() == 1
    (hit,) = index.query(unit(0, 1, 0, 0), where={"user_id": "alice"}, top_k=5)
    assert (hit.document, hit.distance < 1e-4) == ("second", True)
    # Duplicates inside one batch: the later item wins, no error.
    index.upsert(
        [
            VectorItem("b", unit(1, 0, 0, 0), "first", {"user_id": "bob"}),
            VectorItem("b", unit(0, 0, 1, 0), "last", {"user_id": "bob"}),
        ]
    )
    (hit,) = index.query(unit(0, 0, 1, 0), where={"user_id": "bob"}, top_k=5)
    assert hit.document == "last"


def test_embeddings_are_fetched_by_id_without_a_filter(tmp_path: Path) -> None:
    ix = ChromaVectorIndex(tmp_path / "c", dimension=DIM, embedder_name=NAME, batch_size=2)
    try:
        vectors = {f"v{n}": unit(1, n, 0, 1) for n in range(5)}
        ix.upsert([item(vid, vector, "u") for vid, vector in vectors.items()])
        # Pages smaller than the request, unknown and repeated ids: only what exists, once.
        found, matrix = ix.get_embeddings(["v4", "nope", "v0", "v2", "v0"])
        assert sorted(found) == ["v0", "v2", "v4"]
        assert matrix.shape == (3, DIM)
        assert matrix.dtype == np.float32
        for vid, row in zip(found, matrix, strict=True):
            assert row.tolist() == pytest.approx(vectors[vid], abs=1e-6)
        none, empty = ix.get_embeddings(["nope"])
        assert (none, empty.shape) == ([], (0, DIM))
        assert ix.get_embeddings([])[0] == []
    finally:
        ix.close()


def test_an_empty_document_reads_back_empty_and_replaces_an_old_one(
    index: ChromaVectorIndex,
) -> None:
    index.upsert([VectorItem("w", unit(0, 0, 0, 1), "", {"user_id": "u"})])
    (hit,) = index.query(unit(0, 0, 0, 1), where={"user_id": "u"}, top_k=1)
    assert (hit.id, hit.document) == ("w", "")
    # A text written once does not outlive its replacement (Chroma keeps it on a None).
    index.upsert([VectorItem("w", unit(0, 0, 0, 1), "a user's words", {"user_id": "u"})])
    index.upsert([VectorItem("w", unit(0, 0, 0, 1), "", {"user_id": "u"})])
    (hit,) = index.query(unit(0, 0, 0, 1), where={"user_id": "u"}, top_k=1)
    assert (hit.id, hit.document) == ("w", "")


def test_batches_larger_than_the_write_limit(tmp_path: Path) -> None:
    ix = ChromaVectorIndex(tmp_path / "c", dimension=DIM, embedder_name=NAME, batch_size=3)
    try:
        ix.upsert([item(f"i{n}", unit(1, n, 0, 1), "u") for n in range(10)])
        assert ix.count() == 10
        ix.delete([f"i{n}" for n in range(7)])
        assert sorted(ix.ids(where={"user_id": "u"})) == ["i7", "i8", "i9"]
    finally:
        ix.close()


def test_delete_ignores_unknown_ids(index: ChromaVectorIndex) -> None:
    index.upsert([item("a", unit(1, 0, 0, 0), "u"), item("b", unit(0, 1, 0, 0), "u")])
    index.delete(["a", "never-existed", "a"])
    index.delete([])
    assert index.ids(where={"user_id": "u"}) == ["b"]


def test_bad_input_is_refused_before_chroma_sees_it(index: ChromaVectorIndex) -> None:
    with pytest.raises(InvalidInputError, match="3 dimensions"):
        index.upsert([item("a", [1.0, 0.0, 0.0], "u")])
    with pytest.raises(InvalidInputError, match="NaN"):
        index.upsert([item("a", [math.nan, 0, 0, 1], "u")])
    with pytest.raises(InvalidInputError, match="metadata"):
        index.upsert([VectorItem("a", unit(1, 0, 0, 0), "d", {"x": None})])  # type: ignore[dict-item]
    with pytest.raises(InvalidInputError, match="non-empty"):
        index.upsert([item("", unit(1, 0, 0, 0), "u")])
    with pytest.raises(InvalidInputError) as info:
        index.query(unit(1, 0, 0, 0), where={"u": "x"}, top_k=0)
    assert info.value.field == "top_k"
    with pytest.raises(InvalidInputError, match="where"):
        index.query(unit(1, 0, 0, 0), where={"u": 3}, top_k=1)  # type: ignore[dict-item]
    assert index.count() == 0
    with pytest.raises(InvalidInputError) as info:
        ChromaVectorIndex(index.location, "x", dimension=DIM, embedder_name=NAME)
    assert info.value.field == "collection"


def test_reopen_in_a_fresh_client_without_network(tmp_path: Path, no_network: None) -> None:
    path = tmp_path / "chroma"
    first = ChromaVectorIndex(path, dimension=DIM, embedder_name=NAME)
    first.upsert([item("a", unit(1, 0, 0, 0), "alice"), item("b", unit(0, 1, 0, 0), "bob")])
    first.close()
    first.close()  # idempotent
    with pytest.raises(BackendUnavailableError, match="closed"):
        first.query(unit(1, 0, 0, 0), where={}, top_k=1)
    second = ChromaVectorIndex(path, dimension=DIM, embedder_name=NAME)
    try:
        assert [h.id for h in second.query(unit(1, 0, 0, 0), where={}, top_k=1)] == ["a"]
        second.ping()
    finally:
        second.close()
    # Chroma itself must not have recorded a default embedding function for the collection.
    client = chromadb.PersistentClient(str(path), settings=Settings(anonymized_telemetry=False))
    try:
        config = client.get_collection(
            "tiermem_sessions", embedding_function=None
        ).configuration_json
        assert config["hnsw"]["space"] == "cosine"
        assert (config.get("embedding_function") or {}).get("name") in (None, "")
    finally:
        client.close()  # type: ignore[attr-defined]  # Client has it, ClientAPI omits it


_REOPEN_IN_NEW_PROCESS = """
import json, socket, sys

def blocked(*args, **kwargs):
    raise OSError("network blocked in this process")

socket.getaddrinfo = blocked  # any download attempt now fails loudly
from tiers.backends.chroma_index import ChromaVectorIndex
ix = ChromaVectorIndex(sys.argv[1], dimension=4, embedder_name="test-embedder")
hits = ix.query([0.0, 1.0, 0.0, 0.0], where={"user_id": "bob"}, top_k=5)
print(json.dumps([[h.id, h.document] for h in hits]))
ix.close()
"""


def test_reopen_in_a_new_process_without_network(tmp_path: Path) -> None:
    path = tmp_path / "chroma"
    ix = ChromaVectorIndex(path, dimension=DIM, embedder_name=NAME)
    ix.upsert([item("a", unit(1, 0, 0, 0), "alice"), item("b", unit(0, 1, 0, 0), "bob")])
    ix.close()
    done = subprocess.run(
        [sys.executable, "-c", _REOPEN_IN_NEW_PROCESS, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [["b", "doc b"]]


def test_a_collection_of_another_embedder_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "chroma"
    ChromaVectorIndex(path, dimension=DIM, embedder_name=NAME).close()
    with pytest.raises(InvalidInputError, match="test-embedder") as info:
        ChromaVectorIndex(path, dimension=8, embedder_name=NAME)
    assert info.value.field == "embedder"
    with pytest.raises(InvalidInputError, match="another collection name"):
        ChromaVectorIndex(path, dimension=DIM, embedder_name="other-model")
    other = ChromaVectorIndex(path, "other_collection", dimension=8, embedder_name="other-model")
    other.close()


def test_foreign_collections_adopted_when_empty_refused_when_not_cosine(tmp_path: Path) -> None:
    path = tmp_path / "chroma"
    client = chromadb.PersistentClient(str(path), settings=Settings(anonymized_telemetry=False))
    client.create_collection(
        "plain_empty", embedding_function=None, configuration={"hnsw": {"space": "cosine"}}
    )
    client.create_collection(
        "l2_space", embedding_function=None, configuration={"hnsw": {"space": "l2"}}
    )
    client.close()  # type: ignore[attr-defined]  # Client has it, ClientAPI omits it
    adopted = ChromaVectorIndex(path, "plain_empty", dimension=DIM, embedder_name=NAME)
    adopted.upsert([item("a", unit(1, 0, 0, 0), "u")])
    adopted.close()
    # Once it holds our vectors it is ours: another embedder is refused.
    with pytest.raises(InvalidInputError, match="test-embedder"):
        ChromaVectorIndex(path, "plain_empty", dimension=DIM, embedder_name="other-model")
    # Chroma's default space is l2; it cannot be changed afterwards, so this one is refused.
    with pytest.raises(InvalidInputError, match="'l2'"):
        ChromaVectorIndex(path, "l2_space", dimension=DIM, embedder_name=NAME)


def test_constructor_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="dimension"):
        ChromaVectorIndex(tmp_path / "c", embedder_name=NAME)
    with pytest.raises(InvalidInputError, match="embedder_name"):
        ChromaVectorIndex(tmp_path / "c", dimension=DIM)
    with pytest.raises(BackendUnavailableError, match="cannot open Chroma"):
        ChromaVectorIndex(f"http://127.0.0.1:{free_port()}", dimension=DIM, embedder_name=NAME)


# -- a real Chroma server ---------------------------------------------------------------------


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


@pytest.fixture
def chroma_server(tmp_path: Path) -> Iterator[ChromaServer]:
    server = ChromaServer(chroma_binary(), tmp_path / "server-data")
    yield server
    server.stop()


@pytest.mark.usefixtures("no_network")
def test_against_a_real_chroma_server(chroma_server: ChromaServer) -> None:
    ix = ChromaVectorIndex(chroma_server.url, dimension=DIM, embedder_name=NAME)
    try:
        ix.ping()
        ix.upsert([item("a", unit(1, 0, 0, 0), "alice"), item("b", unit(1, 0.2, 0, 0), "bob")])
        hits = ix.query(unit(1, 0.2, 0, 0), where={"tenant": "t1", "user_id": "alice"}, top_k=5)
        assert [h.id for h in hits] == ["a"]
        ix.upsert([item("a", unit(0, 0, 0, 1), "alice")])
        assert ix.count() == 2
        ix.delete(["a"])
        assert ix.ids(where={}) == ["b"]
        with pytest.raises(InvalidInputError):
            ChromaVectorIndex(chroma_server.url, dimension=8, embedder_name=NAME)
        chroma_server.stop()
        with pytest.raises(BackendUnavailableError):
            ix.query(unit(1, 0, 0, 0), where={}, top_k=1)
        with pytest.raises(BackendUnavailableError):
            ix.ping()
    finally:
        ix.close()


# -- a collection lost under an open index (issue 13, defect 6) --------------------------------


def test_metadata_by_filter_and_by_id(index: ChromaVectorIndex) -> None:
    index.upsert([item("a", unit(1, 0, 0, 0), "alice"), item("b", unit(0, 1, 0, 0), "bob")])
    index.upsert([item("c", unit(0, 0, 1, 0), "carol", tenant="t2")])
    assert set(index.metadata(where={"tenant": "t1"})) == {"a", "b"}
    assert index.metadata(where={"tenant": "t1"})["b"]["user_id"] == "bob"
    assert set(index.metadata(where={"tenant": "t1"}, ids=["b", "c", "nope"])) == {"b"}
    assert index.metadata(where={}, ids=[]) == {}


def test_a_collection_deleted_under_an_open_index_is_created_again_empty(tmp_path: Path) -> None:
    ix = ChromaVectorIndex(tmp_path / "chroma", dimension=DIM, embedder_name=NAME)
    try:
        ix.upsert([item("a", unit(1, 0, 0, 0), "alice")])
        client = chromadb.PersistentClient(
            path=str(tmp_path / "chroma"), settings=Settings(anonymized_telemetry=False)
        )
        client.delete_collection("tiermem_sessions")
        # Today's index kept the dropped collection's handle: every call failed from here on.
        ix.ping()
        assert ix.recreated == 1
        assert ix.count() == 0
        ix.upsert([item("b", unit(0, 1, 0, 0), "alice")])
        assert ix.ids(where={}) == ["b"]
    finally:
        ix.close()


@pytest.mark.slow
@pytest.mark.usefixtures("no_network")
def test_a_chroma_server_restarted_empty_is_used_again(tmp_path: Path) -> None:
    server = ChromaServer(chroma_binary(), tmp_path / "first")
    ix = ChromaVectorIndex(server.url, dimension=DIM, embedder_name=NAME)
    try:
        ix.upsert([item("a", unit(1, 0, 0, 0), "alice")])
        server.stop()
        server = ChromaServer(server.binary, tmp_path / "second", port=server.port)
        assert ix.get_embeddings(["a"])[0] == []  # the collection is there again, empty
        assert ix.recreated == 1
        ix.upsert([item("b", unit(0, 1, 0, 0), "alice")])
        hits = ix.query(unit(0, 1, 0, 0), where={"tenant": "t1"}, top_k=5)
        assert [h.id for h in hits] == ["b"]
    finally:
        ix.close()
        server.stop()
