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


def check_budget(max_tokens: object) -> int:
    """``max_tokens`` if it is a positive integer (not a bool, float or string).

    Raises:
        InvalidInputError: Anything else; ``field`` is ``max_tokens``.
    """
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
        raise InvalidInputError(
            f"max_tokens must be a positive integer, got {max_tokens!r}", field="max_tokens"
        )
    return max_tokens


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

    What is kept, in order of precedence:

    1. The most recent session, whenever it fits the budget on its own (with
       the sessions header): facts are cut to make room for it.
    2. Facts, most recently updated first, within ``FACTS_SHARE`` of the
       budget and within what the most recent session leaves.
    3. The other sessions by relevance (``ranked_sessions`` order, duplicates
       and the most recent one removed), each whole: they are kept while they
       fit, and the first one that does not fit is left out together with
       every less relevant one. So the kept sessions are always the most
       relevant ones: a less relevant summary is never kept in place of a
       more relevant one that was left out, even when it is smaller.

    If the final exact count is over budget (the pieces are estimated), the
    least relevant kept session goes first, then facts (oldest first), the
    most recent session last.

    Args:
        user_id: Whose context this is.
        facts: The user's facts; the most recently updated are kept first.
        ranked_sessions: Recalled sessions, most relevant first.
        most_recent: The user's latest session, included before any other.
        max_tokens: Budget of the whole rendered text.
        encoding: tiktoken encoding used to count.

    Raises:
        InvalidInputError: ``max_tokens`` is not a positive integer.
    """
    check_budget(max_tokens)

    def cost(text: str) -> int:
        return _count(text, encoding)

    # Each summary is rendered once here (rendering is as costly as counting).
    ranked: list[SessionSummary] = []
    seen: set[str] = {most_recent.session_id} if most_recent else set()
    for summary in ranked_sessions:
        if summary.session_id not in seen:
            seen.add(summary.session_id)
            ranked.append(summary)
    rendered = {
        summary.session_id: summary.render()
        for summary in ([most_recent] if most_recent else []) + ranked
    }

    # Pieces are counted once each and summed (+1 per joining newline as slack, +2 per
    # blank line); the final text is then counted exactly and trimmed if ever short.
    header_cost = cost(SESSIONS_HEADER) + 2
    latest_cost = 0
    if most_recent is not None:
        alone = header_cost + cost(rendered[most_recent.session_id]) + 2
        if alone <= max_tokens:
            latest_cost = alone

    fact_lines: list[str] = []
    fact_keys: list[str] = []
    omitted_facts: list[str] = []
    facts_budget = min(int(max_tokens * FACTS_SHARE), max_tokens - latest_cost - 2)
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

    latest: SessionSummary | None = most_recent if latest_cost else None
    others: list[SessionSummary] = []
    total = (cost(facts_text) + 2 if facts_text else 0) + (latest_cost or header_cost)
    for summary in ranked:
        summary_cost = cost(rendered[summary.session_id]) + 2
        if total + summary_cost > max_tokens:
            break  # this one and every less relevant one: never keep a less relevant one instead
        others.append(summary)
        total += summary_cost

    def sessions_text() -> str:
        return _sessions_text([*([latest] if latest else []), *others], rendered)

    text = _join(facts_text, sessions_text())
    while cost(text) > max_tokens and (others or fact_lines or latest):
        if others:
            others.pop()
        elif fact_lines:
            fact_lines.pop()
            omitted_facts.append(fact_keys.pop())
            facts_text = "\n".join([FACTS_HEADER, *fact_lines]) if fact_lines else ""
        else:
            latest = None
        text = _join(facts_text, sessions_text())

    chosen = [*([latest] if latest else []), *others]
    kept = {s.session_id for s in chosen}
    # Most recent first, then by relevance: the order in which they were considered.
    omitted_sessions = [sid for sid in rendered if sid not in kept]
    sections = []
    if facts_text:
        sections.append(
            ContextSection(
                name="user_facts", text=facts_text, tokens=cost(facts_text), items=fact_keys
            )
        )
    if chosen:
        final_sessions = sessions_text()
        sections.append(
            ContextSection(
                name="sessions",
                text=final_sessions,
                tokens=cost(final_sessions),
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
