"""redact_json's gates look where a match could be: string values, real credential keys, card runs.

The narrowing ``Redactor.redact_json`` runs over a value's JSON text counts a rule's words only
where a string VALUE holds them (not in key names such as ``idempotency_key``), starts the by-key
walk only when a real key names a credential, and keeps the card rule only for a 13-digit run
where a card may start. Each of these may only skip work: the reference stays the walk with every
rule and every key tested. The strategies here aim at the gates' edges: credential-named keys
(and keys that only contain a credential word), words shared by keys and values, card numbers
with separators after an escape JSON writes, hex ids glued to a word, quotes and backslashes in keys.
"""

from __future__ import annotations

import random
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tiers.test_redaction import ORDINARY, SECRETS
from tiers.redaction import Redactor, luhn_valid

_rng = random.Random(24)


def _card(prefix: str, length: int) -> str:
    body = prefix + "".join(_rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
    return next(body + d for d in string.digits if luhn_valid(body + d))


VISA = _card("4", 16)
AMEX = _card("37", 15)
CARDS = [
    VISA,
    _card("4", 13),
    " ".join(VISA[i : i + 4] for i in range(0, 16, 4)),
    "-".join(VISA[i : i + 4] for i in range(0, 16, 4)),
    f"{AMEX[:4]} {AMEX[4:10]} {AMEX[10:]}",
    f"{AMEX[:4]}-{AMEX[4:10]}-{AMEX[10:]}",
    VISA[:12],  # too short for a card, long enough for the 7-digit run
]

# Keys: credential labels (qualified, bare, camelCase, header), keys that only contain a
# credential word, keys holding a trigger or a whole secret, keys JSON escapes, non-ASCII keys.
KEYS = [
    "note",
    "content",
    "password",
    "Password",
    "passwd",
    "api_key",
    "apiKey",
    "x-api-key",
    "clientSecret",
    "client_secret",
    "secret",
    "Authorization",
    "proxy-authorization",
    "token",
    "access_token",
    "token_id",
    "tokens",
    "idempotency_key",
    "monkey",
    "mytoken",  # glued: no label; its camelCase twin is one
    "myToken",
    "key",
    "pin",
    "spin",
    "cvv",
    "security_code",
    "my password",
    'pass"word',
    "pass\\word",
    "tok\nen",
    "İd_token",
    "\u212aey",  # the Kelvin sign: its lowercase is "k"
    "phone",
    "xoxb-",
    "sk-",
    ":x",
    "a,",
    "",
]

FRAGMENTS = [
    *(text for _, _, text in SECRETS[::3]),
    *ORDINARY[::3],
    *CARDS,
    *KEYS,
    "s3cr3tpw",
    "Zx9kLm2Qw8Er5Ty1Zx9kLm2Q",
    "hunter22",
    " is ",
    ": ",
    "=",
    " ",
    "\n",
    "\x01",
    "\x1f",
    "\t",
    '"',
    "\\",
    "-",
    "_",
    ".",
    "/",
    "a",
    "f",
    "x",
    "4",
    "1700000010.0",
    "eff-12-3-",
    "d4d4714731481113",
    "0123456789",
    "run-00003:000012",
    "xoxr",
    "xoxb-1234567890-",
    "cv",
    "cvc",
    "call me",
    "tel",
]

# What may come right before a card number in a string: nothing, a space, what JSON escapes
# (\n, \u0001, \u001f: their last character a letter or a digit), what glues it to a word.
BEFORE_CARD = ["", " ", "\n", "\x01", "\x1f", "\t", '"', "\\", "-", "_", "a", "f", "x", "4", ":"]
AFTER_CARD = ["", " ", ".", ".5", "-", "x", "\n", " 22"]
card_texts = st.tuples(
    st.sampled_from(FRAGMENTS),
    st.sampled_from(BEFORE_CARD),
    st.sampled_from(CARDS),
    st.sampled_from(AFTER_CARD),
).map("".join)
strings = st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join) | card_texts
keys = st.sampled_from(KEYS) | strings
values = st.recursive(
    strings | st.integers() | st.floats(allow_nan=False) | st.booleans() | st.none(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=10,
)
MODES = st.sampled_from(["secrets", "secrets+pii"])


def _reference(redactor: Redactor, value: object, key: str | None = None) -> object:
    """The walk with every rule, every string under a key tested as labelled by it."""
    return redactor._walk(value, key, redactor._all, True)


@settings(max_examples=600, deadline=None)
@given(values, MODES)
def test_redact_json_equals_the_walk_with_every_rule(value: object, mode: str) -> None:
    redactor = Redactor(mode)  # type: ignore[arg-type]
    assert redactor.redact_json(value) == _reference(redactor, value)


@settings(max_examples=300, deadline=None)
@given(keys, strings, keys, strings, MODES)
def test_a_key_and_a_value_sharing_a_word_are_told_apart(
    key: str, text: str, other_key: str, other: str, mode: str
) -> None:
    # The same fragments on both sides of a colon, in both orders and in a list.
    redactor = Redactor(mode)  # type: ignore[arg-type]
    for value in (
        {key: text, other_key: other},
        {key: other_key, text: other},
        [{key: [text, other]}, other_key],
    ):
        assert redactor.redact_json(value) == _reference(redactor, value)


@settings(max_examples=200, deadline=None)
@given(strings, keys)
def test_a_fact_key_is_tested_whatever_the_value_text(text: str, key: str) -> None:
    redactor = Redactor()
    assert redactor.redact_json(text, key=key) == _reference(redactor, text, key)
    assert redactor.redact_json([text], key=key) == _reference(redactor, [text], key)


def test_each_gate_can_tell_a_finding_from_nothing() -> None:
    """The hand-picked edges: each is a finding the full walk makes and a gate could miss."""
    redactor = Redactor()
    cases: list[object] = [
        {"idempotency_key": "k-1", "text": f"card:\n{VISA}"},  # an escape before a card
        {"id": "x", "text": f"\x01{VISA}"},  # \u0001: hex digits glued before the card
        {"id": "x", "text": f"\x1f{VISA}"},  # \u001f: a hex letter before the card
        {"k": "eff-3-1-", "text": f" {' '.join(VISA[i : i + 4] for i in range(0, 16, 4))}"},
        {"idempotency_key": "x", "notes": ["the api key: Zx9kLm2Qw8Er5Ty1Zx9kLm2Q"]},
        {"user": {"clientSecret": "Zx9kLm2Qw8Er5Ty1Zx9kLm2Q"}},
        {"headers": {"Authorization": "Bearer Zx9kLm2Qw8Er5Ty1"}},
        {"creds": [{"password": "hunter22"}]},
        [{"mytoken": "a"}, {"myToken": "Zx9kLm2Qw8Er5Ty1Zx9kLm2Q"}],  # keys alike but for case
    ]
    for value in cases:
        expected = _reference(redactor, value)
        assert expected != value, value  # the case has a finding
        assert redactor.redact_json(value) == expected, value


def test_a_chat_state_checkpoint_narrows_to_nothing() -> None:
    """Keys such as ``idempotency_key``, timestamps and hex ids keep no rule and no key walk."""
    gen = random.Random(5)
    words = ["the", "tool", "returned", "rows", "for", "query", "plan", "next", "step"]
    payload = {
        "run_id": "run-00003",
        "seq": 12,
        "parent_id": "run-00003:000011",
        "status": "committed",
        "messages": [
            {"id": f"m12-{i}", "role": role, "content": " ".join(gen.choices(words, k=40))}
            for i, role in enumerate(["user", "assistant", "tool"] * 4)
        ],
        "tool_results": [{"call_id": "call-12-0", "tool": "search", "output": "no rows"}],
        "effect_log": [
            {
                "idempotency_key": f"run-00003-eff-12-{i}-{gen.getrandbits(64):016x}",
                "effect": "http.post",
                "status": "done",
                "ts": 1.7e9 + 120 + i,
            }
            for i in range(10)
        ],
    }
    redactor = Redactor()
    rule_set, by_key = redactor._narrow(payload, None)
    assert [rule.name for rule in rule_set.rules] == []
    assert by_key is False
    assert redactor.redact_json(payload) is payload
