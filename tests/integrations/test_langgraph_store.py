"""The LangGraph store (TiermemStore) on SQLite and on a real redis-server, with real Chroma.

Semantics cases follow LangGraph's own store tests (libs/checkpoint/tests/test_store.py,
libs/checkpoint-sqlite/tests/test_store.py and test_ttl.py), ported to tiermem's stricter
choices where they differ (expired items are never returned, ops run in order).
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import anyio
import numpy as np
import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import InjectedStore, ToolNode
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)

from memory import AsyncMemory, Memory, Settings
from memory.integrations.langgraph_store import TiermemStore
from tests.waiting import wait_until
from tiers import keys
from tiers.backends.base import KVStore, VectorIndex
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.errors import InvalidInputError, ValueTooLargeError
from tiers.items import ItemStore

DIMS = 384


class Clock:
    """A settable UTC clock: expiry is tested without sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2031, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture(params=["sqlite", "redis_url", "postgres_url"])
def memory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Memory]:
    # The embedded default, or the URL fixture of a KV server.
    kv_url = None if request.param == "sqlite" else request.getfixturevalue(request.param)
    mem = Memory.from_settings(
        Settings(data_dir=tmp_path / "data", kv_url=kv_url, max_value_bytes=64 * 1024)
    )
    yield mem
    mem.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(memory: Memory, clock: Clock) -> TiermemStore:
    return TiermemStore(memory, clock=clock)


def item_records(memory: Memory) -> list[tuple[str, bytes]]:
    return memory.kv.scan(keys.items_space(memory.tenant))


def item_vector_ids(index: VectorIndex, tenant: str) -> list[str]:
    return index.ids(where={"kind": "item", "tenant": tenant})


def leftovers(memory: Memory) -> dict[str, list[str]]:
    """Every item-related record of the tenant still stored (KV spaces and index)."""
    tenant = memory.tenant
    spaces = [
        keys.items_space(tenant),
        keys.item_vectors_space(tenant),
        keys.item_namespaces_space(tenant),
        keys.item_expiry_space(tenant),
        keys.item_outbox_space(tenant),
    ]
    out = {space: [k for k, _ in memory.kv.scan(space)] for space in spaces}
    out["index"] = item_vector_ids(memory.index, tenant)
    return {name: found for name, found in out.items() if found}


# -- basic operations ---------------------------------------------------------------------------


def test_put_get_update_delete(store: TiermemStore, clock: Clock, memory: Memory) -> None:
    ns = ("test", "documents")
    store.put(ns, "doc1", {"title": "Test Document", "content": "Hello, World!"})
    item = store.get(ns, "doc1")
    assert item is not None
    assert (item.namespace, item.key, item.value) == (
        ns,
        "doc1",
        {"title": "Test Document", "content": "Hello, World!"},
    )
    assert item.created_at == item.updated_at == clock.now
    created = clock.now

    clock.advance(seconds=5)
    store.put(ns, "doc1", {"title": "Updated"})
    updated = store.get(ns, "doc1")
    assert updated is not None
    assert updated.value == {"title": "Updated"}
    assert updated.created_at == created
    assert updated.updated_at == clock.now

    # The value returned is the caller's own: mutating it changes nothing stored.
    updated.value["title"] = "mutated"
    again = store.get(ns, "doc1")
    assert again is not None
    assert again.value == {"title": "Updated"}

    assert store.get(("test", "other_documents"), "doc1") is None
    store.delete(ns, "doc1")
    assert store.get(ns, "doc1") is None
    store.delete(ns, "never-there")  # not an error
    assert leftovers(memory) == {}


def test_batch_runs_ops_in_order_with_one_result_each(store: TiermemStore) -> None:
    store.put(("test", "foo"), "key1", {"data": "value1"})
    results = store.batch(
        [
            GetOp(("test", "foo"), "key1"),
            PutOp(("test", "bar"), "key2", {"data": "value2"}),
            GetOp(("test", "bar"), "key2"),  # sees the put before it
            SearchOp(("test",), filter={"data": "value1"}),
            ListNamespacesOp(),
            PutOp(("test", "foo"), "key1", None),
            GetOp(("test", "foo"), "key1"),
        ]
    )
    assert len(results) == 7
    first = results[0]
    assert isinstance(first, Item)
    assert first.value == {"data": "value1"}
    assert results[1] is None
    third = results[2]
    assert isinstance(third, Item)
    assert third.value == {"data": "value2"}
    assert [i.key for i in results[3]] == ["key1"]  # type: ignore[union-attr]
    assert results[4] == [("test", "bar"), ("test", "foo")]
    assert results[5] is None
    assert results[6] is None


def test_puts_of_one_item_in_a_batch_last_wins(store: TiermemStore) -> None:
    store.batch(
        [
            PutOp(("t",), "k", {"v": 1}),
            PutOp(("t",), "k", {"v": 2}),
            PutOp(("t",), "gone", {"v": 1}),
            PutOp(("t",), "gone", None),
        ]
    )
    item = store.get(("t",), "k")
    assert item is not None
    assert item.value == {"v": 2}
    assert store.get(("t",), "gone") is None


ODD = [
    (("a/b",), "c"),
    (("a", "b"), "c"),
    (("a",), "b/c"),
    (("a",), "b#c"),
    (("a#b",), "c"),
    (("a",), ""),
    (("ab",), "c"),
    (("a:b", "c%2F"), "k:1"),
    (("ünï", "😀 space"), "ключ"),
    (("*", "%"), "%25"),
    (("langgraph-ish", "x"), "y"),
]


def test_odd_namespaces_and_keys_never_collide(store: TiermemStore) -> None:
    for n, (ns, key) in enumerate(ODD):
        store.put(ns, key, {"n": n})
    for n, (ns, key) in enumerate(ODD):
        item = store.get(ns, key)
        assert item is not None, (ns, key)
        assert item.value == {"n": n}, (ns, key)
        assert (item.namespace, item.key) == (ns, key)
    assert sorted(store.list_namespaces(limit=100)) == sorted({ns for ns, _ in ODD})
    # A prefix is a namespace prefix, never a string prefix of a label.
    assert sorted((i.namespace, i.key) for i in store.search(("a",), limit=100)) == sorted(
        [(("a", "b"), "c"), (("a",), "b/c"), (("a",), "b#c"), (("a",), "")]
    )
    assert store.list_namespaces(prefix=("a",)) == [("a",), ("a", "b")]
    assert [i.key for i in store.search(("ünï",))] == ["ключ"]


def test_labels_langgraph_forbids_are_refused_and_nothing_is_stored(
    store: TiermemStore, memory: Memory
) -> None:
    for ns in [(), ("a", ""), ("a.b",), ("nul\x00",)]:
        with pytest.raises(InvalidNamespaceError):
            store.put(ns, "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):  # also straight through batch
        store.batch([PutOp(("a.b",), "k", {"v": 1})])
    with pytest.raises(InvalidInputError) as caught:
        store.put(("bad\ud800",), "k", {"v": 1})
    assert caught.value.field == "namespace"
    with pytest.raises(InvalidInputError) as caught:
        store.put(("ok",), "bad\udfff", {"v": 1})
    assert caught.value.field == "key"
    assert leftovers(memory) == {}


def test_bad_values_filters_and_ttls_are_typed_errors(store: TiermemStore, memory: Memory) -> None:
    store.put(("t",), "keep", {"v": 1})
    cases: list[tuple[str, Any]] = [
        ("value", lambda: store.put(("t",), "k", {"v": math.nan})),
        ("value", lambda: store.put(("t",), "k", {"v": object()})),
        ("value", lambda: store.batch([PutOp(("t",), "k", ["not", "a", "dict"])])),  # type: ignore[arg-type]
        ("ttl", lambda: store.put(("t",), "k", {"v": 1}, ttl=-1)),
        ("filter", lambda: store.search(("t",), filter={"v": {"$regex": "x"}})),
        ("limit", lambda: store.search(("t",), limit=-1)),
        ("max_depth", lambda: store.list_namespaces(max_depth=0)),
    ]
    for field, call in cases:
        with pytest.raises(InvalidInputError) as caught:
            call()
        assert caught.value.field == field
    assert [k for k, _ in item_records(memory)] == [keys.item_address("t/", "keep")]


def test_a_value_over_the_limit_is_refused_naming_the_value(
    store: TiermemStore, memory: Memory
) -> None:
    store.put(("t",), "k", {"v": "small"})
    with pytest.raises(ValueTooLargeError) as caught:
        store.put(("t",), "k", {"v": "x" * 70_000}, index=False)
    assert caught.value.field == "value"
    item = store.get(("t",), "k")
    assert item is not None
    assert item.value == {"v": "small"}


# -- listing namespaces (LangGraph's test_list_namespaces_*) -------------------------------------


def test_list_namespaces_prefix_suffix_wildcards_depth_and_pages(store: TiermemStore) -> None:
    namespaces = [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
        ("users", "123"),
        ("users", "456", "settings"),
        ("admin", "users", "789"),
    ]
    for i, ns in enumerate(namespaces):
        store.put(ns, f"id_{i}", {"data": f"value_{i:02d}"})

    assert store.list_namespaces(prefix=("a", "b")) == [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
    ]
    assert store.list_namespaces(suffix=("f",)) == [
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
    ]
    assert store.list_namespaces(prefix=("a",), suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f")]
    assert store.list_namespaces(prefix=("a", "b"), max_depth=3) == [
        ("a", "b", "c"),
        ("a", "b", "d"),
        ("a", "b", "f"),
    ]
    assert store.list_namespaces(prefix=("a", "b"), limit=2) == [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
    ]
    assert store.list_namespaces(prefix=("a", "b"), offset=2) == [
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
    ]
    assert store.list_namespaces(prefix=("a", "*", "f")) == [("a", "b", "f"), ("a", "c", "f")]
    assert store.list_namespaces(suffix=("*", "f")) == [
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
    ]
    assert store.list_namespaces(prefix=("nonexistent",)) == []
    assert store.list_namespaces(prefix=("users", "123")) == [("users", "123")]
    assert store.list_namespaces(prefix=("users", "*")) == [
        ("users", "123"),
        ("users", "456", "settings"),
    ]
    assert store.list_namespaces(prefix=("*", "users"), suffix=("*", "settings")) == []
    assert store.list_namespaces(max_depth=2) == [
        ("a", "b"),
        ("a", "c"),
        ("admin", "users"),
        ("b", "a"),
        ("users", "123"),
        ("users", "456"),
    ]
    assert len(store.list_namespaces()) == len(namespaces)
    # Both kinds of condition straight through batch, two of a kind at once.
    (both,) = store.batch(
        [
            ListNamespacesOp(
                match_conditions=(
                    MatchCondition("prefix", ("a",)),
                    MatchCondition("prefix", ("*", "b")),
                    MatchCondition("suffix", ("e",)),
                )
            )
        ]
    )
    assert both == [("a", "b", "d", "e")]

    for i in range(20):
        store.put(("namespace", f"sub_{i:02d}"), "k", {"i": i})
    assert store.list_namespaces(prefix=("namespace",), limit=5, offset=15) == [
        ("namespace", f"sub_{i:02d}") for i in range(15, 20)
    ]


def test_a_namespace_emptied_by_deletes_is_no_longer_listed(store: TiermemStore) -> None:
    store.put(("x", "y"), "a", {"v": 1})
    store.put(("x", "y"), "b", {"v": 1})
    store.delete(("x", "y"), "a")
    assert store.list_namespaces() == [("x", "y")]
    store.delete(("x", "y"), "b")
    assert store.list_namespaces() == []


# -- search without a query: filters, order, pages -----------------------------------------------


def test_search_filters_order_and_pages(store: TiermemStore, clock: Clock) -> None:
    docs = [
        (("test", "docs"), "doc1", {"title": "First", "author": "Alice", "score": 4.5, "n": 1}),
        (("test", "docs"), "doc2", {"title": "Second", "author": "Bob", "score": 3.0, "n": 2}),
        (("test", "images"), "img1", {"title": "Image", "author": "Alice", "score": 4.0, "n": 3}),
        (("test", "docs"), "doc3", {"author": "Carol", "meta": {"access-level": "high"}, "n": 4}),
        (("other",), "x", {"author": "Alice"}),
    ]
    for ns, key, value in docs:
        clock.advance(seconds=1)
        store.put(ns, key, value)

    # Newest first, like InMemoryStore and the SQL stores (ORDER BY updated_at DESC).
    assert [i.key for i in store.search(("test",))] == ["doc3", "img1", "doc2", "doc1"]
    assert [i.key for i in store.search(("test", "docs"))] == ["doc3", "doc2", "doc1"]
    assert all(i.score is None for i in store.search(("test",)))
    assert [i.key for i in store.search(("test",), filter={"author": "Alice"})] == ["img1", "doc1"]
    assert [i.key for i in store.search(("test",), filter={"score": {"$gt": 3.5}})] == [
        "img1",
        "doc1",
    ]
    assert [
        i.key for i in store.search(("test",), filter={"score": {"$gte": 3.0, "$lt": 4.5}})
    ] == [
        "img1",
        "doc2",
    ]
    assert [i.key for i in store.search(("test",), filter={"author": {"$ne": "Alice"}})] == [
        "doc3",
        "doc2",
    ]
    assert [i.key for i in store.search(("test",), filter={"meta.access-level": "high"})] == [
        "doc3"
    ]
    assert [i.key for i in store.search(("test",), filter={"meta": {"access-level": "high"}})] == [
        "doc3"
    ]
    assert [i.key for i in store.search(("test",), limit=2)] == ["doc3", "img1"]
    assert [i.key for i in store.search(("test",), offset=2)] == ["doc2", "doc1"]
    assert store.search(("test",), limit=0) == []
    assert len(store.search((), limit=100)) == 5
    # An update moves an item to the front.
    clock.advance(seconds=1)
    store.put(("test", "docs"), "doc1", {"title": "First again", "author": "Alice"})
    assert store.search(("test",), limit=1)[0].key == "doc1"


# -- semantic search with the real bundled embedder ----------------------------------------------


def test_semantic_search_ranks_by_meaning(store: TiermemStore, memory: Memory) -> None:
    ns = ("memories", "alice")
    store.put(ns, "cat", {"content": "my cat is named Tom"})
    store.put(ns, "pizza", {"content": "I like pizza"})
    store.put(ns, "meeting", {"content": "the quarterly meeting moved to Tuesday"})
    store.put(("memories", "bob"), "sushi", {"content": "I love sushi"})

    hits = store.search(ns, query="favourite food")
    assert next(h.key for h in hits) == "pizza"
    assert {h.key for h in hits} == {"cat", "pizza", "meeting"}  # never bob's
    scores = [h.score for h in hits]
    assert all(s is not None for s in scores)
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    assert store.search(ns, query="what is my pet called")[0].key == "cat"

    # Across users under ("memories",): the best food memory of anyone.
    both = store.search(("memories",), query="favourite food", limit=2)
    assert {h.key for h in both} == {"pizza", "sushi"}
    # A filter applies to stored values; pages follow the ranking.
    assert [h.key for h in store.search(ns, query="food", filter={"content": "I like pizza"})] == [
        "pizza"
    ]
    ranked = [h.key for h in store.search(ns, query="favourite food")]
    assert [h.key for h in store.search(ns, query="favourite food", limit=1, offset=1)] == ranked[
        1:2
    ]
    # An empty query lists instead (LangGraph's edge case).
    assert len(store.search(ns, query="")) == 3

    # Re-putting changes the vectors: the old text no longer matches.
    store.put(ns, "pizza", {"content": "the server room is cold"})
    assert store.search(ns, query="favourite food")[0].key != "pizza"
    assert store.search(ns, query="temperature of the machine room")[0].key == "pizza"
    # index=False: stored and listed, never found by meaning.
    store.put(ns, "hidden", {"content": "I like pizza"}, index=False)
    assert "hidden" not in [h.key for h in store.search(ns, query="favourite food")]
    assert "hidden" in [h.key for h in store.search(ns)]
    # One vector per item version: re-puts and index=False leave no strays behind.
    assert len(item_vector_ids(memory.index, memory.tenant)) == 4


def test_index_fields_choose_what_is_embedded(memory: Memory) -> None:
    store = TiermemStore(memory, index={"fields": ["title", "tags[*]"]})
    ns = ("docs",)
    store.put(ns, "a", {"title": "Python tutorial", "body": "pasta carbonara recipe", "tags": []})
    store.put(ns, "b", {"title": "Cooking basics", "body": "variables and loops", "tags": ["food"]})
    assert store.search(ns, query="learn programming")[0].key == "a"
    assert store.search(ns, query="making dinner")[0].key == "b"
    # Per-put index= overrides the store's fields.
    store.put(ns, "c", {"title": "untitled", "body": "Italian pasta dishes"}, index=["body"])
    assert store.search(ns, query="spaghetti")[0].key == "c"
    # A put whose fields are all missing has no vector, and drops the old ones.
    store.put(ns, "a", {"body": "Python tutorial"})
    assert "a" not in [h.key for h in store.search(ns, query="learn programming")]


def hashed_embedding(text: str) -> list[float]:
    """Deterministic 384-d bag of character trigrams, unit length: a real, tiny embedder."""
    vector = np.zeros(DIMS)
    padded = f"  {text.lower()}  "
    for i in range(len(padded) - 2):
        digest = hashlib.blake2b(padded[i : i + 3].encode(), digest_size=4).digest()
        vector[int.from_bytes(digest, "little") % DIMS] += 1.0
    norm = float(np.linalg.norm(vector)) or 1.0
    return (vector / norm).tolist()


def embed_texts(texts: Sequence[str]) -> list[list[float]]:
    return [hashed_embedding(t) for t in texts]


async def aembed_texts(texts: Sequence[str]) -> list[list[float]]:
    await anyio.sleep(0)
    return [hashed_embedding(t) for t in texts]


def test_a_custom_embed_function_sync_and_async(memory: Memory) -> None:
    sync_store = TiermemStore(memory, index={"dims": DIMS, "embed": embed_texts})
    sync_store.put(("docs",), "apple", {"text": "red apple pie"})
    sync_store.put(("docs",), "car", {"text": "blue sports car"})
    assert sync_store.search(("docs",), query="apple")[0].key == "apple"

    async def scenario() -> list[str]:
        store = TiermemStore(
            AsyncMemory(memory),
            index={"dims": DIMS, "embed": aembed_texts},
            embedding_name="langgraph-384",  # the same vectors as the sync store's
        )
        await store.aput(("docs",), "bike", {"text": "green bike bell"})
        hits = await store.asearch(("docs",), query="blue car")
        return [h.key for h in hits]

    assert anyio.run(scenario)[0] == "car"
    # Vectors of another embedder are never compared with these.
    default = TiermemStore(memory)
    assert default.search(("docs",), query="apple") == []
    assert {i.key for i in default.search(("docs",))} == {"apple", "car", "bike"}

    with pytest.raises(InvalidInputError) as caught:
        TiermemStore(memory, index={"dims": 1536, "embed": embed_texts})
    assert caught.value.field == "index.dims"
    wrong = TiermemStore(
        memory, index={"dims": DIMS, "embed": lambda texts: [[1.0, 0.0]] * len(texts)}
    )
    with pytest.raises(InvalidInputError) as caught:
        wrong.put(("docs",), "x", {"text": "y"})
    assert caught.value.field == "vectors"
    assert wrong.get(("docs",), "x") is None


def test_no_index_means_no_vectors(memory: Memory) -> None:
    store = TiermemStore(memory, index=False)
    assert store.index_config is None
    store.put(("t",), "a", {"content": "I like pizza"})
    assert [i.key for i in store.search(("t",), query="favourite food")] == ["a"]
    assert item_vector_ids(memory.index, memory.tenant) == []


# -- TTL ------------------------------------------------------------------------------------------


def test_ttl_expiry_refresh_and_sweep(memory: Memory, clock: Clock) -> None:
    store = TiermemStore(memory, ttl={"default_ttl": 1.0}, clock=clock)
    ns = ("ttl",)
    store.put(ns, "refreshed", {"content": "I like pizza"})
    store.put(ns, "untouched", {"content": "my cat is named Tom"})
    store.put(ns, "forever", {"content": "keep me"}, ttl=None)
    store.put(ns, "long", {"content": "long lived"}, ttl=10)

    clock.advance(seconds=40)
    assert store.get(ns, "refreshed") is not None  # restarts its minute
    clock.advance(seconds=40)  # 80 s after the puts
    assert store.get(ns, "untouched", refresh_ttl=False) is None  # expired: absent at once
    assert store.get(ns, "refreshed", refresh_ttl=False) is not None
    assert {i.key for i in store.search(ns, refresh_ttl=False)} == {"refreshed", "forever", "long"}
    assert "untouched" not in [i.key for i in store.search(ns, query="pet", refresh_ttl=False)]

    clock.advance(seconds=30)  # refreshed expired too (refresh_ttl=False reads above)
    assert store.get(ns, "refreshed") is None
    assert store.sweep_ttl() == 2
    assert {i.key for i in store.search(ns)} == {"forever", "long"}
    # Swept means gone: no record, vector, expiry or outbox entry left for them.
    records = [k for k, _ in item_records(memory)]
    assert records == [keys.item_address("ttl/", "forever"), keys.item_address("ttl/", "long")]
    assert len(item_vector_ids(memory.index, memory.tenant)) == 2
    assert [
        k.partition("/")[2] for k, _ in memory.kv.scan(keys.item_expiry_space(memory.tenant))
    ] == [keys.item_address("ttl/", "long")]

    # A search refreshes what it returns; an expired-only namespace is not listed.
    store.put(("short",), "k", {"v": 1}, ttl=0.5)
    clock.advance(minutes=8)
    assert next(i.key for i in store.search(ns, query="lived")) == "long"
    clock.advance(minutes=8)  # 16 min after "long" was written, 8 after it was found
    assert store.get(ns, "long", refresh_ttl=False) is not None
    assert store.list_namespaces() == [("ttl",)]
    assert store.sweep_ttl() == 1
    assert store.sweep_ttl() == 0


def test_refresh_on_read_off_in_the_config(memory: Memory, clock: Clock) -> None:
    store = TiermemStore(memory, ttl={"default_ttl": 1.0, "refresh_on_read": False}, clock=clock)
    store.put(("t",), "k", {"v": 1})
    clock.advance(seconds=50)
    assert store.get(("t",), "k") is not None  # not refreshed
    clock.advance(seconds=20)
    assert store.get(("t",), "k") is None
    assert store.get(("t",), "k", refresh_ttl=True) is None  # never resurrected


def test_the_sweeper_thread_deletes_expired_items(memory: Memory, clock: Clock) -> None:
    store = TiermemStore(memory, ttl={"default_ttl": 1.0, "sweep_interval_minutes": 1}, clock=clock)
    store.put(("t",), "k", {"v": 1})
    clock.advance(minutes=2)
    future = store.start_ttl_sweeper(sweep_interval_minutes=0.001)
    wait_until(
        lambda: item_records(memory) == [],
        what="the sweeper to delete the expired item",
        every_s=0.02,
    )
    assert store.stop_ttl_sweeper(timeout=10)
    assert future.result(timeout=10) is None


def test_the_sweeper_thread_stops_when_the_store_is_closed(memory: Memory, clock: Clock) -> None:
    store = TiermemStore(memory, ttl={"default_ttl": 1.0, "sweep_interval_minutes": 1}, clock=clock)
    future = store.start_ttl_sweeper(sweep_interval_minutes=0.001)
    memory.close()  # a closed store is final: sweeping it again cannot succeed
    assert future.result(timeout=60) is None  # it used to retry (and log) every interval
    assert store.stop_ttl_sweeper(timeout=10)


# -- tenants, users, deletion ---------------------------------------------------------------------


def test_tenants_never_see_each_other(memory: Memory) -> None:
    ours = TiermemStore(memory)
    theirs = TiermemStore(memory.for_tenant("acme"))
    ours.put(("memories", "u1"), "k", {"content": "I like pizza"})
    theirs.put(("memories", "u1"), "k", {"content": "I like sushi"})
    theirs.put(("private",), "p", {"content": "pizza secrets"})
    ours_item = ours.get(("memories", "u1"), "k")
    assert ours_item is not None
    assert ours_item.value == {"content": "I like pizza"}
    assert ours.get(("private",), "p") is None
    assert ours.list_namespaces() == [("memories", "u1")]
    assert [h.value["content"] for h in ours.search((), query="pizza", limit=10)] == [
        "I like pizza"
    ]
    theirs.delete(("memories", "u1"), "k")
    assert ours.get(("memories", "u1"), "k") is not None


def test_user_namespace_items_join_the_user_tier(memory: Memory) -> None:
    store = TiermemStore(memory, user_namespace=("memories", "{user_id}"))
    store.put(("memories", "alice"), "food", {"content": "I like pizza"})
    store.put(("memories", "alice", "work"), "job", {"content": "works on billing", "team": "core"})
    store.put(("memories", "bob"), "food", {"content": "I like sushi"})
    store.put(("notes",), "n", {"content": "not anyone's"})
    memory.set_fact("alice", "language", "fr")

    context = memory.build_continuation_context("alice")
    assert "I like pizza" in context
    assert "works on billing" in context
    assert "- language: fr" in context
    assert "sushi" not in context
    assert "not anyone's" not in context
    assert {f.key for f in memory.get_facts("alice")} == {"language"}  # derived, never stored

    with pytest.raises(InvalidInputError) as caught:
        store.put(("memories", "not a valid id"), "k", {"v": 1})
    assert caught.value.field == "namespace"
    assert store.get(("memories", "not a valid id"), "k") is None

    memory.forget_user("alice")
    assert store.get(("memories", "alice"), "food") is None
    assert store.search(("memories", "alice"), limit=100) == []
    assert store.search(("memories",), query="pizza", limit=10)[0].key == "food"  # bob's only
    assert store.list_namespaces() == [("memories", "bob"), ("notes",)]
    assert "pizza" not in memory.build_continuation_context("alice")
    tenant = memory.tenant
    assert memory.kv.scan(keys.user_item_namespaces_space(tenant, "alice")) == []
    assert len(item_vector_ids(memory.index, tenant)) == 2


def test_deleting_leaves_nothing_behind(store: TiermemStore, memory: Memory) -> None:
    for n in range(5):
        store.put(("a", str(n)), "k", {"content": f"note number {n}"}, ttl=60)
    assert len(item_vector_ids(memory.index, memory.tenant)) == 5
    store.batch([PutOp(("a", str(n)), "k", None) for n in range(5)])
    assert leftovers(memory) == {}
    assert store.search(("a",), query="note") == []


def test_the_index_is_rebuilt_from_the_kv_store(memory: Memory, tmp_path: Path) -> None:
    """Vectors are authoritative in the KV store: an index that missed writes catches up."""
    dead = ChromaVectorIndex(tmp_path / "dead", embedder=memory.embedder)
    dead.close()
    offline = ItemStore(memory.kv, dead, memory.embedder, tenant=memory.tenant)
    vector = offline.embed(["I like pizza"])
    # The write is acknowledged although the index is down, and queued for repair.
    offline.put(("m",), "pizza", {"content": "I like pizza"}, vectors=vector, model="m1")
    assert [k for k, _ in memory.kv.scan(keys.item_outbox_space(memory.tenant))] == [
        keys.item_address("m/", "pizza")
    ]
    fresh = ChromaVectorIndex(tmp_path / "fresh", embedder=memory.embedder)
    try:
        online = ItemStore(memory.kv, fresh, memory.embedder, tenant=memory.tenant)
        (query,) = online.embed(["favourite food"])
        hits = online.search(("m",), query, model="m1")
        assert [h.key for h in hits] == ["pizza"]
        assert memory.kv.scan(keys.item_outbox_space(memory.tenant)) == []
    finally:
        fresh.close()


# -- real LangGraph graphs ------------------------------------------------------------------------


class Notes(TypedDict):
    text: str
    found: list[str]


def test_a_graph_node_writes_and_searches_through_the_injected_store(memory: Memory) -> None:
    def remember(state: Notes, config: RunnableConfig, *, store: BaseStore) -> dict[str, Any]:
        user = config["configurable"]["user_id"]
        store.put(("memories", user), str(uuid.uuid4()), {"content": state["text"]})
        return {}

    def recall(state: Notes, config: RunnableConfig, *, store: BaseStore) -> dict[str, Any]:
        user = config["configurable"]["user_id"]
        hits = store.search(("memories", user), query="favourite food", limit=1)
        return {"found": [h.value["content"] for h in hits]}

    builder = StateGraph(Notes)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    graph = builder.compile(store=TiermemStore(memory, user_namespace=("memories", "{user_id}")))

    alice = {"configurable": {"user_id": "alice"}}
    graph.invoke({"text": "my cat is named Tom", "found": []}, alice)
    out = graph.invoke({"text": "I like pizza", "found": []}, alice)
    assert out["found"] == ["I like pizza"]
    bob = {"configurable": {"user_id": "bob"}}
    assert graph.invoke({"text": "I drive a red car", "found": []}, bob)["found"] == [
        "I drive a red car"
    ]

    async def again() -> list[str]:
        result = await graph.ainvoke({"text": "I play chess on Sundays", "found": []}, alice)
        return list(result["found"])

    assert anyio.run(again) == ["I like pizza"]
    assert "I like pizza" in memory.build_continuation_context("alice")


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def memory_tools() -> list[Any]:
    """LangMem's pattern (create_manage_memory_tool / create_search_memory_tool) without LangMem:
    the store from the run, a namespace per user from the config, UUID keys, {"content": ...}."""

    def namespace(config: RunnableConfig) -> tuple[str, ...]:
        return ("memories", config["configurable"]["langgraph_user_id"])

    @tool
    def manage_memory(
        content: str,
        config: RunnableConfig,
        action: str = "create",
        id: str | None = None,
    ) -> str:
        """Create, update or delete a memory."""
        store = get_store()
        if action == "delete":
            assert id is not None
            store.delete(namespace(config), id)
            return f"deleted memory {id}"
        key = id or str(uuid.uuid4())
        store.put(namespace(config), key, {"content": content})
        return f"{action}d memory {key}"

    @tool
    def search_memory(
        query: str, config: RunnableConfig, store: Annotated[BaseStore, InjectedStore()]
    ) -> list[dict[str, Any]]:
        """Search the user's memories."""
        hits = store.search(namespace(config), query=query, limit=3)
        return [{"key": h.key, "value": h.value, "score": h.score} for h in hits]

    return [manage_memory, search_memory]


def test_langmem_style_memory_tools_in_a_tool_node(memory: Memory) -> None:
    builder = StateGraph(Chat)
    builder.add_node("tools", ToolNode(memory_tools()))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    graph = builder.compile(store=TiermemStore(memory, user_namespace=("memories", "{user_id}")))
    config = {"configurable": {"langgraph_user_id": "user-a"}}

    def call(name: str, **args: Any) -> str:
        message = AIMessage(
            "",
            tool_calls=[{"name": name, "args": args, "id": uuid.uuid4().hex, "type": "tool_call"}],
        )
        out = graph.invoke({"messages": [message]}, config)
        reply = out["messages"][-1]
        assert isinstance(reply, ToolMessage)
        assert reply.status == "success", reply
        return str(reply.content)

    call("manage_memory", content="My favorite color is blue")
    created = call("manage_memory", content="I prefer dark mode")
    key = created.rsplit(" ", 1)[1]
    call("manage_memory", content="I like pizza with olives")
    assert "dark mode" in call("search_memory", query="user interface theme").split("},")[0]
    assert "pizza" in call("search_memory", query="favourite food").split("},")[0]
    call("manage_memory", content="", action="delete", id=key)
    assert "dark mode" not in call("search_memory", query="user interface theme")
    # The user's memories are part of tiermem's user tier.
    context = memory.build_continuation_context("user-a")
    assert "My favorite color is blue" in context
    assert "dark mode" not in context
    memory.forget_user("user-a")
    assert "blue" not in call("search_memory", query="favourite color")


def test_async_api_end_to_end(memory: Memory, clock: Clock) -> None:
    store = TiermemStore(AsyncMemory(memory), clock=clock)

    async def scenario() -> None:
        await store.aput(("a", "b"), "k1", {"content": "I like pizza"})
        await store.aput(("a", "c"), "k2", {"content": "my cat is named Tom"})
        item = await store.aget(("a", "b"), "k1")
        assert item is not None
        assert item.value == {"content": "I like pizza"}
        hits = await store.asearch(("a",), query="favourite food")
        assert next(h.key for h in hits) == "k1"
        assert await store.alist_namespaces(prefix=("a",)) == [("a", "b"), ("a", "c")]
        await store.adelete(("a", "b"), "k1")
        assert await store.aget(("a", "b"), "k1") is None

    anyio.run(scenario)


def test_a_bad_store_configuration_is_a_typed_error(memory: Memory) -> None:
    kv: KVStore = memory.kv
    with pytest.raises(InvalidInputError) as caught:
        TiermemStore(memory, user_namespace=("memories",))
    assert caught.value.field == "user_namespace"
    with pytest.raises(InvalidInputError) as caught:
        TiermemStore(memory, index={"fields": ["", "b"]})
    assert caught.value.field == "index.fields"
    with pytest.raises(InvalidInputError) as caught:
        TiermemStore(memory, ttl={"default_ttl": 0})
    assert caught.value.field == "ttl.default_ttl"
    assert kv.scan(keys.items_space(memory.tenant)) == []
