"""User-fact candidates (preferences, names, places) found in what the user said."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from summarizer._sentences import _clip, _is_question, _plain, _rx, _words, split_sentences
from tiers.ids import ID_PATTERN
from tiers.models import FactCandidate, Message

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
