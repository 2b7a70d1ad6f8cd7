"""A checkpoint built from its stored fields without pydantic's walk, when they are what we write.

History reads decode every checkpoint of a page; pydantic's validation of the
fields (and the copy that then sets the output and state delta) cost more than
parsing the JSON itself. The stored bytes are our own ``model_dump_json`` of a
validated :class:`~tiers.models.Checkpoint`, so :func:`trusted_checkpoint`
checks that each field has the exact type and form that dump writes (the same
constraints the model states) and builds the record directly. Anything else
(a record of an older release without a newer field, a hand-edited or corrupt
row) gets ``None``, and the caller takes pydantic's path, which decides
exactly as before (the same record, or the same
:class:`~tiers.errors.CorruptRecordError`).

:func:`decode_run_checkpoints` is the whole fast path from stored bytes
for reads of one run (history, the latest checkpoint): one orjson parse per
record, the run's id compared with the one asked for instead of matched
against the id pattern again (the caller validated it), and the record's seq
compared with the one its key names; every record it does not take goes to
the exact decode the caller passes. A record that begins as a step's writer
begins one of version :data:`~tiers.task._format.EXACT_INTS_VERSION` (orjson
wrote it whole, so it holds no int outside 64 bits) is parsed without
:func:`may_hold_big_int`'s scan of its bytes; every other record keeps it.
The record keeps its version, as pydantic's decode keeps it. The cyclic
garbage collector is held off while a page decodes (:class:`_CollectorPause`).
"""

from __future__ import annotations

import gc
import hashlib
import os
import re
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final

import orjson

from tiers import keys
from tiers.ids import ID_PATTERN
from tiers.models import SCHEMA_VERSION, Checkpoint, CheckpointStatus
from tiers.task._format import EXACT_INTS_VERSION

__all__ = ["decode_run_checkpoints", "may_hold_big_int", "trusted_checkpoint"]

# The fields in the order the model dumps them: a record's dict keeps it, so its dump is the same.
# Spelled out because trusted_checkpoint unpacks a record's values in this order (a test pins it).
_FIELDS: Final = (
    "schema_version",
    "checkpoint_id",
    "run_id",
    "seq",
    "parent_id",
    "step",
    "input_hash",
    "output",
    "idempotency_key",
    "status",
    "scope",
    "started_at",
    "created_at",
    "kind",
    "state_delta",
    "event_seq",
)
# A trusted record's fields set: copied, not built from its keys again (they are these).
_FIELDS_SET: Final = frozenset(_FIELDS)
_STATUS: Final = {status.value: status for status in CheckpointStatus}
# The record versions our dump writes (tiers.task._format): the same fields and forms in both.
_VERSIONS: Final = frozenset((SCHEMA_VERSION, EXACT_INTS_VERSION))
_SHA256_HEX: Final = r"[0-9a-f]{64}"
# The one form pydantic dumps a UTC datetime in; fromisoformat reads it as pydantic does.
# ASCII digits only: fromisoformat refuses other Unicode digits (with a ValueError).
_UTC_TIME: Final = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?Z"
# The input hash and the two times in one match of "hash|started|created" (no part can hold a
# "|", so the whole matches exactly when each part does).
_HASH_AND_TIMES: Final = re.compile(f"{_SHA256_HEX}\\|{_UTC_TIME}\\|{_UTC_TIME}", re.ASCII)
# input_hash(None) (tiers.task._records), a valid digest: most steps have no input, and
# comparing with it leaves the regex the two times (half its cost).
_NO_INPUT_HASH: Final = hashlib.sha256(b"null").hexdigest()
_TIMES: Final = re.compile(f"{_UTC_TIME}\\|{_UTC_TIME}", re.ASCII)
_new = Checkpoint.__new__
_set = object.__setattr__
# ASCII digits -> "0", every other byte -> " ": a run of 19 "0"s is where an int over 64 bits may be.
_DIGITS_ONLY: Final = bytes(ord("0") if 48 <= b <= 57 else ord(" ") for b in range(256))
_LONG_DIGITS: Final = b"0" * 19
# How every record of version EXACT_INTS_VERSION begins: only a step's writer writes it (orjson's
# dump, no space), and no record of an older release can begin so (they all say version 1).
_EXACT_INTS_START: Final = b'{"schema_version":%d,' % EXACT_INTS_VERSION
# keys.checkpoint_key as a %-format: a third of the f-string's time, per record of a page.
_CHECKPOINT_KEY: Final = f"{keys.CHECKPOINT_PREFIX}%0{keys.SEQ_WIDTH}d"
_loads = orjson.loads


def may_hold_big_int(data: bytes) -> bool:
    """Whether JSON ``data`` may hold an int over 64 bits, which orjson would read as a float.

    Such an int has at least 19 digits in a row (an int that fits in 64 bits
    orjson reads exactly), so bytes without such a run parse the same with
    orjson as with :mod:`json`; bytes with one (a long number in a string, too)
    take :mod:`json`'s exact path.
    """
    return _LONG_DIGITS in data.translate(_DIGITS_ONLY)


# Containers counted since the collector's last pass past which a decode that ends while others
# still run makes one (about 30 pages of 100 chat-state records that no one dropped).
_OVERDUE: Final = 100_000


class _CollectorPause:
    """The cyclic garbage collector held off while pages decode, in any number of threads.

    A page of 100 chat-state records makes about 3,000 containers (orjson's dicts
    and lists, the records), each counted toward the collector's next pass: a
    history ran four young passes and every other one a middle pass over the
    page it was building (0.2-0.3 ms of a 1.5-2 ms history), and none of them
    can free anything (a decoded record holds no cycle). With the collector off
    while a page decodes, the page's containers are counted off again as the
    caller drops its previous page, so a reader that replaces one page by the
    next leaves the count where it was. The first decode to start turns the
    collector off (if it was on) and the last to end turns it back on; an
    application that turned it off keeps it off. Turning it off or on from
    another thread while a page decodes is undone when the last decode ends.
    Decodes that keep overlapping (many reader threads) would keep it off for
    good: a decode that ends while others still run and finds more than
    :data:`_OVERDUE` containers counted since the last pass makes the pass the
    collector would have made (:func:`_due_pass`). A child of ``fork`` keeps only the
    decodes of the thread that forked (the others never end there).
    """

    def __init__(self) -> None:
        # Reentrant: a signal handler that reads a history runs in the thread it interrupts,
        # maybe while that thread holds this lock.
        self._lock = threading.RLock()
        # Open decodes by thread id (a child of fork keeps only its forking thread's);
        # none open: the collector is as the application set it.
        self._decoding_by_thread: dict[int, int] = {}
        self._was_enabled = False
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    @property
    def _decoding(self) -> int:
        """Decodes open in every thread."""
        return sum(self._decoding_by_thread.values())

    def __enter__(self) -> None:
        thread = threading.get_ident()
        # Counted before the collector is turned off: a decode that starts in between (a
        # signal handler's, in this thread under this lock) must not take "off" for the
        # application's setting and keep it.
        with self._lock:
            first = not self._decoding_by_thread
            self._decoding_by_thread[thread] = self._decoding_by_thread.get(thread, 0) + 1
            if first:
                self._was_enabled = gc.isenabled()
                gc.disable()

    def __exit__(self, *exc_info: object) -> None:
        thread = threading.get_ident()
        with self._lock:
            # Read before the count drops: a decode starting and ending in between (a signal
            # handler's) would set it from the collector we turned off.
            was_enabled = self._was_enabled
            if self._decoding_by_thread[thread] == 1:
                del self._decoding_by_thread[thread]
            else:
                self._decoding_by_thread[thread] -= 1
            overdue = False
            if was_enabled:
                if not self._decoding_by_thread:
                    gc.enable()
                else:
                    overdue = gc.get_count()[0] > _OVERDUE
        if overdue:
            _due_pass()  # outside the lock: a finalizer it runs may decode a page too

    def _after_fork_in_child(self) -> None:
        """The child's state: only the forking thread's decodes go on, the others never end.

        Without this, a fork while another thread decodes would leave the child's
        collector off for good (that decode never ends there) and its lock
        possibly held by a thread the child does not have.
        """
        self._lock = threading.RLock()
        forking_thread = threading.get_ident()
        open_here = self._decoding_by_thread.get(forking_thread, 0)
        self._decoding_by_thread = {forking_thread: open_here} if open_here else {}
        if open_here == 0 and self._was_enabled:
            gc.enable()


def _due_pass() -> None:
    """The pass the collector would make now: of the oldest generation past its threshold.

    Not always a full pass: in an application with millions of objects one takes
    a second, and the collector makes one only after many young and middle ones.
    None when the application set the young threshold to 0 (no automatic pass).
    """
    counts = gc.get_count()
    thresholds = gc.get_threshold()
    if thresholds[0] == 0:
        return
    if counts[2] > thresholds[2]:
        gc.collect(2)
    elif counts[1] > thresholds[1]:
        gc.collect(1)
    else:
        gc.collect(0)


_COLLECTOR_PAUSE: Final = _CollectorPause()


def decode_run_checkpoints(
    run_id: str,
    items: Sequence[tuple[str, bytes]],
    exact: Callable[[str, bytes], Checkpoint],
) -> list[Checkpoint]:
    """Stored checkpoints of run ``run_id`` as records, in their order; ours built without pydantic.

    The cyclic garbage collector is held off while the page decodes (see
    :class:`_CollectorPause`): it would only walk the containers being built.

    A record is built here when its bytes cannot hold an int over 64 bits (they
    begin as a record of version :data:`~tiers.task._format.EXACT_INTS_VERSION`
    does, or have no 19 digits in a row), are a JSON object with a valid
    ``commit_epoch`` (or none), are what :func:`trusted_checkpoint` takes for
    this run, and its seq is the one its key names. Every other record (an older
    release's, a corrupt or misplaced one, one that may hold an int over 64 bits,
    one that begins as version 2 does but is not all our form) goes to
    ``exact``, which decides (the same record, or the
    :class:`~tiers.errors.CorruptRecordError`).

    Args:
        run_id: The run they were read from, already validated as an id.
        items: Its checkpoint keys and stored bytes.
        exact: The exact decode of one item (key, bytes).

    Returns:
        One checkpoint per item.
    """
    with _COLLECTOR_PAUSE:
        return _decode_page(run_id, items, exact)


def _decode_page(
    run_id: str,
    items: Sequence[tuple[str, bytes]],
    exact: Callable[[str, bytes], Checkpoint],
) -> list[Checkpoint]:
    """:func:`decode_run_checkpoints`'s loop."""
    page: list[Checkpoint] = []
    append = page.append
    # One loop, one call per record: per-record calls cost more than the checks in them.
    for key, data in items:
        ckpt = None
        # may_hold_big_int inlined, for the records not marked as holding no such int.
        if data.startswith(_EXACT_INTS_START) or _LONG_DIGITS not in data.translate(_DIGITS_ONLY):
            try:
                fields = _loads(data)
            except orjson.JSONDecodeError:
                fields = None
            if type(fields) is dict:
                epoch = fields.pop("commit_epoch", None)
                if epoch is None or (type(epoch) is int and epoch >= 0):
                    ckpt = _trusted(fields, run_id, key)
        append(exact(key, data) if ckpt is None else ckpt)
    return page


def trusted_checkpoint(fields: dict[str, Any], *, run_id: str | None = None) -> Checkpoint | None:
    """The checkpoint ``fields`` (a stored record's parsed JSON) hold, or ``None``.

    ``None`` unless every field is present, in the model's order, with the type
    and form our own dump writes (``schema_version`` 1, or
    :data:`~tiers.task._format.EXACT_INTS_VERSION`); the caller then validates
    with pydantic.
    ``fields`` becomes the record's storage (the caller passes a dict it owns).
    ``run_id`` (a validated id): also ``None`` unless the record is that run's,
    whose id then needs no pattern match.
    """
    return _trusted(fields, run_id, None)


def _trusted(
    fields: dict[str, Any], run_id: str | None, stored_at: str | None
) -> Checkpoint | None:
    """:func:`trusted_checkpoint`; with ``stored_at`` (its key), ``None`` unless that names its seq.

    Positional, and the seq compared where it is a local: per record of a page,
    a keyword argument and reading the seq back off the record cost more than
    the comparison.
    """
    if tuple(fields) != _FIELDS:
        return None
    (
        version,
        checkpoint_id,
        stored_run,
        seq,
        parent_id,
        step,
        input_hash,
        _output,  # any JSON value
        key,
        status,
        scope,
        started,
        created,
        kind,
        delta,
        event_seq,
    ) = fields.values()
    if not (
        type(version) is int
        and version in _VERSIONS
        and type(checkpoint_id) is str
        and type(stored_run) is str
        and (
            stored_run == run_id
            if run_id is not None
            else ID_PATTERN.fullmatch(stored_run) is not None
        )
        and type(seq) is int
        and seq >= 1
        and (stored_at is None or stored_at == _CHECKPOINT_KEY % seq)
        and (parent_id is None or type(parent_id) is str)
        and type(step) is str
        and 1 <= len(step) <= 256
        and type(input_hash) is str
        and type(key) is str
        and 1 <= len(key) <= 512
        and type(status) is str
        and (member := _STATUS.get(status)) is not None
        and (scope is None or type(scope) is dict)
        and type(started) is str
        and type(created) is str
        and (
            _TIMES.fullmatch(f"{started}|{created}")
            if input_hash == _NO_INPUT_HASH
            else _HASH_AND_TIMES.fullmatch(f"{input_hash}|{started}|{created}")
        )
        is not None
        and type(kind) is str
        and 1 <= len(kind) <= 32
        and (event_seq is None or (type(event_seq) is int and event_seq >= 1))
        and (delta is None or type(delta) is dict)
    ):
        return None
    fields["status"] = member
    fields["started_at"] = datetime.fromisoformat(started)
    fields["created_at"] = datetime.fromisoformat(created)
    ckpt = _new(Checkpoint)
    _set(ckpt, "__dict__", fields)
    _set(ckpt, "__pydantic_fields_set__", set(_FIELDS_SET))
    _set(ckpt, "__pydantic_extra__", None)
    _set(ckpt, "__pydantic_private__", None)
    return ckpt
