"""Reads of checkpoints: the trusted decode gives exactly the record pydantic's path gives.

:func:`~tiers.task._checkpoint_decode.trusted_checkpoint` builds a checkpoint
from the fields our own dump writes without pydantic's validation; anything it
does not recognise goes to pydantic, which decides as before. Both are checked
here against :func:`tiers.codec.decode`, on generated records and on records an
older release or a corruption could leave.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from tests.kv_spies import CountingKV
from tiers import keys
from tiers.backends.base import Delete, KVStore, Put
from tiers.codec import decode, encode
from tiers.errors import CorruptRecordError, RunNotFoundError
from tiers.models import Checkpoint
from tiers.task import TaskTier
from tiers.task._checkpoint_decode import _FIELDS, trusted_checkpoint
from tiers.task._records import decode_stored_checkpoint

_TEXT = st.one_of(
    st.sampled_from(['"', "\\", "\n\x00", "é😀\u2028", ',"output":null,']), st.text(max_size=10)
)
_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        _TEXT,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)),
    max_leaves=20,
)
_NAME = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() == s and s != "")
_WHEN = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


def _checkpoint(**fields: object) -> Checkpoint:
    base: dict[str, object] = {
        "checkpoint_id": "ckpt-000000000001-0123456789ab",
        "run_id": "run-1",
        "seq": 1,
        "parent_id": None,
        "step": "s",
        "input_hash": "0" * 64,
        "idempotency_key": "k",
        "started_at": datetime(2026, 11, 26, 12, 0, tzinfo=UTC),
        "created_at": datetime(2026, 11, 26, 12, 0, 0, 120000, tzinfo=UTC),
        "event_seq": 2,
        "output": {"a": [1, 2.5, "x"]},
    }
    return Checkpoint.model_validate({**base, **fields})


def _same_as_pydantic(data: bytes) -> Checkpoint:
    expected = decode(Checkpoint, data, where="w")
    got, epoch = decode_stored_checkpoint(data, where="w")
    assert epoch is None
    assert got == expected
    assert got.model_fields_set == expected.model_fields_set
    assert encode(got) == encode(expected) == data
    assert got.started_at.tzinfo is expected.started_at.tzinfo
    assert got.status is expected.status
    return got


@settings(max_examples=300, deadline=None)
@given(
    output=_JSON,
    delta=st.none() | st.dictionaries(_TEXT, _JSON, max_size=3),
    scope=st.none() | st.dictionaries(_TEXT, _JSON, max_size=3),
    step=_NAME,
    key=_NAME,
    kind=st.sampled_from(["step", "effect", "update", "fork"]),
    parent_id=st.none() | _TEXT,
    event_seq=st.none() | st.integers(min_value=1, max_value=2**40),
    started_at=_WHEN,
    created_at=_WHEN,
)
def test_the_trusted_decode_gives_the_record_and_bytes_of_pydantic(
    output: JsonValue,
    delta: dict[str, JsonValue] | None,
    scope: dict[str, JsonValue] | None,
    step: str,
    key: str,
    kind: str,
    parent_id: str | None,
    event_seq: int | None,
    started_at: datetime,
    created_at: datetime,
) -> None:
    ckpt = _checkpoint(
        output=output,
        state_delta=delta,
        scope=scope,
        step=step,
        idempotency_key=key,
        kind=kind,
        parent_id=parent_id,
        event_seq=event_seq,
        started_at=started_at,
        created_at=created_at,
    )
    data = encode(ckpt)
    assert trusted_checkpoint(orjson.loads(data)) is not None  # the fast path took it
    assert _same_as_pydantic(data) == ckpt


def _variant(**changes: object) -> bytes:
    fields = orjson.loads(encode(_checkpoint()))
    for name, value in changes.items():
        if value is _DROP:
            del fields[name]
        else:
            fields[name] = value
    return orjson.dumps(fields)


_DROP = object()


@pytest.mark.parametrize(
    "changes",
    [
        {"kind": _DROP, "state_delta": _DROP, "event_seq": _DROP},  # an older release's record
        {"started_at": "2026-11-26T12:00:00+00:00"},
        {"created_at": "2026-11-26T14:00:00+02:00"},
        {"created_at": "2026-11-26T12:00:00"},  # naive: taken as UTC
        {"seq": 1.0},
        {"seq": True},  # pydantic's lax mode reads these as 1
        {"seq": "1"},
        {"schema_version": 0},
        {"schema_version": True},  # equal to 1, but pydantic stores the int
        {"schema_version": 1.0},
    ],
)
def test_records_the_trusted_decode_does_not_take_decode_as_before(
    changes: dict[str, object],
) -> None:
    data = _variant(**changes)
    assert trusted_checkpoint(orjson.loads(data)) is None
    expected = decode(Checkpoint, data, where="w")
    assert decode_stored_checkpoint(data, where="w") == (expected, None)


def test_a_record_in_another_field_order_decodes_as_before() -> None:
    fields = orjson.loads(encode(_checkpoint()))
    data = orjson.dumps(dict(reversed(list(fields.items()))))
    assert trusted_checkpoint(orjson.loads(data)) is None
    decoded, _ = decode_stored_checkpoint(data, where="w")
    assert decoded == decode(Checkpoint, data, where="w")
    assert encode(decoded) == encode(_checkpoint())


@pytest.mark.parametrize(
    "changes",
    [
        {"seq": 0},
        {"run_id": "no spaces allowed"},
        {"input_hash": "A" * 64},
        {"status": "done"},
        {"step": ""},
        {"step": "s" * 257},
        {"idempotency_key": "k" * 513},
        {"kind": "k" * 33},
        {"scope": [1]},
        {"state_delta": [1]},
        {"event_seq": 0},
        {"started_at": "2026-W48-4T12:00:00Z"},
        {"created_at": "yesterday"},
        {"started_at": "\u0662\u0660\u0662\u0666-11-26T12:00:00Z"},  # digits fromisoformat refuses
        {"extra": 1},
        {"checkpoint_id": 7},
    ],
)
def test_corrupt_records_are_refused_as_before(changes: dict[str, object]) -> None:
    data = _variant(**changes)
    assert trusted_checkpoint(orjson.loads(data)) is None
    with pytest.raises(CorruptRecordError) as old:
        decode(Checkpoint, data, where="w")
    with pytest.raises(CorruptRecordError) as new:
        decode_stored_checkpoint(data, where="w")
    assert str(new.value) == str(old.value)


def test_history_is_the_stored_records_decoded_by_pydantic(kv: KVStore) -> None:
    tasks = TaskTier(kv)
    run = tasks.start_run("alice", "r1")
    for i in range(12):
        run.step(f"s{i}", lambda i=i: {"i": i, "text": "é" * i}, input={"n": i})
    tasks.update_state("r1", tasks.history("r1")[3].checkpoint_id, {"x": 1})
    stored = kv.scan(keys.run_space(tasks.tenant, "r1"), prefix=keys.CHECKPOINT_PREFIX)
    expected = []
    for _, data in stored:
        fields = orjson.loads(data)
        fields.pop("commit_epoch", None)  # a layout-2 record holds its event's epoch
        expected.append(decode(Checkpoint, orjson.dumps(fields), where="w"))
    history = tasks.history("r1")
    assert history == expected
    assert [encode(c) for c in history] == [encode(c) for c in expected]
    assert tasks.latest_checkpoint("r1") == expected[-1]
    assert history[0].created_at.tzinfo is UTC
    assert history[0].created_at - history[0].started_at < timedelta(minutes=1)


def test_the_trusted_decode_unpacks_the_models_fields_in_order() -> None:
    assert tuple(Checkpoint.model_fields) == _FIELDS


def test_history_pages_are_the_full_historys_slices_in_one_read(kv: KVStore) -> None:
    counting = CountingKV(kv)
    tasks = TaskTier(counting)
    run = tasks.start_run("alice", "r1")
    for i in range(9):
        run.step(f"s{i}", lambda i=i: {"i": i})
    tasks.update_state("r1", tasks.history("r1")[4].checkpoint_id, {"x": 1})  # a branch: seq 10
    tasks.start_run("alice", "empty")
    full = tasks.history("r1")
    assert [c.seq for c in full] == list(range(1, 11))
    for limit in (None, 0, 1, 3, 20):
        for after in (None, 0, 2, 9, 10, 12):
            for before in (None, 0, 1, 5, 10, 11, 50, 10**12 - 1, 10**12, 10**20):
                for newest in (False, True):
                    wanted = [
                        c
                        for c in full
                        if c.seq > (after or 0) and (before is None or c.seq < before)
                    ]
                    if newest:
                        wanted.reverse()
                    if limit is not None:
                        wanted = wanted[:limit]
                    bounds = {"limit": limit, "after_seq": after, "before_seq": before}
                    counting.reads = 0
                    got = tasks.history("r1", newest_first=newest, **bounds)  # type: ignore[arg-type]
                    assert got == wanted, (newest, bounds)
                    unbounded = before is None or before >= 10**keys.SEQ_WIDTH
                    if got and not (newest and after and unbounded):
                        assert counting.reads == 1, (newest, bounds)  # no head read
                    assert tasks.history("empty", newest_first=newest, **bounds) == []  # type: ignore[arg-type]
                    with pytest.raises(RunNotFoundError):
                        tasks.history("missing", newest_first=newest, **bounds)  # type: ignore[arg-type]
    counting.reads = 0
    assert (
        tasks.latest_checkpoint("r1")
        == full[-1]
        == tasks.get_checkpoint("r1", tasks.get_run("r1").head_checkpoint_id or "")
    )
    assert counting.reads == 3  # the latest: one read; then the head and the point read
    assert tasks.latest_checkpoint("empty") is None
    with pytest.raises(RunNotFoundError):
        tasks.latest_checkpoint("missing")


def test_ints_over_64_bits_read_back_exactly(kv: KVStore) -> None:
    tasks = TaskTier(kv)
    output = {"big": 2**70, "low": -(2**63) - 1, "top": 2**64 - 1, "text": "1" * 30, "f": 0.1}
    tasks.start_run("alice", "r1").step("s", lambda: output)
    for ckpt in (tasks.latest_checkpoint("r1"), tasks.history("r1")[0]):
        assert ckpt is not None
        assert ckpt.output == output
        assert isinstance(ckpt.output, dict)
        assert {k: type(v) for k, v in ckpt.output.items()} == {
            k: type(v) for k, v in output.items()
        }


def test_corrupt_or_misplaced_checkpoints_are_refused_on_read(kv: KVStore) -> None:
    tasks = TaskTier(kv)
    for run_id in ("r1", "r2"):
        run = tasks.start_run("alice", run_id)
        run.step("a", lambda: 1)
        run.step("b", lambda: 2)
    space = keys.run_space(tasks.tenant, "r1")
    other = kv.get_many(keys.run_space(tasks.tenant, "r2"), [keys.checkpoint_key(2)])[0]
    assert other is not None
    kv.commit([Put(space, keys.checkpoint_key(2), other)])  # r2's record at r1's key
    for read in (lambda: tasks.latest_checkpoint("r1"), lambda: tasks.history("r1")):
        with pytest.raises(CorruptRecordError, match="is for run 'r2' seq 2"):
            read()
    first = kv.get_many(space, [keys.checkpoint_key(1)])[0]
    assert first is not None
    kv.commit([Put(space, keys.checkpoint_key(2), first)])  # seq 1's record at seq 2's key
    with pytest.raises(CorruptRecordError, match="is for run 'r1' seq 1"):
        tasks.latest_checkpoint("r1")
    kv.commit([Delete(space, keys.checkpoint_key(1)), Delete(space, keys.checkpoint_key(2))])
    with pytest.raises(CorruptRecordError, match="has head_seq 2 but no checkpoint"):
        tasks.latest_checkpoint("r1")
