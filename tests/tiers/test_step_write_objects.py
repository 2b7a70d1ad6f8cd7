"""The objects a step builds on its hot path behave as the plain versions they replace.

``Put`` and ``Check`` set their slots without the frozen dataclass's generated
``__init__``; ``Txn.head`` merges the head's fields without ``HeadUpdate.changes``;
a fast checkpoint writes its times with orjson instead of ``isoformat``. Each is
checked here against what the replaced code gave.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from tiers.backends.base import Check, Delete, Put
from tiers.models import RunInfo, RunStatus
from tiers.task._checkpoint_encode import _utc
from tiers.task._txn import Txn


@pytest.mark.parametrize(
    ("cls", "last"),
    [(Put, "value"), (Check, "expected")],
)
def test_put_and_check_are_frozen_dataclasses_as_before(cls: type, last: str) -> None:
    built = cls("space", "key", b"v")
    assert built == cls(space="space", key="key", **{last: b"v"})
    assert hash(built) == hash(cls("space", "key", b"v"))
    assert built != cls("space", "key", b"w")
    assert repr(built) == f"{cls.__name__}(space='space', key='key', {last}=b'v')"
    assert [f.name for f in dataclasses.fields(built)] == ["space", "key", last]
    assert dataclasses.replace(built, key="other") == cls("space", "other", b"v")
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.key = "other"
    with pytest.raises(TypeError):
        cls("space", "key")
    with pytest.raises(AttributeError):
        built.__dict__  # noqa: B018 (slots: no instance dict)


def test_a_put_never_equals_a_check_or_a_delete_of_the_same_fields() -> None:
    put: object = Put("s", "k", b"v")
    assert put != Check("s", "k", b"v")
    assert put != Delete("s", "k")


def test_a_check_of_an_absent_key_holds_none() -> None:
    assert Check("s", "k", None).expected is None


def test_txn_head_is_model_copy_with_the_changes() -> None:
    now = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
    base = RunInfo(run_id="r1", user_id="u")
    txn = Txn("r1", 1, base, now)
    txn.update.head_seq = 3
    txn.update.head_checkpoint_id = "c3"
    txn.update.last_checkpoint_at = now
    txn.held = 2
    head = txn.head()
    expected = base.model_copy(
        update={
            "head_seq": 3,
            "head_checkpoint_id": "c3",
            "last_checkpoint_at": now,
            "status": txn.status,
            "event_seq": base.event_seq + 2,
            "updated_at": now,
        }
    )
    assert head == expected
    assert head.__dict__ == expected.__dict__
    assert head.model_fields_set == expected.model_fields_set
    assert head.status is RunStatus.RUNNING
    # The base is left as it was.
    assert base.head_seq == 0
    assert base.updated_at != now


_DUMP_TIME = TypeAdapter(datetime).dump_json


@given(st.datetimes(min_value=datetime(1000, 1, 1)))
def test_a_time_is_written_as_pydantic_writes_it(when: datetime) -> None:
    utc = when.replace(tzinfo=UTC)
    converted = _utc(when)
    assert converted is not None
    held, text = converted
    assert held == utc
    assert held.tzinfo is UTC
    written = orjson.dumps(text)
    assert written == _DUMP_TIME(utc)
    assert written == f'"{utc.isoformat()[:-6]}Z"'.encode()


def test_a_time_in_another_zone_is_written_in_utc() -> None:
    when = datetime(2026, 11, 27, 19, 30, 0, 5, tzinfo=timezone(timedelta(hours=5)))
    converted = _utc(when)
    assert converted is not None
    assert orjson.dumps(converted[1]) == b'"2026-11-27T14:30:00.000005Z"'


def test_set_head_checkpoint_assigns_the_three_fields_as_attributes_do() -> None:
    at = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
    base = RunInfo(run_id="r1", user_id="u")
    direct, by_attribute = Txn("r1", 1, base, at), Txn("r1", 1, base, at)
    direct.update.set_head_checkpoint(4, "c4", at)
    by_attribute.update.head_seq = 4
    by_attribute.update.head_checkpoint_id = "c4"
    by_attribute.update.last_checkpoint_at = at
    assert direct.update.changes() == by_attribute.update.changes()
    assert direct.head() == by_attribute.head()
