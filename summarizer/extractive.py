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
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from summarizer.base import Summarization, parse_transcript
from summarizer.errors import InvalidSummarizerConfigError
from summarizer.formats import render_tool_use, tool_uses
from tiers.ids import ID_PATTERN, check_id
from tiers.models import FactCandidate, Message, SessionSummary, utcnow

# --------------------------------------------------------------------------- sentences

_CODE_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d{1,3}[.)]|#{1,6})\s+")
_BOUNDARY = re.compile(r"([.!?…]+)([\"'”’)\]]*)\s+")
_ABBREVIATIONS: frozenset[str] = frozenset().union(
    ("mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "al", "approx"),
    ("appt", "apt", "dept", "inc", "ltd", "co", "corp", "eg", "ie", "e.g", "i.e", "a.m"),
    ("p.m", "u.s", "u.k", "jan", "feb", "apr", "jun", "jul", "aug", "sep", "sept", "oct"),
    ("nov", "dec", "mon", "tue", "wed", "thu", "fri", "min", "max", "avg", "ave", "blvd"),
    ("rd", "hwy"),
)
# Abbreviations only when a number follows ("No. 5"); "I said no. Then" ends a sentence.
_NUMBERED = frozenset(["no", "nos", "vol", "fig", "p", "pp", "ch", "sec"])


def split_sentences(text: str) -> list[str]:
    """Split chat text into sentences, whitespace-normalised.

    Fenced code blocks are dropped; blank lines and list bullets end a
    sentence; other line breaks are read as spaces. A period after a known
    abbreviation ("Dr.", "e.g."), an initial ("J.") or before a lowercase word
    does not end a sentence, and decimals ("3.5") never do.
    """
    text = _CODE_FENCE.sub("\n\n", text)
    blocks: list[list[str]] = []
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line:
            blocks.append([])
            continue
        if _BULLET.match(line) or not blocks:
            blocks.append([])
        blocks[-1].append(_BULLET.sub("", line))
    sentences: list[str] = []
    for block in blocks:
        paragraph = " ".join(" ".join(block).split())
        if paragraph:
            sentences.extend(_split_paragraph(paragraph))
    return sentences


def _split_paragraph(paragraph: str) -> list[str]:
    out: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(paragraph):
        end = match.end()
        if end >= len(paragraph) or not _ends_sentence(paragraph, match):
            continue
        piece = paragraph[start : match.start() + len(match.group(1)) + len(match.group(2))]
        if piece.strip():
            out.append(piece.strip())
        start = end
    tail = paragraph[start:].strip()
    if tail:
        out.append(tail)
    return out


def _ends_sentence(paragraph: str, match: re.Match[str]) -> bool:
    following = paragraph[match.end()]
    if following.islower():
        return False
    if match.group(1) != ".":
        return True
    before = paragraph[: match.start()].rsplit(None, 1)
    word = before[-1].lstrip("([\"'").lower() if before else ""
    if word in _ABBREVIATIONS or (word in _NUMBERED and following.isdigit()):
        return False
    # A single capital letter before the period is an initial ("J. R. R. Tolkien").
    return not (len(word) == 1 and word.isalpha() and paragraph[match.start() - 1].isupper())


# --------------------------------------------------------------------------- cues


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


_INTERJECTION = _rx(
    r"^(?:hi|hello|hey|hiya|howdy|yo|greetings|good (?:morning|afternoon|evening|day|night)|"
    r"thanks|thank you|thx|cheers|ok|okay|sure|great|cool|awesome|nice|perfect|wow|yes|yeah|"
    r"yep|yup|no|nope|bye|goodbye|congrats|congratulations|got it|sounds good|no problem|"
    r"of course|absolutely|definitely|haha|lol|hmm|oh|ah|alright|all right|right|exactly|"
    r"indeed|amazing|excellent|wonderful|fantastic|gotcha|understood|welcome|will do)\b"
)
_PHATIC = _rx(
    r"(?:(?:hi|hello|hey|yo|so|well)(?: [a-z]+)? )?(?:"
    r"how are (?:you|things)(?: doing)?(?: today)?|how(?:'s| is) it going(?: for you| with you)?|"
    r"how have you been|how(?:'s| is) everything(?: going)?(?: with you)?|"
    r"(?:it(?:'s| has) )?been (?:a while|a long time|ages|forever|a few (?:days|weeks|months)|"
    r"some time)(?: since [a-z' ]+)?|what(?:'s| is) new(?: with you)?(?: since [a-z' ]+)?|"
    r"(?:wassup|whassup|sup|what's good)|i(?:'ve been| have been)? miss(?:ed|ing)? "
    r"(?:you|our (?:chats|talks)|talking to you)|how(?:'s| is| has| have) (?:your|the) [a-z]+ (?:been|going)|"
    r"what(?:'s| is| has) (?:been )?up(?: since we last (?:talked|spoke))?|"
    r"(?:it(?:'s| is| was) )?(?:so )?(?:good|great|nice) to (?:see|hear from|meet|talk to) (?:you|ya)(?: again)?|"
    r"(?:i )?hope you(?:'re| are)? (?:doing )?(?:well|good|great|okay|ok|fine)|"
    r"(?:i )?hope (?:all|everything)(?: is|'s) (?:good|well|great|okay)(?: with you)?|long time no see|"
    r"thanks?(?: you)?(?: so much| a lot| very much)?(?: for [a-z' ]+)?|"
    r"(?:you(?:'re| are) )?(?:very )?welcome|my pleasure|(?:i'm )?(?:glad|happy) (?:i could|to) help|"
    r"have a (?:great|nice|good|wonderful|safe) [a-z ]+|"
    r"(?:is there )?anything else(?: i can (?:help|do)(?: you)?(?: with)?)?(?: today)?|"
    r"how (?:can|may) i (?:help|assist)(?: you)?(?: today)?|does (?:that|this) (?:help|make sense)|"
    r"(?:does that )?(?:make|makes) sense|(?:how does )?(?:that|this) sounds? (?:good|ok|okay)|"
    r"(?:how|what) about you|and you|anything (?:new|interesting|exciting|fun)"
    r"(?: and (?:new|interesting|exciting|fun))?(?: (?:happening|going on|with you|lately))?|what do you think|you know what i mean|take care(?: of yourself)?|"
    r"see (?:you|ya)(?: soon| later| then| tomorrow| around)?|talk (?:to you )?(?:soon|later)|"
    r"catch you later|keep (?:it )?up the (?:good|great) work|"
    r"let me know how (?:it goes|it went|you like it|that goes)|i'll (?:let you know|keep you posted)|"
    r"(?:i'll )?keep you (?:posted|updated)|long time no (?:see|talk|chat|speak)|"
    r"(?:cute|right|okay|ok|really|huh|yeah|you know)"
    r")"
)
_QUESTION_END = re.compile(r"\?[\"'”’)\]]*\W*$")
_UNCERTAIN = _rx(
    r"\b(?:not sure|unsure|tbd|to be (?:decided|determined|confirmed)|"
    r"still (?:need|have) to (?:figure out|decide|check|confirm|find out|work out)|"
    r"need to figure out|(?:haven't|have not|hasn't|has not|not yet|haven't yet) "
    r"(?:decided|figured|worked out|settled)|not (?:yet )?decided|undecided|unclear|"
    r"(?:don't|do not) know (?:yet|whether|if)|no idea (?:yet )?(?:whether|if|how to|what to)|"
    r"open question|we'll see|remains to be seen|still pending|pending|waiting (?:on|for)|"
    r"can't decide|cannot decide|i wonder (?:if|whether)|not certain)\b"
)
_DECISION = _rx(
    r"(?:(?:'ll|will|let's|let us|going to|gonna|decided to|'d|would|should we) go with|"
    r"\bgoing with\b|\bwent with\b|\bdecided\b|\bdecision\b|\bdecide on\b|"
    r"\blet's (?:use|go|stick|do|book|pick|choose|take|switch|keep|try|plan|make|skip|drop|"
    r"stay|aim|move|start|reserve)\b|\bagreed\b|\bagree (?:to|on)\b|\bwe agree\b|"
    r"(?:'ll| will) (?:choose|take|pick|go for|stick with)\b|\b(?:chose|chosen|picked|opted|"
    r"opting for|opt for)\b|\bsettled? on\b|\bsettling on\b|\binstead of\b|\brather than\b|"
    r"\bswitch(?:ed|ing)? (?:over )?to\b|\bwe(?:'ll| will) use\b|\bwe(?:'re| are) using\b|"
    r"\bi(?:'ll| will) use\b|\bthe plan is\b|\bfinal answer\b|\bmy choice\b|\bno need to\b)"
)
_NEGATION = _rx(r"\b(?:not|never|no|haven't|hasn't|didn't|don't|won't|can't|yet to)\s+(?:\w+\s+)?$")
_COMPLETED_VERBS = (
    "added|applied|approved|archived|booked|built|canceled|cancelled|changed|cleaned|closed|"
    "committed|completed|configured|converted|corrected|created|credited|debugged|deleted|"
    "deployed|disabled|drafted|emailed|enabled|exported|filed|finished|fixed|generated|"
    "implemented|imported|initiated|installed|issued|launched|logged|merged|migrated|moved|"
    "ordered|paid|patched|processed|published|purchased|pushed|rebooked|rebuilt|refactored|"
    "refunded|released|removed|renamed|replaced|reserved|resolved|restarted|rewrote|rewritten|"
    "saved|scheduled|sent|shipped|signed|submitted|tested|updated|upgraded|uploaded|verified|"
    "wrote|written|done|solved|packed|printed|reinstalled|rolled back|set up|sorted out|"
    "taken care of|escalated|refreshed|reset|documented|outlined|put together|compiled|translated"
)
_COMPLETED = _rx(
    rf"(?<!-)\b(?:{_COMPLETED_VERBS})\b(?!-)|\b(?:works|working|passing|passes|fixed|live) now\b|"
    r"\ball set\b|\bgood to go\b|\bup and running\b|\bhere(?:'s| is) (?:the|your|a|an)\b"
)
# A completion verb right after one of these is a plan or a condition, not a done thing.
_NOT_DONE_BEFORE = _rx(
    r"(?:\b(?:will|would|could|should|can|may|might|must|to|not|never|please|if|once|unless|"
    r"gonna|need|needs|want|wants|let|when|until|before|whether|be)\b|'ll|n't)\W*(?:\w+\W+){0,2}$"
)
_IMPERATIVE_START = _rx(
    r"^(?:(?:please|then|also|first|finally|now|just|next|and)\W+)*(?:run|try|check|install|"
    r"add|update|open|book|call|email|send|pack|buy|make|keep|use|set|restart|remove|"
    r"replace|consider|reply|visit|download|review|test|create|change|start|go|take|bring|"
    r"reserve|confirm|contact|schedule|follow|print|upgrade|delete|write|read|apply|"
    r"submit|monitor|watch|avoid|plan|prepare|save|share|pick|order|look|ask|wait|remember|"
    r"note|double-check|verify|enable|disable|configure|rename|merge|deploy|push|pull|commit)\b"
)
_NEXT_STRONG = _rx(
    r"\b(?:next|tomorrow|follow(?:-| )?up|to-?do|remind me|we should|you should|i should|"
    r"need(?:s)? to|have to|has to|got to|plan(?:ning)? to|make sure|don't forget|"
    r"remember to|keep an eye|check back|next week|next time|after that|later today|"
    r"this (?:week|weekend|afternoon|evening)|by (?:monday|tuesday|wednesday|thursday|friday|"
    r"saturday|sunday|tonight|the end of))\b"
)
_NEXT_WEAK = _rx(
    r"\b(?:will|gonna|let me know|reach out|within \d+|later|soon)\b|'ll\b|"
    r"\bgoing to (?!(?:the|a|an|my|our|your|his|her|their|be there)\b)(?-i:[a-z]+)"
)
_NOT_NEEDED = _rx(r"\b(?:no|don't|do not|doesn't|does not|won't|will not|didn't) (?:\w+ )?need")
# A user's own past actions ("I ordered it last week") are context unless marked done-now.
_USER_DONE = _rx(
    r"\b(?:i've|i have|we've|we have|just|already|finally|now)\b|^(?:done|finished|fixed)\b"
)
_DEFERRAL = _rx(
    r"^(?:\W*(?:hmm|well|honestly|good question|great question)\W+)*(?:i'm |i am )?"
    r"(?:not sure|unsure|no idea|don't know|do not know|can't say|cannot say|"
    r"let me (?:check|find out|look into|get back)|i'll (?:check|find out|look into|get back)|"
    r"i need to check|hard to say|tbd)\b"
)
_STOPWORDS: frozenset[str] = frozenset().union(
    ("a", "an", "and", "are", "as", "at", "be", "been", "but", "by", "can", "could", "did"),
    ("do", "does", "for", "from", "had", "has", "have", "how", "i", "i'm", "if", "in"),
    ("into", "is", "it", "it's", "its", "me", "my", "of", "on", "or", "our", "so", "that"),
    ("the", "their", "them", "then", "there", "these", "they", "this", "to", "was", "we"),
    ("were", "what", "when", "where", "which", "who", "why", "will", "with", "would", "you"),
    ("your", "any", "anything", "some", "something", "just", "also", "about", "there's"),
    ("can't", "don't", "should"),
)
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# Cues are written with straight quotes; phones and word processors type curly ones.
_PLAIN = str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"'})


def _plain(text: str) -> str:
    return text.translate(_PLAIN)


def _words(text: str) -> list[str]:
    return _WORD.findall(_plain(text).lower())


def _normal(text: str) -> str:
    return " ".join(_words(text))


def _content_stems(text: str) -> set[str]:
    return {word[:5] for word in _words(text) if word not in _STOPWORDS and len(word) > 2}


@functools.lru_cache(maxsize=8192)
def is_filler(sentence: str) -> bool:
    """True for phatic sentences that carry no content ("Hi Sam!", "Thanks so much!")."""
    norm = _normal(sentence)
    words = norm.split()
    if len(words) <= 1 or _PHATIC.fullmatch(norm):
        return True
    if all(_PHATIC.fullmatch(part) for part in norm.split(" and ")):
        return True  # "Take care and have a good one!"
    match = _INTERJECTION.match(norm)
    if match is None:
        return False
    rest = norm[match.end() :].split()
    return len(rest) <= 1 or bool(_PHATIC.fullmatch(" ".join(rest)))


def _is_question(sentence: str) -> bool:
    return bool(_QUESTION_END.search(sentence))


def _completion_cue(sentence: str) -> bool:
    for match in _COMPLETED.finditer(sentence):
        if not _NOT_DONE_BEFORE.search(sentence[: match.start()]):
            return True
    return False


def _decision_cue(sentence: str) -> bool:
    return any(
        not _NEGATION.search(sentence[: match.start()]) for match in _DECISION.finditer(sentence)
    )


# --------------------------------------------------------------------------- classification


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


# --------------------------------------------------------------------------- selection


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split()).rstrip(" :")
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-") + "…"


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


# --------------------------------------------------------------------------- facts

_NAME = r"([A-Z][\w'-]+(?: [A-Z][\w'-]+){0,2})"
_PLACE = r"([A-Z][\w.'-]*(?:(?:,? |-)(?:[A-Z][\w.'-]*|de|del|la|le|am|upon|on))*)"
_LIKE_VERBS = (
    r"prefer|like|love|enjoy|adore|hate|dislike|detest|can't stand|cannot stand|"
    r"don't like|do not like|don't enjoy"
)
_PHRASE_END = (
    r"(?=\s*(?:[,.;!?)]|$|\s(?:because|since|but|so|when|if|though|although|and i|and we|"
    rf"which|as long as|-|and (?:{_LIKE_VERBS}))\s))"
)
_PHRASE = rf"([A-Za-z0-9][\w'&/+ -]{{1,80}}?){_PHRASE_END}"
_ADVERBS = r"(?:(?:really|also|absolutely|just|totally|do|still|actually|honestly|generally|usually|definitely|very much|much|kind of|kinda|sort of)\s+)*"

_FACT_RULES: tuple[tuple[re.Pattern[str], str, float], ...] = (
    (re.compile(rf"\b(?i:my name is|my name's)\s+{_NAME}"), "name", 0.8),
    (
        re.compile(rf"\b(?i:call me|please call me)\s+{_NAME}(?!\s+(?i:at|on|back|when|if))"),
        "preferred_name",
        0.75,
    ),
    (
        re.compile(
            rf"\b(?i:i live in|i'm living in|i am living in|i'm based in|i am based in|"
            rf"i moved to|i just moved to|i recently moved to|i reside in)\s+(?:the\s+)?{_PLACE}"
        ),
        "location",
        0.8,
    ),
    (
        re.compile(rf"\b(?i:i'm from|i am from|i grew up in|i was born in)\s+{_PLACE}"),
        "hometown",
        0.7,
    ),
    (
        _rx(
            rf"\b(?:i'm|i am|i've always been|i have always been)\s+{_ADVERBS}(?:severely\s+|very\s+|"
            rf"deathly\s+|mildly\s+|slightly\s+)?allergic to\s+{_PHRASE}"
        ),
        "allergy",
        0.8,
    ),
    (_rx(rf"\bi have an?\s+{_PHRASE.replace('{1,80}', '{1,40}')}\s+allergy\b"), "allergy", 0.8),
    (
        _rx(
            rf"\b(?:i work|i'm working|i am working|i started working|i started a new job|"
            rf"i got a job|i have a job|i've been working)\s+as\s+(?:an?\s+)?{_PHRASE}"
        ),
        "occupation",
        0.75,
    ),
    (_rx(rf"\b(?:i'm|i am)\s+an?\s+{_PHRASE}\s+by (?:trade|profession)\b"), "occupation", 0.75),
    (
        re.compile(
            rf"\b(?i:i work at|i work for|i'm working at|i am working at|i'm employed at|"
            rf"i am employed at|i'm employed by)\s+(?:the\s+)?{_PLACE}"
        ),
        "employer",
        0.75,
    ),
    (
        _rx(
            r"\b(?:i'm|i am|i've been|i have been)\s+(?:a\s+|strictly\s+|mostly\s+|now\s+)?"
            r"(vegetarian|vegan|pescatarian|gluten-free|lactose intolerant|keto|kosher|halal)\b"
        ),
        "diet",
        0.8,
    ),
)
# "We love hiking and hate crowds": the user speaking for their household counts, and so
# does a second verb joined by "and".
_PREFERENCE = _rx(rf"\b(?:i|we)\s+{_ADVERBS}({_LIKE_VERBS})\s+{_PHRASE}")
_AND_PREFERENCE = _rx(rf"\s+and\s+{_ADVERBS}({_LIKE_VERBS})\s+{_PHRASE}")
_FAVORITE = _rx(rf"\bmy (?:favou?rite|fave)\s+([a-z][a-z -]{{1,40}}?)\s+(?:is|are)\s+{_PHRASE}")
_ALWAYS_NEVER = _rx(rf"^(?:please\s+)?(?:i\s+)?(always|never)\s+{_PHRASE}")
_VAGUE_OBJECT = _rx(
    r"^(?:it|that|this|those|these|them|you|him|her|what|how|when|where|why|which|who|"
    r"your|the idea|the sound of|to think|to say|so|a lot|the way|my|our|the fact|all of)\b"
)
_SENTIMENT = {
    "prefer": "prefers",
    "like": "likes",
    "love": "loves",
    "enjoy": "enjoys",
    "adore": "loves",
    "hate": "dislikes",
    "dislike": "dislikes",
    "detest": "dislikes",
    "can't stand": "dislikes",
    "cannot stand": "dislikes",
    "don't like": "dislikes",
    "do not like": "dislikes",
    "don't enjoy": "dislikes",
}
_SLUG_DROP = frozenset(["a", "an", "the", "to", "my", "some", "any", "of", "for"])


def _slug(text: str, words: int = 4) -> str:
    # Keys are ASCII ids: "Café Crème" -> "cafe_creme".
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    tokens = [w.replace("'", "") for w in _words(ascii_text) if w not in _SLUG_DROP][:words]
    slug = "_".join(t for t in tokens if t)
    return slug[:80].strip("_")


def _fact(key: str, value: str, confidence: float, evidence: str) -> FactCandidate | None:
    value = " ".join(value.split()).strip(" ,;:-").rstrip(".")
    if not value or key.endswith((".", "_")) or ID_PATTERN.fullmatch(key) is None:
        return None  # nothing left to store, or no usable key ("allergy." from "to ???")
    return FactCandidate(key=key, value=value, confidence=confidence, evidence=_clip(evidence, 300))


def _preference(verb: str, obj: str, sentence: str) -> FactCandidate | None:
    verb = " ".join(verb.lower().split())
    if _VAGUE_OBJECT.match(obj) or len(obj.split()) > 8:
        return None
    topic = re.split(r"\s+(?:over|to|rather than|instead of|than)\s+", obj, maxsplit=1)[0]
    confidence = 0.7 if verb == "prefer" else 0.6
    return _fact(f"preference.{_slug(topic)}", f"{_SENTIMENT[verb]} {obj}", confidence, sentence)


def _facts_in(original: str) -> list[FactCandidate]:
    sentence = _plain(original)
    found: list[FactCandidate | None] = []
    for pattern, key, confidence in _FACT_RULES:
        for match in pattern.finditer(sentence):
            value = match.group(1)
            if key == "allergy":
                slug = _slug(value, 3)
                found.append(_fact(f"allergy.{slug}", value, confidence, sentence))
            else:
                found.append(_fact(key, value, confidence, sentence))
    for first in _PREFERENCE.finditer(sentence):
        liked: re.Match[str] | None = first
        while liked is not None:
            found.append(_preference(liked.group(1), liked.group(2), sentence))
            liked = _AND_PREFERENCE.match(sentence, liked.end())
    for match in _FAVORITE.finditer(sentence):
        thing, value = match.group(1), match.group(2)
        found.append(_fact(f"preference.favorite_{_slug(thing, 3)}", value, 0.7, sentence))
    for match in _ALWAYS_NEVER.finditer(sentence):
        word, rest = match.group(1).lower(), match.group(2)
        if _VAGUE_OBJECT.match(rest) or len(rest.split()) > 10:
            continue
        found.append(_fact(f"preference.{_slug(rest)}", f"{word} {rest}", 0.7, sentence))
    evidence = _clip(original, 300)
    return [f.model_copy(update={"evidence": evidence}) for f in found if f is not None]


def extract_facts(messages: Sequence[Message], max_facts: int = 12) -> list[FactCandidate]:
    """Fact candidates stated by the user about themselves, later statements winning.

    Only ``user`` messages are read; questions are skipped (asking "do I like
    X?" states nothing).

    Args:
        messages: The transcript.
        max_facts: At most this many facts; past it, the earliest-mentioned keys are dropped.

    Returns:
        Facts keyed ``name``, ``preferred_name``, ``location``, ``hometown``,
        ``occupation``, ``employer``, ``diet``, ``allergy.<what>`` or
        ``preference.<topic>``, in order of first mention, each with the value
        and evidence of its latest mention.
    """
    by_key: dict[str, FactCandidate] = {}
    for message in messages:
        if message.role != "user" or message.item_type is not None:
            continue
        for sentence in split_sentences(message.content):
            if _is_question(sentence):
                continue
            for fact in _facts_in(sentence):
                by_key[fact.key] = fact
    facts = list(by_key.values())
    return facts[-max_facts:] if max_facts > 0 else []


# --------------------------------------------------------------------------- summarizer


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
