"""Retention for everything: how long sessions, transcripts, facts and idle runs are kept.

Off by default: with no TTL set, everything is kept until it is deleted.

**Policy.** Four TTLs, each ``None`` (keep forever) or a :class:`~datetime.timedelta`:

- ``sessions``: a session (summary, transcript, vectors, the facts learned from
  it) is deleted this long after it ended (the summary's ``created_at``; for a
  session never summarized, its transcript's);
- ``transcripts``: a session's raw transcript is deleted this long after the
  session ended; its summary stays (and so do the facts learned from it: they
  have their own TTL). A transcript with no summary is all its session holds,
  so the session goes;
- ``facts``: a fact whose last update (its newest version, a deletion
  included) is older than this is deleted with its whole history; of a fact
  still current, the past versions replaced longer ago than this are dropped;
- ``idle_runs``: a run never finished, not touched (no step, heartbeat or
  other commit) for this long and holding no live lease is deleted whole.

Finished runs have their own retention (``TaskTier.retention``, 7 days by default).

**Where it is set.** A deployment default (``Settings.retention_*_days``) and,
per tenant, overrides stored in the KV store beside the tenant's data
(:func:`~tiers.keys.tenant_config_space`): each kind a tenant overrides takes
the tenant's value (a TTL, or off), the others follow the default.

**Sweeping.** :func:`sweep_expired` applies a policy to one tenant, a page at
a time (users, sessions, runs), through the tiers' own delete paths: each
deletion is one commit checked against the records it read, so anything
written or touched meanwhile is left for the next sweep.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tiers import cas, keys
from tiers.backends.base import Check, KVStore, Put
from tiers.codec import decode, encode
from tiers.errors import ConflictError, InvalidInputError
from tiers.ids import check_id
from tiers.models import Record
from tiers.session import SessionTier
from tiers.task import TaskTier
from tiers.user import UserTier

__all__ = [
    "DEFAULT",
    "KINDS",
    "MAX_TTL",
    "RetentionKind",
    "RetentionPolicy",
    "SweepReport",
    "TenantRetention",
    "effective_policy",
    "format_ttl",
    "parse_ttl",
    "read_overrides",
    "set_overrides",
    "sweep_expired",
]

logger = logging.getLogger(__name__)

RetentionKind = Literal["sessions", "transcripts", "facts", "idle_runs"]
KINDS: tuple[RetentionKind, ...] = get_args(RetentionKind)

MAX_TTL = timedelta(days=36_500)
"""Longest TTL (100 years): longer is the same as keeping forever, and must stay representable."""

DEFAULT = "default"
"""Given as a tenant's TTL: follow the deployment's default again."""

_PAGE = 256  # users, summaries and runs read per page
_TRANSCRIPT_PAGE = 32  # transcript rows per page: pages of a transcript are large values

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_TTL_TEXT = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def _check_ttl(value: timedelta | None, field: str) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta) or not timedelta(0) < value <= MAX_TTL:
        raise InvalidInputError(
            f"{field} must be a duration > 0 and at most {MAX_TTL.days} days, or off",
            field=field,
        )
    return value


class RetentionPolicy(BaseModel):
    """The TTL of each kind of data, ``None`` for keep forever (see the module docstring).

    Attributes:
        sessions: Sessions are deleted this long after they ended.
        transcripts: Raw transcripts are deleted this long after their session ended.
        facts: Facts are deleted this long after their last update, history included.
        idle_runs: Unfinished runs untouched this long (and with no live lease) are deleted.
        tenant_set: The kinds whose TTL comes from the tenant's own overrides
            (the rest follow the deployment's default).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    sessions: timedelta | None = None
    transcripts: timedelta | None = None
    facts: timedelta | None = None
    idle_runs: timedelta | None = None
    tenant_set: tuple[RetentionKind, ...] = ()

    @field_validator("sessions", "transcripts", "facts", "idle_runs")
    @classmethod
    def _in_range(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and not timedelta(0) < value <= MAX_TTL:
            raise ValueError(f"must be > 0 and at most {MAX_TTL.days} days, or None (keep forever)")
        return value

    def ttl(self, kind: RetentionKind) -> timedelta | None:
        """The TTL of ``kind`` (``None``: kept forever)."""
        value: timedelta | None = getattr(self, kind)
        return value

    @property
    def enabled(self) -> bool:
        """Whether any kind has a TTL."""
        return any(self.ttl(kind) is not None for kind in KINDS)


TtlSeconds = Annotated[float, Field(gt=0, le=MAX_TTL.total_seconds())]


class TenantRetention(Record):
    """A tenant's stored overrides: kind -> TTL in seconds, or ``None`` for keep forever.

    A kind not in ``overrides`` follows the deployment's default.
    """

    overrides: dict[RetentionKind, TtlSeconds | None] = Field(default_factory=dict)


def parse_ttl(value: object, field: str) -> timedelta | None:
    """A TTL as given by a caller: a timedelta, or text such as ``90d``, ``12h``, ``2w``, ``30m``, ``45s``.

    ``None``, ``"off"`` and ``"never"`` mean keep forever.

    Raises:
        InvalidInputError: Anything else, or a duration out of range; ``field`` names it.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        return _check_ttl(value, field)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("off", "never"):
            return None
        match = _TTL_TEXT.fullmatch(text)
        if match is not None:
            amount = float(match.group(1)) * _UNITS[match.group(2)]
            if 0 < amount <= MAX_TTL.total_seconds():
                return timedelta(seconds=amount)
    raise InvalidInputError(
        f"{field} must be a duration such as 90d, 12h, 2w, 30m or 45s (at most {MAX_TTL.days} "
        f"days), or off; got {str(value)[:80]!r}",
        field=field,
    )


def format_ttl(value: timedelta | None) -> str:
    """A TTL as :func:`parse_ttl` reads it: ``90d``, ``36h``, ``off``, ..."""
    if value is None:
        return "off"
    seconds = value.total_seconds()
    for unit, size in (("w", 7 * 86_400), ("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _config(tenant: str) -> str:
    return keys.tenant_config_space(check_id(tenant, "tenant"))


def _read(kv: KVStore, tenant: str) -> tuple[TenantRetention, bytes | None]:
    space = _config(tenant)
    (data,) = kv.get_many(space, [keys.RETENTION_KEY])
    if data is None:
        return TenantRetention(), None
    return decode(TenantRetention, data, where=f"{space}/{keys.RETENTION_KEY}"), data


def read_overrides(kv: KVStore, tenant: str) -> dict[RetentionKind, timedelta | None]:
    """The tenant's stored overrides: kind -> TTL (``None``: keep forever); absent kinds follow the default.

    Raises:
        InvalidInputError: A bad tenant.
        CorruptRecordError: The stored overrides are damaged.
    """
    record, _ = _read(kv, tenant)
    return {
        kind: None if seconds is None else timedelta(seconds=seconds)
        for kind, seconds in record.overrides.items()
    }


def set_overrides(
    kv: KVStore, tenant: str, changes: Mapping[str, object]
) -> dict[RetentionKind, timedelta | None]:
    """Change some of a tenant's overrides (compare-and-set); the kinds not named are unchanged.

    Args:
        kv: The store holding the tenant's data.
        tenant: The tenant.
        changes: Kind -> a TTL (a timedelta or text, see :func:`parse_ttl`),
            ``None``/``"off"`` to keep that kind forever whatever the default,
            or :data:`DEFAULT` to follow the deployment's default again.

    Returns:
        The tenant's overrides now stored.

    Raises:
        InvalidInputError: An unknown kind or a bad TTL (``field`` names it); nothing was written.
        ConflictError: Others kept changing the overrides; retry.
    """
    parsed: dict[RetentionKind, timedelta | str | None] = {}
    for name, value in changes.items():
        if name not in KINDS:
            raise InvalidInputError(
                f"unknown retention kind {name!r}: use {', '.join(KINDS)}", field=str(name)
            )
        kind: RetentionKind = name
        is_default = isinstance(value, str) and value.strip().lower() == DEFAULT
        parsed[kind] = DEFAULT if is_default else parse_ttl(value, kind)
    space = _config(tenant)
    for attempt in range(cas.ATTEMPTS):
        record, data = _read(kv, tenant)
        overrides = dict(record.overrides)
        for kind, ttl in parsed.items():
            if ttl == DEFAULT:
                overrides.pop(kind, None)
            else:
                overrides[kind] = None if not isinstance(ttl, timedelta) else ttl.total_seconds()
        try:
            new = TenantRetention(overrides=overrides)
        except ValidationError as exc:  # pragma: no cover - every value was checked above
            raise InvalidInputError(f"invalid retention: {exc.errors()[0]['msg']}") from exc
        try:
            kv.commit(
                [Put(space, keys.RETENTION_KEY, encode(new))],
                [Check(space, keys.RETENTION_KEY, data)],
            )
        except ConflictError:
            cas.backoff(attempt)
            continue
        return read_overrides(kv, tenant)
    raise ConflictError(f"the retention of tenant {tenant!r} is changing too fast; retry")


def effective_policy(
    default: RetentionPolicy, overrides: Mapping[RetentionKind, timedelta | None]
) -> RetentionPolicy:
    """``default`` with a tenant's ``overrides`` applied (each overridden kind takes the tenant's TTL)."""
    values: dict[str, object] = {kind: default.ttl(kind) for kind in KINDS}
    for kind, ttl in overrides.items():
        values[kind] = ttl
    return RetentionPolicy.model_validate(
        {**values, "tenant_set": tuple(kind for kind in KINDS if kind in overrides)}
    )


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one sweep of a tenant deleted.

    Attributes:
        tenant: The tenant swept.
        finished_runs: Runs finished longer than the run retention ago.
        idle_runs: Unfinished runs idle past the ``idle_runs`` TTL.
        sessions: Sessions (summary, transcript, vectors, facts learned from them) past ``sessions``.
        transcripts: Transcripts past ``transcripts`` whose session kept its summary.
        facts: Fact versions (current ones and history) past ``facts``.
        users: Users whose data was looked at (0 when no session or fact TTL is on).
    """

    tenant: str
    finished_runs: int = 0
    idle_runs: int = 0
    sessions: int = 0
    transcripts: int = 0
    facts: int = 0
    users: int = 0

    @property
    def deleted(self) -> int:
        """Everything deleted, over every kind."""
        return self.finished_runs + self.idle_runs + self.sessions + self.transcripts + self.facts

    def describe(self) -> str:
        """One line for a log or a terminal."""
        return (
            f"tenant {self.tenant}: deleted {self.finished_runs} finished runs, "
            f"{self.idle_runs} idle runs, {self.sessions} sessions, {self.transcripts} "
            f"transcripts, {self.facts} fact versions ({self.users} users looked at)"
        )


def sweep_expired(
    *,
    kv: KVStore,
    tasks: TaskTier,
    sessions: SessionTier,
    users: UserTier,
    policy: RetentionPolicy,
    now: datetime,
) -> SweepReport:
    """Delete what ``policy`` (and the run retention of ``tasks``) says is expired at ``now``.

    The three tiers must be one tenant's, on ``kv``. Users, summaries,
    transcripts and runs are read a page at a time, so memory stays bounded
    however much the tenant holds. Deletion goes through each tier's checked
    delete path: a record changed meanwhile is left for the next sweep.

    Returns:
        What was deleted.

    Raises:
        BackendUnavailableError: A store failed; what was deleted so far stays deleted.
    """
    finished = len(tasks.sweep(now=now))
    idle_ttl = policy.idle_runs
    idle = 0 if idle_ttl is None else len(tasks.sweep_idle(idle_ttl, now=now))
    session_cut = None if policy.sessions is None else now - policy.sessions
    transcript_cut = None if policy.transcripts is None else now - policy.transcripts
    fact_cut = None if policy.facts is None else now - policy.facts
    expired_sessions = expired_transcripts = expired_facts = looked_at = 0
    if session_cut is not None or transcript_cut is not None or fact_cut is not None:
        space = keys.users_space(tasks.tenant)
        after: str | None = None
        while True:
            page = kv.scan(space, start_after=after, limit=_PAGE)
            for user_id, _ in page:
                looked_at += 1
                if session_cut is not None or transcript_cut is not None:
                    gone, dropped = sessions.expire(
                        user_id,
                        sessions_before=session_cut,
                        transcripts_before=transcript_cut,
                        page=_TRANSCRIPT_PAGE,
                    )
                    expired_sessions += gone
                    expired_transcripts += dropped
                if fact_cut is not None:
                    expired_facts += users.expire_facts(user_id, before=fact_cut)
            if len(page) < _PAGE:
                break
            after = page[-1][0]
    return SweepReport(
        tenant=tasks.tenant,
        finished_runs=finished,
        idle_runs=idle,
        sessions=expired_sessions,
        transcripts=expired_transcripts,
        facts=expired_facts,
        users=looked_at,
    )
