"""A page of stored checkpoints decodes to exactly what the exact path gives, record by record.

:func:`~tiers.task._checkpoint_decode.decode_run_checkpoints` builds our own
records without pydantic and hands every other one to the exact decode. Here
pages of generated records, clean ones beside records that must fall back
(ints over 64 bits, long digit runs in strings, bad ``commit_epoch``s, another
run's or another seq's record, not an object, not JSON, another field order),
are compared with the exact decode of each item: the same records (fields,
fields set, bytes), or the same error, and the exact decode called for exactly
the records the fast path must not take. The collector is off while a page decodes and back as it was after, also
when the decode raises or when pages decode in two threads at once, and
decodes that keep overlapping still let it pass. Then the SQLite readers' memory map:
reads through one reader see every later commit, after the file has grown and
the WAL was checkpointed into it.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import FrameType

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from tests.forking import in_forked_child
from tiers import keys
from tiers.backends._sqlite_connections import READ_MMAP_BYTES
from tiers.backends.base import Put
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.codec import encode
from tiers.errors import CorruptRecordError
from tiers.models import Checkpoint
from tiers.task import TaskTier
from tiers.task._checkpoint_decode import (
    _CHECKPOINT_KEY,
    _COLLECTOR_PAUSE,
    _NO_INPUT_HASH,
    _OVERDUE,
    _CollectorPause,
    decode_run_checkpoints,
    may_hold_big_int,
)
from tiers.task._records import decode_stored_checkpoint, encode_checkpoint, input_hash

RUN = "run-1"

_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        # Fewer than 19 digits: a longer int always takes the exact path ("int over 64 bits").
        st.integers(min_value=-(10**18) + 1, max_value=10**18 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)


def _exact(key: str, data: bytes) -> Checkpoint:
    """The exact decode of one stored item (``RunStore.decode_checkpoint``'s rule)."""
    ckpt, _ = decode_stored_checkpoint(data, where=key)
    if ckpt.run_id != RUN or keys.checkpoint_key(ckpt.seq) != key:
        raise CorruptRecordError(
            f"stored Checkpoint at {key} is for run {ckpt.run_id!r} seq {ckpt.seq}"
        )
    return ckpt


def _record(seq: int, run_id: str = RUN) -> Checkpoint:
    return Checkpoint(
        checkpoint_id=f"ckpt-{seq:012d}-0123456789ab",
        run_id=run_id,
        seq=seq,
        parent_id=None if seq == 1 else f"ckpt-{seq - 1:012d}-0123456789ab",
        step="s",
        input_hash="0123456789abcdef" * 4,  # no 19 digits in a row: that takes the exact path
        idempotency_key=f"k{seq}",
        started_at=datetime(2026, 11, 27, 5, 0, tzinfo=UTC),
        created_at=datetime(2026, 11, 27, 5, 0, 1, 250000, tzinfo=UTC),
        event_seq=seq + 1,
    )


def _stored(seq: int, output: JsonValue, how: str) -> tuple[str, bytes, bool]:
    """A stored item at seq ``seq`` changed as ``how`` says, and whether the fast path may take it."""
    key = keys.checkpoint_key(seq)
    base = _record(seq)
    match how:
        case "layout 1":
            return key, encode_checkpoint(base, output, None), True
        case "layout 2":
            return key, encode_checkpoint(base, output, {"x": output}, commit_epoch=seq), True
        case "no input":
            no_input = base.model_copy(update={"input_hash": input_hash(None)})
            return key, encode_checkpoint(no_input, output, None, commit_epoch=0), True
        case "no input, offset time":
            fields = orjson.loads(encode_checkpoint(base, output, None))
            fields["input_hash"] = input_hash(None)
            return key, orjson.dumps({**fields, "created_at": "2026-11-27T05:00:01+00:00"}), False
        case "null epoch":
            fields = orjson.loads(encode_checkpoint(base, output, None))
            return key, orjson.dumps({**fields, "commit_epoch": None}), True
        case "int over 64 bits":
            return key, encode_checkpoint(base, [output, 2**64], None, commit_epoch=1), False
        case "19 digits in a string":
            return key, encode_checkpoint(base, {"id": "1" * 19, "v": output}, None), False
        case "negative epoch" | "float epoch" | "string epoch" | "bool epoch":
            bad: object = {"negative epoch": -1, "float epoch": 1.0, "string epoch": "1"}.get(
                how, True
            )
            fields = orjson.loads(encode_checkpoint(base, output, None))
            return key, orjson.dumps({**fields, "commit_epoch": bad}), False
        case "another seq's record":
            return keys.checkpoint_key(seq + 1), encode_checkpoint(base, output, None), False
        case "another run's record":
            other = _record(seq, run_id="run-2")
            return key, encode_checkpoint(other, output, None), False
        case "reversed fields":
            fields = orjson.loads(encode_checkpoint(base, output, None))
            return key, orjson.dumps(dict(reversed(list(fields.items())))), False
        case "an array":
            return key, b"[1]", False
        case _:  # "not JSON"
            return key, b'{"schema_version":1,', False


_HOW = st.sampled_from(
    [
        "layout 1",
        "layout 2",
        "null epoch",
        "no input",
        "no input, offset time",
        "int over 64 bits",
        "19 digits in a string",
        "negative epoch",
        "float epoch",
        "string epoch",
        "bool epoch",
        "another seq's record",
        "another run's record",
        "reversed fields",
        "an array",
        "not JSON",
    ]
)


@settings(max_examples=200, deadline=None)
@example(page=[({"a": [1, 2.5]}, "layout 1"), (None, "layout 2"), ("x", "null epoch")])
@given(page=st.lists(st.tuples(_JSON, _HOW), min_size=1, max_size=6))
def test_a_page_decodes_as_the_exact_path_decodes_each_record(
    page: list[tuple[JsonValue, str]],
) -> None:
    items: list[tuple[str, bytes]] = []
    fast: list[bool] = []
    for seq, (output, how) in enumerate(page, start=1):
        key, data, trusted = _stored(seq, output, how)
        items.append((key, data))
        # A float can print with 19 digits in a row too (0.00012345678901234568).
        fast.append(trusted and not may_hold_big_int(data))
    exact_calls: list[str] = []

    def exact(key: str, data: bytes) -> Checkpoint:
        exact_calls.append(key)
        return _exact(key, data)

    expected: list[Checkpoint] = []
    error: CorruptRecordError | None = None
    for key, data in items:
        try:
            expected.append(_exact(key, data))
        except CorruptRecordError as exc:
            error = exc
            break
    if error is not None:
        with pytest.raises(CorruptRecordError) as raised:
            decode_run_checkpoints(RUN, items, exact)
        assert str(raised.value) == str(error)
        return
    got = decode_run_checkpoints(RUN, items, exact)
    assert got == expected
    assert [c.model_fields_set for c in got] == [c.model_fields_set for c in expected]
    assert [encode(c) for c in got] == [encode(c) for c in expected]
    assert [type(c.output) for c in got] == [type(c.output) for c in expected]
    assert exact_calls == [
        key for (key, _), trusted in zip(items, fast, strict=True) if not trusted
    ]


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The collector on for the test, and as it was after."""
    was_enabled = gc.isenabled()
    gc.enable()
    yield
    if not was_enabled:
        gc.disable()


def _clean_page(count: int) -> list[tuple[str, bytes]]:
    return [
        (keys.checkpoint_key(seq), encode_checkpoint(_record(seq), {"n": seq}, None))
        for seq in range(1, count + 1)
    ]


@contextmanager
def _a_page_held_mid_decode() -> Iterator[None]:
    """Another thread decoding a page, held inside its decode until the block ends."""
    inside = threading.Event()
    release = threading.Event()

    def held(key: str, data: bytes) -> Checkpoint:
        inside.set()
        assert release.wait(10)
        return _exact(key, data)

    slow_page = [_stored(1, [1], "int over 64 bits")[:2]]
    first = threading.Thread(target=decode_run_checkpoints, args=(RUN, slow_page, held))
    first.start()
    try:
        assert inside.wait(10)
        yield
    finally:
        release.set()
        first.join()


@pytest.mark.usefixtures("collector_on")
def test_the_collector_is_off_while_a_page_decodes_and_on_after() -> None:
    seen: list[bool] = []

    def exact(key: str, data: bytes) -> Checkpoint:
        seen.append(gc.isenabled())
        return _exact(key, data)

    items = [*_clean_page(2), _stored(3, [1], "int over 64 bits")[:2]]
    assert len(decode_run_checkpoints(RUN, items, exact)) == 3
    assert seen == [False]
    assert gc.isenabled()
    with pytest.raises(CorruptRecordError):
        decode_run_checkpoints(RUN, [(keys.checkpoint_key(1), b"[1]")], exact)
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_an_application_that_turned_the_collector_off_keeps_it_off() -> None:
    gc.disable()
    assert len(decode_run_checkpoints(RUN, _clean_page(2), _exact)) == 2
    assert not gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_the_collector_comes_back_when_the_last_of_two_threads_ends_its_decode() -> None:
    after_other: list[bool] = []
    with _a_page_held_mid_decode():
        assert len(decode_run_checkpoints(RUN, _clean_page(3), _exact)) == 3
        after_other.append(gc.isenabled())  # the first thread's page is still decoding
    assert after_other == [False]
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_decodes_that_keep_overlapping_still_let_the_collector_pass() -> None:
    with _a_page_held_mid_decode():
        kept = [[] for _ in range(_OVERDUE + 1)]  # containers the collector has not seen
        assert gc.get_count()[0] > _OVERDUE
        assert len(decode_run_checkpoints(RUN, _clean_page(1), _exact)) == 1
        assert gc.get_count()[0] < _OVERDUE  # the decode that ended made the pass
        assert not gc.isenabled()  # and the first thread's page is still decoding
        del kept
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_the_overdue_pass_is_the_young_one_the_collector_would_make() -> None:
    passes: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    gc.collect()  # every generation's count at 0: only the young one is due
    with _a_page_held_mid_decode():
        kept = [[] for _ in range(_OVERDUE + 1)]
        gc.callbacks.append(record)
        try:
            assert len(decode_run_checkpoints(RUN, _clean_page(1), _exact)) == 1
        finally:
            gc.callbacks.remove(record)
        del kept
    assert passes == [0]  # not a full pass over the whole heap


@pytest.mark.usefixtures("collector_on")
def test_a_decode_started_at_any_instruction_of_another_leaves_the_collector_on() -> None:
    # A signal handler runs between two instructions of the thread it interrupts, also
    # inside the pause's lock: here one decode starts and ends at every instruction of the
    # outer decode's enter and exit (tracing is off while it runs, so it is not nested again).
    pause_code = {_CollectorPause.__enter__.__code__, _CollectorPause.__exit__.__code__}
    nested: list[int] = []
    result: list[object] = []

    def at_instruction(frame: FrameType, event: str, arg: object) -> object:
        if event == "opcode":
            nested.append(len(decode_run_checkpoints(RUN, _clean_page(1), _exact)))
        return at_instruction

    def on_call(frame: FrameType, event: str, arg: object) -> object:
        if frame.f_code in pause_code:
            frame.f_trace_opcodes = True
            return at_instruction
        return None

    def decode_traced() -> None:
        sys.settrace(on_call)
        try:
            result.append(len(decode_run_checkpoints(RUN, _clean_page(2), _exact)))
        finally:
            sys.settrace(None)

    outer = threading.Thread(target=decode_traced, daemon=True)
    outer.start()
    outer.join(30)
    assert not outer.is_alive()  # no deadlock on the pause's lock
    assert result == [2]
    assert len(nested) > 10
    assert set(nested) == {1}
    assert gc.isenabled()
    assert _COLLECTOR_PAUSE._decoding == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.usefixtures("collector_on")
def test_a_child_forked_while_another_thread_decodes_has_its_collector_back() -> None:
    def check() -> list[object]:
        after_fork = gc.isenabled()
        decoded = len(decode_run_checkpoints(RUN, _clean_page(2), _exact))
        return [after_fork, decoded, gc.isenabled()]

    with _a_page_held_mid_decode():
        reported = in_forked_child(check)
    assert reported == [True, 2, True]
    assert gc.isenabled()


def test_the_no_input_hash_is_the_hash_of_no_input() -> None:
    assert input_hash(None) == _NO_INPUT_HASH


def test_the_key_format_is_the_checkpoint_key() -> None:
    for seq in (1, 9, 10, 123_456, 10**keys.SEQ_WIDTH - 1):
        assert _CHECKPOINT_KEY % seq == keys.checkpoint_key(seq)


def test_each_trusted_record_has_a_fields_set_of_its_own(tmp_path: Path) -> None:
    tasks = TaskTier(SqliteKVStore(tmp_path / "kv.sqlite3"))
    run = tasks.start_run("alice", "r1")
    for i in range(3):
        run.step(f"s{i}", partial(dict, i=i))
    first, second, _ = tasks.history("r1")
    assert first.model_fields_set == second.model_fields_set == set(Checkpoint.model_fields)
    assert first.model_fields_set is not second.model_fields_set
    first.model_fields_set.discard("kind")  # a caller's change stays in its record
    assert "kind" in second.model_fields_set
    assert "kind" in tasks.history("r1")[0].model_fields_set


def test_readers_see_every_later_commit_after_the_file_grew(tmp_path: Path) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        store.commit([Put("s", "k0000", b"first")])
        assert store.scan("s") == [("k0000", b"first")]
        reader = store._connections.local.reader
        # Readers never map the file (a mapped page the file lost would be a SIGBUS).
        (mapped,) = reader.conn.execute("PRAGMA mmap_size").fetchone()
        assert mapped == READ_MMAP_BYTES == 0
        # Grow the file well past what the reader had read, and move the WAL into it.
        values = {f"k{n:04d}": bytes([n % 251]) * 6000 for n in range(1, 400)}
        for start in range(1, 400, 50):
            store.commit([Put("s", k, v) for k, v in list(values.items())[start - 1 : start + 49]])
        store._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        store.commit([Put("s", "k0000", b"second")])  # in the WAL, over the mapped page
        expected = [("k0000", b"second"), *sorted(values.items())]
        assert store.scan("s") == expected
        assert store.get_many("s", ["k0000", "k0399"]) == [b"second", values["k0399"]]
        seen: list[list[tuple[str, bytes]]] = []

        def read() -> None:
            seen.append(store.scan("s"))

        other = threading.Thread(target=read)  # another reader, opened after the growth
        other.start()
        other.join()
        assert seen == [expected]
    finally:
        store.close()
