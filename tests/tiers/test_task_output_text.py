"""A step's output is written once: the checkpoint embeds the JSON text of its round trip.

:func:`tiers.codec.to_json_text` returns :func:`tiers.codec.to_json`'s value and,
when orjson's path produced it, the text orjson wrote. A step's checkpoint embeds
that text instead of writing the output again, so the text must be orjson's dump
of the returned value byte for byte, and a checkpoint built with it must be the
one built without it. Redaction that changes the output must drop the text.
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers import keys, values
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.codec import to_json, to_json_text
from tiers.errors import InvalidInputError
from tiers.redaction import Redactor
from tiers.task import Charged, TaskTier
from tiers.task._checkpoint_encode import CheckpointFields, fast_checkpoint
from tiers.task._records import checkpoint_id

_TEXT = st.one_of(
    st.sampled_from(["", '"', "\\", "\n\t\x00\x1f\x7f", "é😀\u2028", "\ud800", "b", "a"]),
    st.text(max_size=10),
)


class _Colour(enum.Enum):
    RED = "red"


class _Level(enum.IntEnum):
    HIGH = 3


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.integers(),
    st.floats(),  # NaN and infinity too: orjson writes null, json refuses
    _TEXT,
    st.sampled_from([_Colour.RED, _Level.HIGH, uuid.UUID(int=7), (1, "x"), datetime(2026, 1, 1)]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(_TEXT, inner, max_size=4),
    ),
    max_leaves=16,
)
_DIGEST = "0123456789abcdef" * 4


@settings(max_examples=500, deadline=None)
@given(_VALUES)
def test_the_text_is_orjson_s_dump_of_the_value_returned(value: Any) -> None:
    try:
        expected = values.to_json(value, field="output")
    except InvalidInputError:
        with pytest.raises(InvalidInputError):
            to_json_text(value, field="output")
        return
    parsed, text = to_json_text(value, field="output")
    assert parsed == expected
    assert to_json(value, field="output") == expected
    if text is not None:
        assert text == orjson.dumps(parsed)
        assert orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS) == text


@settings(max_examples=300, deadline=None)
@given(_VALUES)
def test_a_checkpoint_with_the_text_is_the_checkpoint_without_it(value: Any) -> None:
    try:
        output, text = to_json_text(value, field="output")
    except InvalidInputError:
        return
    when = datetime(2026, 11, 27, 5, 0, 0, 123, tzinfo=UTC)
    fields = CheckpointFields(
        checkpoint_id=checkpoint_id("run-1", 2, "k"),
        run_id="run-1",
        seq=2,
        parent_id=None,
        step="s",
        input_hash=_DIGEST,
        output=output,
        idempotency_key="k",
        scope=None,
        started_at=when,
        created_at=when,
        kind="step",
        state_delta=None,
        event_seq=3,
        commit_epoch=1,
    )
    without = fast_checkpoint(fields)
    with_text = fast_checkpoint(fields._replace(output_text=text))
    assert (without is None) == (with_text is None)
    if without is not None and with_text is not None:
        assert with_text[1] == without[1]
        assert with_text[0] == without[0]
        assert with_text[0].output is output


def test_a_redacted_output_is_stored_redacted(tmp_path: Path) -> None:
    """The text is the unredacted output's: a step whose output redaction changed drops it."""
    kv = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        tasks = TaskTier(kv, redactor=Redactor())
        run = tasks.start_run("u", "redact")
        secret = "AKIAIOSFODNN7EXAMPLE"
        out = run.step("leak", lambda: {"note": f"key {secret}", "n": 1})
        plain = run.step("plain", lambda: Charged({"b": 1, "a": [1.5, "é"]}, tokens=3))
        assert secret not in orjson.dumps(out).decode()
        assert plain == {"a": [1.5, "é"], "b": 1}
        assert list(plain) == ["a", "b"]
        space = keys.run_space("default", run.run_id)
        for seq, returned in ((1, out), (2, plain)):
            (data,) = kv.get_many(space, [keys.checkpoint_key(seq)])
            assert data is not None
            assert secret.encode() not in data
            assert orjson.loads(data)["output"] == returned
            assert orjson.dumps(returned) in data
        again = tasks.acquire(run.run_id)
        assert again.step("leak", lambda: pytest.fail("replayed")) == out
        assert again.step("plain", lambda: pytest.fail("replayed")) == plain
    finally:
        kv.close()
