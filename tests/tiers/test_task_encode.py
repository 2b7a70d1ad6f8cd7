"""A step's checkpoint built without pydantic: the same bytes and record as pydantic's path.

:func:`~tiers.task._checkpoint_encode.build_checkpoint` writes a step's checkpoint
with orjson and builds the record directly. pydantic's model and dump stay the
reference here: on generated steps (varied JSON outputs, unicode, big ints,
floats, scopes, state deltas, datetimes in any zone) the bytes and the record
must be the same, and what pydantic refuses must still be refused, with the same
error.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import JsonValue, ValidationError

from tiers import keys
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.codec import decode, encode
from tiers.errors import InvalidInputError
from tiers.models import Checkpoint
from tiers.task import Charged, TaskTier
from tiers.task._checkpoint_encode import (
    CheckpointFields,
    build_checkpoint,
    fast_checkpoint,
    index_entry_bytes,
)
from tiers.task._records import IdempotencyEntry, checkpoint_id

_TEXT = st.one_of(
    st.sampled_from(["", '"', "\\", "\n\t\x00\x1f\x7f", "é😀\u2028", "</script>", "\ud800"]),
    st.text(max_size=12),
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(),  # over 64 bits too: orjson refuses those, pydantic writes them
    st.floats(allow_nan=False, allow_infinity=False),
    _TEXT,
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)),
    max_leaves=20,
)


class _Colour(enum.Enum):
    RED = "red"


class _Level(enum.StrEnum):
    HIGH = "high"


# A scope is dict[str, Any]: values pydantic writes in a form of its own are among them.
_ODD = st.one_of(
    st.just(_Colour.RED),
    st.just(_Level.HIGH),
    st.uuids(),
    st.tuples(st.integers(), _TEXT),
    st.frozensets(st.integers(), max_size=3),
    st.datetimes(),
    st.just(float("nan")),
    st.just(float("inf")),
    st.binary(max_size=4),
)
_SCOPE = st.one_of(
    st.none(),
    st.dictionaries(_TEXT, _JSON, max_size=4),
    st.dictionaries(_TEXT, st.one_of(_JSON, _ODD), max_size=3),
    st.dictionaries(st.one_of(_TEXT, st.integers()), _JSON, max_size=2),
)
_DELTA = st.one_of(st.none(), st.dictionaries(_TEXT, _JSON, max_size=4))
_ZONES: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.just(UTC),
    st.builds(
        timezone, st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23))
    ),
)
_TIMES = st.one_of(
    st.datetimes(timezones=_ZONES),
    st.datetimes(min_value=datetime(2000, 1, 1), timezones=_ZONES),
    st.just(datetime(2026, 11, 26, 12, 0, tzinfo=UTC)),
)
_DIGEST = "0123456789abcdef" * 4
_NAMES = st.one_of(st.sampled_from(["s", "fetch", "x" * 256, "é"]), st.text(max_size=300))


def _mostly(valid: list[Any], invalid: list[Any]) -> st.SearchStrategy[Any]:
    """One of ``valid`` nine times in ten, else one of ``invalid``."""
    return st.sampled_from(valid * (9 * len(invalid)) + invalid * len(valid))


@st.composite
def _steps(draw: st.DrawFn) -> dict[str, Any]:
    # Mostly valid fields, so most steps take the fast path; now and then one pydantic refuses.
    run_id = draw(_mostly(["run-1", "u.1+x@y"], ["-bad", "", "a" * 129]))
    seq = draw(_mostly([1, 2, 10**12], [0, -1]))
    key = draw(_NAMES)
    return {
        "checkpoint_id": checkpoint_id(run_id, seq, key),
        "run_id": run_id,
        "seq": seq,
        "parent_id": draw(st.one_of(st.none(), st.just("ckpt-000000000001-abcdefabcdef"), _TEXT)),
        "step": draw(_NAMES),
        "input_hash": draw(_mostly([_DIGEST], [_DIGEST.upper(), "abc"])),
        "output": draw(_JSON),
        "idempotency_key": key,
        "scope": draw(_SCOPE),
        "started_at": draw(_TIMES),
        "created_at": draw(_TIMES),
        "kind": draw(_mostly(["step", "effect", "update"], ["", "k" * 33])),
        "state_delta": draw(_DELTA),
        "event_seq": draw(_mostly([1, 7, 2**40], [0])),
        "commit_epoch": draw(st.one_of(st.none(), st.integers(min_value=0, max_value=2**40))),
    }


def _reference(fields: dict[str, Any]) -> tuple[Checkpoint, bytes]:
    """pydantic's path: the model validated, then dumped (the layout-2 epoch appended)."""
    fields = dict(fields)
    commit_epoch = fields.pop("commit_epoch")
    ckpt = Checkpoint(**fields)
    data = encode(ckpt)
    if commit_epoch is not None:
        data = b'%s,"commit_epoch":%d}' % (data[:-1], commit_epoch)
    return ckpt, data


@settings(max_examples=600, deadline=None)
@given(_steps())
def test_a_step_checkpoint_is_what_pydantic_builds_and_writes(fields: dict[str, Any]) -> None:
    try:
        expected, expected_data = _reference(fields)
    except ValidationError as exc:
        assert fast_checkpoint(CheckpointFields(**fields)) is None
        with pytest.raises(InvalidInputError) as refused:
            build_checkpoint(CheckpointFields(**fields))
        assert refused.value.__cause__ is not None
        first = exc.errors()[0]
        assert refused.value.field == (".".join(str(p) for p in first["loc"]) or "output")
        return
    except (TypeError, ValueError, OverflowError):
        # pydantic cannot write it (a lone surrogate, a set...): neither path may store it.
        assert fast_checkpoint(CheckpointFields(**fields)) is None
        return
    ckpt, data = build_checkpoint(CheckpointFields(**fields))
    assert data == expected_data
    assert ckpt == expected
    assert ckpt.model_dump() == expected.model_dump()


@settings(max_examples=200, deadline=None)
@given(
    output=_JSON,
    scope=st.one_of(st.none(), st.dictionaries(st.text(max_size=8), _JSON, max_size=3)),
    delta=_DELTA,
    when=st.datetimes(min_value=datetime(1001, 1, 1), timezones=_ZONES),
    step=st.text(min_size=1, max_size=256),
)
def test_a_plain_step_takes_the_fast_path(
    output: JsonValue,
    scope: dict[str, JsonValue] | None,
    delta: dict[str, JsonValue] | None,
    when: datetime,
    step: str,
) -> None:
    """The fast builder vouches for every ordinary step (64-bit numbers, valid UTF-8)."""
    fields: dict[str, Any] = {
        "checkpoint_id": checkpoint_id("run-1", 3, "k"),
        "run_id": "run-1",
        "seq": 3,
        "parent_id": None,
        "step": step,
        "input_hash": _DIGEST,
        "output": output,
        "idempotency_key": "k",
        "scope": scope,
        "started_at": when,
        "created_at": when,
        "kind": "step",
        "state_delta": delta,
        "event_seq": 4,
        "commit_epoch": 2,
    }
    try:
        expected_data = _reference(fields)[1]
        plain = True
    except (TypeError, ValueError):
        plain = False  # a lone surrogate: pydantic cannot write it either
    built = fast_checkpoint(CheckpointFields(**fields))
    ordinary = all(-(2**63) <= n < 2**64 for n in _ints([output, scope, delta]))
    if plain and ordinary and _utf8([output, scope, delta]):
        assert built is not None
    if built is not None:
        assert built[1] == expected_data


def _utf8(value: object) -> bool:
    """Whether every string of ``value`` is valid UTF-8 (no lone surrogate, which orjson refuses)."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def _ints(value: object) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _ints(v)]
    if isinstance(value, list | tuple):
        return [n for v in value for n in _ints(v)]
    return []


def test_the_index_entry_is_what_pydantic_writes() -> None:
    ckpt_id = checkpoint_id("run-1", 12, "k")
    entry = IdempotencyEntry(seq=12, checkpoint_id=ckpt_id, input_hash=_DIGEST)
    assert index_entry_bytes(12, ckpt_id, _DIGEST) == encode(entry)


def test_a_datetime_subclass_and_an_old_year_take_pydantic_s_path() -> None:
    class Stamp(datetime):
        pass

    base: dict[str, Any] = {
        "checkpoint_id": checkpoint_id("run-1", 1, "k"),
        "run_id": "run-1",
        "seq": 1,
        "parent_id": None,
        "step": "s",
        "input_hash": _DIGEST,
        "output": None,
        "idempotency_key": "k",
        "scope": None,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
        "kind": "step",
        "state_delta": None,
        "event_seq": 1,
        "commit_epoch": None,
    }
    for when in (Stamp(2026, 1, 1, tzinfo=UTC), datetime(999, 1, 1)):
        fields: dict[str, Any] = {**base, "started_at": when}
        assert fast_checkpoint(CheckpointFields(**fields)) is None
        ckpt, data = build_checkpoint(CheckpointFields(**fields))
        assert (ckpt, data) == _reference(fields)


@pytest.mark.parametrize(
    "clock",
    [
        lambda: datetime(2026, 11, 26, 12, 0, 0, 250),  # naive: taken as UTC
        lambda: datetime(2026, 11, 26, 17, 0, tzinfo=timezone(timedelta(hours=5))),
        lambda: datetime(999, 1, 1, tzinfo=UTC),  # pydantic's path
    ],
)
def test_steps_store_what_pydantic_writes(tmp_path: Path, clock: Callable[[], datetime]) -> None:
    """Through a real store: plain steps, and big ints (pydantic's path), in any clock's zone."""
    kv = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        tasks = TaskTier(kv, clock=clock)
        run = tasks.start_run("u", "encode")
        run.step("plain", lambda: {"b": [1.5, "é😀"], "a": None}, scope={"phase": "x"})
        run.step("big", lambda: Charged({"n": 2**70}, state={"m": -(2**65)}))
        run.step("odd", lambda: 1, scope={"pair": (1, "x"), "n": 2**66})
        space = keys.run_space("default", run.run_id)
        for seq in (1, 2, 3):
            (data,) = kv.get_many(space, [keys.checkpoint_key(seq)])
            assert data is not None
            record, epoch = data.rsplit(b',"commit_epoch":', 1)
            stored = record + b"}"
            # pydantic reads the record and writes it back as it is: its own form, byte for byte.
            assert encode(decode(Checkpoint, stored, where="w")) == stored
            assert epoch == b"1}"
        latest = tasks.latest_checkpoint(run.run_id)
        assert latest is not None
        assert latest.scope == {"n": 2**66, "pair": [1, "x"]}
    finally:
        kv.close()


def test_an_invalid_step_is_refused_as_before(tmp_path: Path) -> None:
    kv = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        run = TaskTier(kv).start_run("u", "encode")
        with pytest.raises(InvalidInputError):
            run.step("s" * 257, lambda: 1)
        with pytest.raises(InvalidInputError):
            run.step("nan", lambda: float("nan"))
        with pytest.raises(InvalidInputError):
            run.step("key", lambda: 1, idempotency_key="k" * 513)
        with pytest.raises(InvalidInputError):
            run.step("scope", lambda: 1, scope={"tags": {"a", "b"}})
        assert run.step("ok", lambda: 2) == 2
    finally:
        kv.close()


def test_a_replayed_big_int_stays_an_int(tmp_path: Path) -> None:
    """orjson reads an int over 64 bits as a float; the checkpoint read gives it back exact."""
    kv = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        tasks = TaskTier(kv)
        run = tasks.start_run("u", "big")
        first = run.step(
            "big", lambda: Charged({"n": 2**70, "id": "1" * 25}, state={"m": -(2**65)})
        )
        again = tasks.acquire(run.run_id)
        replayed = again.step("big", lambda: pytest.fail("replayed, not run"))
        assert replayed == first == {"id": "1" * 25, "n": 2**70}
        assert isinstance(replayed, dict)
        assert type(replayed["n"]) is int
        latest = tasks.latest_checkpoint(run.run_id)
        assert latest is not None
        assert latest.state_delta == {"m": -(2**65)}
    finally:
        kv.close()
