"""``tiers.codec.encode`` writes what ``model_dump_json`` wrote, byte for byte (stored bytes unchanged).

``encode`` calls the record's serializer for bytes directly instead of going
through ``model_dump_json``'s ``str``; these tests compare the two on the
records a run stores, with generated results, texts, floats and times. So
does the task tier's ``encode_head`` (orjson for a head as a step leaves it).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from tiers.codec import encode
from tiers.models import PendingApproval, RunInfo, RunStatus
from tiers.task import _checkpoint_encode as checkpoint_encode
from tiers.task._checkpoint_encode import encode_head
from tiers.task._records import Event, EventKind, Snapshot
from tiers.task._txn import Txn

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
_times = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(9998, 12, 31), timezones=st.just(UTC)
)


def _old(record: BaseModel) -> bytes:
    return record.model_dump_json().encode()


@settings(max_examples=200, deadline=None)
@given(
    result=_json,
    error=st.none() | st.text(max_size=40),
    spent_cost=st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    budget_cost=st.none() | st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    at=_times,
    status=st.sampled_from(list(RunStatus)),
    pending=st.booleans(),
)
def test_a_run_head_encodes_as_model_dump_json(
    result: object,
    error: str | None,
    spent_cost: float,
    budget_cost: float | None,
    at: datetime,
    status: RunStatus,
    pending: bool,
) -> None:
    info = RunInfo.model_validate(
        {
            "run_id": "run-1",
            "user_id": "user-1",
            "status": status,
            "result": result,
            "error": error,
            "spent_cost": spent_cost,
            "budget_cost": budget_cost,
            "created_at": at,
            "updated_at": at + timedelta(microseconds=1),
            "last_checkpoint_at": at.astimezone(timezone(timedelta(hours=2))),
            "superseded": [(1, 2)],
            "unknown_effects": ["k\u2028\x00é"],
            "pending_approval": (
                PendingApproval(key="gate", plan_hash="ab", requested_at=at) if pending else None
            ),
        }
    )
    assert encode(info) == _old(info)


@settings(max_examples=100, deadline=None)
@given(data=st.dictionaries(st.text(), _json, max_size=4), at=_times)
def test_events_and_snapshots_encode_as_model_dump_json(
    data: dict[str, object], at: datetime
) -> None:
    event = Event(run_id="r", seq=3, kind=EventKind.STEP_COMMITTED, epoch=1, at=at, data=data)
    snap = Snapshot(
        run_id="r",
        seq=2,
        checkpoint_id="ckpt-000000000002-0123456789ab",
        event_seq=3,
        values=data,
        status="running",
        spent_tokens=1,
        spent_cost=0.5,
        unknown_effects=[],
    )
    assert encode(event) == _old(event)
    assert encode(snap) == _old(snap)


def test_a_head_built_without_validation_encodes_as_model_dump_json() -> None:
    # Txn.head() sets fields without validating them; the bytes are the serializer's either way.
    info = RunInfo(run_id="r", user_id="u")
    head = info.model_copy(update={"spent_cost": 5, "lease_ttl_s": 3, "head_seq": 7})
    assert encode(head) == _old(head)


# -- encode_head: orjson's bytes for a head as a step leaves it, else pydantic's -------------

_texts = st.text() | st.sampled_from(['"', "\\", "\n\t\x00\x1f\x7f", "\u2028é\U0001f600", "</"])
_floats = st.floats(min_value=0, allow_nan=False, allow_infinity=False)


@settings(max_examples=400, deadline=None)
@given(
    texts=st.lists(st.none() | _texts, min_size=6, max_size=6),
    ints=st.lists(st.integers(min_value=0, max_value=2**63 - 1), min_size=7, max_size=7),
    spent_cost=_floats | st.integers(min_value=0, max_value=10**6),
    lease_ttl_s=st.none() | st.floats(min_value=1e-9, allow_nan=False, allow_infinity=False),
    budget_cost=st.none() | _floats,
    budget_tokens=st.none() | st.integers(min_value=0, max_value=2**70),
    times=st.lists(st.none() | _times, min_size=3, max_size=3),
    at=_times,
    status=st.sampled_from(list(RunStatus)),
    result=st.none() | _json,
    superseded=st.sampled_from([[], [(1, 2)]]),
    unknown=st.sampled_from([[], ["k\u2028\x00é"]]),
    pending=st.booleans(),
    validated=st.booleans(),
    plain=st.booleans(),
)
def test_encode_head_is_encode_byte_for_byte(
    texts: list[str | None],
    ints: list[int],
    spent_cost: float,
    lease_ttl_s: float | None,
    budget_cost: float | None,
    budget_tokens: int | None,
    times: list[datetime | None],
    at: datetime,
    status: RunStatus,
    result: object,
    superseded: list[tuple[int, int]],
    unknown: list[str],
    pending: bool,
    validated: bool,
    plain: bool,
) -> None:
    if plain:  # half the heads shaped as a step leaves them (orjson's path), half anything
        result, superseded, unknown, pending, spent_cost = None, [], [], False, float(spent_cost)
    # A head validated from stored bytes, or built as Txn.head() builds one (no validation:
    # an int may sit in a float field, a time in another zone); both must keep their bytes.
    error, head_checkpoint_id, lease_owner, parent_checkpoint_id, incarnation, external_id = texts
    fields: dict[str, object] = {
        "run_id": "run-1",
        "user_id": "user-1",
        "status": status,
        "head_seq": ints[0],
        "head_checkpoint_id": head_checkpoint_id,
        "lease_epoch": ints[1],
        "error": error,
        "result": result,
        "created_at": at,
        "updated_at": times[0] or at,
        "last_checkpoint_at": times[1],
        "event_seq": ints[2],
        "snapshot_event_seq": ints[3],
        "compacted_through": ints[4],
        "lease_owner": lease_owner,
        "lease_expires_at": times[2],
        "lease_ttl_s": lease_ttl_s,
        "parent_checkpoint_id": parent_checkpoint_id,
        "pending_approval": (
            PendingApproval(key="gate", plan_hash="ab", requested_at=at) if pending else None
        ),
        "budget_tokens": budget_tokens,
        "budget_cost": budget_cost,
        "spent_tokens": ints[5],
        "spent_cost": spent_cost,
        "superseded": superseded,
        "unknown_effects": unknown,
        "external_id": external_id or None,
        "incarnation": incarnation or None,
    }
    base = RunInfo(run_id="run-1", user_id="user-1")
    if validated:
        # What a store's bytes decode to (texts the model refuses are left out).
        try:
            info = RunInfo.model_validate(fields)
        except ValidationError:
            return
    else:
        info = base.model_copy(update=fields)
    assert encode_head(info) == encode(info) == _old(info)


def test_encode_head_keeps_pydantic_bytes_for_what_orjson_writes_otherwise() -> None:
    at = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)
    base = RunInfo(run_id="r", user_id="u", created_at=at, updated_at=at)
    heads = [
        base,
        base.model_copy(update={"spent_cost": 5, "lease_ttl_s": 3}),  # ints in float fields
        base.model_copy(update={"updated_at": at.astimezone(timezone(timedelta(hours=2)))}),
        base.model_copy(update={"updated_at": at.replace(tzinfo=None)}),
        base.model_copy(update={"updated_at": datetime(999, 1, 1, tzinfo=UTC)}),
        base.model_copy(update={"spent_tokens": 2**70}),  # orjson refuses it
        base.model_copy(update={"lease_owner": "w\ud800"}),  # a lone surrogate
        base.model_copy(update={"result": {"b": 1.0, "a": [1, "x"]}}),
    ]
    for head in heads:
        try:
            expected = _old(head)
        except ValueError:  # pydantic refuses it too: both raise
            continue
        assert encode_head(head) == expected


def test_a_steps_head_takes_orjsons_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # The head a step commits is written without pydantic (what the path is for).
    def refuse(record: BaseModel) -> bytes:
        raise AssertionError(f"pydantic's path for {record!r}")

    at = datetime(2026, 11, 27, 10, 0, 0, 123456, tzinfo=UTC)
    txn = Txn("r", 2, RunInfo(run_id="r", user_id="u", lease_epoch=2, lease_ttl_s=30.0), at)
    txn.update.set_head_checkpoint(1, "ckpt-000000000001-0123456789ab", at)
    txn.update.lease_expires_at = at + timedelta(seconds=30)
    head = txn.head()
    expected = _old(head)
    monkeypatch.setattr(checkpoint_encode, "encode", refuse)
    assert encode_head(head) == expected
