"""redact_json narrows the rules on a value's JSON text: the result is that of testing every rule.

``Redactor.redact_json`` first runs cheap gates over the value's JSON text and then walks its
strings with the rules that may match. The walk with every rule (``_walk`` over all rules, keys
included) is the reference: the gates may only skip work, never a finding.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tiers.test_redaction import ORDINARY, SECRETS
from tiers.redaction import Redactor

# Pieces that sit on the gates' edges: URL credentials, escapes JSON writes (control
# characters, backslash, quote), labels with and without a letter after them, non-ASCII
# characters whose lowercase is longer, tokens' first parts with and without a token after them.
FRAGMENTS = [
    *(text for _, _, text in SECRETS),
    *ORDINARY,
    "postgresql://app:",
    "s3cr3tpw",
    "@10.0.0.5",
    "https://example.com/a-b/1",
    "://",
    ":",
    "@",
    "/",
    "\\",
    '"',
    "\n",
    "\t",
    "\x01",
    "\x1f",
    "\b",
    "İ",
    "ß",
    "pin",
    "PIN",
    "key",
    "token",
    "tokens",
    " is ",
    ": ",
    "=",
    "7391",
    "hunter22",
    "Bearer ",
    " ",
    # Tokens' first parts, and what makes a token of them (a long run after them).
    "sk-",
    "task-",
    "sk-ant-",
    "hf_",
    "npm_",
    "AIza",
    "SG.",
    ".",
    "eyJ",
    "tmk_0123456789ab_",
    "Zx9kLm2Qw8Er5Ty1",
]

strings = st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join)
keys = st.sampled_from(["note", "password", "api_key", "Authorization", "url", "text", "pin"])
values = st.recursive(
    strings | st.integers() | st.none(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(values, st.sampled_from(["secrets", "secrets+pii"]))
def test_redact_json_equals_the_walk_with_every_rule(value: object, mode: str) -> None:
    redactor = Redactor(mode)  # type: ignore[arg-type]
    expected = redactor._walk(value, None, redactor._all, True)
    assert redactor.redact_json(value) == expected


@settings(max_examples=200, deadline=None)
@given(strings, keys)
def test_a_labelled_string_is_redacted_as_by_the_walk(text: str, key: str) -> None:
    redactor = Redactor()
    assert redactor.redact_json(text, key=key) == redactor._walk(text, key, redactor._all, True)
    assert redactor.redact_json({key: [text]}) == redactor._walk(
        {key: [text]}, None, redactor._all, True
    )
