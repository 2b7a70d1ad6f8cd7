"""The lean durable step: each fast path gives exactly what the path it replaced gave.

A step's output is validated and encoded once (orjson, :func:`tiers.codec.to_json`),
its checkpoint's JSON values are spliced into the record's bytes
(:func:`~tiers.task._records.encode_checkpoint`), reads parse them with orjson
(:func:`~tiers.task._records.decode_checkpoint`), and redaction narrows its rules
once per value. Each is checked here against the old path, on generated values.
"""

from __future__ import annotations

import enum
import math
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from tiers import values
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.codec import decode, encode, to_json
from tiers.errors import CorruptRecordError, InvalidInputError
from tiers.models import Checkpoint
from tiers.redaction import Redactor
from tiers.redaction._rules import _DIGIT_RUN, _has_digit_run
from tiers.task import TaskTier
from tiers.task._records import decode_checkpoint, encode_checkpoint

# Strings JSON has to escape, text that looks like the structure the splice looks for,
# non-ASCII and non-BMP characters.
_TRICKY = st.sampled_from(
    [
        "",
        '"',
        "\\",
        "\n\t\x00\x1f\x7f",
        ',"output":null,',
        ',"state_delta":null,"event_seq":',
        "é😀\u2028",
        "</script>",
    ]
)
_TEXT = st.one_of(_TRICKY, st.text(max_size=12))
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _TEXT,
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)),
    max_leaves=20,
)
_NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


class _Colour(enum.Enum):
    RED = "red"


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_to_json_returns_what_the_json_round_trip_returns(value: JsonValue) -> None:
    expected = values.to_json(value, field="output")
    got = to_json(value, field="output")
    assert got == expected
    assert list(_walk_keys(got)) == list(_walk_keys(expected))  # sorted alike


def test_to_json_converts_and_refuses_what_json_converts_and_refuses() -> None:
    converted: list[object] = [(1, "a"), {1: "x"}, {"b": (2.5,), "a": [True]}, 2**80]
    for value in converted:
        assert to_json(value, field="output") == values.to_json(value, field="output")
    refused: list[object] = [
        math.nan,
        {"k": math.inf},
        _Colour.RED,
        uuid.UUID(int=7),
        _NOW,
        {1, 2},
        "\ud800",
        {1: "a", "b": 2},
        object(),
    ]
    for value in refused:
        with pytest.raises(InvalidInputError):
            values.to_json(value, field="output")
        with pytest.raises(InvalidInputError):
            to_json(value, field="output")


def _walk_keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in [key, *_walk_keys(v)]]
    if isinstance(value, list):
        return [k for v in value for k in _walk_keys(v)]
    return []


def _checkpoint(step: str, scope: dict[str, JsonValue] | None) -> Checkpoint:
    return Checkpoint(
        checkpoint_id="ckpt-000000000001-0123456789ab",
        run_id="run-1",
        seq=1,
        parent_id=None,
        step=step,
        input_hash="0" * 64,
        idempotency_key=step,
        scope=scope,
        started_at=_NOW,
        created_at=_NOW,
        event_seq=2,
    )


@settings(max_examples=300, deadline=None)
@given(
    output=_JSON,
    delta=st.none() | st.dictionaries(_TEXT, _JSON, max_size=3),
    scope=st.none() | st.dictionaries(_TEXT, _JSON, max_size=3),
    step=_TRICKY.filter(lambda s: s.strip() != "") | st.just("step"),
)
def test_checkpoint_bytes_and_records_are_those_of_the_pydantic_path(
    output: JsonValue,
    delta: dict[str, JsonValue] | None,
    scope: dict[str, JsonValue] | None,
    step: str,
) -> None:
    base = _checkpoint(step, scope)
    full = base.model_copy(update={"output": output, "state_delta": delta})
    data = encode_checkpoint(base, output, delta)
    assert data == encode(full)
    assert decode_checkpoint(data, where="w") == decode(Checkpoint, data, where="w")


def test_a_corrupt_checkpoint_is_refused_as_before() -> None:
    good = encode(_checkpoint("s", None).model_copy(update={"output": {"a": 1}}))
    corrupt = [b"{", b"[1]", b"{}", good.replace(b'"seq":1', b'"seq":0'), good[:-1] + b',"x":1}']
    for data in corrupt:
        with pytest.raises(CorruptRecordError) as old:
            decode(Checkpoint, data, where="w")
        with pytest.raises(CorruptRecordError) as new:
            decode_checkpoint(data, where="w")
        assert str(new.value) == str(old.value)


# -- redaction narrowed per value ------------------------------------------------------

_SECRETS = [
    "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z",
    "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "AKIA" + "Q3RT5VX7Z9B2D4F6",
    "my password is Zx9#kLm2qq",
    "postgres://app:pa55w0rdX@db.internal/app",
    "card 4111 1111 1111 1111 exp 12/29",
    "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlMTIz",
    "call me at +1 415 555 0134 or mail ann@example.org",
    "EMP-123456 joined",
]
_PROSE = [
    "the agent searched the docs",
    "keyboard shortcuts",
    "pinned result 7",
    "ok",
    "order 12-34-56 (7) 8.9",
    "\u0664\u0661\u0661\u0661 \u0661\u0661\u0661\u0661 \u0661\u0661\u0661\u0661 \u0661\u0661\u0661\u0661",
]
_RED_TEXT = st.sampled_from(_SECRETS + _PROSE) | _TRICKY
_RED_KEYS = st.sampled_from(["password", "apiKey", "Authorization", "tone", "note", "pin", "x"])
_RED_JSON = st.recursive(
    st.one_of(st.none(), st.integers(), _RED_TEXT),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(_RED_KEYS, inner, max_size=4)
    ),
    max_leaves=12,
)
_REDACTORS = [
    Redactor(),
    Redactor("secrets+pii"),
    Redactor(patterns={"employee_id": r"EMP-\d{6}"}),
]


def _string_by_string(redactor: Redactor, value: object, key: str | None) -> object:
    """Each string redacted on its own: what redact_json did before it narrowed its rules."""
    if isinstance(value, str):
        return redactor.redact_json(value, key=key) if key is not None else redactor.redact(value)
    if isinstance(value, dict):
        return {k: _string_by_string(redactor, v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_string_by_string(redactor, v, key) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(value=_RED_JSON, which=st.sampled_from(range(len(_REDACTORS))))
def test_narrowed_redaction_finds_what_string_by_string_redaction_finds(
    value: JsonValue, which: int
) -> None:
    redactor = _REDACTORS[which]
    assert redactor.redact_json(value) == _string_by_string(redactor, value, None)
    assert redactor.redact_json(value, key="password") == _string_by_string(
        redactor, value, "password"
    )


def test_a_value_nothing_can_match_comes_back_unwalked() -> None:
    value = {"results": [{"title": "the agent", "score": 0.5}] * 50}
    assert Redactor().redact_json(value) is value


def test_a_value_json_cannot_encode_as_such_is_still_redacted() -> None:
    secret = _SECRETS[0]
    value = {"a": [2**80, secret]}  # an int orjson cannot write: every rule is tested
    assert Redactor().redact_json(value) == {"a": [2**80, "[REDACTED:api_key]"]}


def test_a_5kb_step_stores_and_returns_its_redacted_output(sqlite_kv: SqliteKVStore) -> None:
    results: list[JsonValue] = [
        {"title": f"result {n}", "url": f"https://example.com/{n}", "rank": n} for n in range(60)
    ]
    payload: JsonValue = {
        "results": [*results, {"note": _SECRETS[4]}],
        "password": "Zx9#kLm2qq",
    }
    tasks = TaskTier(sqlite_kv, redactor=Redactor())
    run = tasks.start_run("u", "lean")
    first = run.step("search", lambda: payload)
    assert first == Redactor().redact_json(to_json(payload, field="output"))
    assert "pa55w0rdX" not in str(first)
    again = tasks.acquire(run.run_id)
    assert again.step("search", lambda: pytest.fail("replayed, not run")) == first
    latest = tasks.latest_checkpoint(run.run_id)
    assert latest is not None
    assert latest.output == first


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0123456789 -().a\n\u0661", max_size=40))
def test_the_digit_run_gate_matches_where_its_regex_matches(text: str) -> None:
    assert _has_digit_run(text.encode(), text) == (_DIGIT_RUN.search(text) is not None)
