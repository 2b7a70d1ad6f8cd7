"""The offline default summarizer: rules over sentences, no model, deterministic.

Each message is split into sentences (code blocks dropped, abbreviations and
decimals kept whole), phatic filler ("Hi!", "Thanks so much!") is dropped, and
every remaining sentence goes to at most one list, first match wins:

1. a question (``?``) -> open question, if the other side never answered it;
2. an explicit uncertainty ("not sure", "TBD", "haven't decided") -> open question;
3. a decision cue ("we'll go with", "decided", "instead of") -> decisions made;
4. a past-tense action not under a modal ("I've issued", "was shipped") -> work completed;
5. a plan cue ("next", "tomorrow", "need to", "I'll") or an imperative -> next steps.

Each list is deduplicated, ranked (later sentences, and the user's questions,
weigh more) and capped; items keep transcript order and are the transcript's
own sentences, clipped to a length limit. Facts about the user come from
simple first-person patterns in the user's messages only.

Tool calls are work the assistant did: each becomes a work-completed
candidate ``Called tool NAME(ARGUMENTS) -> RESULT`` (clipped), ranked below
what the assistant itself said at the same point. Only chat messages are the
conversation: tool results, reasoning and other Responses-API items are not
split into sentences (see :mod:`summarizer.formats`).

Sentence splitting and the cue phrases are in :mod:`summarizer._sentences`,
fact extraction in :mod:`summarizer._facts`; the classification of sentences
into summary fields and the summarizer are here.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from summarizer._facts import _facts_in, extract_facts
from summarizer._sentences import (
    _DEFERRAL,
    _IMPERATIVE_START,
    _NEXT_STRONG,
    _NEXT_WEAK,
    _NOT_NEEDED,
    _UNCERTAIN,
    _USER_DONE,
    _clip,
    _completion_cue,
    _content_stems,
    _decision_cue,
    _is_question,
    _plain,
    _rx,
    _words,
    is_filler,
    split_sentences,
)
from summarizer.base import Summarization, parse_transcript
from summarizer.errors import InvalidSummarizerConfigError
from summarizer.formats import render_tool_use, tool_uses
from tiers.ids import check_id
from tiers.models import Message, SessionSummary, utcnow

__all__ = ["ExtractiveSummarizer", "extract_facts", "is_filler", "split_sentences"]


@dataclass(frozen=True, slots=True)
class _Sentence:
    text: str
    role: str
    message: int
    order: float  # position among the sentences; a tool call sits between two (x.5)


@dataclass(frozen=True, slots=True)
class _Candidate:
    sentence: _Sentence
    score: float


def _in_conversation(message: Message) -> bool:
    """A user or assistant chat turn with something said (not a call-only turn, not an item)."""
    return (
        message.role in ("user", "assistant")
        and message.item_type is None
        and (not message.tool_calls or bool(message.content.strip()))
    )


def _sentences(messages: Sequence[Message]) -> list[_Sentence]:
    out: list[_Sentence] = []
    for index, message in enumerate(messages):
        if not _in_conversation(message):
            continue  # system prompts, tool output, reasoning are not the conversation
        for text in split_sentences(message.content):
            out.append(_Sentence(text, message.role, index, len(out)))
    return out


@dataclass(frozen=True, slots=True)
class _Reply:
    """What a turn offers as an answer to the turn before it."""

    answers: bool  # has a statement and does not open by deferring ("not sure", "let me check")
    stems: frozenset[str]  # content words of its statements


class _Conversation:
    """Sentences grouped by turn, with each turn's reply, computed once per transcript."""

    def __init__(self, sentences: Sequence[_Sentence], messages: Sequence[Message]) -> None:
        self.said = [s for s in sentences if not is_filler(s.text)]
        self._by_message: dict[int, list[_Sentence]] = {}
        for sentence in self.said:
            self._by_message.setdefault(sentence.message, []).append(sentence)
        self._next_other: dict[int, int | None] = {}
        following: dict[str, int | None] = {"user": None, "assistant": None}
        for index in range(len(messages) - 1, -1, -1):
            role = messages[index].role
            # A turn that only called tools is not the other side's reply (its answer follows).
            if _in_conversation(messages[index]) and role in following:
                self._next_other[index] = following["assistant" if role == "user" else "user"]
                following[role] = index
        self._replies: dict[int, _Reply] = {}
        self._questions = {
            message: sum(_is_question(s.text) for s in said)
            for message, said in self._by_message.items()
        }

    def questions_in(self, message: int) -> int:
        return self._questions.get(message, 0)

    def answered(self, question: _Sentence, multi: bool) -> bool:
        """Whether the other side's next turn plausibly answers ``question``."""
        later = self._next_other.get(question.message)
        if later is None:
            return False
        reply = self._reply(later)
        if not reply.answers:
            return False
        if multi:
            # Several questions in one turn: count one answered only if the reply touches it.
            return bool(_content_stems(question.text) & reply.stems)
        return True

    def _reply(self, message: int) -> _Reply:
        if message not in self._replies:
            said = self._by_message.get(message, [])
            statements = [s.text for s in said if not _is_question(s.text)]
            answers = bool(statements) and not _DEFERRAL.search(_plain(said[0].text))
            stems = frozenset().union(*(_content_stems(text) for text in statements))
            self._replies[message] = _Reply(answers, stems)
        return self._replies[message]


@dataclass(frozen=True, slots=True)
class _Buckets:
    decisions: list[_Candidate]
    completed: list[_Candidate]
    questions: list[_Candidate]
    next_steps: list[_Candidate]


def _classify(sentences: Sequence[_Sentence], messages: Sequence[Message]) -> _Buckets:
    buckets = _Buckets([], [], [], [])
    total = max(len(sentences) - 1, 1)
    conversation = _Conversation(sentences, messages)
    for sentence in conversation.said:
        text = _plain(sentence.text)
        late = sentence.order / total
        is_user = sentence.role == "user"
        if _is_question(text):
            multi = conversation.questions_in(sentence.message) > 1
            # Two content words at least: "How about you?" asks nothing worth keeping.
            if len(_content_stems(text)) >= 2 and not conversation.answered(sentence, multi):
                buckets.questions.append(_Candidate(sentence, late + (0.5 if is_user else 0.0)))
        elif _UNCERTAIN.search(text):
            buckets.questions.append(_Candidate(sentence, late + 0.75))
        elif _decision_cue(text):
            buckets.decisions.append(_Candidate(sentence, late))
        elif _is_completion(text, is_user):
            buckets.completed.append(_Candidate(sentence, late + (0.0 if is_user else 0.5)))
        elif is_user and _facts_in(text):
            continue  # the user describing themselves: a fact, not a plan
        elif _NEXT_STRONG.search(text) and not _NOT_NEEDED.search(text):
            buckets.next_steps.append(_Candidate(sentence, 1.0 + 1.5 * late))
        elif late >= _WEAK_PLAN_FROM and (
            _IMPERATIVE_START.search(text) or _NEXT_WEAK.search(text)
        ):
            buckets.next_steps.append(_Candidate(sentence, 1.5 * late))
    return buckets


def _tool_candidates(
    messages: Sequence[Message], sentences: Sequence[_Sentence], max_chars: int
) -> list[_Candidate]:
    """Each tool call (with its result) as a work-completed candidate, placed where it was made.

    It ranks like an assistant statement at the same point less 0.5: what the
    assistant said it did comes first, and a long run of calls cannot crowd
    out the conversation.
    """
    uses = [use for use in tool_uses(messages) if use.call is not None]
    if not uses:
        return []
    total = max(len(sentences) - 1, 1)
    starts = [sentence.message for sentence in sentences]
    # Room for the arguments and the result within one item, the result getting the larger share.
    arguments, result = max_chars // 3, max_chars // 2
    out = []
    for use in uses:
        order = bisect.bisect_right(starts, use.message) - 0.5
        line = render_tool_use(use, max_arguments=arguments, max_result=result)
        text = line[0].upper() + line[1:]
        out.append(
            _Candidate(_Sentence(text, "assistant", use.message, order), max(order, 0) / total)
        )
    return out


# Imperatives and plain future tense count as next steps only in the last part of a session:
# earlier ones were usually carried out within it.
_WEAK_PLAN_FROM = 0.6


def _is_completion(text: str, is_user: bool) -> bool:
    if _NEXT_STRONG.match(text) or _IMPERATIVE_START.match(text) or not _completion_cue(text):
        return False
    return not is_user or bool(_USER_DONE.search(text))


def _near_duplicate(a: str, b: str) -> bool:
    words_a, words_b = set(_words(a)), set(_words(b))
    if not words_a or not words_b:
        return words_a == words_b
    overlap = len(words_a & words_b)
    if overlap / len(words_a | words_b) >= 0.8:
        return True
    smaller = min(len(words_a), len(words_b))
    return smaller >= 4 and overlap == smaller


def _select(candidates: Iterable[_Candidate], max_items: int, max_chars: int) -> list[str]:
    kept: list[_Candidate] = []
    for candidate in candidates:
        for position, existing in enumerate(kept):
            if _near_duplicate(candidate.sentence.text, existing.sentence.text):
                # Keep the fuller wording, at the better score, in the earlier slot.
                longer = max((existing, candidate), key=lambda c: len(c.sentence.text)).sentence
                kept[position] = _Candidate(longer, max(existing.score, candidate.score))
                break
        else:
            kept.append(candidate)
    best = sorted(kept, key=lambda c: (-c.score, c.sentence.order))[:max_items]
    return [_clip(c.sentence.text, max_chars) for c in sorted(best, key=lambda c: c.sentence.order)]


_REQUEST = _rx(
    r"\b(?:i need|i want|i'd like|i would like|i'm trying|i am trying|i'm looking|"
    r"i am looking|can you|could you|would you|will you|help me|please|how do i|how can i|"
    r"how should i|what's the best|what is the best|is it possible|i have a|i've got a|"
    r"i'm planning|i am planning|we're planning|i'm getting|my [a-z]+ (?:is|isn't|won't|keeps))\b"
)


def _task_description(sentences: Sequence[_Sentence], max_chars: int) -> str:
    said = [s for s in sentences if not is_filler(s.text)]
    substantive = [s for s in said if len(_words(s.text)) >= 4] or said or list(sentences)
    if not substantive:
        return ""
    pool = [s for s in substantive if s.role == "user"] or substantive
    # The asker's first turns: a greeting turn often comes before the real request.
    window = [s for s in pool if s.message <= pool[0].message + 2][:6]
    request = next((s for s in window if _REQUEST.search(_plain(s.text))), None)
    if request is None:
        chosen = window[:2]
    else:
        # The request with one sentence of context from its own message ("Any ideas?" counts).
        own = [s for s in said if s.message == request.message] or [request]
        index = own.index(request) if request in own else 0
        chosen = own[index - 1 : index + 1] if index > 0 else own[:2]
    text = " ".join(s.text for s in chosen)
    if len(text) > max_chars and len(chosen) > 1:
        text = (request or chosen[0]).text
    return _clip(text, max_chars)


class ExtractiveSummarizer:
    """Rule-based summarizer: no model, no network, same input -> same output.

    Args:
        max_items: Cap of each summary list.
        max_item_chars: Longer sentences are clipped (with "…") to this many characters.
        max_task_chars: Cap of ``task_description``.
        max_facts: Cap of fact candidates.

    Raises:
        InvalidSummarizerConfigError: A cap is out of range (also a ``ValueError``).
    """

    name = "extractive"

    def __init__(
        self,
        *,
        max_items: int = 8,
        max_item_chars: int = 300,
        max_task_chars: int = 300,
        max_facts: int = 12,
    ) -> None:
        if min(max_items, max_facts) < 0 or min(max_item_chars, max_task_chars) < 20:
            raise InvalidSummarizerConfigError(
                "max_items and max_facts must be >= 0, max_item_chars and max_task_chars >= 20"
            )
        self.max_items = max_items
        self.max_item_chars = max_item_chars
        self.max_task_chars = max_task_chars
        self.max_facts = max_facts

    def summarize(
        self,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        user_id: str,
        session_id: str,
        created_at: datetime | None = None,
    ) -> Summarization:
        """Summarize one session with rules (see the module docstring).

        Args:
            transcript: The session's messages, oldest first.
            user_id: Owner of the session.
            session_id: The session.
            created_at: Timestamp of the summary; defaults to now (UTC).

        Returns:
            The summary and fact candidates; ``usage`` is ``None``.

        Raises:
            InvalidTranscriptError: The transcript is empty or malformed.
            tiers.errors.InvalidInputError: ``user_id`` or ``session_id`` is not a valid id.
        """
        messages = parse_transcript(transcript)
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        sentences = _sentences(messages)
        buckets = _classify(sentences, messages)
        limit, chars = self.max_items, self.max_item_chars
        summary = SessionSummary(
            session_id=session_id,
            user_id=user_id,
            task_description=_task_description(sentences, self.max_task_chars),
            decisions_made=_select(buckets.decisions, limit, chars),
            work_completed=_select(
                buckets.completed + _tool_candidates(messages, sentences, chars), limit, chars
            ),
            open_questions=_select(buckets.questions, limit, chars),
            next_recommended_steps=_select(buckets.next_steps, limit, chars),
            created_at=created_at or utcnow(),
        )
        return Summarization(summary=summary, facts=extract_facts(messages, self.max_facts))
