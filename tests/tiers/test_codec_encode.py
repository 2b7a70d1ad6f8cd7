"""``tiers.codec.encode`` writes what ``model_dump_json`` wrote, byte for byte (stored bytes unchanged).

``encode`` calls the record's serializer for bytes directly instead of going
through ``model_dump_json``'s ``str``; these tests compare the two on the
records a run stores, with generated results, texts, floats and times.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from tiers.codec import encode
from tiers.models import PendingApproval, RunInfo, RunStatus
from tiers.task._records import Event, EventKind, Snapshot

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
