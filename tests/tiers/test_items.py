"""The item store (tiers.items) against a plain dict model, on every KV backend with real Chroma.

A Hypothesis state machine puts, deletes, batches, reads (some refreshing
TTLs), lists, searches by vector, lists namespaces, lets time pass, sweeps and
forgets users, on the real store and on the model side by side. Namespaces and
keys are chosen so that naive encodings would collide (``("a/b",)`` and
``("a", "b")``, ``#`` and ``/`` in keys, an empty label). After every step the
vector index must hold exactly the vectors of the stored items, with no index
work left queued.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tiers import keys
from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.errors import InvalidInputError
from tiers.items import ITEM_FACT_SOURCE, ItemStore, ItemWrite, matches_filter

DIMS = 384
MODEL = "hashed-trigrams"
NAMESPACES = [
    ("a",),
    ("a", "b"),
    ("a/b",),
    ("ab",),
    ("a", "b", "c"),
    ("x#y", "z"),
    ("ü",),
    ("a", ""),
]
KEYS = ["k", "", "k#1", "k/2"]
TAGS = ["red apple", "blue car", "green apple", "fast car"]
PREFIXES = [(), ("a",), ("a", "b"), ("ab",), ("x#y",), ("a", "")]
PATTERNS: list[tuple[str | None, ...]] = [(), ("a",), ("a", None), (None, "b"), ("x#y", "z")]
SUFFIXES: list[tuple[str | None, ...]] = [(), ("b",), (None, "c"), ("",)]


def embedding(text: str) -> list[float]:
    """Deterministic unit vector: a bag of hashed character trigrams."""
    vector = np.zeros(DIMS)
    padded = f"  {text}  "
    for i in range(len(padded) - 2):
        digest = hashlib.blake2b(padded[i : i + 3].encode(), digest_size=4).digest()
        vector[int.from_bytes(digest, "little") % DIMS] += 1.0
    return (vector / np.linalg.norm(vector)).tolist()


@dataclass
class Stored:
    value: dict[str, object]
    created: datetime
    updated: datetime
    expires: datetime | None
    ttl: float | None
    vector: list[float] | None
    user: str | None


class ItemsMachine(RuleBasedStateMachine):
    def __init__(self, kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder) -> None:
        super().__init__()
        self.now = datetime(2031, 1, 1, tzinfo=UTC)
        self.tenant = f"t{uuid.uuid4().hex[:12]}"  # a fresh tenant per example: nothing shared
        self.store = ItemStore(kv, index, embedder, tenant=self.tenant, clock=lambda: self.now)
        self.index = index
        self.model: dict[tuple[tuple[str, ...], str], Stored] = {}

    # -- model helpers -------------------------------------------------------------------------

    def live(self) -> dict[tuple[tuple[str, ...], str], Stored]:
        return {
            ref: s for ref, s in self.model.items() if s.expires is None or s.expires > self.now
        }

    def model_put(
        self,
        ns: tuple[str, ...],
        key: str,
        value: dict[str, object],
        vector: list[float] | None,
        ttl: float | None,
        user: str | None,
    ) -> None:
        old = self.model.get((ns, key))
        self.model[(ns, key)] = Stored(
            value=value,
            created=old.created if old is not None else self.now,
            updated=self.now,
            expires=None if ttl is None else self.now + timedelta(minutes=ttl),
            ttl=ttl,
            vector=vector,
            user=user,
        )

    # -- rules -----------------------------------------------------------------------------------

    @rule(
        ns=st.sampled_from(NAMESPACES),
        key=st.sampled_from(KEYS),
        n=st.integers(0, 3),
        tag=st.sampled_from(TAGS),
        indexed=st.booleans(),
        ttl=st.sampled_from([None, None, 1.0, 5.0]),
        user=st.sampled_from([None, "u1", "u2"]),
    )
    def put(
        self,
        ns: tuple[str, ...],
        key: str,
        n: int,
        tag: str,
        indexed: bool,
        ttl: float | None,
        user: str | None,
    ) -> None:
        vector = embedding(tag) if indexed else None
        value: dict[str, object] = {"n": n, "tag": tag}
        self.store.put(
            ns,
            key,
            value,
            vectors=[vector] if vector else [],
            model=MODEL if vector else None,
            ttl_minutes=ttl,
            user_id=user,
        )
        self.model_put(ns, key, value, vector, ttl, user)

    @rule(ns=st.sampled_from(NAMESPACES), key=st.sampled_from(KEYS))
    def delete(self, ns: tuple[str, ...], key: str) -> None:
        self.store.delete(ns, key)
        self.model.pop((ns, key), None)

    @rule(
        ops=st.lists(
            st.tuples(
                st.sampled_from(NAMESPACES[:3]),
                st.sampled_from(KEYS[:2]),
                st.one_of(st.none(), st.integers(0, 3)),
            ),
            min_size=1,
            max_size=4,
        )
    )
    def batch(self, ops: list[tuple[tuple[str, ...], str, int | None]]) -> None:
        writes = [
            ItemWrite(
                ns,
                key,
                None if n is None else {"n": n, "tag": TAGS[n]},
                vectors=[] if n is None else [embedding(TAGS[n])],
                model=MODEL,
            )
            for ns, key, n in ops
        ]
        self.store.write(writes)
        for ns, key, n in ops:  # last write of an item wins
            if n is None:
                self.model.pop((ns, key), None)
            else:
                value: dict[str, object] = {"n": n, "tag": TAGS[n]}
                self.model_put(ns, key, value, embedding(TAGS[n]), None, None)

    @rule(minutes=st.sampled_from([0.0, 0.5, 2.0, 6.0]))
    def advance(self, minutes: float) -> None:
        self.now += timedelta(minutes=minutes)

    @rule(ns=st.sampled_from(NAMESPACES), key=st.sampled_from(KEYS), refresh=st.booleans())
    def get(self, ns: tuple[str, ...], key: str, refresh: bool) -> None:
        got = self.store.get(ns, key, refresh_ttl=refresh)
        expected = self.live().get((ns, key))
        if expected is None:
            assert got is None
            return
        assert got is not None
        assert (got.namespace, got.key, got.value) == (ns, key, expected.value)
        assert (got.created_at, got.updated_at) == (expected.created, expected.updated)
        assert got.user_id == expected.user
        if refresh and expected.ttl is not None and expected.expires is not None:
            fresh = self.now + timedelta(minutes=expected.ttl)
            if fresh - expected.expires >= timedelta(seconds=1):
                expected.expires = fresh

    @rule(
        prefix=st.sampled_from(PREFIXES),
        tag=st.one_of(st.none(), st.sampled_from(TAGS)),
        limit=st.integers(0, 4),
        offset=st.integers(0, 3),
    )
    def list_items(self, prefix: tuple[str, ...], tag: str | None, limit: int, offset: int) -> None:
        flt = None if tag is None else {"tag": tag}
        got = self.store.list_items(prefix, filter=flt, limit=limit, offset=offset)
        expected = sorted(
            (
                (ns, key)
                for (ns, key), s in self.live().items()
                if ns[: len(prefix)] == prefix and matches_filter(s.value, flt)
            ),
            key=lambda ref: (-self.model[ref].updated.timestamp(), ref[0], ref[1]),
        )[offset : offset + limit]
        assert [(i.namespace, i.key) for i in got] == expected

    @rule(
        prefix=st.sampled_from(PREFIXES),
        query=st.sampled_from([*TAGS, "apple", "car"]),
        limit=st.integers(1, 4),
        n_at_least=st.one_of(st.none(), st.integers(0, 3)),
    )
    def search(
        self, prefix: tuple[str, ...], query: str, limit: int, n_at_least: int | None
    ) -> None:
        flt = None if n_at_least is None else {"n": {"$gte": n_at_least}}
        q = np.asarray(embedding(query))
        got = self.store.search(prefix, q.tolist(), model=MODEL, filter=flt, limit=limit)
        scores = {
            (ns, key): float(np.dot(q, np.asarray(s.vector)))
            for (ns, key), s in self.live().items()
            if s.vector is not None and ns[: len(prefix)] == prefix and matches_filter(s.value, flt)
        }
        best = sorted(scores.values(), reverse=True)[:limit]
        assert len(got) == len(best)
        for item, expected_score in zip(got, best, strict=True):
            assert item.score is not None
            assert abs(item.score - expected_score) < 1e-3
            assert abs(scores[(item.namespace, item.key)] - item.score) < 1e-3

    @rule(
        prefix=st.sampled_from(PATTERNS),
        suffix=st.sampled_from(SUFFIXES),
        max_depth=st.sampled_from([None, 1, 2]),
        offset=st.integers(0, 2),
    )
    def namespaces(
        self,
        prefix: tuple[str | None, ...],
        suffix: tuple[str | None, ...],
        max_depth: int | None,
        offset: int,
    ) -> None:
        def fits(ns: tuple[str, ...], pattern: tuple[str | None, ...], tail: bool) -> bool:
            if len(ns) < len(pattern):
                return False
            part = ns[len(ns) - len(pattern) :] if tail else ns[: len(pattern)]
            return all(p is None or p == label for p, label in zip(pattern, part, strict=True))

        shown = {
            ns if max_depth is None else ns[:max_depth]
            for ns, _ in self.live()
            if fits(ns, prefix, False) and fits(ns, suffix, True)
        }
        got = self.store.namespaces(
            prefixes=[prefix] if prefix else [],
            suffixes=[suffix] if suffix else [],
            max_depth=max_depth,
            limit=3,
            offset=offset,
        )
        assert got == sorted(shown)[offset : offset + 3]

    @rule()
    def sweep(self) -> None:
        expired = [ref for ref in self.model if ref not in self.live()]
        assert self.store.sweep() == len(expired)
        for ref in expired:
            del self.model[ref]

    @rule(user=st.sampled_from(["u1", "u2"]))
    def forget(self, user: str) -> None:
        owned = [ref for ref, s in self.model.items() if s.user == user]
        assert self.store.delete_user(user) == len(owned)
        for ref in owned:
            del self.model[ref]

    @rule(user=st.sampled_from(["u1", "u2"]))
    def user_facts(self, user: str) -> None:
        facts = self.store.user_facts(user)
        assert all(f.source == ITEM_FACT_SOURCE and f.user_id == user for f in facts)
        got = sorted((json.dumps(f.value, sort_keys=True), f.updated_at) for f in facts)
        expected = sorted(
            (json.dumps(s.value, sort_keys=True), s.updated)
            for s in self.live().values()
            if s.user == user
        )
        assert got == expected

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def index_holds_exactly_the_stored_vectors(self) -> None:
        expected = {
            keys.item_vector_id(
                self.tenant, keys.item_address(keys.item_namespace_code(ns), key), 0
            )
            for (ns, key), s in self.model.items()
            if s.vector is not None
        }
        assert set(self.index.ids(where={"kind": "item", "tenant": self.tenant})) == expected
        assert self.store._kv.scan(keys.item_outbox_space(self.tenant)) == []


MODEL_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.mark.slow
def test_item_store_behaves_like_a_dict_model(
    kv: KVStore, tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    index = ChromaVectorIndex(tmp_path / "chroma", embedder=embedder)
    try:
        run_state_machine_as_test(
            lambda: ItemsMachine(kv, index, embedder), settings=MODEL_SETTINGS
        )
    finally:
        index.close()


def test_bad_arguments_name_the_field_and_store_nothing(
    kv: KVStore, tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    index = ChromaVectorIndex(tmp_path / "chroma", embedder=embedder)
    store = ItemStore(kv, index, embedder, tenant="t1")
    vector = embedding("x")
    cases: list[tuple[str, ItemWrite]] = [
        ("namespace", ItemWrite((), "k", {"v": 1})),
        ("namespace", ItemWrite("ab", "k", {"v": 1})),  # type: ignore[arg-type]
        ("namespace", ItemWrite(("a",) * 33, "k", {"v": 1})),
        ("namespace", ItemWrite(("x" * 257,), "k", {"v": 1})),
        ("key", ItemWrite(("a",), "k" * 1025, {"v": 1})),
        ("key", ItemWrite(("a",), 7, {"v": 1})),  # type: ignore[arg-type]
        ("value", ItemWrite(("a",), "k", {1: "int key"})),  # type: ignore[dict-item]
        ("value", ItemWrite(("a",), "k", {"v": float("inf")})),
        ("vectors", ItemWrite(("a",), "k", {"v": 1}, vectors=[[1.0, 2.0]], model=MODEL)),
        ("vectors", ItemWrite(("a",), "k", {"v": 1}, vectors=[[float("nan")] * DIMS], model=MODEL)),
        ("model", ItemWrite(("a",), "k", {"v": 1}, vectors=[vector])),
        ("ttl", ItemWrite(("a",), "k", {"v": 1}, ttl_minutes=0)),
        ("ttl", ItemWrite(("a",), "k", {"v": 1}, ttl_minutes=float("nan"))),
        ("user_id", ItemWrite(("a",), "k", {"v": 1}, user_id="no spaces")),
    ]
    for field, write in cases:
        with pytest.raises(InvalidInputError) as caught:
            # A good write first: one bad write in a batch stores none of it.
            store.write([ItemWrite(("a",), "good", {"v": 1}), write])
        assert caught.value.field == field, write
    assert kv.scan(keys.items_space("t1")) == []
    index.close()


def test_a_put_after_a_delete_in_one_batch_is_a_new_item(
    kv: KVStore, tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    # Found by the dict model: the batch's delete was dropped (last write wins) and the put
    # kept the deleted item's created_at.
    now = datetime(2031, 1, 1, tzinfo=UTC)
    index = ChromaVectorIndex(tmp_path / "chroma", embedder=embedder)
    try:
        store = ItemStore(kv, index, embedder, tenant="t1", clock=lambda: now)
        store.write([ItemWrite(("a", "b"), "k", {"v": 0})])
        now += timedelta(seconds=30)
        store.write([ItemWrite(("a", "b"), "k", {"v": 1})])
        item = store.get(("a", "b"), "k")
        assert item is not None
        assert (item.created_at, item.updated_at) == (now - timedelta(seconds=30), now)
        now += timedelta(seconds=30)
        store.write([ItemWrite(("a", "b"), "k", None), ItemWrite(("a", "b"), "k", {"v": 2})])
        item = store.get(("a", "b"), "k")
        assert item is not None
        assert (item.created_at, item.updated_at, item.value) == (now, now, {"v": 2})
    finally:
        index.close()
