"""Adversarial cases for the session-26 narrowing: the completed scan, the card gate, the step's text.

``Redactor.redact_json`` narrows its rules on a value's JSON text: two leftmost-first automata
(``tiers/redaction/_scan.py``) completed from a table of what a match hides, a card gate that
searches only runs of digits, spaces and dashes, and the JSON text a step already wrote
(``json_text``). A narrowing that drops a rule the walk needs writes a secret to disk, so the
reference is always the walk with every rule and every key tested. The cases draw the pattern
sets themselves (nested, prefix/suffix, self-overlapping words), put cards after every escape
JSON writes and every kind of digit, and pass the text the way a step does.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers import keys
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.codec import to_json_text
from tiers.redaction import Redactor, luhn_valid, redact_dumped_json
from tiers.redaction._scan import GateScan
from tiers.task import TaskTier

SECRET = "Zx9kLm2Qw8Er5Ty1Zx9kLm2Q"
CARD = "4111111111111111"
# One card in the groupings people write, and cards of 13, 15 and 19 digits (the rule takes
# some groupings only: the narrowing must agree with the walk on all of them).
CARDS = (
    CARD,
    "4111 1111 1111 1111",
    "4111-1111-1111-1111",
    "41 11 11 11 11 11 11 11",
    "4-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1",
    "4111 111111 111111",
    "4222222222222",
    "378282246310005",
    "3782 822463 10005",
    "6011000990139424009",
    "6011 0009 9013 9424 009",
)


def _reference(redactor: Redactor, value: object, key: str | None = None) -> object:
    """The walk with every rule, every string under a key tested as labelled by it."""
    return redactor._walk(value, key, redactor._all, True)


def _places(hay: str, patterns: list[str]) -> dict[str, list[int]]:
    """Per pattern found in ``hay``, every place it starts (overlapping ones too)."""
    found: dict[str, list[int]] = {}
    for pattern in patterns:
        at = [n for n in range(len(hay)) if hay.startswith(pattern, n)]
        if at:
            found[pattern] = at
    return found


def _assert_scan_finds_every_place(words: list[str], triggers: list[str], text: str) -> None:
    scan = GateScan(words, triggers)
    lowered = text.lower()
    found, present = scan.scan(text, lowered)
    assert found == _places(lowered, words), text
    assert present == set(_places(text, triggers)), text
    if text.isascii():
        assert scan.scan(text, lowered, text.encode()) == (found, present)


def test_self_overlapping_and_nested_words_at_both_ends() -> None:
    words = ["aa", "a", "aaa", "aba", "ab", "b", "bab"]
    for text in ("aaaa", "aaaaa", "abababa", "babab", "a", "b", "ab", "ba", "xaaax", "aaab"):
        _assert_scan_finds_every_place(words, ["AA", "A", "aA", "Aa"], text)
        _assert_scan_finds_every_place(words, ["AA", "A", "aA", "Aa"], text.upper())


def test_a_trigger_hidden_by_a_longer_one_or_by_its_own_repeat() -> None:
    triggers = ["sk-", "sk-ant-", "k_live_", "-", "xox", "oxo", "xoxo"]
    for text in ("sk-ant-sk-", "xoxoxox", "rk_live_sk-", "sk-ant-", "-sk-", "oxoxo"):
        _assert_scan_finds_every_place(["key", "pass", "ss", "s"], triggers, text)


def test_lowercase_of_another_length_or_script_moves_no_place() -> None:
    words = ["key", "ss", "s", "σς", "k"]
    for text in ("İkey", "ẞkey", "ẞSS", "\u212aey", "ΣΣ key", "keyİ", "İ" * 5 + "ss", "\u212a"):
        _assert_scan_finds_every_place(words, ["KEY", "İ"], text)


_LETTERS = st.text(alphabet="abc", min_size=1, max_size=5)
_CASED = st.text(alphabet="aAbB", min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_LETTERS, min_size=1, max_size=6, unique=True),
    st.lists(_CASED, min_size=1, max_size=6, unique=True),
    st.text(alphabet="aAbBcCİẞ\u212aΣ", max_size=30),
)
def test_any_pattern_set_is_completed_to_every_place(
    words: list[str], triggers: list[str], text: str
) -> None:
    # Drawn from two or three letters, the sets nest, share prefixes and suffixes and
    # overlap themselves far more often than the rules' own words and triggers do.
    _assert_scan_finds_every_place(words, triggers, text)


# What a JSON text may hold right before a card's first digit: every escape JSON writes
# (ending in a letter, a hex digit, a quote or a backslash), characters it writes as they
# are, other scripts' and full-width digits, and what glues a number to a word.
_BEFORE = [
    "",
    "\n",
    "\t",
    "\r",
    "\b",
    "\f",
    "\x00",
    "\x10",
    "\x19",
    "\x1f",
    "\x7f",
    '"',
    "\\",
    " ",
    "\u2028",
    "é",
    "٣",
    "１",
    "a",
    "u",
    "g",
    "-",
    ".",
    "_",
    "/",
    "+",
    ": ",
    "0",
]


def test_a_card_after_anything_json_writes_is_narrowed_as_the_walk_redacts_it() -> None:
    for mode in ("secrets", "secrets+pii"):
        redactor = Redactor(mode)
        for card in CARDS:
            assert luhn_valid(card.replace(" ", "").replace("-", "")), card
            taken = redactor.redact(card) != card  # the rule redacts the card alone
            for before in _BEFORE:
                for value in (
                    {"note": f"{before}{card}"},
                    [f"card {before}{card} y"],
                    f"{before}{card}",
                ):
                    expected = _reference(redactor, value)
                    assert redactor.redact_json(value) == expected, (mode, value)
                    if taken and before in ("", "\n", '"', " ", "\x10", "\u2028"):
                        assert card not in orjson.dumps(expected).decode(), (mode, value)


def test_full_width_and_other_script_cards_are_narrowed_as_the_walk_redacts_them() -> None:
    full_width = CARD.translate(str.maketrans("0123456789", "０１２３４５６７８９"))
    arabic = CARD.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    redactor = Redactor()
    for card in (full_width, arabic, f"{arabic[:8]} {CARD[8:]}"):
        for value in ({"note": card}, [f"card {card}"], {"n": f"\n{card}"}):
            assert redactor.redact_json(value) == _reference(redactor, value), value


class _Kind(enum.StrEnum):
    NOTE = "note"


# Outputs a step may return, orjson's and json's paths both: NaN and infinity (refused), big
# ints, non-str keys, str subclasses, tuples, and escapes and non-ASCII text around secrets.
_OUTPUTS: list[object] = [
    {"note": f"api_key={SECRET}", "n": 2**70},
    {1: f"password: {SECRET}"},
    {"k": _Kind.NOTE, "v": f"token: {SECRET}"},
    (f"\n{CARD}", "x"),
    {"b": f'the "api key": "{SECRET}"', "a": "İ\u212aey"},
    {"password": SECRET, "idempotency_key": "k-1"},
    [f"\x10{CARD}", "ya29." + SECRET],
    {"z": 1.5, "y": [None, True, f"keya29.{SECRET}"]},
]


def test_a_steps_json_text_narrows_as_the_value_itself_does() -> None:
    for mode in ("secrets", "secrets+pii"):
        redactor = Redactor(mode)
        for raw in _OUTPUTS:
            output, text = to_json_text(raw, field="output")
            if text is not None:
                # The text the step passes is orjson's dump of the very value redacted.
                assert orjson.loads(text) == output
                redacted = redact_dumped_json(redactor, output, text)
                assert redacted == redactor.redact_json(output), raw
            else:
                redacted = redactor.redact_json(output)
            assert redacted == _reference(redactor, output), raw
            assert redacted != output, raw  # each holds a secret


def _returning(value: object) -> Callable[[], object]:
    return lambda: value


def test_a_steps_secret_is_not_stored(tmp_path: Path) -> None:
    kv = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        run = TaskTier(kv, redactor=Redactor()).start_run("u", "adversarial")
        space = keys.run_space("default", run.run_id)
        for seq, raw in enumerate(_OUTPUTS, start=1):
            out = run.step(f"s{seq}", _returning(raw))
            (data,) = kv.get_many(space, [keys.checkpoint_key(seq)])
            assert data is not None
            assert orjson.loads(data)["output"] == out
            for secret in (SECRET, CARD):
                assert secret.encode() not in data, raw
    finally:
        kv.close()


def test_the_trusted_text_is_not_on_the_public_redactor() -> None:
    # A wrong text skips secrets (above), so the public method takes none: a caller that has the
    # value's orjson text uses redact_dumped_json, which the task writer does.
    secret_free_text: dict[str, Any] = {"json_text": b"{}"}
    with pytest.raises(TypeError):
        Redactor("secrets").redact_json({"password": "hunter2-" + SECRET}, **secret_free_text)
    value = {"password": "hunter2-" + SECRET}
    assert redact_dumped_json(Redactor("secrets"), value, orjson.dumps(value)) == Redactor(
        "secrets"
    ).redact_json(value)
