"""Time travel: the state at any checkpoint, forks, and human-edited branches."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import JsonValue

from tiers import keys
from tiers.backends.base import Check, Put
from tiers.codec import encode
from tiers.errors import (
    ConflictError,
    InvalidInputError,
    RunStateError,
)
from tiers.ids import check_id
from tiers.models import Checkpoint, RunInfo
from tiers.task import _lifecycle as lifecycle
from tiers.task import _records as task_events
from tiers.task._records import (
    EventKind,
    IdempotencyEntry,
    Snapshot,
    check_decider,
    input_hash,
    to_json_dict,
)
from tiers.task._store import RunStore
from tiers.task._txn import Txn

__all__ = ["TimeTravel"]


class TimeTravel:
    """The state at any checkpoint, forks and human-edited branches of a tier's runs."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def state_at(self, run_id: str, checkpoint_id: str) -> dict[str, JsonValue]:
        """The run's state values as of a checkpoint (every delta up to it, along its branch).

        Raises:
            RunNotFoundError: No such run.
            CheckpointNotFoundError: No such checkpoint.
        """
        ckpt = self.store.get_checkpoint(run_id, checkpoint_id)
        return self.store.values_at(run_id, ckpt.seq)

    def fork(self, run_id: str, checkpoint_id: str, new_run_id: str | None = None) -> RunInfo:
        """Start a new run from a checkpoint: its history up to there, a link to its parent.

        The new run (status ``resumable``, owned by the same user) holds copies
        of the checkpoints on the path to ``checkpoint_id`` (renumbered 1..n,
        default idempotency keys renamed to the new run), so a script started on
        it replays them and continues from there. Effects recorded after the
        fork point are not copied: on the fork they run again.

        Returns:
            The new run's head.

        Raises:
            RunNotFoundError, CheckpointNotFoundError: No such run or checkpoint.
            ConflictError: ``new_run_id`` is taken.
            InvalidInputError: Bad ``new_run_id``.
        """
        source = self.store.get_run(run_id)
        target = self.store.get_checkpoint(run_id, checkpoint_id)
        new_id = (
            task_events.new_run_id() if new_run_id is None else check_id(new_run_id, "new_run_id")
        )
        space = keys.run_space(self.store.tenant, run_id)
        by_id = {
            c.checkpoint_id: c
            for c in (
                self.store.decode_checkpoint(run_id, k, d)
                for k, d in self.store.kv.scan(
                    space,
                    prefix=keys.CHECKPOINT_PREFIX,
                    start_after=None,
                    limit=target.seq,
                )
            )
        }
        path: list[Checkpoint] = []
        cursor: Checkpoint | None = target
        while cursor is not None:
            path.append(cursor)
            cursor = by_id.get(cursor.parent_id) if cursor.parent_id else None
        path.reverse()
        values = self.store.values_at(run_id, target.seq)
        now = self.store.clock()
        new_space = keys.run_space(self.store.tenant, new_id)
        prefix = f"{run_id}/"
        base = RunInfo(
            run_id=new_id,
            user_id=source.user_id,
            status=lifecycle.INITIAL,  # RunForked moves it
            parent_run_id=run_id,
            parent_checkpoint_id=target.checkpoint_id,
            budget_tokens=source.budget_tokens,
            budget_cost=source.budget_cost,
            created_at=now,
            updated_at=now,
            incarnation=task_events.new_incarnation(),
        )
        txn = Txn(new_id, 0, base, now)
        event_seq = txn.add_event(
            EventKind.RUN_FORKED,
            parent_run_id=run_id,
            parent_checkpoint_id=target.checkpoint_id,
            copied=len(path),
        )
        parent: str | None = None
        for seq, old in enumerate(path, start=1):
            key = old.idempotency_key
            if key.startswith(prefix):
                key = f"{new_id}/{key[len(prefix) :]}"
            ckpt = old.model_copy(
                update={
                    "checkpoint_id": task_events.checkpoint_id(new_id, seq, key),
                    "run_id": new_id,
                    "seq": seq,
                    "parent_id": parent,
                    "idempotency_key": key,
                    "event_seq": event_seq,
                }
            )
            parent = ckpt.checkpoint_id
            entry = IdempotencyEntry(
                seq=seq, checkpoint_id=ckpt.checkpoint_id, input_hash=ckpt.input_hash
            )
            txn.puts += [
                Put(new_space, keys.checkpoint_key(seq), encode(ckpt)),
                Put(new_space, keys.idempotency_key(key), encode(entry)),
            ]
        if path:
            snap = Snapshot(
                run_id=new_id,
                seq=len(path),
                checkpoint_id=parent,
                event_seq=event_seq,
                values=values,
                status=txn.status.value,
            )
            txn.puts.append(
                Put(new_space, keys.snapshot_key(len(path)), self.store.fit(encode(snap)))
            )
        txn.update.head_seq = len(path)
        txn.update.head_checkpoint_id = parent
        txn.update.last_checkpoint_at = now if path else None
        txn.update.snapshot_event_seq = event_seq if path else 0
        try:
            info, _ = self.store.apply(txn, None)
        except ConflictError as exc:
            raise ConflictError(f"run id {new_id!r} is taken: fork to another new_run_id") from exc
        return info

    def update_state(
        self,
        run_id: str,
        checkpoint_id: str,
        values: dict[str, Any],
        *,
        by: str = "operator",
        by_key: str | None = None,
    ) -> Checkpoint:
        """Append a human-edited checkpoint: the state at ``checkpoint_id`` with ``values`` set.

        The new checkpoint's parent is ``checkpoint_id``, so when that is not
        the head the checkpoints after it leave the run's lineage (a new
        branch): on resume their steps run again from the edited state (their
        effects, already recorded, are not repeated). The lease is revoked (the
        running worker, if any, is fenced out) and the run becomes resumable.

        ``by`` (who edits, as the caller names them, 1-256 characters) and
        ``by_key`` (the id of the credential the caller was authenticated with:
        a service passes its API key id; ``None`` from the library) are kept in
        the ``StateUpdated`` event.

        Returns:
            The appended checkpoint (kind ``update``).

        Raises:
            InvalidInputError: ``values`` is not a JSON dict, the checkpoint is on
                a superseded branch (fork from it instead), or a bad ``by`` or ``by_key``.
            RunStateError: The run is finished (fork it instead).
            RunNotFoundError, CheckpointNotFoundError: No such run or checkpoint.
            ValueTooLargeError: The resulting state snapshot exceeds the value limit.
        """
        by, by_key = check_decider(by, by_key)
        delta = to_json_dict(values, field="values")
        digest = input_hash(delta, field="values")  # of the edit as given; stored redacted
        delta = self.store.redactor.redact_json(delta)
        target = self.store.get_checkpoint(run_id, checkpoint_id)
        base_values = self.store.values_at(run_id, target.seq)
        space = keys.run_space(self.store.tenant, run_id)
        made: list[Checkpoint] = []

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            made.clear()
            if info.status.finished:
                raise RunStateError(
                    f"run {run_id!r} is {info.status.value}: fork it to edit its state"
                )
            if not info.in_lineage(target.seq):
                raise InvalidInputError(
                    f"checkpoint {checkpoint_id!r} is on a superseded branch of run "
                    f"{run_id!r}: fork from it instead",
                    field="checkpoint_id",
                )
            changed: list[JsonValue] = [*sorted(delta)]
            seq = info.head_seq + 1
            key = f"{run_id}/update_state/@{seq}"
            ckpt_id = task_events.checkpoint_id(run_id, seq, key)
            txn = Txn(run_id, info.lease_epoch + 1, info, now)
            ev = txn.add_event(
                EventKind.STATE_UPDATED,
                seq=seq,
                checkpoint_id=ckpt_id,
                parent_id=target.checkpoint_id,
                keys=changed,
                by=by,
                by_key=by_key,
            )
            ckpt = Checkpoint(
                checkpoint_id=ckpt_id,
                run_id=run_id,
                seq=seq,
                parent_id=target.checkpoint_id,
                step="update_state",
                input_hash=digest,
                output=None,
                idempotency_key=key,
                started_at=now,
                created_at=now,
                kind="update",
                state_delta=delta,
                event_seq=ev,
            )
            snap = Snapshot(
                run_id=run_id,
                seq=seq,
                checkpoint_id=ckpt_id,
                event_seq=ev,
                values={**base_values, **delta},
                status=txn.status.value,
                pending_plan_hash=(
                    info.pending_approval.plan_hash if info.pending_approval else None
                ),
                spent_tokens=info.spent_tokens,
                spent_cost=info.spent_cost,
                unknown_effects=info.unknown_effects,
            )
            superseded = list(info.superseded)
            if target.seq < info.head_seq:
                superseded.append((target.seq + 1, info.head_seq))
            entry = IdempotencyEntry(seq=seq, checkpoint_id=ckpt_id, input_hash=ckpt.input_hash)
            txn.puts += [
                Put(space, keys.checkpoint_key(seq), encode(ckpt)),
                Put(space, keys.idempotency_key(key), encode(entry)),
                Put(space, keys.snapshot_key(seq), self.store.fit(encode(snap))),
            ]
            txn.checks += [
                Check(space, keys.checkpoint_key(seq), None),
                Check(space, keys.idempotency_key(key), None),
            ]
            txn.update.lease_epoch = info.lease_epoch + 1
            txn.update.lease_owner = None
            txn.update.lease_expires_at = None
            txn.update.head_seq = seq
            txn.update.head_checkpoint_id = ckpt_id
            txn.update.last_checkpoint_at = now
            txn.update.snapshot_event_seq = ev
            txn.update.superseded = superseded
            made.append(ckpt)
            return txn

        self.store.operate(run_id, build, "update the state of")
        return made[0]
