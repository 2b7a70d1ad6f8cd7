"""Sentences of a transcript, the cue phrases that tell what a sentence says, and clipping."""

from __future__ import annotations

import re

from tiers.memo import TextMemo

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


def is_filler(sentence: str) -> bool:
    """True for phatic sentences that carry no content ("Hi Sam!", "Thanks so much!")."""
    return _FILLER(sentence)


def _is_filler(sentence: str) -> bool:
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


# Kept by each sentence's digest, never its text (tiers.memo): a forgotten user's words do not
# stay in the process.
_FILLER: TextMemo[bool] = TextMemo(_is_filler, entries=8192)


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


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split()).rstrip(" :")
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-") + "…"
