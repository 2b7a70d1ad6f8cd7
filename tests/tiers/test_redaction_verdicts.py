"""Strings found clean kept per redactor: a redactor that saw a string before answers as a new one.

``Redactor.redact_json`` keeps the strings its walk found nothing in (by the
rules it used and the exact text), so a chat state's history, the same text
every step, is not tested again. These tests hold that a redactor that kept
strings of earlier values gives what a fresh one gives, value by value, that
nothing is copied when nothing changed, that a string with a secret is never
kept, and that what is kept stays bounded.
"""

from __future__ import annotations

import copy
from hashlib import blake2b

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tiers.test_redaction import SECRETS
from tests.tiers.test_redaction_narrowing import REDACTORS, values
from tiers.redaction import Redactor, redact_dumped_json
from tiers.redaction._verdicts import GENERATION_ENTRIES, CleanStrings, _entry

_HISTORY = [
    "My key point is that the pin on the map was wrong.",
    f"password: {SECRETS[1][1]}",
    "The token of appreciation arrived: thanks!",
    f"use {SECRETS[0][1]} for the call",
    "Call me at +1 415 555 0100 after six.",
    "Card 4111 1111 1111 1111, expiry 12/29.",
    "Reviewed: ok.",
]


def _thread(turns: int) -> list[dict[str, object]]:
    """The states of a growing chat thread, one per step, each decoded afresh (new string objects)."""
    messages: list[dict[str, str]] = []
    states: list[dict[str, object]] = []
    for n in range(turns):
        messages.append({"role": "user", "content": _HISTORY[n % len(_HISTORY)] + f" ({n})"})
        messages.append({"role": "assistant", "content": _HISTORY[(n * 3) % len(_HISTORY)]})
        states.append(orjson.loads(orjson.dumps({"messages": messages, "step": n})))
    return states


def test_a_growing_thread_is_redacted_as_by_a_fresh_redactor_at_every_step() -> None:
    for mode in ("secrets", "secrets+pii"):
        seasoned = Redactor(mode)
        for state in _thread(30):
            text = orjson.dumps(state)
            expected = Redactor(mode).redact_json(copy.deepcopy(state))
            assert redact_dumped_json(seasoned, state, text) == expected
            assert seasoned.redact_json(state) == expected
        assert len(seasoned._clean) > 0  # the history was answered from them


def test_an_unchanged_string_is_given_back_itself_when_an_equal_one_was_seen() -> None:
    redactor = Redactor()
    first = orjson.loads(orjson.dumps({"notes": ["the key to the garden shed is lost"]}))
    again = orjson.loads(orjson.dumps(first))
    assert redactor.redact_json(first) is first
    assert again["notes"][0] is not first["notes"][0]
    assert redactor.redact_json(again) is again  # no copy of the dict or the list


def test_a_string_with_a_secret_is_redacted_again_and_never_kept() -> None:
    redactor = Redactor()
    secret = f"password: {SECRETS[1][1]}"
    before = redactor.redact_json({"a": [secret, "the key is under the mat"]})
    after = redactor.redact_json({"b": orjson.loads(orjson.dumps([secret]))})
    assert before["a"][0] == after["b"][0]
    assert SECRETS[1][1] not in after["b"][0]
    assert len(redactor._clean) == 1  # the clean one
    kept = {digest for _, digest in redactor._clean._young}
    assert {_entry(((0,), "the key is under the mat"))[1]} == kept
    assert _entry(((0,), secret))[1] not in kept


@settings(max_examples=300, deadline=None)
@given(st.lists(values, min_size=2, max_size=5), st.integers(0, len(REDACTORS) - 1))
def test_values_in_a_row_are_redacted_as_each_alone(row: list[object], which: int) -> None:
    # The shared redactors keep verdicts across every example of this test and the others.
    redactor = REDACTORS[which]
    for value in [*row, *row]:
        fresh = Redactor(
            redactor.mode, patterns=redactor.patterns, placeholder=redactor.placeholder
        )
        assert redactor.redact_json(value) == fresh.redact_json(value)


def test_clean_strings_stay_within_their_bound() -> None:
    clean = CleanStrings()
    for n in range(3 * GENERATION_ENTRIES):
        clean.add(((0,), f"message {n}"))
        assert len(clean._young) <= GENERATION_ENTRIES
    assert len(clean) <= 2 * GENERATION_ENTRIES
    assert ((0,), f"message {n}") in clean
    assert ((0,), "message 0") not in clean  # dropped with its generation
    assert ((1,), f"message {n}") not in clean  # other rules, another entry


def test_the_kept_entries_hold_no_text() -> None:
    redactor = Redactor()
    words = "the key to the garden shed is under the third flowerpot"
    assert redactor.redact_json({"notes": [words]}) == {"notes": [words]}
    assert len(redactor._clean) == 1
    # The one entry is the rules' indexes and the words' digest, not the words.
    ((_, digest),) = redactor._clean._young
    assert digest == blake2b(words.encode(), digest_size=16).digest()
    # A long string is kept as a digest too, and answered from it.
    long_text = "the key to it all " + "y" * 100_000
    assert redactor.redact_json([long_text])[0] is long_text
    assert len(redactor._clean) == 2
    again = "".join(["the key to it all ", "y" * 100_000])
    assert again is not long_text
    assert redactor.redact_json([again])[0] is again


class _OwnEncode(str):
    """A str whose encode gives the same bytes for every text."""

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"same"


def test_a_str_subclass_with_its_own_encode_is_kept_by_its_text() -> None:
    redactor = Redactor()
    secret = f"use {SECRETS[0][1]} for the call"
    # Both values keep the same rules (the secret's trigger is in both), so only the text differs.
    first = redactor.redact_json({"m": _OwnEncode(secret), "n": _OwnEncode("sk- nothing here")})
    assert first["n"] == "sk- nothing here"  # found clean and kept
    assert redactor.redact_json({"n": _OwnEncode(secret)}) == Redactor().redact_json({"n": secret})
