"""The narrowing's card gate (``_has_card_run``) against the card rule's own start and run.

``Redactor.redact_json`` keeps the ``card_number`` rule for a value only when its
JSON text has 13 digits, a single space or dash allowed between two of them,
starting where the rule may start a card: not after a digit or a dash, nor after
a letter, ``_``, ``.``, ``+`` or ``/`` that glues a number to a word, but for the
letters a JSON escape ends with (``\\n``, ``\\u001f``: a-f, n, r, t, u). The gate
finds runs of digits, spaces and dashes by a table map and a substring test and
searches only those; the reference here is a plain loop over every place.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tiers.redaction import Redactor, _redactor, _rules
from tiers.redaction._rules import (
    _CARD_RUN,
    _DIGIT_RUN,
    _has_card_run,
    _has_digit_run,
    _other_digits,
)

_GLUE = frozenset(c for c in string.ascii_letters if c.lower() not in "abcdefnrtu") | frozenset(
    "_.+/"
)


def _reference(text: str) -> bool:
    """Whether a card run starts somewhere in ASCII ``text`` (every place tried)."""
    for start, char in enumerate(text):
        if not char.isdigit():
            continue
        before = text[start - 1] if start else ""
        if before.isdigit() or before == "-" or before in _GLUE:
            continue
        digits, pos = 1, start + 1
        while digits < 13 and pos < len(text):
            if text[pos] in " -" and pos + 1 < len(text) and text[pos + 1].isdigit():
                pos += 1
            if not text[pos].isdigit():
                break
            digits, pos = digits + 1, pos + 1
        if digits == 13:
            return True
    return False


def test_runs_the_card_rule_may_start_pass() -> None:
    for text in (
        '"4111111111111111"',
        '"card 4111 1111 1111 1111"',
        '"4111-1111-1111-1111"',
        "1234567890123",
        '"\\n4111111111111111"',  # after an escape's letter
        '"eff-3-1-a4129876543210"',  # a hex id: the digits follow "a"
        '"ab 12 34  5678901234567"',  # a later start in the same run
        '"ab 1234 x 5678901234567"',  # a later run
    ):
        assert _has_card_run(text.encode(), text) is True, text


def test_runs_glued_or_short_fail() -> None:
    for text in (
        '"x4111111111111111"',  # glued to a word
        '"eff-3-1-4129876543210"',  # after a dash
        '"1700000123.0"',
        '"4111  1111 1111 1111"',  # two separators
        '"411111111111"',  # 12 digits
        '"4111 - 1111"',
        "",
    ):
        assert _has_card_run(text.encode(), text) is False, text


@settings(max_examples=1500, deadline=None)
@given(st.text(alphabet="0123456789" * 3 + '  --afnrtuAxzZ_.+/:"\\,', max_size=60))
@example("1 2 3 4 5 6 7 8 9 0 1 2 3")
@example("x1 2 3 4 5 6 7 8 9 0 1 2 3 4")
@example("-1234567890123 4")
def test_the_gate_is_the_reference(text: str) -> None:
    assert _has_card_run(text.encode(), text) is _reference(text)


# Text with characters of other scripts: digits of theirs (Arabic-Indic, full-width,
# Devanagari), letters, and the separators the card and phone runs allow.
_MIXED = "0123456789" * 3 + '  --().éß日€\u0663\uff11\u0967aZ"\\'


@settings(max_examples=1500, deadline=None)
@given(st.text(alphabet=_MIXED, max_size=60))
@example("é4111111111111111")
@example("é411111111111\u0663")  # 13 digits, the last of another script
@example("日 415 555 0100")
@example("\uff11" + "4111111111111111")
@example("Z0000000000000")  # drawn all ASCII: the ASCII gate's reference holds there
def test_on_non_ascii_text_the_gates_are_the_regexes_over_the_text(text: str) -> None:
    data = text.encode()
    if text.isascii():  # the alphabet can draw ASCII only: the ASCII gate, checked above
        assert _has_card_run(data, text) is _reference(text)
    else:
        assert _has_card_run(data, text) is (_CARD_RUN.search(text) is not None)
    assert _has_digit_run(data, text) is (_DIGIT_RUN.search(text) is not None)


_PII = Redactor("secrets+pii")


@settings(max_examples=1500, deadline=None)
@given(
    st.text(alphabet="0123456789" * 3 + "  ().--+", max_size=30),
    st.sampled_from(["phone: ", "tel ", "call ", "", "x "]),
)
@example("555 - 1234 x", "phone: ")  # two separators: no 7-digit run with single ones
@example("12 (34) (56) (78) now", "call +")
@example("020 - 7946 - 0958", "Tel: ")
def test_the_digit_gate_holds_wherever_a_phone_or_card_rule_finds_one(tail: str, lead: str) -> None:
    text = lead + tail
    hits = [
        rule.name
        for rule in _PII._rules
        if rule.digits
        for m in rule.pattern.finditer(text)
        if rule.classify(m) is not None
    ]
    if hits:
        assert _DIGIT_RUN.search(text) is not None, hits
        assert _has_digit_run(text.encode(), text), hits
        assert _PII.redact(text) != text
        assert _PII.redact_json({"m": text}) == {"m": _PII.redact(text)}


@pytest.mark.parametrize(
    "text",
    [
        "café: card 4111 1111 1111 1111, call 212-456-7890",  # both gates, ASCII digits only
        "café ٣ card 4111 1111 1111 1111, call 212-456-7890",  # an Arabic-Indic digit too
    ],
)
def test_other_scripts_digits_are_looked_for_once_per_narrowing(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The card and the phone gates ask the same question of one non-ASCII text: once.
    calls: list[bytes] = []

    def counted(data: bytes) -> bool:
        calls.append(data)
        return _other_digits(data)

    monkeypatch.setattr(_redactor, "_other_digits", counted)
    monkeypatch.setattr(_rules, "_other_digits", counted)
    value = {"note": text}
    redacted = Redactor("secrets+pii").redact_json(value)
    assert len(calls) == 1
    assert redacted == {"note": Redactor("secrets+pii").redact(text)}
    assert "4111" not in redacted["note"]
    assert "456-7890" not in redacted["note"]


def test_ascii_text_asks_nothing_of_other_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    monkeypatch.setattr(_redactor, "_other_digits", calls.append)
    monkeypatch.setattr(_rules, "_other_digits", calls.append)
    text = "card 4111 1111 1111 1111, call 212-456-7890"
    assert Redactor("secrets+pii").redact_json({"note": text}) == {
        "note": "card [REDACTED:card_number], call [REDACTED:phone]"
    }
    assert calls == []
