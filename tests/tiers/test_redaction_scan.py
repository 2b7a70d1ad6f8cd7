"""The narrowing's automaton scan at its edges: overlaps, the text's end, non-ASCII, escapes.

``Redactor.redact_json`` narrows its rules on a value's JSON text from one Aho-Corasick pass
(``tiers/redaction/_scan.py``) that finds every gate word (in the lowercased text) and every
trigger (as it is), with every place a word starts. A scan that missed an occurrence would drop
a rule the walk needs; the reference stays the walk with every rule and every key tested. The
cases aim where an automaton step goes wrong: a pattern whose only occurrence overlaps another
one, a secret ending the text, text whose lowercase is longer (positions move) or turns
non-ASCII letters into ASCII ones, and words next to or made by the escapes JSON writes.
"""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.redaction import Redactor
from tiers.redaction._scan import GateScan

# A Google OAuth token has no boundary test before it: "keya29." holds the word "key" and
# the trigger "ya29." overlapping on the "y".
OAUTH = "ya29." + "Zx9kLm2Qw8Er5Ty1Zx9kLm2Q"
GITHUB = "ghp_" + "Zx9kLm2Qw8Er5Ty1Zx9kLm2Qw8Er5Ty1Zx9k"
SECRET = "Zx9kLm2Qw8Er5Ty1Zx9kLm2Q"


def _reference(redactor: Redactor, value: object, key: str | None = None) -> object:
    """The walk with every rule, every string under a key tested as labelled by it."""
    return redactor._walk(value, key, redactor._all, True)


def _redacted_as_by_the_walk(value: object, key: str | None = None) -> None:
    """``redact_json`` finds something in ``value`` and gives what the walk with every rule does."""
    redactor = Redactor()
    expected = _reference(redactor, value, key)
    assert expected != value, value  # the case has a finding
    assert redactor.redact_json(value, key=key) == expected, value


def test_the_scan_finds_overlapping_occurrences() -> None:
    scan = GateScan(["key", "cvc", "csc", "security"], ["ya29.", "eyJ"])
    words, triggers = scan.scan(
        "keya29. cscvc securitya29. KEYJ", "keya29. cscvc securitya29. keyj"
    )
    assert words == {"key": [0, 27], "csc": [8], "cvc": [10], "security": [14]}
    assert triggers == {"ya29."}  # "eyj" occurs lowercased only: "eyJ" is confirmed in the text


def test_a_rule_whose_only_trigger_overlaps_a_word_is_kept() -> None:
    for text in (f"keya29.{OAUTH[5:]}", f"see security{OAUTH}", f"the monkey{OAUTH}"):
        _redacted_as_by_the_walk({"note": text})
        _redacted_as_by_the_walk([{"idempotency_key": "k-1"}, text])


def test_the_scan_finds_a_pattern_ending_the_text() -> None:
    scan = GateScan(["token"], ["ghp_", "xox"])
    assert scan.scan("a xox", "a xox") == ({}, {"xox"})
    assert scan.scan("my token", "my token") == ({"token": [3]}, set())
    assert scan.scan("token", "token") == ({"token": [0]}, set())


def test_a_secret_ending_the_text_is_found() -> None:
    _redacted_as_by_the_walk(GITHUB)
    _redacted_as_by_the_walk(f"use {GITHUB}")
    _redacted_as_by_the_walk({"note": "x", "last": f"the api key: {SECRET}"})
    _redacted_as_by_the_walk([1, 2, f"password: {SECRET}"])


def test_words_are_found_whatever_their_case_triggers_only_as_they_are() -> None:
    scan = GateScan(["token", "key"], ["AKIA", "sk-"])
    text = "API_KEY TOKEN akia AKIA SK-"
    words, triggers = scan.scan(text, text.lower())
    assert words == {"key": [4], "token": [8]}
    assert triggers == {"AKIA"}
    _redacted_as_by_the_walk({"note": f"API_KEY={SECRET}"})
    _redacted_as_by_the_walk({"note": f"Access TOKEN: {SECRET}"})


def test_positions_are_characters_where_lowercasing_moves_them() -> None:
    # "İ" lowercases to two characters ("i" and a combining dot): what follows moves by one.
    text = "İİ key, ß token"
    lowered = text.lower()
    assert len(lowered) == len(text) + 2
    words, _ = GateScan(["key", "token"], []).scan(text, lowered)
    assert words == {"key": [lowered.index("key")], "token": [lowered.index("token")]}
    # The Kelvin sign lowercases to an ASCII "k": the lowercased text is ASCII, the text not.
    kelvin = "api_\u212aey"
    assert GateScan(["key"], []).scan(kelvin, kelvin.lower()) == ({"key": [4]}, set())


def test_non_ascii_text_is_narrowed_as_the_walk_redacts_it() -> None:
    _redacted_as_by_the_walk({"note": f"İİ the api key: {SECRET}", "ü": "ß"})
    _redacted_as_by_the_walk({"İd": "x", "notes": [f"İ İ password: {SECRET}", "é"]})
    _redacted_as_by_the_walk({"note": f"api_\u212aey={SECRET}"})
    _redacted_as_by_the_walk({"note": f"日本語 {GITHUB} İ"})
    _redacted_as_by_the_walk({"password": SECRET, "İ": "İ key"})
    _redacted_as_by_the_walk([SECRET, "İ"], key="api_key")


def test_words_next_to_or_made_by_a_json_escape() -> None:
    # JSON writes "\n" as a backslash and "n", "\t" as a backslash and "t", "\x01" as "\u0001":
    # a letter of an escape may complete a word the string does not hold ("pi\n" -> "pi\\n"),
    # and a word or trigger right after an escape must still be found.
    for text in (
        f"x\n{GITHUB}",
        f"\x01{GITHUB}",
        f"\tpassword: {SECRET}",
        f"pi\n\ttoken: {SECRET}",
        f'the "api key": "{SECRET}"',
        f"\\api_key={SECRET}",
        f"keya29.\n{OAUTH}",
    ):
        _redacted_as_by_the_walk({"note": text})
    _redacted_as_by_the_walk({'x"y\\': "\\", "api_key": SECRET, "pi\n": "\token"})
    _redacted_as_by_the_walk({"a\\": {"api_key": SECRET}})


def test_escapes_that_spell_a_word_change_nothing() -> None:
    redactor = Redactor()
    for value in ({"note": "pi\n"}, {"note": "\token"}, ["\x01ey", "s\x1fk-"], {"pi\n": "x"}):
        assert redactor.redact_json(value) == _reference(redactor, value) == value


# Fragments for the property: words and triggers that overlap one another, non-ASCII letters
# whose lowercase is longer or ASCII, characters JSON escapes, and what makes a finding.
FRAGMENTS = [
    "key",
    "KEY",
    "\u212aey",
    "ya29.",
    OAUTH[5:],
    "cvc",
    "csc",
    "security",
    "token",
    "Token",
    "pin",
    "pass",
    "word",
    "api_",
    "sk-",
    "ghp_",
    GITHUB[4:],
    "eyJ",
    "xox",
    "b-1234567890",
    "İ",
    "ß",
    "é",
    "日",
    "\n",
    "\t",
    "\x01",
    '"',
    "\\",
    ": ",
    "=",
    " ",
    SECRET,
    "4111111111111111",
]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=8).map("".join)
values = st.recursive(
    texts | st.integers() | st.none(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(values, st.sampled_from(["secrets", "secrets+pii"]))
def test_redact_json_equals_the_walk_at_the_scans_edges(value: object, mode: str) -> None:
    redactor = Redactor(mode)  # type: ignore[arg-type]
    assert redactor.redact_json(value) == _reference(redactor, value)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.ascii_letters + 'İß\u212a\n"\\:_.- ', max_size=40))
def test_the_scan_finds_every_occurrence_substring_tests_find(text: str) -> None:
    words = ["key", "pass", "cvc", "csc", "pin", "token", "ss", "s"]
    triggers = ["sK-", "ya29.", "AKIA", "KEY"]  # "KEY": the lowercase of a trigger is a word
    lowered = text.lower()
    found, present = GateScan(words, triggers).scan(text, lowered)
    for word in words:
        at = [n for n in range(len(lowered)) if lowered.startswith(word, n)]
        assert found.get(word, []) == at
    assert present == {t for t in triggers if t in text}


def test_what_a_leftmost_match_hides_is_found() -> None:
    # The automata report leftmost-first matches, longest first, without overlaps: a word
    # inside a reported one ("ss" in "pass"), one starting inside it and running past its
    # end ("secret" after "pas", "token" after "secre"), a shorter trigger where a longer
    # one starts ("sk-" at "sk-ant-") must come from the completion table.
    words = ["pass", "secret", "security", "token", "cvc", "csc", "ss", "s"]
    triggers = ["sk-", "sk-ant-", "k_live_", "ya29.", "t-x"]
    scan = GateScan(words, triggers)
    text = "passecretoken cvcsc sk-ant-x rk_live_ passs securitysecret"
    lowered = text.lower()
    found, present = scan.scan(text, lowered)
    for word in words:
        assert found.get(word, []) == [
            n for n in range(len(lowered)) if lowered.startswith(word, n)
        ]
    assert present == {t for t in triggers if t in text} == set(triggers) - {"ya29."}
