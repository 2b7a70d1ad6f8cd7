"""The session tier's pure parts: tokenizer + BM25, windows, fusion, transcript pages."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiers.backends.base import Delete, KVStore, Put
from tiers.errors import CorruptRecordError, InvalidInputError
from tiers.models import Message, SessionSummary
from tiers.session import (
    BM25Index,
    FusionWeights,
    UserView,
    ViewCache,
    decode_header,
    decode_transcript,
    fuse,
    header_key,
    keyword_text,
    page_key,
    parse_messages,
    session_windows,
    summary_text,
    tokenize,
    transcript_text,
    transcript_writes,
    windows,
)

# -- tokenizer and BM25 -----------------------------------------------------------------------


def test_tokenize_drops_stopwords_and_folds_plurals_and_possessives() -> None:
    assert tokenize("The Dogs' owners AND Caroline's cities, don't they?") == [
        "dog",
        "owner",
        "caroline",
        "city",
    ]
    assert tokenize("glass bus analysis 2023 v1.2") == [
        "glass",
        "bus",
        "analysis",
        "2023",
        "v1",
        "2",
    ]
    assert tokenize("Überraschung café") == ["überraschung", "café"]
    assert tokenize("") == []


def test_bm25_prefers_rare_terms_and_short_documents() -> None:
    docs = {
        "a": "we talked about the database migration and the schema",
        "b": "database database database tuning for the reporting database",
        "c": "Zephyrine reviewed the database budget",
        "d": "nothing relevant here at all",
    }
    index = BM25Index.build((sid, tokenize(text)) for sid, text in docs.items())
    assert len(index) == 4
    scores = index.scores(tokenize("Zephyrine database"))
    # The rare name outweighs any number of repeats of a common word.
    assert max(scores, key=scores.__getitem__) == "c"
    assert "d" not in scores
    assert scores["b"] > scores["a"]  # more occurrences, saturating
    assert index.scores(tokenize("unknown words only")) == {}
    assert BM25Index.build([]).scores(["x"]) == {}


def test_bm25_from_counts_matches_build() -> None:
    from collections import Counter

    docs = [("x", tokenize("red apples and green apples")), ("y", tokenize("green pears"))]
    built = BM25Index.build(docs).scores(tokenize("green apples"))
    counted = BM25Index.from_counts((sid, Counter(t)) for sid, t in docs).scores(
        tokenize("green apples")
    )
    assert built == pytest.approx(counted)
    assert built["x"] > built["y"] > 0


# -- windows ----------------------------------------------------------------------------------


def test_windows_overlap_and_cover_the_whole_text() -> None:
    words = [f"w{n}" for n in range(1000)]
    chunks = windows(" ".join(words), size=100, overlap=20)
    assert all(len(c.split()) == 100 for c in chunks)
    assert chunks[0].split()[0] == "w0"
    assert chunks[-1].split()[-1] == "w999"
    assert chunks[1].split()[:20] == chunks[0].split()[-20:]
    covered = {w for c in chunks for w in c.split()}
    assert covered == set(words)
    assert windows("  ") == []
    assert windows("just a few words", size=100, overlap=20) == ["just a few words"]


def test_windows_are_capped_and_spread_over_a_huge_text() -> None:
    words = [f"w{n}" for n in range(50_000)]
    chunks = windows(" ".join(words), size=100, overlap=20, max_windows=50)
    assert len(chunks) == 50
    assert chunks[0].split()[0] == "w0"
    assert chunks[-1].split()[-1] == "w49999"
    with pytest.raises(ValueError, match="overlap"):
        windows("x", size=10, overlap=10)


def test_session_texts_summary_first_then_transcript() -> None:
    summary = SessionSummary(
        session_id="s1",
        user_id="u",
        task_description="Plan the trip",
        decisions_made=["Fly to Lisbon"],
    )
    messages = [
        Message(role="user", content="Hi there", name="Ana"),
        Message(role="assistant", content="   "),
        Message(role="assistant", content="Booked " + "word " * 300),
    ]
    assert summary_text(summary) == "Plan the trip\nFly to Lisbon"
    assert transcript_text(messages).startswith("Ana: Hi there\nassistant: Booked")
    texts = session_windows(summary, messages)
    assert texts[0] == "Plan the trip Fly to Lisbon"
    assert len(texts) > 2
    assert session_windows(summary, None) == [texts[0]]
    empty = SessionSummary(session_id="s2", user_id="u")
    assert session_windows(empty, None) == [empty.render()]
    assert "Booked" in keyword_text(summary, messages)
    assert keyword_text("head", None) == "head"


# -- fusion -----------------------------------------------------------------------------------


def test_fusion_combines_normalised_signals_and_recency_breaks_ties() -> None:
    day = 86_400.0
    ids = ["dense-hit", "keyword-hit", "both", "old-twin", "new-twin"]
    similarity = np.array([0.9, 0.1, 0.7, 0.3, 0.3])
    keyword = {"keyword-hit": 8.0, "both": 6.0, "old-twin": 1.0, "new-twin": 1.0}
    created = np.array([10 * day, 10 * day, 10 * day, 0.0, 5 * day])
    ranked = fuse(ids, similarity=similarity, keyword=keyword, created_at=created)
    order = [r.session_id for r in ranked]
    assert order[0] == "both"  # strong on both signals beats strong on one
    assert order.index("new-twin") < order.index("old-twin")  # equal but newer
    assert all(0.0 <= r.score <= 1.0 for r in ranked)
    assert [r.score for r in ranked] == sorted((r.score for r in ranked), reverse=True)
    top = ranked[0]
    assert top.similarity == pytest.approx(0.7)
    assert top.keyword == pytest.approx(0.75)


def test_fusion_handles_missing_vectors_and_no_keyword_match() -> None:
    ranked = fuse(
        ["a", "b", "c"],
        similarity=np.array([math.nan, 0.2, 0.5]),
        keyword={},
        created_at=np.zeros(3),
    )
    # A session with no vector yet counts as the least similar one.
    assert [r.session_id for r in ranked] == ["c", "a", "b"]
    assert ranked[1].similarity is None
    assert ranked[1].score == ranked[2].score
    assert fuse([], similarity=np.array([]), keyword={}, created_at=np.array([])) == []
    only_keyword = fuse(
        ["a", "b"],
        similarity=np.array([0.4, 0.4]),
        keyword={"b": 2.0},
        created_at=np.zeros(2),
        weights=FusionWeights(dense=0.0, recency=0.0),
    )
    assert [r.session_id for r in only_keyword] == ["b", "a"]
    with pytest.raises(ValueError, match="dense"):
        FusionWeights(dense=1.5)


# -- transcripts ------------------------------------------------------------------------------


def _store(kv: KVStore, space: str, messages: list[Message], old: bytes | None) -> bytes:
    header, raw, writes = transcript_writes(
        space,
        "u",
        "s1",
        messages,
        max_value_bytes=kv.max_value_bytes,
        old_header=decode_header(old, where="t") if old else None,
    )
    kv.commit(writes)
    assert header.pages == sum(1 for w in writes if isinstance(w, Put)) - 1
    return raw


def _load(kv: KVStore, space: str) -> list[Message]:
    (raw,) = kv.get_many(space, [header_key("s1")])
    assert raw is not None
    header = decode_header(raw, where="t")
    pages = kv.get_many(space, [page_key("s1", n) for n in range(header.pages)])
    return decode_transcript(header, pages, where="t")


def test_a_transcript_larger_than_a_value_is_paged_and_replaced_cleanly(kv: KVStore) -> None:
    space = "t:user:u:transcripts"
    big = [Message(role="user", content=f"message {n} " + "é" * 3000) for n in range(60)]
    raw = _store(kv, space, big, None)
    assert decode_header(raw, where="t").pages > 2  # 64 KB values in the test stores
    assert _load(kv, space) == big
    small = [Message(role="assistant", content="short", name="bot")]
    _store(kv, space, small, raw)
    assert _load(kv, space) == small
    assert [key for key, _ in kv.scan(space)] == ["s1", "s1/000000"]  # no stale pages


def test_a_damaged_transcript_is_reported_not_misread(kv: KVStore) -> None:
    space = "t:user:u:transcripts"
    messages = [Message(role="user", content="x" * 200_000)]
    _store(kv, space, messages, None)
    kv.commit([Put(space, page_key("s1", 1), b"tampered")])
    with pytest.raises(CorruptRecordError, match="checksum"):
        _load(kv, space)
    kv.commit([Delete(space, page_key("s1", 0))])
    with pytest.raises(CorruptRecordError, match="missing pages"):
        _load(kv, space)


def test_parse_messages_names_the_bad_item() -> None:
    assert parse_messages([{"role": "user", "content": "hi"}]) == [
        Message(role="user", content="hi")
    ]
    with pytest.raises(InvalidInputError) as info:
        parse_messages([{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}])
    assert info.value.field == "messages[1].role"
    for bad in ("text", [], {"role": "user"}):
        with pytest.raises(InvalidInputError) as info:
            parse_messages(bad)
        assert info.value.field == "messages"


# -- view cache -------------------------------------------------------------------------------


def _view(revision: bytes, nbytes: int) -> UserView:
    return UserView(revision, [], np.zeros(0), [], nbytes=nbytes)


def test_view_cache_is_bounded_by_users_and_bytes_and_checks_revisions() -> None:
    cache = ViewCache(max_users=3, max_bytes=1000)
    for user in ("a", "b", "c", "d"):
        _, generation = cache.get(user, b"r1")
        cache.put(user, _view(b"r1", 100), generation)
    assert cache.get("a", b"r1")[0] is None  # least recently used, over the user bound
    assert cache.get("b", b"r1")[0] is not None
    assert cache.get("b", b"r2")[0] is None  # another revision: stale
    big = _view(b"r1", 900)
    cache.put("e", big, cache.get("e", b"r1")[1])
    # Over the byte bound: the oldest go, the newest always stays.
    assert cache.get("e", b"r1")[0] is big
    assert cache.get("c", b"r1")[0] is None
    big.nbytes = 5000  # grew lazily
    cache.trim()
    assert cache.get("e", b"r1")[0] is big
    assert cache.get("b", b"r1")[0] is None


def test_view_cache_drops_a_view_built_across_an_invalidation() -> None:
    cache = ViewCache(max_users=10, max_bytes=1 << 20)
    _, generation = cache.get("a", b"r1")
    cache.invalidate(["a"])  # the index changed while the view was being built
    cache.put("a", _view(b"r1", 1), generation)
    assert cache.get("a", b"r1")[0] is None
    _, generation = cache.get("a", b"r1")
    cache.put("a", _view(b"r1", 1), generation)
    assert cache.get("a", b"r1")[0] is not None
    cache.clear()
    assert cache.get("a", b"r1")[0] is None
