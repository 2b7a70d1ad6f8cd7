"""Continuation context: what an agent should know at the start of a new session.

The context holds the user's standing facts and the earlier sessions most
relevant to the new session's query, always including the most recent one.
It fits a token budget by leaving out whole summaries, least relevant first,
never by cutting one in half.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from summarizer.tokens import count_tokens
from tiers.errors import InvalidInputError
from tiers.memo import TextMemo
from tiers.models import SessionSummary, UserFact

FACTS_HEADER = "## What I know about this user"
# Newest first: of two sessions that disagree ("I live in Berlin", later "I moved to
# Lisbon"), the one that still holds is read first; each session shows its date.
SESSIONS_HEADER = "## Earlier sessions (newest first)"
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


# Each text's count is kept by the text's digest, never the text (tiers.memo): a forgotten
# user's words do not stay in the process.
_COUNTS: TextMemo[int] = TextMemo(count_tokens, entries=2048)


def _count(text: str, encoding: str) -> int:
    """Tokens of ``text``; memoised by the text's digest.

    A user's facts and summaries are counted again on every context of that
    user, and counting costs about 0.1 us per character (a digest about 1 ns).
    The count is a pure function of the text, so the memo can never be stale.
    """
    return _COUNTS(text, encoding)


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

    ranked = _without_duplicates(ranked_sessions, most_recent)
    # Each summary is rendered once here (rendering is as costly as counting).
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

    facts_budget = min(int(max_tokens * FACTS_SHARE), max_tokens - latest_cost - 2)
    draft = _Draft(rendered=rendered, latest=most_recent if latest_cost else None)
    _fit_facts(draft, facts, facts_budget, cost)
    facts_text = draft.facts_text()
    used = (cost(facts_text) + 2 if facts_text else 0) + (latest_cost or header_cost)
    _fit_sessions(draft, ranked, used, max_tokens, cost)

    text = draft.text()
    while cost(text) > max_tokens and draft.drop_one():
        text = draft.text()

    kept = {s.session_id for s in draft.chosen()}
    return ContinuationContext(
        user_id=user_id,
        text=text,
        tokens=cost(text),
        max_tokens=max_tokens,
        sections=_sections(draft, cost),
        # Most recent first, then by relevance: the order in which they were considered.
        omitted_session_ids=[sid for sid in rendered if sid not in kept],
        omitted_fact_keys=draft.omitted_facts,
    )


@dataclass
class _Draft:
    """The pieces of a context chosen so far, trimmed one at a time until the exact count fits.

    Attributes:
        rendered: Session id -> rendered summary, for every session considered.
        latest: The most recent session, while it is kept.
        others: The other kept sessions, most relevant first.
        fact_lines: Kept fact lines, most recently updated first.
        fact_keys: Their keys, in the same order.
        omitted_facts: Keys of the facts left out, in the order they were left out.
    """

    rendered: dict[str, str]
    latest: SessionSummary | None
    others: list[SessionSummary] = field(default_factory=list)
    fact_lines: list[str] = field(default_factory=list)
    fact_keys: list[str] = field(default_factory=list)
    omitted_facts: list[str] = field(default_factory=list)

    def chosen(self) -> list[SessionSummary]:
        return [*([self.latest] if self.latest else []), *self.others]

    def facts_text(self) -> str:
        return "\n".join([FACTS_HEADER, *self.fact_lines]) if self.fact_lines else ""

    def sessions_text(self) -> str:
        return _sessions_text(self.chosen(), self.rendered)

    def text(self) -> str:
        return _join(self.facts_text(), self.sessions_text())

    def drop_one(self) -> bool:
        """Leave out the least relevant session, else the oldest fact, else the latest session.

        Returns:
            False when nothing was left to leave out.
        """
        if self.others:
            self.others.pop()
        elif self.fact_lines:
            self.fact_lines.pop()
            self.omitted_facts.append(self.fact_keys.pop())
        elif self.latest:
            self.latest = None
        else:
            return False
        return True


def _without_duplicates(
    ranked_sessions: Sequence[SessionSummary], most_recent: SessionSummary | None
) -> list[SessionSummary]:
    """``ranked_sessions`` in order, each once, without the most recent session."""
    ranked: list[SessionSummary] = []
    seen: set[str] = {most_recent.session_id} if most_recent else set()
    for summary in ranked_sessions:
        if summary.session_id not in seen:
            seen.add(summary.session_id)
            ranked.append(summary)
    return ranked


def _fit_facts(
    draft: _Draft, facts: Sequence[UserFact], budget: int, cost: Callable[[str], int]
) -> None:
    """Keep the most recently updated facts whose lines fit ``budget`` (header included)."""
    used = cost(FACTS_HEADER)
    for fact in sorted(facts, key=lambda f: f.updated_at, reverse=True):
        line = render_fact(fact)
        line_cost = cost(line) + 1
        if used + line_cost <= budget:
            draft.fact_lines.append(line)
            draft.fact_keys.append(fact.key)
            used += line_cost
        else:
            draft.omitted_facts.append(fact.key)


def _fit_sessions(
    draft: _Draft,
    ranked: Sequence[SessionSummary],
    used: int,
    max_tokens: int,
    cost: Callable[[str], int],
) -> None:
    """Keep the most relevant sessions while they fit after ``used`` tokens."""
    total = used
    for summary in ranked:
        summary_cost = cost(draft.rendered[summary.session_id]) + 2
        if total + summary_cost > max_tokens:
            break  # this one and every less relevant one: never keep a less relevant one instead
        draft.others.append(summary)
        total += summary_cost


def _sections(draft: _Draft, cost: Callable[[str], int]) -> list[ContextSection]:
    sections = []
    facts_text = draft.facts_text()
    if facts_text:
        sections.append(
            ContextSection(
                name="user_facts", text=facts_text, tokens=cost(facts_text), items=draft.fact_keys
            )
        )
    chosen = draft.chosen()
    if chosen:
        sessions_text = draft.sessions_text()
        sections.append(
            ContextSection(
                name="sessions",
                text=sessions_text,
                tokens=cost(sessions_text),
                items=[s.session_id for s in _newest_first(chosen)],
            )
        )
    return sections


def _newest_first(summaries: Sequence[SessionSummary]) -> list[SessionSummary]:
    return sorted(summaries, key=lambda s: (s.created_at, s.session_id), reverse=True)


def _sessions_text(summaries: Sequence[SessionSummary], rendered: dict[str, str]) -> str:
    """The sessions section ("" without sessions); ``rendered`` maps session id to its text."""
    if not summaries:
        return ""
    return "\n\n".join(
        [SESSIONS_HEADER, *(rendered[s.session_id] for s in _newest_first(summaries))]
    )


def _join(facts_text: str, sessions_text: str) -> str:
    return "\n\n".join(part for part in (facts_text, sessions_text) if part)
