"""Continuation context: what an agent should know at the start of a new session.

The context holds the user's standing facts and the earlier sessions most
relevant to the new session's query, always including the most recent one.
It fits a token budget by leaving out whole summaries, least relevant first,
never by cutting one in half.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from summarizer.tokens import count_tokens
from tiers.errors import InvalidInputError
from tiers.models import SessionSummary, UserFact

FACTS_HEADER = "## What I know about this user"
SESSIONS_HEADER = "## Earlier sessions (oldest first)"
# Facts are compact and always useful, but must not crowd out every session.
FACTS_SHARE = 0.4


class ContextSection(BaseModel):
    """One part of a continuation context and what it cost."""

    model_config = ConfigDict(frozen=True)

    name: str
    text: str
    tokens: int
    items: list[str]


class ContinuationContext(BaseModel):
    """A prompt-ready context and how it was assembled."""

    model_config = ConfigDict(frozen=True)

    user_id: str
    text: str
    tokens: int
    max_tokens: int
    sections: list[ContextSection]
    omitted_session_ids: list[str]
    omitted_fact_keys: list[str]

    def __str__(self) -> str:
        return self.text


# Texts up to this many characters have their token counts memoised (about 32 MB at most).
_MEMO_CHARS = 16_384
_MEMO_ENTRIES = 2048


@functools.lru_cache(maxsize=_MEMO_ENTRIES)
def _memo_count(text: str, encoding: str) -> int:
    return count_tokens(text, encoding)


def _count(text: str, encoding: str) -> int:
    """Tokens of ``text``; memoised by the exact text for texts of moderate size.

    A user's facts and summaries are counted again on every context of that
    user, and counting costs about 0.1 us per character. The count is a pure
    function of the text, so the memo can never be stale.
    """
    if len(text) > _MEMO_CHARS:
        return count_tokens(text, encoding)
    return _memo_count(text, encoding)


def render_fact(fact: UserFact) -> str:
    """One line for a fact: ``- key: value``."""
    value = fact.value if isinstance(fact.value, str) else json.dumps(fact.value, sort_keys=True)
    return f"- {fact.key}: {value}"


def assemble_context(
    user_id: str,
    *,
    facts: Sequence[UserFact],
    ranked_sessions: Sequence[SessionSummary],
    most_recent: SessionSummary | None,
    max_tokens: int,
    encoding: str = "cl100k_base",
) -> ContinuationContext:
    """Build a :class:`ContinuationContext` that never exceeds ``max_tokens``.

    Args:
        user_id: Whose context this is.
        facts: The user's facts; the most recently updated are kept first.
        ranked_sessions: Recalled sessions, most relevant first.
        most_recent: The user's latest session, included before any other.
        max_tokens: Budget of the whole rendered text.
        encoding: tiktoken encoding used to count.

    Raises:
        InvalidInputError: ``max_tokens`` is not positive.
    """
    if max_tokens <= 0:
        raise InvalidInputError("max_tokens must be positive", field="max_tokens")

    def cost(text: str) -> int:
        return _count(text, encoding)

    # Pieces are counted once each and summed (+1 per joining newline as slack); the
    # final text is then counted exactly and trimmed if the estimate was ever short.
    fact_lines: list[str] = []
    fact_keys: list[str] = []
    omitted_facts: list[str] = []
    facts_budget = int(max_tokens * FACTS_SHARE)
    used = cost(FACTS_HEADER)
    for fact in sorted(facts, key=lambda f: f.updated_at, reverse=True):
        line = render_fact(fact)
        line_cost = cost(line) + 1
        if used + line_cost <= facts_budget:
            fact_lines.append(line)
            fact_keys.append(fact.key)
            used += line_cost
        else:
            omitted_facts.append(fact.key)
    facts_text = "\n".join([FACTS_HEADER, *fact_lines]) if fact_lines else ""

    # Sessions: most recent first, then by relevance; each kept whole or not at all.
    candidates: list[SessionSummary] = []
    seen: set[str] = set()
    for summary in ([most_recent] if most_recent else []) + list(ranked_sessions):
        if summary.session_id not in seen:
            seen.add(summary.session_id)
            candidates.append(summary)
    # Each summary is rendered once here (rendering is as costly as counting).
    rendered = {summary.session_id: summary.render() for summary in candidates}
    chosen: list[SessionSummary] = []
    omitted_sessions: list[str] = []
    total = (cost(facts_text) + 2 if facts_text else 0) + cost(SESSIONS_HEADER) + 2
    for summary in candidates:
        summary_cost = cost(rendered[summary.session_id]) + 2
        if total + summary_cost <= max_tokens:
            chosen.append(summary)
            total += summary_cost
        else:
            omitted_sessions.append(summary.session_id)
    sessions_text = _sessions_text(chosen, rendered)
    text = _join(facts_text, sessions_text)
    while chosen and cost(text) > max_tokens:
        omitted_sessions.append(chosen.pop().session_id)
        sessions_text = _sessions_text(chosen, rendered)
        text = _join(facts_text, sessions_text)
    while fact_lines and cost(text) > max_tokens:
        fact_lines.pop()
        omitted_facts.append(fact_keys.pop())
        facts_text = "\n".join([FACTS_HEADER, *fact_lines]) if fact_lines else ""
        text = _join(facts_text, sessions_text)

    sections = []
    if facts_text:
        sections.append(
            ContextSection(
                name="user_facts", text=facts_text, tokens=cost(facts_text), items=fact_keys
            )
        )
    if chosen:
        sections.append(
            ContextSection(
                name="sessions",
                text=sessions_text,
                tokens=cost(sessions_text),
                items=[s.session_id for s in _chronological(chosen)],
            )
        )
    return ContinuationContext(
        user_id=user_id,
        text=text,
        tokens=cost(text),
        max_tokens=max_tokens,
        sections=sections,
        omitted_session_ids=omitted_sessions,
        omitted_fact_keys=omitted_facts,
    )


def _chronological(summaries: Sequence[SessionSummary]) -> list[SessionSummary]:
    return sorted(summaries, key=lambda s: (s.created_at, s.session_id))


def _sessions_text(summaries: Sequence[SessionSummary], rendered: dict[str, str]) -> str:
    """The sessions section ("" without sessions); ``rendered`` maps session id to its text."""
    if not summaries:
        return ""
    return "\n\n".join(
        [SESSIONS_HEADER, *(rendered[s.session_id] for s in _chronological(summaries))]
    )


def _join(facts_text: str, sessions_text: str) -> str:
    return "\n\n".join(part for part in (facts_text, sessions_text) if part)
