"""Redaction's rule narrowing (one automaton scan) keeps every rule the walk with every rule uses.

``Redactor.redact_json`` narrows its rules on one Aho-Corasick pass over a
value's JSON text. Values here are made of the pieces that pass can get
wrong: every rule's gate words (in any case) and triggers, real secrets,
characters whose lowercase is longer or shorter ('İ', Kelvin sign, 'ẞ'),
JSON escapes, credential keys, long texts, and custom patterns (as
``TIERMEM_REDACT_PATTERNS`` gives them); each is compared with the walk
testing every rule on every string.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.tiers.test_redaction import ORDINARY, SECRETS
from tiers.redaction import Redactor
from tiers.redaction._values import _KEY_WORDS

# Custom kinds as settings load them from TIERMEM_REDACT_PATTERNS: no trigger, no gate word.
_CUSTOM = {"employee_id": r"EMP-\d{6}", "sharp": r"ẞ\w+", "ticket": r"(?i)tkt-[a-z]{4}"}
REDACTORS = (
    Redactor("secrets"),
    Redactor("secrets+pii"),
    Redactor("secrets+pii", patterns=_CUSTOM),
    Redactor("secrets").with_patterns(_CUSTOM),
)
_WORDS = sorted({w for r in REDACTORS for w in r._all.words} | set(_KEY_WORDS))
_TRIGGERS = sorted({t for r in REDACTORS for t in r._all.triggers})
_PIECES = [
    *_WORDS,
    *(w.upper() for w in _WORDS),
    *(w.title() for w in _WORDS),
    *_TRIGGERS,
    *(secret for _, secret, _ in SECRETS),
    *(text for _, _, text in SECRETS[:6]),
    *ORDINARY[:4],
    *("İ", "ß", "ẞ", "\u212a", "Σ", "ς", "ﬃ", "日本", "é"),
    *('"', "\\", ":", " ", "=", "\n", "\t", "_", "-", "\x00", "\u2028"),
    *("4111 1111 1111 1111", "+1 415 555 0100", "jane@example.com", "EMP-123456", "TKT-abcd"),
]
_KEYS = ["api_key", "Authorization", "password", "clientSecret", "note", "İd", 'x"y', "key\\"]

strings = st.lists(st.sampled_from(_PIECES), max_size=8).map("".join)
keys = st.one_of(st.sampled_from(_KEYS), st.sampled_from(_WORDS), strings)
values = st.recursive(
    strings,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(values, st.sampled_from([None, "api_key", "note", "İd"]), st.sampled_from(REDACTORS))
@example("İ" * 3000 + SECRETS[0][2], None, REDACTORS[0])
@example({"note": "ß" * 5000 + " password: " + SECRETS[1][1]}, None, REDACTORS[2])
@example(["x" * 20000, {"api_key": SECRETS[0][1]}, "EMP-123456"], None, REDACTORS[3])
@example({"\u212a": "\u212aey " + SECRETS[1][1], "ẞx": "ẞtrasse"}, None, REDACTORS[2])
def test_redact_json_equals_the_walk_with_every_rule(
    value: object, key: str | None, redactor: Redactor
) -> None:
    expected = redactor._walk(value, key, redactor._all, True)
    assert redactor.redact_json(value, key=key) == expected


# Non-ASCII text that lowercases in place (no "İ"): the keys holding a gate word are read
# from it, so a key naming a credential starts the by-key walk and none other does.
_IN_PLACE = [p for p in _PIECES if "İ" not in p] + [
    "é",
    "日本",
    "\u212aey",
    "clé",
    "Schlüssel",
    "ö",
]
_in_place_strings = st.lists(st.sampled_from(_IN_PLACE), max_size=8).map("".join)
_in_place_keys = st.one_of(
    st.sampled_from([*_KEYS[:5], "clé_token", "\u212aey", "passwörd"]), _in_place_strings
)
_in_place_values = st.recursive(
    _in_place_strings,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(_in_place_keys, inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(_in_place_values, st.sampled_from(REDACTORS))
@example({"note": "café", "api_key": SECRETS[0][1]}, REDACTORS[0])
@example({"\u212aey": "Zx9kLm2Qw8Er5Ty1Zx9kLm2Qw8Er5Ty1", "note": "é"}, REDACTORS[0])
@example({"passwörd": "hunter22", "password": "hunter22é"}, REDACTORS[1])
def test_non_ascii_keys_start_the_by_key_walk_as_the_walk_decides(
    value: object, redactor: Redactor
) -> None:
    assert redactor.redact_json(value) == redactor._walk(value, None, redactor._all, True)
