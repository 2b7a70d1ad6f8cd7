"""The continuation context puts the newer of two conflicting sessions first (issue 19 item 3)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from memory import Memory
from memory.context import SESSIONS_HEADER, assemble_context
from tiers.models import Message, SessionSummary

NOW = datetime.now(UTC)


def summary(session_id: str, days_ago: int, task: str) -> SessionSummary:
    return SessionSummary(
        session_id=session_id,
        user_id="u1",
        task_description=task,
        created_at=NOW - timedelta(days=days_ago),
    )


BERLIN = summary("berlin", 300, "I live in Berlin, in a small flat near the canal.")
LISBON = summary("lisbon", 60, "I moved: I live in Lisbon now, in a small flat near the river.")
TAXES = summary("taxes", 10, "Help me file my tax return.")


def test_sessions_are_shown_newest_first_whatever_their_relevance() -> None:
    context = assemble_context(
        "u1", facts=[], ranked_sessions=[BERLIN, LISBON], most_recent=TAXES, max_tokens=2000
    )
    text = context.text
    assert SESSIONS_HEADER in text
    assert "newest first" in SESSIONS_HEADER
    assert text.index("Session taxes") < text.index("Session lisbon") < text.index("Session berlin")
    assert context.sections[-1].items == ["taxes", "lisbon", "berlin"]


def test_where_do_i_live_shows_lisbon_before_berlin(tmp_path: Path) -> None:
    with Memory.open(tmp_path) as memory:
        for session in (BERLIN, LISBON, TAXES):
            memory.save_transcript(
                "u1",
                session.session_id,
                [Message(role="user", content=session.task_description)],
            )
            memory.save_session(session)
        hits = memory.recall_relevant("u1", "where do I live", top_k=3)
        ids = [hit.summary.session_id for hit in hits]
        assert ids.index("lisbon") < ids.index("berlin")
        text = memory.build_continuation_context("u1", "where do I live")
    assert "Lisbon" in text
    assert "Berlin" in text
    assert text.index("Lisbon") < text.index("Berlin")
