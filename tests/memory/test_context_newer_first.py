"""The continuation context puts the newer of two conflicting sessions first (issue 19 item 3)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memory.context import SESSIONS_HEADER, assemble_context
from tiers.models import SessionSummary

NOW = datetime.now(UTC)


def summary(session_id: str, days_ago: int, task: str) -> SessionSummary:
    return SessionSummary(
        session_id=session_id,
        user_id="u1",
        task_description=task,
        created_at=NOW - timedelta(days=days_ago),
    )


BERLIN = summary("berlin", 300, "I live in Berlin, in a small flat in Kreuzberg.")
LISBON = summary("lisbon", 60, "I moved to Lisbon, I live in a flat in Alfama now.")
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
