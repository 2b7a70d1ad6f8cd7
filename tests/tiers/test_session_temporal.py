"""Dates in recall queries and newer facts first (issue 19 item 3).

The parser is checked on its own; the ranking through the real tier (every
KV backend, embedded Chroma, the real MiniLM model).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.errors import InvalidInputError
from tiers.models import Message, SessionSummary
from tiers.session import SessionTier
from tiers.session._temporal import TimeWindow, date_match, parse_query

# A Saturday.
NOW = datetime(2024, 11, 16, 15, 30, tzinfo=UTC)


def days(first: date, last: date | None = None) -> TimeWindow:
    return TimeWindow.of_days(first, last or first)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("What did I say last March?", [days(date(2024, 3, 1), date(2024, 3, 31))]),
        ("What did I say in March?", [days(date(2024, 3, 1), date(2024, 3, 31))]),
        # Said in November: "last November" is a year back, "in December" last year's.
        ("last November", [days(date(2023, 11, 1), date(2023, 11, 30))]),
        ("in December", [days(date(2023, 12, 1), date(2023, 12, 31))]),
        ("What happened in May 2023?", [days(date(2023, 5, 1), date(2023, 5, 31))]),
        ("on 7 May", [days(date(2024, 5, 7))]),
        ("on the 7th of May, 2022", [days(date(2022, 5, 7))]),
        ("What did Audrey eat on October 24, 2023?", [days(date(2023, 10, 24))]),
        ("the notes from 2024-02-29", [days(date(2024, 2, 29))]),
        ("yesterday", [days(date(2024, 11, 15))]),
        ("the day before yesterday", [days(date(2024, 11, 14))]),
        ("what did we decide today", [days(date(2024, 11, 16))]),
        ("three days ago", [days(date(2024, 11, 13))]),
        ("two months ago", [days(date(2024, 9, 2), date(2024, 10, 2))]),
        ("a couple of weeks ago", [days(date(2024, 10, 30), date(2024, 11, 5))]),
        ("last Saturday", [days(date(2024, 11, 9))]),
        ("on Wednesday", [days(date(2024, 11, 13))]),
        ("last weekend", [days(date(2024, 11, 9), date(2024, 11, 10))]),
        ("last week", [days(date(2024, 11, 4), date(2024, 11, 16))]),
        ("in the past three months", [days(date(2024, 8, 18), date(2024, 11, 16))]),
        ("last month", [days(date(2024, 10, 1), date(2024, 11, 16))]),
        ("in 2022", [days(date(2022, 1, 1), date(2022, 12, 31))]),
        (
            "the novels I finished in January and March",
            [days(date(2024, 1, 1), date(2024, 1, 31)), days(date(2024, 3, 1), date(2024, 3, 31))],
        ),
        ("from July to October", [days(date(2024, 7, 1), date(2024, 10, 31))]),
    ],
)
def test_time_expressions_become_windows_relative_to_the_query(
    query: str, expected: list[TimeWindow]
) -> None:
    assert parse_query(query, NOW).windows == expected


@pytest.mark.parametrize(
    "query",
    [
        "where do I live",
        "May I ask about the permit?",
        "I checked the logs and may I say, they look clean",
        "what did we discuss last time?",
        "have I been to Lisbon in the past?",
        "the march on the capital",
        "how many months ago did I start?",
        "31 February",
    ],
)
def test_a_query_without_a_date_has_no_window(query: str) -> None:
    parsed = parse_query(query, NOW)
    assert parsed.windows == []
    assert parsed.rest == query


def test_a_naive_query_time_is_utc() -> None:
    assert parse_query("yesterday", NOW.replace(tzinfo=None)) == parse_query("yesterday", NOW)


def test_the_time_expression_is_not_matched_by_keyword() -> None:
    assert parse_query("What did I say last March?", NOW).rest.split() == [
        "What",
        "did",
        "I",
        "say",
        "?",
    ]


def test_date_match_is_one_inside_and_falls_off_outside() -> None:
    march = days(date(2024, 3, 1), date(2024, 3, 31))
    inside = datetime(2024, 3, 15, tzinfo=UTC).timestamp()
    just_after = datetime(2024, 4, 3, tzinfo=UTC).timestamp()
    far = datetime(2024, 7, 1, tzinfo=UTC).timestamp()
    assert date_match(inside, [march]) == 1.0
    assert 0.0 < date_match(just_after, [march]) < 1.0
    assert date_match(far, [march]) == 0.0
    assert date_match(inside, []) == 0.0


# -- through the tier ------------------------------------------------------------------------


@pytest.fixture
def tier(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> SessionTier:
    return SessionTier(kv, index, embedder)


def save(tier: SessionTier, session_id: str, when: datetime, *lines: str) -> None:
    transcript = [
        Message(role="user" if n % 2 == 0 else "assistant", content=line)
        for n, line in enumerate(lines)
    ]
    tier.save_transcript("alice", session_id, transcript)
    tier.save_session(
        SessionSummary(
            session_id=session_id,
            user_id="alice",
            task_description=lines[0],
            work_completed=list(lines[1:]),
            created_at=when,
        )
    )


MONTHLY_TOPICS = [
    "I am planning a vegetable garden and want to know which seeds to order.",
    "Help me write a cover letter for a junior data analyst position.",
    "I keep getting a segmentation fault when my C program frees a list.",
    "Which running shoes are good for a first half marathon?",
    "Suggest a three-day itinerary for a city break in Vienna.",
    "My sourdough starter smells like nail polish remover, is it dead?",
    "Explain how compound interest works on a savings account.",
    "I want to learn the chords of a simple folk song on the guitar.",
    "What should I pack for a week of camping in the rain?",
    "How do I repot a monstera that has outgrown its pot?",
]


def test_a_named_month_finds_that_months_session_among_others(tier: SessionTier) -> None:
    for month, topic in enumerate(MONTHLY_TOPICS, start=1):
        save(tier, f"m{month:02d}", datetime(2024, month, 12, 18, 0, tzinfo=UTC), topic, "Sure.")
    hits = tier.recall_relevant("alice", "What did I say last March?", top_k=3, now=NOW)
    assert hits[0].summary.session_id == "m03"
    hits = tier.recall_relevant("alice", "what did we talk about on 12 June?", top_k=3, now=NOW)
    assert hits[0].summary.session_id == "m06"
    # Content still counts: the month only adds to it.
    hits = tier.recall_relevant("alice", "guitar chords I asked about", top_k=1, now=NOW)
    assert hits[0].summary.session_id == "m08"


def test_without_a_date_in_the_query_the_query_time_changes_nothing(tier: SessionTier) -> None:
    for month, topic in enumerate(MONTHLY_TOPICS[:5], start=1):
        save(tier, f"m{month:02d}", datetime(2024, month, 12, tzinfo=UTC), topic, "Sure.")
    query = "training for a long run"
    early = tier.recall_relevant("alice", query, top_k=5, now=datetime(2024, 1, 1, tzinfo=UTC))
    late = tier.recall_relevant("alice", query, top_k=5, now=NOW)
    assert [(h.summary.session_id, h.score) for h in early] == [
        (h.summary.session_id, h.score) for h in late
    ]


BERLIN = ("I live in Berlin, in a small flat near the canal.", "Noted: you live in Berlin.")
LISBON = (
    "I moved: I live in Lisbon now, in a small flat near the river.",
    "Noted: you live in Lisbon.",
)


@pytest.mark.parametrize(("older", "newer"), [("berlin", "lisbon"), ("lisbon", "berlin")])
@pytest.mark.parametrize(
    ("older_age", "newer_age"),
    [
        pytest.param(300, 60, id="months-apart"),
        # Both far older than the newest session: the decay is ~0 for both; their order counts.
        pytest.param(1200, 500, id="both-old"),
    ],
)
def test_the_newer_of_two_conflicting_statements_is_recalled_first(
    tier: SessionTier, older: str, newer: str, older_age: int, newer_age: int
) -> None:
    # The same two sessions either way round: only their dates decide which comes first.
    lines = {"berlin": BERLIN, "lisbon": LISBON}
    save(tier, older, NOW - timedelta(days=older_age), *lines[older])
    save(tier, "recipes", NOW - timedelta(days=older_age - 100), "A quick lentil soup?", "Ok.")
    save(tier, newer, NOW - timedelta(days=newer_age), *lines[newer])
    save(tier, "taxes", NOW - timedelta(days=10), "Help me file my tax return.", "Sure.")
    hits = tier.recall_relevant("alice", "where do I live", top_k=3, now=NOW)
    assert [h.summary.session_id for h in hits[:2]] == [newer, older]


def test_a_query_time_must_be_a_datetime(tier: SessionTier) -> None:
    save(tier, "s1", NOW, "Hello there.", "Hi.")
    with pytest.raises(InvalidInputError) as caught:
        tier.recall_relevant("alice", "hello", now="yesterday")  # type: ignore[arg-type]
    assert caught.value.field == "now"
