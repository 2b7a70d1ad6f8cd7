"""The redactor: finds what the rules match in text and JSON and replaces it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, cast

import orjson

from tiers.errors import InvalidInputError
from tiers.redaction._base import (
    _KIND,
    DEFAULT_PLACEHOLDER,
    MODES,
    Finding,
    J,
    RedactMode,
    _group,
    _Rule,
)
from tiers.redaction._json_text import placeable, word_places
from tiers.redaction._rules import (
    _ASCII_CARD_RUN,
    _CARD_DIGITS,
    _DIGIT_RUN,
    _GATE_MAP,
    _PII_RULES,
    _SECRET_RULES,
    _has_card_run,
    _has_digit_run,
    _other_digits,
    _runs_match,
)
from tiers.redaction._scan import GateScan
from tiers.redaction._values import (
    _AUTH_SCHEME,
    _CLASS_KIND,
    _KEY_WORDS,
    _accept,
    _key_class,
    _machine_made,
    _plain_value,
)
from tiers.redaction._verdicts import CleanStrings


def check_patterns(patterns: Mapping[str, str | re.Pattern[str]]) -> dict[str, re.Pattern[str]]:
    """Compile custom patterns (kind -> regex).

    Raises:
        InvalidInputError: A kind is not ``[a-z][a-z0-9_]{0,31}``, or a pattern
            does not compile or matches the empty string (``field`` is
            ``redact_patterns.<kind>``).
    """
    if not isinstance(patterns, Mapping):
        raise InvalidInputError(
            f"redaction patterns must be a mapping of kind to regex, got {type(patterns).__name__}",
            field="redact_patterns",
        )
    compiled: dict[str, re.Pattern[str]] = {}
    for kind, pattern in patterns.items():
        field = f"redact_patterns.{kind}"
        if not isinstance(kind, str) or _KIND.fullmatch(kind) is None:
            raise InvalidInputError(
                f"redaction kind {kind!r} is invalid: use a lowercase letter then up to 31 of "
                "a-z 0-9 _ (it names the placeholder, e.g. [REDACTED:employee_id])",
                field=field,
            )
        if isinstance(pattern, re.Pattern):
            regex = pattern
        elif isinstance(pattern, str):
            try:
                regex = re.compile(pattern)
            except re.error as exc:
                raise InvalidInputError(
                    f"redaction pattern of {kind!r} does not compile: {exc}", field=field
                ) from exc
        else:
            raise InvalidInputError(
                f"redaction pattern of {kind!r} must be a regex string, got {type(pattern).__name__}",
                field=field,
            )
        if regex.fullmatch("") is not None:
            raise InvalidInputError(
                f"redaction pattern of {kind!r} matches the empty string", field=field
            )
        compiled[kind] = regex
    return compiled


def _anchored(rule: _Rule, text: str, lowered: str) -> Iterator[re.Match[str] | None]:
    """Matches of ``rule.pattern`` where its finder finds its word (one per word, no overlaps)."""
    assert rule.finder is not None
    assert rule.finder_i is not None
    # Lowercasing keeps positions unless the text has one of the few characters whose
    # lowercase is longer (e.g. "İ"); then search the text itself, case-insensitively.
    hits = (
        rule.finder.finditer(lowered) if len(lowered) == len(text) else rule.finder_i.finditer(text)
    )
    end = 0
    for hit in hits:
        if hit.start() < end:
            continue
        m = rule.pattern.match(text, hit.start())
        if m is not None:
            end = m.end()
        yield m


_JSON_PLAIN: Final = re.compile(r'[^"\\\x00-\x1f]*')
"""Text JSON writes as it is (no quote, backslash or control character to escape)."""
_MAX_NARROWED: Final = 256
# Passes of one text at most (each finds what the last one's placeholders uncovered).
_MAX_PASSES: Final = 8


@dataclass(frozen=True, slots=True)
class _RuleSet:
    """Rules and their gates at once: text that passes none (most text) costs a few substring tests."""

    rules: tuple[_Rule, ...]
    # The rules' indexes in the redactor's table: what a string was found clean by.
    key: tuple[int, ...]
    ungated: bool
    triggers: tuple[str, ...]
    words: tuple[str, ...]
    digits: bool

    @classmethod
    def of(cls, rules: tuple[_Rule, ...], key: tuple[int, ...]) -> _RuleSet:
        return cls(
            rules,
            key,
            any(not (r.triggers or r.words or r.digits) for r in rules),
            tuple(sorted({t for r in rules for t in r.triggers})),
            tuple(sorted({w for r in rules for w in r.words})),
            any(r.digits for r in rules),
        )


class Redactor:
    """Finds secrets (and optionally PII) in text and JSON and replaces them with placeholders.

    Its configuration is immutable and it is thread-safe; build one per
    configuration and share it. What it keeps between calls (the strings its
    walk found clean, a few MB at most) only saves work: every answer is the
    one a new redactor gives.

    Args:
        mode: ``"secrets"`` (default), ``"secrets+pii"`` or ``"off"``.
        patterns: Custom kinds, kind -> regex (string or compiled); applied in
            every mode but ``"off"``. A group named ``secret`` is what is replaced
            (else the whole match).
        placeholder: What a finding becomes; ``{kind}`` is replaced by its kind.

    Raises:
        InvalidInputError: A bad mode (``field="redact"``), pattern or placeholder.
    """

    def __init__(
        self,
        mode: RedactMode = "secrets",
        *,
        patterns: Mapping[str, str | re.Pattern[str]] | None = None,
        placeholder: str = DEFAULT_PLACEHOLDER,
    ) -> None:
        if mode not in MODES:
            raise InvalidInputError(
                f"redact must be one of {', '.join(MODES)}, got {mode!r}", field="redact"
            )
        if not isinstance(placeholder, str) or not placeholder:
            raise InvalidInputError(
                "redaction placeholder must be a non-empty string such as '[REDACTED:{kind}]'",
                field="redact_placeholder",
            )
        self.mode: RedactMode = mode
        self.placeholder = placeholder
        self._custom = check_patterns(patterns or {})
        rules: list[_Rule] = []
        if mode != "off":
            rules.extend(_SECRET_RULES)
            if mode == "secrets+pii":
                rules.extend(_PII_RULES)
            for kind, regex in self._custom.items():
                group: int | str = "secret" if "secret" in regex.groupindex else 0
                rules.append(_Rule(f"custom:{kind}", regex, _group(kind, group)))
        self._rules: tuple[_Rule, ...] = tuple(rules)
        self._order = {rule.name: n for n, rule in enumerate(self._rules)}
        self._all = _RuleSet.of(self._rules, tuple(range(len(self._rules))))
        # The rule sets redact_json narrowed to, by the rules kept (a handful in practice).
        self._narrowed: dict[tuple[int, ...], _RuleSet] = {}
        # The gates can be tested on a value's JSON text only if JSON never escapes
        # a character of theirs, so an occurrence in a string is one in the text too;
        # and a word must be letters only, so its occurrences are inside strings,
        # where the quote closing each tells a key from a value.
        self._text_gates = all(
            _JSON_PLAIN.fullmatch(gate) is not None for gate in self._all.triggers
        ) and all(placeable(word) for word in (*self._all.words, *_KEY_WORDS))
        # Every gate word (a rule's, or one a credential key holds) and every trigger, found
        # by two automaton passes over a value's JSON text (its lowercase, and itself).
        self._gate_scan = GateScan({*self._all.words, *_KEY_WORDS}, self._all.triggers)
        # Which rules a trigger gates, by trigger (by its rules' indexes, as _narrow keeps them).
        self._untriggered = frozenset(n for n, rule in enumerate(self._rules) if not rule.triggers)
        # In order: the rules a text holding no trigger (most text) is tested against, and
        # those of them left when no string value holds a gate word either.
        self._untriggered_order = tuple(sorted(self._untriggered))
        self._untriggered_wordless = tuple(
            n for n in self._untriggered_order if not self._rules[n].words
        )
        self._by_trigger = {
            t: frozenset(n for n, rule in enumerate(self._rules) if t in rule.triggers)
            for t in self._all.triggers
        }

        # Strings the walk found nothing in: the history a chat state repeats every step.
        self._clean = CleanStrings()

        # Redacting twice changes nothing: a value already replaced is never a finding.
        self._prefix = placeholder.split("{kind}", 1)[0]

    @property
    def enabled(self) -> bool:
        """Whether this redactor changes anything (``mode`` is not ``"off"``)."""
        return bool(self._rules)

    @property
    def patterns(self) -> dict[str, re.Pattern[str]]:
        """The custom patterns, kind -> compiled regex."""
        return dict(self._custom)

    def with_patterns(self, patterns: Mapping[str, str | re.Pattern[str]]) -> Redactor:
        """A redactor like this one with more custom kinds (same kind: the new pattern wins)."""
        return Redactor(
            self.mode, patterns={**self._custom, **patterns}, placeholder=self.placeholder
        )

    def render(self, kind: str) -> str:
        """The placeholder of ``kind``."""
        return self.placeholder.replace("{kind}", kind)

    def findings(self, text: str) -> list[Finding]:
        """What :meth:`redact` replaces in ``text``, in order, without overlaps."""
        return self._find(_plain(text), self._all)

    def _find(self, text: str, rule_set: _RuleSet) -> list[Finding]:
        """:meth:`findings` by the rules of ``rule_set`` (all rules, or those a value can match)."""
        if not rule_set.rules or len(text) < 6:
            return []
        found: list[tuple[int, int, int, str, str]] = []
        lowered: str | None = None
        digits: bool | None = None
        if not rule_set.ungated:
            # Lowercased only for rules with words (a narrowed set often has none).
            if rule_set.words:
                lowered = text.lower()
            if not (
                any(map(text.__contains__, rule_set.triggers))
                or (lowered is not None and any(map(lowered.__contains__, rule_set.words)))
                or (rule_set.digits and (digits := _DIGIT_RUN.search(text) is not None))
            ):
                return []
        for rule in rule_set.rules:
            # Cheap gates first (substring tests run in C); most text passes no rule's.
            if rule.triggers and not any(map(text.__contains__, rule.triggers)):
                continue
            if rule.words:
                if lowered is None:
                    lowered = text.lower()
                if not any(map(lowered.__contains__, rule.words)):
                    continue
            if rule.digits:
                if digits is None:
                    digits = _DIGIT_RUN.search(text) is not None
                if not digits:
                    continue
            if rule.finder is None:
                matches: Iterable[re.Match[str] | None] = rule.pattern.finditer(text)
            else:
                if lowered is None:
                    lowered = text.lower()
                matches = _anchored(rule, text, lowered)
            for m in matches:
                if m is None:
                    continue
                hit = rule.classify(m)
                if hit is None:
                    continue
                kind, start, end = hit
                if self._prefix and text.startswith(self._prefix, start):
                    continue
                found.append((start, self._order[rule.name], -end, kind, rule.name))
        if not found:
            return []
        found.sort()
        result: list[Finding] = []
        pos = 0
        for start, _, neg_end, kind, name in found:
            end = -neg_end
            if end <= pos:
                continue  # inside one already taken
            if start < pos:
                # Overlaps the previous finding and reaches past it: hide the rest too.
                prev = result[-1]
                result[-1] = Finding(prev.kind, prev.rule, prev.start, end)
            else:
                result.append(Finding(kind, name, start, end))
            pos = end
        return result

    def redact(self, text: str) -> str:
        """``text`` with every finding replaced by its placeholder."""
        plain = _plain(text)
        redacted = self._redact(plain, self._all)
        return text if redacted is plain else redacted

    def _redact(self, text: str, rule_set: _RuleSet) -> str:
        # A placeholder borders its neighbours differently from what it replaced: a number
        # glued to a key ("...TUB+1 41114111") stands alone, as a phone number, once the key
        # is gone. So redact again until nothing more is found: redacting what was redacted
        # changes nothing. Only a text that had a finding pays a second pass, with every rule:
        # the narrowing judged the text before, not the placeholders' new borders.
        for _ in range(_MAX_PASSES):
            found = self._find(text, rule_set)
            if not found:
                break
            parts: list[str] = []
            pos = 0
            for f in found:
                parts.append(text[pos : f.start])
                parts.append(self.render(f.kind))
                pos = f.end
            parts.append(text[pos:])
            text = "".join(parts)
            rule_set = self._all
        return text

    def redact_json(self, value: J, *, key: str | None = None) -> J:
        """A JSON value with every string redacted; the same object when nothing changed.

        A string under a key naming a credential (``password``, ``api_key``,
        ``clientSecret``, ``Authorization``...) is replaced whole when it looks
        like one; ``key`` is the label of ``value`` itself (a fact's key). A
        tuple is walked as a list (JSON's form of it) and given back as a tuple;
        a mapping that is no dict is walked, and given back when changed, as a dict.
        """
        return self._redact_json(value, key, None)

    def _redact_json(self, value: J, key: str | None, json_text: bytes | None) -> J:
        """:meth:`redact_json`, the rules narrowed on ``json_text`` when given (trusted)."""
        if not self._rules:
            return value
        rule_set, by_key = self._narrow(value, key, json_text)
        if not rule_set.rules and not by_key:
            return value  # no string of it can change: no walk
        return cast(J, self._walk(value, key, rule_set, by_key))

    def _narrow(
        self, value: object, key: str | None, json_text: bytes | None = None
    ) -> tuple[_RuleSet, bool]:
        """The rules some string of ``value`` may match, and whether a key may name a credential.

        One pass over the value's JSON text (every string of it is in there
        verbatim) runs every rule's gates once, so each string is then tested
        against the few rules left instead of all of them: a rule whose gates
        the whole text fails is skipped by every string's gates too. Rules
        look only at string values, so a word counts only where it occurs in
        one (``key`` in ``idempotency_key`` keeps no rule), and the by-key walk
        runs only when an actual key names a credential. Which words and
        triggers the text holds, and where the words are, is two automaton
        passes (:class:`GateScan`); the rules are then decided from those sets.
        """
        if not self._text_gates:
            return self._all, True
        if json_text is not None:
            data = json_text
        else:
            try:
                data = orjson.dumps(value)
            except TypeError:  # not plain JSON (an int key, a huge int, deep nesting): test it all
                return self._all, True
        text = data.decode()
        ascii_text = data.isascii()
        folded: bytes | None = None
        if ascii_text:
            # One map of the bytes serves the gate words (its letters are the lowercase's, in
            # place) and the card gate (its zeros are the digits, spaces and dashes); the word
            # places read only its letters, quotes, backslashes and colons, all as lowercased.
            folded = data.translate(_GATE_MAP)
            lowered = folded.decode()
            found_words, triggers = self._gate_scan.scan_ascii(data, folded)
            other_digits = False
        else:
            lowered = text.lower()
            found_words, triggers = self._gate_scan.scan(text, lowered)
            # Asked once: the card and the phone gates both need it.
            other_digits = _other_digits(data)
        # Per word, the string values holding it (as spans of the text).
        words: dict[str, list[tuple[int, int]]] = {}
        by_key = key is not None
        for word, at in found_words.items():
            values, keys = word_places(lowered, text, word, at)
            if values:
                words[word] = values
            if not by_key and keys != set() and word in _KEY_WORDS:
                by_key = keys is None or any(_key_class(k) is not None for k in keys)
        phone_digits: bool | None = None
        card_digits: bool | None = None
        finder_text: str | None = None
        kept: list[int] = []
        # The rules without triggers, and those whose triggers the text holds (few, if any).
        if triggers:
            candidates: Iterable[int] = sorted(
                self._untriggered.union(*(self._by_trigger[t] for t in triggers))
            )
        else:
            candidates = self._untriggered_order if words else self._untriggered_wordless
        for n in candidates:
            rule = self._rules[n]
            if rule.words and words.keys().isdisjoint(rule.words):
                continue
            if rule.digits == _CARD_DIGITS:
                if card_digits is None:
                    card_digits = (
                        _has_card_run(data, text, other_digits)
                        if folded is None
                        else _runs_match(data, folded, _ASCII_CARD_RUN)
                    )
                if not card_digits:
                    continue
            elif rule.digits:
                if phone_digits is None:
                    phone_digits = _has_digit_run(data, text, other_digits)
                if not phone_digits:
                    continue
            if rule.json_gate is not None and rule.json_gate.search(text) is None:
                continue
            # On ASCII text (where a string's lowercase is its part of the lowered text)
            # an escape JSON writes starts with a backslash, no letter, so where a rule's
            # finder finds its word in a string it finds it in that string's part of the
            # lowered text too (a string without the rule's words is never searched).
            if rule.finder is not None and ascii_text:
                spans = {span for w in rule.words for span in words.get(w, ())}
                if not spans:
                    continue
                if finder_text is None:
                    # The lowercase itself: ``lowered`` maps digits and spaces, which finders read.
                    finder_text = text.lower()
                if not any(rule.finder.search(finder_text, start, end) for start, end in spans):
                    continue
            kept.append(n)
        chosen = tuple(kept)
        rule_set = self._narrowed.get(chosen)
        if rule_set is None:
            rule_set = _RuleSet.of(tuple(self._rules[n] for n in chosen), chosen)
            if len(self._narrowed) < _MAX_NARROWED:
                self._narrowed[chosen] = rule_set
        return rule_set, by_key

    def _walk(self, value: object, key: str | None, rule_set: _RuleSet, by_key: bool) -> object:
        if isinstance(value, str):
            if type(value) is not str:
                # A subclass's own methods (lower, __contains__) are not str's: its text is
                # judged as a str, and the verdict kept is of that text.
                plain = str.__str__(value)
                redacted = self._walk(plain, key, rule_set, by_key)
                return value if redacted is plain else redacted
            # A key that is no str (an int: then orjson refused the value) names no credential.
            if by_key and isinstance(key, str):
                whole = self._by_key(key, value)
                if whole is not None:
                    return whole
            if not rule_set.rules or len(value) < 6:
                return value  # what _find decides first, without two calls per string
            # One digest of the string, to test and then to keep.
            entry = self._clean.entry((rule_set.key, value))
            if self._clean.holds(entry):
                return value
            redacted = self._redact(value, rule_set)
            if redacted is value:
                self._clean.keep(entry)
            return redacted
        if isinstance(value, dict):
            changed: dict[object, object] | None = None
            for k, v in value.items():
                new = self._walk(v, k, rule_set, by_key)
                if new is not v:
                    if changed is None:
                        changed = dict(value)
                    changed[k] = new
            return value if changed is None else changed
        # A tuple too: its JSON text (where the rules were narrowed) is a list's.
        if isinstance(value, (list, tuple)):
            out: list[object] | None = None
            for n, v in enumerate(value):
                new = self._walk(v, key, rule_set, by_key)
                if new is not v:
                    if out is None:
                        out = list(value)
                    out[n] = new
            if out is None:
                return value
            return out if isinstance(value, list) else tuple(out)
        # Another mapping (a MappingProxyType) is walked as the dict JSON makes of it. orjson
        # refuses one, so a value holding it kept every rule: other rule sets need no test.
        if rule_set is self._all and isinstance(value, Mapping):
            as_dict = dict(value)
            new = self._walk(as_dict, key, rule_set, by_key)
            return value if new is as_dict else new
        return value

    def _by_key(self, key: str, value: str) -> str | None:
        label = _key_class(key)
        if label is None or not value or (self._prefix and value.startswith(self._prefix)):
            return None
        if label == "auth":
            scheme = _AUTH_SCHEME.match(value)
            rest = value[scheme.end() :] if scheme else value
            if _plain_value(rest) and _machine_made(rest, 8):
                return f"{value[: len(value) - len(rest)]}{self.render('token')}"
            return None
        if not _accept(
            label.removeprefix("q_"),
            label.startswith("q_") or label == "password",
            value,
            prose=False,
            quoted=True,
            last=True,
        ):
            return None
        return self.render(_CLASS_KIND[label])

    def __repr__(self) -> str:
        custom = f", patterns={sorted(self._custom)}" if self._custom else ""
        return f"Redactor({self.mode!r}{custom})"


def _plain(text: str) -> str:
    """``text`` as a str itself (the same object when it is one).

    A subclass's own methods (``lower``, ``__contains__``, ``__len__``) may hide
    what the rules look for, and a verdict kept of its text would then hide it
    in every str with that text.
    """
    return text if type(text) is str else str.__str__(text)


OFF: Final = Redactor("off")
"""A redactor that changes nothing (what the tiers use when given none)."""


def redact_dumped_json(redactor: Redactor, value: J, json_text: bytes | None) -> J:
    """``redactor.redact_json(value)`` for a caller that may have ``value``'s JSON text already.

    ``json_text``, when not None, must be orjson's ``dumps`` of this very value
    (keys in any order; :func:`tiers.codec.to_json_text`'s pair): the rules are
    narrowed on it instead of a new dump. It is trusted, not checked: another text (one of
    the value before it changed, or ``json.dumps``'s, which escapes non-ASCII
    letters) can leave a secret of ``value`` unredacted. So this is not on
    :class:`Redactor`'s public face (``memory`` exports the class): the task
    tier's writer, which made the pair, is its caller.
    """
    return redactor._redact_json(value, None, json_text)
