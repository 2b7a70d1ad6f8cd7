"""The VectorIndex contract: one suite, run on embedded Chroma and on a real `chroma run` server.

Every case opens a fresh index through ``open_index`` (embedded: a new directory; server: a
new collection on one server started for the session), so the cases hold for any backend of
:class:`~tiers.backends.base.VectorIndex`. What only Chroma does (its collections, its
configuration, a server going away) is tested in tests/tiers/test_chroma_index.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.servers import ChromaServer, chroma_binary
from tiers.backends.base import VectorIndex, VectorItem
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.errors import InvalidInputError, StoreClosedError

DIM = 4
NAME = "test-embedder"

# Opens a fresh, empty index of dimension DIM (``batch_size`` bounds one write or read call),
# or with ``again=True`` the storage of the last one opened.
OpenIndex = Callable[..., ChromaVectorIndex]


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


def count(index: VectorIndex) -> int:
    return len(index.ids(where={}))


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChromaServer]:
    """One `chroma run` for every server case; each case uses a collection of its own."""
    server = ChromaServer(chroma_binary(), tmp_path_factory.mktemp("chroma-server") / "data")
    yield server
    server.stop()


_collections = itertools.count()


@pytest.fixture(params=["embedded", pytest.param("server", marks=pytest.mark.heavy)])
def open_index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenIndex]:
    opened: list[tuple[ChromaVectorIndex, str | Path, str]] = []

    def open_(*, batch_size: int | None = None, again: bool = False) -> ChromaVectorIndex:
        if again:
            _, where, collection = opened[-1]
        elif request.param == "embedded":
            where, collection = tmp_path / f"chroma-{len(opened)}", "tiermem_sessions"
        else:
            where = request.getfixturevalue("chroma_server").url
            collection = f"contract_{next(_collections)}"
        # Without batch_size, the index's own default.
        options: dict[str, Any] = {} if batch_size is None else {"batch_size": batch_size}
        ix = ChromaVectorIndex(where, collection, dimension=DIM, embedder_name=NAME, **options)
        opened.append((ix, where, collection))
        return ix

    yield open_
    for ix, _, _ in opened:
        ix.close()


@pytest.fixture
def index(open_index: OpenIndex) -> ChromaVectorIndex:
    return open_index()


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
    assert [h.id for h in index.query(unit(1, 0, 0, 0), where={}, top_k=2)] == ["near", "mid"]


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
    assert index.metadata(where={}) == {}
    found, matrix = index.get_embeddings(["a"])
    assert (found, matrix.shape) == ([], (0, DIM))
    index.upsert([item("a", unit(1, 0, 0, 0), "alice")])
    assert index.query(unit(1, 0, 0, 0), where={"user_id": "nobody"}, top_k=5) == []
    assert [h.id for h in index.query(unit(1, 0, 0, 0), where={}, top_k=100)] == ["a"]


def test_upsert_is_idempotent_by_id_and_the_last_write_wins(index: ChromaVectorIndex) -> None:
    index.upsert([item("a", unit(1, 0, 0, 0), "alice")])
    index.upsert([item("a", unit(1, 0, 0, 0), "alice")])
    replaced = VectorItem("a", unit(0, 1, 0, 0), "second", {"user_id": "alice"})
    index.upsert([replaced])
    assert count(index) == 1
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


def test_upsert_replaces_the_metadata_whole(index: ChromaVectorIndex) -> None:
    index.upsert([item("a", unit(1, 0, 0, 0), "alice")])
    index.upsert([VectorItem("a", unit(1, 0, 0, 0), "second", {"user_id": "alice"})])
    assert index.metadata(where={}) == {"a": {"user_id": "alice"}}
    assert index.ids(where={"tenant": "t1"}) == []


def test_embeddings_are_fetched_by_id_without_a_filter(open_index: OpenIndex) -> None:
    ix = open_index(batch_size=2)
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


def test_batches_larger_than_the_write_limit(open_index: OpenIndex) -> None:
    ix = open_index(batch_size=3)
    ix.upsert([item(f"i{n}", unit(1, n, 0, 1), "u") for n in range(10)])
    assert count(ix) == 10
    ix.delete([f"i{n}" for n in range(7)])
    assert sorted(ix.ids(where={"user_id": "u"})) == ["i7", "i8", "i9"]


def test_delete_ignores_unknown_ids(index: ChromaVectorIndex) -> None:
    index.upsert([item("a", unit(1, 0, 0, 0), "u"), item("b", unit(0, 1, 0, 0), "u")])
    index.delete(["a", "never-existed", "a"])
    index.delete([])
    assert index.ids(where={"user_id": "u"}) == ["b"]
    # A deleted item leaves every read at once.
    assert [h.id for h in index.query(unit(1, 0, 0, 0), where={}, top_k=5)] == ["b"]
    assert index.get_embeddings(["a"])[0] == []
    assert set(index.metadata(where={})) == {"b"}


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
    assert count(index) == 0
    with pytest.raises(InvalidInputError) as info:
        ChromaVectorIndex(index.location, "x", dimension=DIM, embedder_name=NAME)
    assert info.value.field == "collection"


def test_a_query_of_another_dimension_is_refused(index: ChromaVectorIndex) -> None:
    index.upsert([item("a", unit(1, 0, 0, 0), "u")])
    with pytest.raises(InvalidInputError, match="5 dimensions") as info:
        index.query(unit(1, 0, 0, 0, 1), where={}, top_k=1)
    assert info.value.field == "embedding"
    with pytest.raises(InvalidInputError, match="3 dimensions"):
        index.upsert([item("a", unit(1, 0, 0), "u"), item("b", unit(0, 1, 0, 0), "u")])
    # A batch with one bad item writes nothing, not even its good items.
    assert index.ids(where={}) == ["a"]


def test_metadata_by_filter_and_by_id(index: ChromaVectorIndex) -> None:
    index.upsert([item("a", unit(1, 0, 0, 0), "alice"), item("b", unit(0, 1, 0, 0), "bob")])
    index.upsert([item("c", unit(0, 0, 1, 0), "carol", tenant="t2")])
    assert set(index.metadata(where={"tenant": "t1"})) == {"a", "b"}
    assert index.metadata(where={"tenant": "t1"})["b"]["user_id"] == "bob"
    assert set(index.metadata(where={"tenant": "t1"}, ids=["b", "c", "nope"])) == {"b"}
    assert index.metadata(where={}, ids=[]) == {}
    # Every metadata type comes back as it was written.
    assert index.metadata(where={}, ids=["c"]) == {
        "c": {"tenant": "t2", "user_id": "carol", "n": 1, "ok": True, "at": 1.5}
    }


def test_ping_answers_and_close_is_final_and_idempotent(index: ChromaVectorIndex) -> None:
    index.ping()
    index.upsert([item("a", unit(1, 0, 0, 0), "u")])
    index.close()
    index.close()
    for call in (
        index.ping,
        lambda: index.query(unit(1, 0, 0, 0), where={}, top_k=1),
        lambda: index.upsert([item("b", unit(0, 1, 0, 0), "u")]),
        lambda: index.ids(where={}),
        lambda: index.delete(["a"]),
    ):
        with pytest.raises(StoreClosedError, match="closed"):
            call()


def test_the_index_keeps_what_it_holds_when_opened_again(open_index: OpenIndex) -> None:
    first = open_index()
    first.upsert([item("a", unit(1, 0, 0, 0), "alice"), item("b", unit(0, 1, 0, 0), "bob")])
    first.close()
    again = open_index(again=True)
    assert sorted(again.ids(where={})) == ["a", "b"]
    assert [h.id for h in again.query(unit(0, 1, 0, 0), where={}, top_k=1)] == ["b"]
