"""Step checkpoints stored as record version 2: read without the scan for ints over 64 bits.

A step's writer stores a checkpoint orjson wrote whole (its output's text from
``to_json_text``, also orjson's) as ``schema_version`` 2
(:data:`~tiers.task._format.EXACT_INTS_VERSION`): orjson refuses an int outside
64 bits, so such a record cannot hold one and a history parses it without
:func:`~tiers.task._checkpoint_decode.may_hold_big_int`. Here: records the
previous release wrote (literal bytes) read exactly as before and keep the
scan; a step with an int over 64 bits in any field is stored as version 1 and
reads back exactly; pages of written records beside marked records that are
not all our form (cut short, a field changed, an int over 64 bits where the
model wants a number) give the exact path's records or error, and the exact
decode is called for exactly the records the fast path must not take.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from tiers import keys
from tiers.backends.base import KVStore, Put
from tiers.codec import decode, encode, to_json_text
from tiers.errors import CorruptRecordError
from tiers.models import Checkpoint
from tiers.task import Charged, TaskTier
from tiers.task._checkpoint_decode import (
    _EXACT_INTS_START,
    decode_run_checkpoints,
    may_hold_big_int,
)
from tiers.task._checkpoint_encode import CheckpointFields, build_checkpoint
from tiers.task._format import EXACT_INTS_VERSION
from tiers.task._records import checkpoint_id, decode_stored_checkpoint

# Written by the release before record version 2 (main at 8b1f80d): run "today", steps
# "plain" (a 19-digit int that fits in 64 bits), "big output" (2**70), "big state"
# (-(2**65)), "big scope" (2**66), "long digits" (a 25-digit string), in layout 1 ...
PREVIOUS_LAYOUT_1 = [
    (
        b'{"schema_version":1,"checkpoint_id":"ckpt-000000000001-b52f62e8ec74",'
        b'"run_id":"today","seq":1,"parent_id":null,"step":"plain",'
        b'"input_hash":"74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",'
        b'"output":{"f":1.5,"n":9223372036854775807,"text":"\xc3\xa9\xf0\x9f\x98\x80"},'
        b'"idempotency_key":"today/plain/0","status":"committed","scope":null,'
        b'"started_at":"2026-11-27T08:00:02Z","created_at":"2026-11-27T08:00:03Z",'
        b'"kind":"step","state_delta":null,"event_seq":2}'
    ),
    (
        b'{"schema_version":1,"checkpoint_id":"ckpt-000000000002-5925be70131c",'
        b'"run_id":"today","seq":2,"parent_id":"ckpt-000000000001-b52f62e8ec74",'
        b'"step":"big output",'
        b'"input_hash":"74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",'
        b'"output":{"n":1180591620717411303424},"idempotency_key":"today/big output/0",'
        b'"status":"committed","scope":null,"started_at":"2026-11-27T08:00:04Z",'
        b'"created_at":"2026-11-27T08:00:05Z","kind":"step","state_delta":null,'
        b'"event_seq":3}'
    ),
    (
        b'{"schema_version":1,"checkpoint_id":"ckpt-000000000003-3c33f5ba7a42",'
        b'"run_id":"today","seq":3,"parent_id":"ckpt-000000000002-5925be70131c",'
        b'"step":"big state",'
        b'"input_hash":"74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",'
        b'"output":"x","idempotency_key":"today/big state/0","status":"committed",'
        b'"scope":null,"started_at":"2026-11-27T08:00:06Z",'
        b'"created_at":"2026-11-27T08:00:07Z","kind":"step",'
        b'"state_delta":{"m":-36893488147419103232},"event_seq":4}'
    ),
    (
        b'{"schema_version":1,"checkpoint_id":"ckpt-000000000004-93b7b02f67c7",'
        b'"run_id":"today","seq":4,"parent_id":"ckpt-000000000003-3c33f5ba7a42",'
        b'"step":"big scope",'
        b'"input_hash":"74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",'
        b'"output":1,"idempotency_key":"today/big scope/0","status":"committed",'
        b'"scope":{"n":73786976294838206464},"started_at":"2026-11-27T08:00:08Z",'
        b'"created_at":"2026-11-27T08:00:09Z","kind":"step","state_delta":null,'
        b'"event_seq":5}'
    ),
    (
        b'{"schema_version":1,"checkpoint_id":"ckpt-000000000005-c55f5e445185",'
        b'"run_id":"today","seq":5,"parent_id":"ckpt-000000000004-93b7b02f67c7",'
        b'"step":"long digits",'
        b'"input_hash":"6ae0f660046dadcf5fe8462c0e00a062db4c8d67be82f4098c5ea4208d19b076",'
        b'"output":"1111111111111111111111111","idempotency_key":"today/long digits/0",'
        b'"status":"committed","scope":null,"started_at":"2026-11-27T08:00:10Z",'
        b'"created_at":"2026-11-27T08:00:11Z","kind":"step","state_delta":null,'
        b'"event_seq":6}'
    ),
]
# ... and the same steps in layout 2 (each record holds its StepCommitted's epoch).
PREVIOUS_LAYOUT_2 = [
    (
        b'{"schema_version":1,"checkpoint_id":"ckpt-000000000001-b52f62e8ec74",'
        b'"run_id":"today","seq":1,"parent_id":null,"step":"plain",'
        b'"input_hash":"74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",'
        b'"output":{"f":1.5,"n":9223372036854775807,"text":"\xc3\xa9\xf0\x9f\x98\x80"},'
        b'"idempotency_key":"today/plain/0","status":"committed","scope":null,'
        b'"started_at":"2026-11-27T08:00:14Z","created_at":"2026-11-27T08:00:15Z",'
        b'"kind":"step","state_delta":null,"event_seq":2,"commit_epoch":1}'
    ),
    (
        b'{"schema_version":1,"checkpoint_id":"ckpt-000000000002-5925be70131c",'
        b'"run_id":"today","seq":2,"parent_id":"ckpt-000000000001-b52f62e8ec74",'
        b'"step":"big output",'
        b'"input_hash":"74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",'
        b'"output":{"n":1180591620717411303424},"idempotency_key":"today/big output/0",'
        b'"status":"committed","scope":null,"started_at":"2026-11-27T08:00:16Z",'
        b'"created_at":"2026-11-27T08:00:17Z","kind":"step","state_delta":null,'
        b'"event_seq":3,"commit_epoch":1}'
    ),
    (
        b'{"schema_version":1,"checkpoint_id":"ckpt-000000000003-3c33f5ba7a42",'
        b'"run_id":"today","seq":3,"parent_id":"ckpt-000000000002-5925be70131c",'
        b'"step":"big state",'
        b'"input_hash":"74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",'
        b'"output":"x","idempotency_key":"today/big state/0","status":"committed",'
        b'"scope":null,"started_at":"2026-11-27T08:00:18Z",'
        b'"created_at":"2026-11-27T08:00:19Z","kind":"step",'
        b'"state_delta":{"m":-36893488147419103232},"event_seq":4,"commit_epoch":1}'
    ),
    (
        b'{"schema_version":1,"checkpoint_id":"ckpt-000000000004-93b7b02f67c7",'
        b'"run_id":"today","seq":4,"parent_id":"ckpt-000000000003-3c33f5ba7a42",'
        b'"step":"big scope",'
        b'"input_hash":"74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",'
        b'"output":1,"idempotency_key":"today/big scope/0","status":"committed",'
        b'"scope":{"n":73786976294838206464},"started_at":"2026-11-27T08:00:20Z",'
        b'"created_at":"2026-11-27T08:00:21Z","kind":"step","state_delta":null,'
        b'"event_seq":5,"commit_epoch":1}'
    ),
    (
        b'{"schema_version":1,"checkpoint_id":"ckpt-000000000005-c55f5e445185",'
        b'"run_id":"today","seq":5,"parent_id":"ckpt-000000000004-93b7b02f67c7",'
        b'"step":"long digits",'
        b'"input_hash":"6ae0f660046dadcf5fe8462c0e00a062db4c8d67be82f4098c5ea4208d19b076",'
        b'"output":"1111111111111111111111111","idempotency_key":"today/long digits/0",'
        b'"status":"committed","scope":null,"started_at":"2026-11-27T08:00:22Z",'
        b'"created_at":"2026-11-27T08:00:23Z","kind":"step","state_delta":null,'
        b'"event_seq":6,"commit_epoch":1}'
    ),
]
RUN = "run-1"


def _without_epoch(data: bytes) -> bytes:
    """A stored checkpoint as the model's JSON: layout 2's ``commit_epoch``, its last member, cut."""
    head, sep, _ = data.rpartition(b',"commit_epoch":')
    return head + b"}" if sep else data


def _exact_for(run_id: str) -> tuple[list[str], Any]:
    """The exact decode of one item (``RunStore.decode_checkpoint``'s rule) and its calls."""
    calls: list[str] = []

    def exact(key: str, data: bytes) -> Checkpoint:
        calls.append(key)
        ckpt, _ = decode_stored_checkpoint(data, where=key)
        if ckpt.run_id != run_id or keys.checkpoint_key(ckpt.seq) != key:
            raise CorruptRecordError(
                f"stored Checkpoint at {key} is for run {ckpt.run_id!r} seq {ckpt.seq}"
            )
        return ckpt

    return calls, exact


@pytest.mark.parametrize("stored", [PREVIOUS_LAYOUT_1, PREVIOUS_LAYOUT_2])
def test_records_of_the_previous_release_read_exactly_as_before(stored: list[bytes]) -> None:
    items = [(keys.checkpoint_key(seq), data) for seq, data in enumerate(stored, start=1)]
    calls, exact = _exact_for("today")
    got = decode_run_checkpoints("today", items, exact)
    expected = [decode(Checkpoint, _without_epoch(data), where="w") for data in stored]
    assert got == expected
    assert [encode(c) for c in got] == [encode(c) for c in expected]
    assert {c.schema_version for c in got} == {1}
    # Unmarked: every record with 19 digits in a row still goes to the exact path.
    assert (
        calls == [key for key, data in items if may_hold_big_int(data)] == [key for key, _ in items]
    )
    assert got[0].output == {"f": 1.5, "n": 2**63 - 1, "text": "é😀"}
    assert got[1].output == {"n": 2**70}
    assert got[2].state_delta == {"m": -(2**65)}
    assert got[3].scope == {"n": 2**66}
    assert got[4].output == "1" * 25


def test_records_of_the_previous_release_read_as_before_from_a_store(kv: KVStore) -> None:
    space = keys.run_space("default", "today")
    kv.commit(
        [
            Put(space, keys.checkpoint_key(seq), data)
            for seq, data in enumerate(PREVIOUS_LAYOUT_2, start=1)
        ],
        [],
    )
    tasks = TaskTier(kv)
    expected = [decode(Checkpoint, _without_epoch(data), where="w") for data in PREVIOUS_LAYOUT_2]
    assert tasks.history("today") == expected
    assert tasks.history("today", newest_first=True, limit=2) == expected[:2:-1]
    assert tasks.latest_checkpoint("today") == expected[-1]
    stored = kv.scan(space, prefix=keys.CHECKPOINT_PREFIX)
    assert [data for _, data in stored] == PREVIOUS_LAYOUT_2  # reads change nothing


def test_a_step_is_marked_exactly_when_orjson_wrote_its_checkpoint(kv: KVStore) -> None:
    tasks = TaskTier(kv)
    run = tasks.start_run("u", "r1")
    run.step("plain", lambda: {"n": 2**64 - 1, "m": -(2**63), "id": "1" * 30, "f": 1e300})
    run.step("big output", lambda: [2**64])
    run.step("big state", lambda: Charged("x", state={"m": -(2**63) - 1}))
    run.step("big scope", lambda: 1, scope={"n": 2**66})
    run.step("scope pair", lambda: 2, scope={"pair": (1, "x")})  # a list by then
    run.step("no output", lambda: None, input={"q": "1" * 19})
    items = kv.scan(keys.run_space("default", "r1"), prefix=keys.CHECKPOINT_PREFIX)
    marked = [data.startswith(_EXACT_INTS_START) for _, data in items]
    assert marked == [True, False, False, False, True, True]
    assert orjson.loads(items[0][1])["schema_version"] == EXACT_INTS_VERSION
    calls, exact = _exact_for("r1")
    page = decode_run_checkpoints("r1", items, exact)
    # What pydantic (and so the previous release) reads from the same bytes, version and all.
    expected = [decode(Checkpoint, _without_epoch(data), where="w") for _, data in items]
    assert page == expected == tasks.history("r1")
    assert [c.schema_version for c in page] == [2, 1, 1, 1, 2, 2]
    assert calls == [key for (key, _), mark in zip(items, marked, strict=True) if not mark]
    assert page[0].output == {"n": 2**64 - 1, "m": -(2**63), "id": "1" * 30, "f": 1e300}
    assert page[1].output == [2**64]
    assert page[2].state_delta == {"m": -(2**63) - 1}
    assert page[3].scope == {"n": 2**66}
    assert tasks.latest_checkpoint("r1") == expected[-1]
    for _, data in items:
        # pydantic reads a marked record and writes it back as it is stored.
        assert encode(decode(Checkpoint, _without_epoch(data), where="w")) == _without_epoch(data)


_INTS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([2**63 - 1, 2**64 - 1, -(2**63), 10**18, 10**19]),
    st.integers(),  # over 64 bits too: the record is then pydantic's, version 1
)
_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        _INTS,
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=6),
        st.just("1" * 19),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=10,
)
_DELTA = st.one_of(st.none(), st.dictionaries(st.text(max_size=4), _JSON, max_size=2))
_SCOPE = st.one_of(st.none(), st.dictionaries(st.text(max_size=4), _JSON, max_size=2))
_HOW = st.sampled_from(
    [
        "written",
        "written",
        "written",
        "unmarked",
        "cut short",
        "seq over 64 bits",
        "event_seq over 64 bits",
        "epoch over 64 bits",
        "another run's",
        "reversed fields",
        "an extra field",
        "offset time",
    ]
)


def _written(
    seq: int, output: JsonValue, scope: Any, delta: Any, *, exact_ints: bool = True
) -> bytes:
    """What a step's writer stores for these values at ``seq`` (layout 2)."""
    value, text = to_json_text(output, field="output")
    key = f"k{seq}"
    _, data = build_checkpoint(
        CheckpointFields(
            checkpoint_id=checkpoint_id(RUN, seq, key),
            run_id=RUN,
            seq=seq,
            parent_id=None,
            step="s",
            input_hash="0123456789abcdef" * 4,
            output=value,
            idempotency_key=key,
            scope=scope,
            started_at=datetime(2026, 11, 27, 8, 0, tzinfo=UTC),
            created_at=datetime(2026, 11, 27, 8, 0, 1, 5, tzinfo=UTC),
            kind="step",
            state_delta=delta,
            event_seq=seq + 1,
            commit_epoch=3,
            output_text=text,
        ),
        exact_ints=exact_ints,
    )
    return data


def _changed(data: bytes, how: str) -> bytes:
    """A marked record changed as ``how`` says (the bytes stay a marked record's start)."""
    if how == "cut short":
        return data[:-1]
    fields = orjson.loads(data)
    match how:
        case "seq over 64 bits":
            fields["seq"] = orjson.Fragment(b"%d" % (2**64 + fields["seq"]))
        case "event_seq over 64 bits":
            fields["event_seq"] = orjson.Fragment(b"%d" % 2**65)
        case "epoch over 64 bits":
            fields["commit_epoch"] = orjson.Fragment(b"%d" % 2**65)
        case "another run's":
            fields["run_id"] = "run-2"
        case "reversed fields":
            version = fields.pop("schema_version")
            fields = {"schema_version": version, **dict(reversed(list(fields.items())))}
        case "an extra field":
            fields["extra"] = 1
        case _:  # "offset time"
            fields["created_at"] = "2026-11-27T08:00:01.000005+00:00"
    return orjson.dumps(fields)


@settings(max_examples=300, deadline=None)
@example(page=[({"n": 2**63}, None, None, "written"), ("1" * 19, None, None, "cut short")])
@example(page=[(1, None, {"m": 2**70}, "written"), (1, {"n": -(2**64)}, None, "written")])
@given(page=st.lists(st.tuples(_JSON, _SCOPE, _DELTA, _HOW), min_size=1, max_size=5))
def test_a_page_of_marked_records_decodes_as_the_exact_path_decodes_each(
    page: list[tuple[JsonValue, Any, Any, str]],
) -> None:
    items: list[tuple[str, bytes]] = []
    fast: list[bool] = []
    for seq, (output, scope, delta, how) in enumerate(page, start=1):
        data = _written(seq, output, scope, delta, exact_ints=how != "unmarked")
        marked = data.startswith(_EXACT_INTS_START)
        if how in ("written", "unmarked") or not marked:
            fast.append(marked or not may_hold_big_int(data))
        else:
            data = _changed(data, how)
            assert data.startswith(_EXACT_INTS_START)
            fast.append(False)
        items.append((keys.checkpoint_key(seq), data))
    expected: list[Checkpoint] = []
    error: CorruptRecordError | None = None
    _, exact_alone = _exact_for(RUN)
    for key, data in items:
        try:
            expected.append(exact_alone(key, data))
        except CorruptRecordError as exc:
            error = exc
            break
    calls, exact = _exact_for(RUN)
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
    assert calls == [key for (key, _), taken in zip(items, fast, strict=True) if not taken]
    for (_, data), ckpt, taken in zip(items, got, fast, strict=True):
        if taken:
            # What pydantic, so also the previous release, reads from the same bytes.
            assert ckpt == decode(Checkpoint, _without_epoch(data), where="w")
