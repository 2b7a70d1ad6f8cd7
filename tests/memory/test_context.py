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
    n = draw(st.integers(0, 6))
    return [
        SessionSummary(
            session_id=f"s{i}",
            user_id="u",
            task_description=draw(text),
            decisions_made=draw(items),
            work_completed=draw(items),
            created_at=NOW - timedelta(days=draw(st.integers(0, 50))),
        )
        for i in range(n)
    ]


@st.composite
def facts(draw: st.DrawFn) -> list[UserFact]:
    n = draw(st.integers(0, 8))
    return [
        UserFact(user_id="u", key=f"k{i}", value=draw(text), updated_at=NOW - timedelta(hours=i))
        for i in range(n)
    ]


@settings(max_examples=150, deadline=None)
@given(ranked=summaries(), user_facts=facts(), budget=st.integers(1, 400))
def test_context_never_exceeds_budget_and_keeps_summaries_whole(
    ranked: list[SessionSummary], user_facts: list[UserFact], budget: int
) -> None:
    latest = max(ranked, key=lambda s: s.created_at) if ranked else None
    context = assemble_context(
        "u", facts=user_facts, ranked_sessions=ranked, most_recent=latest, max_tokens=budget
    )
    assert context.tokens == count_tokens(context.text) <= budget
    kept = [s for s in ranked if s.render() in context.text]
    kept_ids = {s.session_id for s in kept}
    assert kept_ids | set(context.omitted_session_ids) == {s.session_id for s in ranked}
    assert not kept_ids & set(context.omitted_session_ids)
    if latest is not None:
        alone = assemble_context(
            "u", facts=user_facts, ranked_sessions=[], most_recent=latest, max_tokens=budget
        )
        if not alone.omitted_session_ids:
            assert latest.session_id in kept_ids  # the most recent is taken first


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
