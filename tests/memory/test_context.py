"""Continuation-context assembly: budget, whole summaries, latest first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from memory.context import assemble_context
from summarizer.tokens import count_tokens
from tiers.models import SessionSummary, UserFact

NOW = datetime(2026, 1, 1, tzinfo=UTC)
text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=80)
items = st.lists(text.map(lambda t: t.strip() or "x"), max_size=4)


@st.composite
def summaries(draw: st.DrawFn) -> list[SessionSummary]:
    """Sessions in a random relevance order (not by date), some with long texts."""
    n = draw(st.integers(0, 6))
    return [
        SessionSummary(
            session_id=f"s{i}",
            user_id="u",
            task_description=draw(text) * draw(st.integers(1, 6)),
            decisions_made=draw(items),
            work_completed=draw(items),
            created_at=NOW - timedelta(days=draw(st.integers(0, 50))),
        )
        for i in range(n)
    ]


@st.composite
def facts(draw: st.DrawFn) -> list[UserFact]:
    """Up to 30 facts: enough to fill the facts' share of a small budget."""
    n = draw(st.integers(0, 30))
    return [
        UserFact(user_id="u", key=f"k{i}", value=draw(text), updated_at=NOW - timedelta(hours=i))
        for i in range(n)
    ]


@st.composite
def latest_sessions(draw: st.DrawFn) -> SessionSummary | None:
    """The most recent session: absent, short, or long (it may or may not be recalled too)."""
    if draw(st.booleans()):
        return None
    return SessionSummary(
        session_id="latest",
        user_id="u",
        task_description=draw(text) * draw(st.integers(1, 20)),
        next_recommended_steps=draw(items),
        created_at=NOW + timedelta(days=1),
    )


@settings(max_examples=300, deadline=None)
@given(
    ranked=summaries(),
    user_facts=facts(),
    latest=latest_sessions(),
    latest_recalled=st.booleans(),
    budget=st.integers(1, 400),
)
def test_context_never_exceeds_budget_keeps_latest_and_drops_least_relevant_first(
    ranked: list[SessionSummary],
    user_facts: list[UserFact],
    latest: SessionSummary | None,
    latest_recalled: bool,
    budget: int,
) -> None:
    if latest is not None and latest_recalled:
        ranked = [*ranked[:1], latest, *ranked[1:]]  # recall found it too: counted once
    context = assemble_context(
        "u", facts=user_facts, ranked_sessions=ranked, most_recent=latest, max_tokens=budget
    )
    assert context.tokens == count_tokens(context.text) <= budget
    everyone = {s.session_id: s for s in [*([latest] if latest else []), *ranked]}
    kept_ids = {sid for sid, s in everyone.items() if s.render() in context.text}
    omitted = context.omitted_session_ids
    # Whole summaries only, each either kept or omitted, never both, never twice.
    assert kept_ids | set(omitted) == set(everyone)
    assert not kept_ids & set(omitted)
    assert len(omitted) == len(set(omitted))
    if context.sections and context.sections[-1].name == "sessions":
        assert set(context.sections[-1].items) == kept_ids
    # The most recent session is kept whenever it fits the budget on its own, whatever
    # the facts and the other sessions.
    if latest is not None:
        alone = assemble_context(
            "u", facts=[], ranked_sessions=[], most_recent=latest, max_tokens=budget
        )
        if not alone.omitted_session_ids:
            assert latest.session_id in kept_ids
    # The others are dropped least relevant first: what is kept is a prefix of the ranking.
    others = [s.session_id for s in ranked if latest is None or s.session_id != latest.session_id]
    others = list(dict.fromkeys(others))
    flags = [sid in kept_ids for sid in others]
    assert flags == sorted(flags, reverse=True), (others, kept_ids)


def test_the_latest_session_is_kept_over_facts_and_older_sessions() -> None:
    # The audit's case: facts used to take their share first and the latest session, which
    # fits the budget on its own, was dropped while an older, less relevant one was kept.
    latest = SessionSummary(
        session_id="latest",
        user_id="u",
        task_description="deploy the new billing pipeline " * 20,
        created_at=NOW,
    )
    old = SessionSummary(
        session_id="old", user_id="u", task_description="x", created_at=NOW - timedelta(days=3)
    )
    user_facts = [
        UserFact(user_id="u", key=f"k{i}", value=f"v{i}", updated_at=NOW - timedelta(hours=i))
        for i in range(30)
    ]
    context = assemble_context(
        "u", facts=user_facts, ranked_sessions=[old], most_recent=latest, max_tokens=200
    )
    assert context.tokens <= 200
    assert latest.render() in context.text
    assert "latest" not in context.omitted_session_ids
    assert context.omitted_fact_keys  # the facts made room for it


def test_a_less_relevant_small_session_is_not_kept_over_a_more_relevant_one() -> None:
    big = SessionSummary(session_id="relevant", user_id="u", task_description="topic " * 120)
    small = SessionSummary(session_id="marginal", user_id="u", task_description="other")
    context = assemble_context(
        "u", facts=[], ranked_sessions=[big, small], most_recent=None, max_tokens=60
    )
    assert context.omitted_session_ids == ["relevant", "marginal"]
    assert context.text == ""


def test_least_relevant_is_dropped_first() -> None:
    ranked = [
        SessionSummary(session_id=f"s{i}", user_id="u", task_description=f"topic {i} " * 20)
        for i in range(4)
    ]
    roomy = assemble_context(
        "u", facts=[], ranked_sessions=ranked, most_recent=None, max_tokens=5000
    )
    assert roomy.omitted_session_ids == []
    tight = assemble_context(
        "u", facts=[], ranked_sessions=ranked, most_recent=None, max_tokens=roomy.tokens - 5
    )
    assert tight.omitted_session_ids == ["s3"]
