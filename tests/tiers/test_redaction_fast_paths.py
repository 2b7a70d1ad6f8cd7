"""Redaction's fast paths against a reference that skips every gate (session 28 review).

``Redactor.redact_json`` decides which rules a value's strings are tested
against from one byte map of its JSON text (gate words, card runs), the
trigger-less word-less rules when the text holds no trigger and no gate word,
and the verdicts it keeps per string. Each fast path must be exactly as strict
as testing every rule on every string: a secret the rules redact is never
stored because a fast path decided it could not be there. The reference here
runs every rule, its triggers, gate words, digit runs and JSON gates removed,
on every string of the value, with no narrowing and no kept verdicts.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.tiers.test_redaction import SECRETS, VISA, grouped
from tiers.redaction import Redactor, redact_dumped_json
from tiers.redaction._redactor import _RuleSet
from tiers.redaction._values import _KEY_WORDS

# Custom kinds of every shape a gate could miss: digits and separators, a quote, a newline,
# a backslash, other scripts, case-insensitive letters.
_CUSTOM = {
    "employee_id": r"EMP-\d{6}",
    "quoted": r'q"[a-z]{3}"q',
    "two_lines": r"ab\ncd\d",
    "slashed": r"zz\\[0-9]{4}",
    "sharp": r"ẞ\w+",
    "ticket": r"(?i)tkt-[a-z]{4}",
    "digits": r"(?<!\d)\d{5}(?!\d)",
}
REDACTORS = (
    Redactor("secrets"),
    Redactor("secrets+pii"),
    Redactor("secrets+pii", patterns=_CUSTOM),
    Redactor("secrets").with_patterns(_CUSTOM),
    Redactor("secrets+pii").with_patterns({"digits": _CUSTOM["digits"]}),
)


def _reference(redactor: Redactor) -> Redactor:
    """A redactor with ``redactor``'s rules, every gate of theirs removed and no narrowing."""
    ref = Redactor(redactor.mode, patterns=redactor.patterns, placeholder=redactor.placeholder)
    # The finder stays: it is where a labelled rule's pattern is matched, not a gate.
    rules = tuple(
        dataclasses.replace(rule, triggers=(), words=(), digits=0, json_gate=None)
        for rule in ref._rules
    )
    ref._rules = rules
    ref._all = _RuleSet.of(rules, tuple(range(len(rules))))
    ref._text_gates = False
    return ref


_REFERENCES = {id(r): _reference(r) for r in REDACTORS}


def _expected(redactor: Redactor, value: object, key: str | None) -> object:
    """Every rule on every string of ``value`` (the by-key test where a key names a credential)."""
    ref = _REFERENCES[id(redactor)]
    if isinstance(value, str):
        if key is not None:
            whole = ref._by_key(key, value)
            if whole is not None:
                return whole
        return ref._redact(value, ref._all)
    if isinstance(value, dict):
        return {k: _expected(redactor, v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_expected(redactor, v, key) for v in value]
    return value


_WORDS = sorted({w for r in REDACTORS for w in r._all.words} | set(_KEY_WORDS))
_TRIGGERS = sorted({t for r in REDACTORS for t in r._all.triggers})
_PIECES = [
    *_WORDS,
    *(w.upper() for w in _WORDS),
    *(w.title() for w in _WORDS),
    *(w[0] + w[1:].upper() for w in _WORDS if len(w) > 1),
    *_TRIGGERS,
    *(secret for _, secret, _ in SECRETS),
    *(text for _, _, text in SECRETS),
    # What JSON escapes, and text that looks like an escape.
    *('"', "\\", "/", "\\/", "\\u0041", "\\n", '\\"', "\n", "\t", "\r", "\b", "\f", "\x00"),
    *("\x01", "\x1f", "\x7f", "\u2028", "é", "İ", "\u212a", "٣", "４"),
    *(":", " ", "  ", "-", "--", "=", ".", "_", "+", "(", ")", "@", "#", "me", "call"),
    # Cards, whole and in pieces (a piece per string: split across strings and keys).
    *(VISA, grouped(VISA, " "), grouped(VISA, "-"), grouped(VISA, "."), VISA[:8], VISA[8:]),
    *("4111 1111 1111 1111", "4111-1111-1111-1111", "4111", "1111 ", " 1111", "111111"),
    *("0" * 13, " " * 13, "-" * 13, "1 - 2 - 3", "0-0-0-0-0-0-0"),
    # Phones, emails, custom kinds.
    *("212-456-7890", "(212) 456-7890", "+1 415 555 0100", "020 7946 0958", "123-45-6789"),
    *("5551234", "555 1234", "jane@example.com", "J.Doe@Example.co.uk"),
    *("EMP-123456", "TKT-abcd", 'q"abc"q', "ab\ncd5", "zz\\1234", "ẞtraße", "12345", "٣٣٣٣٣"),
]
_KEYS = ["api_key", "Authorization", "password", "clientSecret", "note", "pin", "card", "x\\"]

strings = st.lists(st.sampled_from(_PIECES), max_size=8).map("".join)
keys = st.one_of(st.sampled_from(_KEYS), st.sampled_from(_WORDS), strings)
values = st.recursive(
    strings | st.integers(-(2**63), 2**63 - 1) | st.none() | st.booleans(),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=600, deadline=None)
@given(values, st.sampled_from([None, "api_key", "note", "pin"]), st.sampled_from(REDACTORS))
@example({"n": "call me\\n5551234"}, None, REDACTORS[1])
@example({"n": "\\u0041IzaSy" + "A" * 33}, None, REDACTORS[0])
@example(["4111 1111", " 1111 1111"], None, REDACTORS[1])
@example({"4111111111111111": "x"}, None, REDACTORS[1])
@example({"n": "x\n" + grouped(VISA, " ")}, None, REDACTORS[0])
@example({"n": "TKT-ABCD", "m": "ab\ncd5", "o": 'q"abc"q'}, None, REDACTORS[3])
def test_redact_json_equals_every_rule_on_every_string(
    value: object, key: str | None, redactor: Redactor
) -> None:
    expected = _expected(redactor, value, key)
    assert redactor.redact_json(value, key=key) == expected
    # Twice: the second call answers from the verdicts the first one kept.
    assert redactor.redact_json(value, key=key) == expected
    # The task tier's path: the rules narrowed on the value's sorted-keys text.
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    assert redact_dumped_json(redactor, value, text) == _expected(redactor, value, None)


@settings(max_examples=300, deadline=None)
@given(strings, st.sampled_from(REDACTORS))
def test_redact_equals_every_rule(text: str, redactor: Redactor) -> None:
    ref = _REFERENCES[id(redactor)]
    assert redactor.redact(text) == ref._redact(text, ref._all)


def test_the_wordless_rules_are_each_redactors_own() -> None:
    # Every rule without a trigger and a gate word is tested on a value without them:
    # the card rule, the unlabelled phone rules in "secrets+pii", every custom pattern.
    for redactor in REDACTORS:
        names = {redactor._rules[n].name for n in redactor._untriggered_wordless}
        expected = {r.name for r in redactor._rules if not (r.triggers or r.words)}
        assert names == expected
        assert {f"custom:{kind}" for kind in redactor.patterns} <= names
    assert "phone_nanp" in {REDACTORS[1]._rules[n].name for n in REDACTORS[1]._untriggered_wordless}
    assert "phone_nanp" not in {
        REDACTORS[0]._rules[n].name for n in REDACTORS[0]._untriggered_wordless
    }


def test_a_tuple_is_walked_as_the_list_its_json_text_shows() -> None:
    # The narrowing reads a tuple's strings in its JSON text (a list there): the walk must
    # redact them too, not hand the tuple back with the secret the narrowing kept rules for.
    secret = SECRETS[2][1]
    for redactor in REDACTORS:
        assert redactor.redact_json((secret, "ok")) == ("[REDACTED:api_key]", "ok")
        assert redactor.redact_json({"a": [(secret,)]}) == {"a": [("[REDACTED:api_key]",)]}
        assert redactor.redact_json({"password": ("hunter22",)}) == {
            "password": ("[REDACTED:password]",)
        }
        unchanged = ("nothing here", 1)
        assert redactor.redact_json(unchanged) is unchanged


class _OwnLowercase(str):
    """A str subclass whose methods are not str's (its lowercase is its uppercase)."""

    __slots__ = ()

    def lower(self) -> str:
        return str.upper(self)


def test_a_str_subclass_is_judged_by_its_text_and_keeps_no_verdict_of_its_own() -> None:
    # Its own lower() hid the gate word from the rules, and the verdict it got was kept
    # for its text: the same text as a plain str then went unredacted, where a new
    # redactor redacts it.
    text = "my password is hunter22"
    for redactor in REDACTORS:
        redacted = {"n": "my password is [REDACTED:password]"}
        assert redactor.redact_json({"n": _OwnLowercase(text)}) == redacted
        assert redactor.redact_json({"n": text}) == redacted
        assert redactor.redact(_OwnLowercase(text)) == redactor.redact(text) != text
        assert redactor.findings(_OwnLowercase(text)) == redactor.findings(text) != []
        clean = _OwnLowercase("nothing to hide here")
        assert redactor.redact_json({"n": clean})["n"] is clean
        assert redactor.redact(clean) is clean


def test_a_non_str_key_names_no_credential_and_its_value_is_still_redacted() -> None:
    # orjson refuses an int key, so every rule is kept and every key tested: the key test
    # read len() of the int and raised (json writes such a key as "1": it names nothing).
    secret = SECRETS[2][1]
    for redactor in REDACTORS:
        assert redactor.redact_json({1: secret, "a": {2: "hunter22"}}) == {
            1: "[REDACTED:api_key]",
            "a": {2: "hunter22"},
        }
        assert redactor.redact_json({1: ["x"], None: "y"}, key="password") == {
            1: ["x"],
            None: "y",
        }


def test_a_mapping_that_is_no_dict_is_walked_as_the_dict_it_stands_for() -> None:
    # orjson refuses one, so every rule is kept: the walk then handed it back untested
    # (the LangGraph store embeds what redact_json gives of a put's value).
    secret = SECRETS[2][1]
    for redactor in REDACTORS:
        proxy = MappingProxyType({"a": secret, "password": "hunter22"})
        assert redactor.redact_json(proxy) == {
            "a": "[REDACTED:api_key]",
            "password": "[REDACTED:password]",
        }
        assert redactor.redact_json([{"x": proxy}]) == [{"x": redactor.redact_json(proxy)}]
        clean = MappingProxyType({"a": "nothing to hide here"})
        assert redactor.redact_json(clean) is clean


def test_a_phone_label_of_two_words_is_found_whatever_space_is_between_them() -> None:
    # The rule's pattern reads "call\s+me"; its finder, where the pattern is matched, read
    # "call me" with one space: two spaces, a newline or a tab hid the number.
    redactor = REDACTORS[1]
    for space in (" ", "  ", "\n", "\t", " \r\n ", "\x0b", "\x1f"):
        for label in ("call", "Text", "reach"):
            text = f"{label}{space}me 5551234 ok"
            assert redactor.redact(text) == f"{label}{space}me [REDACTED:phone] ok", repr(text)
            assert redactor.redact_json({"n": text}) == {"n": redactor.redact(text)}
            assert redactor.redact_json([text, "x"]) == [redactor.redact(text), "x"]
