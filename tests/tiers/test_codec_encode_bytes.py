"""``codec.encode`` writes exactly the bytes of ``model_dump_json().encode()``.

Since session 26 ``encode`` calls the model's serializer for bytes directly,
without ``model_dump_json``'s ``str`` round trip. The stored bytes must not
change: every record a real workload encodes (runs with steps, effects and a
completion; user facts; a session summary) is compared with the old form as it
is encoded, and so are records holding the awkward values (non-ASCII and
escapes, floats at their edges, datetimes with offsets, extra fields, a model
subclass). A value with a lone surrogate is refused by both forms alike.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, JsonValue

from memory import Memory
from tiers import codec
from tiers.models import UserFact

AWKWARD_TEXT = [
    "",
    "plain",
    "caf\u00e9 \u4e2d\u6587 \U0001f600",
    'quote " backslash \\ slash / tab \t newline \n nul \x00 del \x7f',
    "\u2028\u2029 line separators",
    "\ufeff bom \uffff",
]
AWKWARD_FLOATS = [0.0, -0.0, 1.5, 1e-7, 1e300, -2.5e-308, 0.1 + 0.2, 123456789.0]


class Loose(BaseModel):
    """A record shape with every awkward kind of value, and extra fields allowed."""

    model_config = ConfigDict(extra="allow")

    text: str
    number: float
    at: datetime
    value: JsonValue = None


class Stricter(Loose):
    """A model subclass: its own serializer must give the same bytes both ways."""

    note: str = "sub"


def _returning(value: JsonValue) -> Callable[[], JsonValue]:
    return lambda: value


def _old(record: BaseModel) -> bytes:
    """What ``encode`` returned before session 26."""
    return record.model_dump_json().encode()


@pytest.mark.parametrize("text", AWKWARD_TEXT)
@pytest.mark.parametrize("number", AWKWARD_FLOATS)
def test_awkward_values_encode_to_the_old_bytes(text: str, number: float) -> None:
    at = datetime(2026, 11, 27, 8, 42, 1, 123456, tzinfo=timezone(timedelta(hours=-3, minutes=-30)))
    value: JsonValue = {"k\u00e9y": [text, number, None, True, 10**30]}
    for record in (
        Loose(text=text, number=number, at=at, value=value, extra_field=text),
        Stricter(text=text, number=number, at=at.astimezone(UTC), value=value),
        Loose(text=text, number=number, at=at.replace(tzinfo=None)),
    ):
        assert codec.encode(record) == _old(record)


def test_non_finite_floats_and_a_lone_surrogate_behave_as_before() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    for number in (float("nan"), float("inf"), float("-inf")):
        record = Loose(text="x", number=number, at=at)
        assert codec.encode(record) == _old(record)
    surrogate = Loose.model_construct(text="lone \ud800", number=1.0, at=at)
    with pytest.raises(ValueError, match="surrogates not allowed") as new:
        codec.encode(surrogate)
    with pytest.raises(ValueError, match="surrogates not allowed") as old:
        _old(surrogate)
    assert type(new.value) is type(old.value)


def test_every_record_a_workload_encodes_has_the_old_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: dict[str, int] = {}
    real = codec.encode

    def comparing(record: BaseModel) -> bytes:
        data = real(record)
        assert data == _old(record), type(record).__name__
        name = type(record).__name__
        encoded[name] = encoded.get(name, 0) + 1
        return data

    # Every module that imported encode by name gets the comparing one.
    for module in list(sys.modules.values()):
        if getattr(module, "encode", None) is real:
            monkeypatch.setattr(module, "encode", comparing)
    with Memory.open(tmp_path / "data") as memory:
        for n, text in enumerate(AWKWARD_TEXT):
            run = memory.start_run("u1", f"run-{n}")
            output: JsonValue = {"text": text, "floats": list(AWKWARD_FLOATS)}
            run.step("think", _returning(output))
            run.effect(f"send {n}", _returning({"sent": output}), idempotency_key=f"e{n}")
            run.complete({"done": text})
        memory.set_fact("u1", "city", "S\u00e3o Paulo \U0001f600")
        memory.set_fact("u1", "city", {"name": "Z\u00fcrich", "lat": 47.3769})
        memory.save_session(
            {"session_id": "s1", "user_id": "u1", "task_description": AWKWARD_TEXT[3]}
        )
    # The kinds of records that reach encode on the way (a checkpoint takes its own
    # fast path, _records.build_checkpoint, compared with encode by its own tests).
    kinds = {"EffectRecord", "Event", "RunInfo", "SessionSummary", UserFact.__name__}
    assert kinds <= set(encoded)
