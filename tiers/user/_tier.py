"""The user tier: long-lived facts and preferences of a user, with provenance and history.

Each fact is one KV record (``facts_space``). A change never loses the old
value: the version it replaces is appended to ``fact_history_space`` in the
same atomic commit. Conflicts are resolved by recency: a write whose
``updated_at`` is older than the stored fact's goes to the history only.

A fact key names its subject (``preference.green_tea``), so on a store that
keeps key names opaque (an encrypted one: :class:`TokenizesKeys`) a fact is
stored under the store's token of its key instead, the key itself inside the
encrypted record; its history keys start with the same token. Elsewhere the
name is the key.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from pydantic import JsonValue, ValidationError

from tiers import cas, keys
from tiers.backends.base import (
    Check,
    Delete,
    DeleteSpace,
    KVStore,
    Put,
    TokenizesKeys,
    Write,
)
from tiers.codec import decode, encode
from tiers.errors import (
    ConflictError,
    FactNotFoundError,
    InvalidInputError,
    ValueTooLargeError,
)
from tiers.ids import check_id
from tiers.models import MAX_TEXT, FactCandidate, UserFact, utcnow
from tiers.redaction import OFF, Redactor
from tiers.user._decoded import SHARED, DecodedFacts
from tiers.values import canonical_json, check_datetime

_TOMBSTONE_SOURCE = "deleted"

Guard = Callable[[], Sequence[Check]]
"""Checks a commit must also pass, computed afresh before each attempt (see :meth:`UserTier.set_learned_facts`)."""


class UserTier:
    """Facts and preferences per user.

    Args:
        kv: The authoritative store.
        tenant: Namespace of every key this tier writes.
        decoded: Where read facts are memoised by their stored bytes; default:
            one cache shared by the process (see :class:`DecodedFacts`).
        redactor: Redacts a fact's value (the fact's key counts as its label:
            ``password`` -> ``[REDACTED:password]``) and evidence before it is
            stored; ``None``: nothing is redacted.
    """

    def __init__(
        self,
        kv: KVStore,
        *,
        tenant: str = "default",
        decoded: DecodedFacts | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self._kv = kv
        self._redactor = redactor if redactor is not None else OFF
        self._tenant = check_id(tenant, "tenant")
        self._decoded = decoded if decoded is not None else SHARED
        self._key_token = kv.key_token if isinstance(kv, TokenizesKeys) else None
        self._writers = cas.Stripes()

    def set_fact(
        self,
        user_id: str,
        key: str,
        value: JsonValue,
        *,
        source: str = "api",
        confidence: float = 1.0,
        evidence: str = "",
        updated_at: datetime | None = None,
    ) -> UserFact:
        """Set a fact, keeping the value it replaces in the fact's history.

        Args:
            user_id: The user.
            key: The fact's key, e.g. ``"language"`` or ``"preference.tone"``.
            value: Any JSON value (no NaN or infinity, no lone surrogates in strings).
            source: Provenance, e.g. ``"api"`` or ``"session:<session_id>"``.
            confidence: 0..1, how sure the source is.
            evidence: What the source based it on (e.g. the user's words).
            updated_at: When the fact became true; defaults to now. A naive
                datetime is taken as UTC; a time in the future is clamped to
                now (a fact cannot be learned later than it is written). A
                value older than the stored one is kept in history only.

        Returns:
            The fact now current (the stored one if this write was older).

        Raises:
            InvalidInputError: Bad id, value, source, confidence or
                ``updated_at`` (``field`` names it); nothing was written.
            ValueTooLargeError: The fact is over the store's size limit; nothing was written.
        """
        now = utcnow()
        fact = self._build(
            user_id,
            key,
            value,
            source=source,
            confidence=confidence,
            evidence=evidence,
            updated_at=updated_at,
            now=now,
            field="value",
        )
        return self._write(fact.user_id, [fact])[0]

    def set_facts(
        self, user_id: str, facts: Mapping[str, JsonValue], *, source: str = "api"
    ) -> list[UserFact]:
        """Set several facts in one atomic commit; each keeps its own history.

        Every fact is validated before anything is written: one bad key or
        value (``field`` is ``facts.<key>``) or one fact over the size limit
        stores none of them.

        Returns:
            The facts now current, in the order given.

        Raises:
            InvalidInputError: ``facts`` is not a mapping, or a key or value is invalid.
            ValueTooLargeError: A fact is over the store's size limit.
        """
        check_id(user_id, "user_id")
        if not isinstance(facts, Mapping):
            raise InvalidInputError(
                f"facts must be a mapping of fact key to JSON value, got {type(facts).__name__}",
                field="facts",
            )
        now = utcnow()
        built = [
            self._build(
                user_id,
                key,
                value,
                source=source,
                confidence=1.0,
                evidence="",
                updated_at=None,
                now=now,
                field=f"facts.{key}" if isinstance(key, str) else "facts",
            )
            for key, value in facts.items()
        ]
        return self._write(user_id, built) if built else []

    def set_learned_facts(
        self,
        user_id: str,
        candidates: Sequence[FactCandidate],
        *,
        source: str,
        updated_at: datetime | None = None,
        guard: Guard | None = None,
    ) -> list[UserFact]:
        """Store the facts a summarizer found, in one atomic commit, only while ``guard`` holds.

        Each fact keeps its own history and resolves by recency like
        :meth:`set_fact`; a key proposed twice keeps its last candidate.

        Args:
            user_id: The user.
            candidates: The proposed facts (key, value, confidence, evidence).
            source: Provenance of every fact, e.g. ``"session:<session_id>"``.
            updated_at: When the facts became true (clamped to now); default now.
            guard: Called before every commit attempt. It returns checks the
                commit must pass as well (e.g. that the transcript the facts
                came from is still stored), or raises when the source is gone.
                So a deletion committed before the facts always wins: they
                are never written after it.

        Returns:
            The facts now current, one per distinct key.

        Raises:
            InvalidInputError: A bad id, key or value; nothing was written.
            ValueTooLargeError: A fact is over the store's size limit; nothing was written.
            ConflictError: ``guard`` says the source is gone (raised by it); nothing was written.
        """
        check_id(user_id, "user_id")
        now = utcnow()
        latest: dict[str, UserFact] = {}
        for candidate in candidates:
            latest[candidate.key] = self._build(
                user_id,
                candidate.key,
                candidate.value,
                source=source,
                confidence=candidate.confidence,
                evidence=candidate.evidence,
                updated_at=updated_at,
                now=now,
                field=f"facts.{candidate.key}",
            )
        return self._write(user_id, list(latest.values()), guard=guard) if latest else []

    def _write(
        self, user_id: str, facts: list[UserFact], *, guard: Guard | None = None
    ) -> list[UserFact]:
        """Store ``facts`` (distinct keys of one user) in one compare-and-set commit.

        Conflicts resolve by recency: a fact older than the stored one goes to
        the history only. A stored fact dated in the future (written before
        dates were clamped) is replaced by any write, so it cannot outrank
        every later one. ``guard`` (re-run before each attempt) adds checks.
        """
        with self._writers.lock(user_id):
            return self._commit_facts(user_id, facts, guard)

    def _commit_facts(
        self, user_id: str, facts: list[UserFact], guard: Guard | None
    ) -> list[UserFact]:
        space = keys.facts_space(self._tenant, user_id)
        names = [self._name(space, fact.key) for fact in facts]
        for attempt in range(cas.ATTEMPTS):
            stored = self._kv.get_many(space, names)
            now = utcnow()
            writes: list[Write] = []
            checks: list[Check] = list(guard()) if guard is not None else []
            results: list[UserFact] = []
            for fact, name, current_bytes in zip(facts, names, stored, strict=True):
                checks.append(Check(space, name, current_bytes))
                if current_bytes is None:
                    writes.append(Put(space, name, encode(fact)))
                    results.append(fact)
                    continue
                current = decode(UserFact, current_bytes, where=f"{space}/{name}")
                if current.value == fact.value and current.source == fact.source:
                    results.append(current)
                elif fact.updated_at < current.updated_at <= now:
                    writes.append(self._history_put(fact, name))
                    results.append(current)
                else:
                    writes.append(self._history_put(current, name))
                    writes.append(Put(space, name, encode(fact)))
                    results.append(fact)
            if not writes:
                return results
            if any(result is fact for result, fact in zip(results, facts, strict=True)):
                writes.append(Put(keys.users_space(self._tenant), user_id, b"1"))
            try:
                self._kv.commit(writes, checks)
            except ConflictError:
                cas.backoff(attempt)
                continue
            return results
        which = ", ".join(repr(fact.key) for fact in facts[:5])
        raise ConflictError(f"fact(s) {which} of user {user_id!r} are changing too fast; retry")

    def get_fact(self, user_id: str, key: str) -> UserFact:
        """The current fact ``key`` of the user.

        Raises:
            FactNotFoundError: The user has no such fact.
        """
        check_id(user_id, "user_id")
        check_id(key, "key")
        space = keys.facts_space(self._tenant, user_id)
        name = self._name(space, key)
        read_at = self._decoded.mark()
        (data,) = self._kv.get_many(space, [name])
        if data is None:
            raise FactNotFoundError(f"user {user_id!r} has no fact {key!r}")
        return self._decoded.decode(space, name, data, read_at=read_at)

    def get_facts(self, user_id: str) -> list[UserFact]:
        """Every current fact of the user, sorted by key (empty for an unknown user)."""
        check_id(user_id, "user_id")
        space = keys.facts_space(self._tenant, user_id)
        read_at = self._decoded.mark()
        facts = self._decoded.decode_all(space, self._kv.scan(space), read_at=read_at, whole=True)
        if self._key_token is not None:
            facts.sort(key=lambda fact: fact.key)  # tokens are in no order of their keys
        return facts

    def fact_history(self, user_id: str, key: str) -> list[UserFact]:
        """Every earlier version of the fact, oldest first, then the current one if any.

        Deletions appear as versions whose ``source`` is ``"deleted"`` and value ``None``.
        """
        check_id(user_id, "user_id")
        check_id(key, "key")
        name = self._name(keys.facts_space(self._tenant, user_id), key)
        space = keys.fact_history_space(self._tenant, user_id)
        versions = [
            decode(UserFact, v, where=f"{space}/{k}")
            for k, v in self._kv.scan(space, prefix=keys.fact_history_prefix(name))
        ]
        versions.sort(key=lambda f: f.updated_at)
        with contextlib.suppress(FactNotFoundError):
            versions.append(self.get_fact(user_id, key))
        return versions

    def delete_fact(self, user_id: str, key: str) -> bool:
        """Delete a fact, recording a tombstone in its history.

        Returns:
            Whether the fact existed.
        """
        check_id(user_id, "user_id")
        check_id(key, "key")
        space = keys.facts_space(self._tenant, user_id)
        name = self._name(space, key)
        for attempt in range(cas.ATTEMPTS):
            (data,) = self._kv.get_many(space, [name])
            if data is None:
                return False
            current = decode(UserFact, data, where=f"{space}/{name}")
            # The tombstone keeps no evidence: withdrawing the fact's source must find it all.
            tombstone = current.model_copy(
                update={
                    "value": None,
                    "source": _TOMBSTONE_SOURCE,
                    "evidence": "",
                    "updated_at": utcnow(),
                }
            )
            try:
                self._commit_deleting(
                    space,
                    [
                        self._history_put(current, name),
                        self._history_put(tombstone, name),
                        Delete(space, name),
                    ],
                    [Check(space, name, data)],
                )
            except ConflictError:
                cas.backoff(attempt)
                continue
            return True
        raise ConflictError(f"fact {key!r} of user {user_id!r} is changing too fast; retry")

    def expire_facts(self, user_id: str, *, before: datetime, page: int = 256) -> int:
        """Delete the user's fact versions that expired before ``before`` (a retention TTL's cutoff).

        A fact whose last update (its newest version, current or past, a
        deletion included) is older than ``before`` is deleted whole, history
        included: no tombstone is left. Of a fact updated since, the past
        versions replaced before ``before`` are dropped; the current one
        stays. Each fact is one commit checked against every version it
        read: a fact written meanwhile is left for the next sweep. Keys are
        read ``page`` at a time.

        Returns:
            How many versions (current or past) were deleted.

        Raises:
            InvalidInputError: A bad id or cutoff.
            BackendUnavailableError: The KV store failed; what was deleted so far stays deleted.
        """
        check_id(user_id, "user_id")
        cutoff = check_datetime(before, "before")
        facts = keys.facts_space(self._tenant, user_id)
        history = keys.fact_history_space(self._tenant, user_id)
        names: set[str] = set()
        for space in (facts, history):
            after: str | None = None
            while True:
                rows = self._kv.scan(space, start_after=after, limit=page)
                names.update(keys.fact_name_of_history_key(key)[0] for key, _ in rows)
                if len(rows) < page:
                    break
                after = rows[-1][0]
        removed = 0
        for name in sorted(names):
            removed += self._expire_fact(user_id, name, cutoff)
        return removed

    def _expire_fact(self, user_id: str, name: str, cutoff: datetime) -> int:
        """Delete what of the fact stored as ``name`` expired before ``cutoff``; returns the
        versions deleted."""
        facts = keys.facts_space(self._tenant, user_id)
        history = keys.fact_history_space(self._tenant, user_id)
        read_at = self._decoded.mark()
        (current,) = self._kv.get_many(facts, [name])
        past = [
            (hkey, data, decode(UserFact, data, where=f"{history}/{hkey}").updated_at)
            for hkey, data in self._kv.scan(history, prefix=keys.fact_history_prefix(name))
        ]
        past.sort(key=lambda entry: entry[2])
        dates = [when for _, _, when in past]
        if current is not None:
            dates.append(self._decoded.decode(facts, name, current, read_at=read_at).updated_at)
        if not dates:
            return 0
        writes: list[Write] = []
        checks: list[Check] = [Check(facts, name, current)]
        if max(dates) < cutoff:
            if current is not None:
                writes.append(Delete(facts, name))
            doomed = past
        else:
            # A past version stopped being current when the next one was written.
            doomed = [
                entry
                for entry, replaced_at in zip(past, dates[1:], strict=False)
                if replaced_at < cutoff
            ]
        for hkey, data, _ in doomed:
            writes.append(Delete(history, hkey))
            checks.append(Check(history, hkey, data))
        if not writes:
            return 0
        try:
            self._commit_deleting(facts, writes, checks)
        except ConflictError:
            return 0  # written meanwhile: the next sweep decides again
        return len(writes)

    def delete_user(self, user_id: str) -> None:
        """Forget every fact of the user, history included."""
        check_id(user_id, "user_id")
        facts = keys.facts_space(self._tenant, user_id)
        self._commit_deleting(
            facts, [DeleteSpace(facts), DeleteSpace(keys.fact_history_space(self._tenant, user_id))]
        )

    def unlist_user(self, user_id: str) -> None:
        """Drop the user from the tenant's index of users (once everything of theirs is deleted)."""
        check_id(user_id, "user_id")
        self._kv.commit([Delete(keys.users_space(self._tenant), user_id)])

    def forget_source(self, user_id: str, source: str) -> int:
        """Withdraw every version of the user's facts that came from ``source``, history included.

        For content that is gone (a deleted or replaced session transcript):
        nothing learned from it is kept, not even as history, since its
        evidence quotes it. A current fact from ``source`` gives way to its
        newest earlier version from another source, as if ``source`` had
        never been; if there is none, or that version is a deletion, the fact
        is gone. One atomic commit, checked against every record it read.

        Returns:
            How many versions (current or past) were removed.

        Raises:
            InvalidInputError: A bad id.
            ConflictError: The user's facts kept changing through every attempt; retry.
        """
        check_id(user_id, "user_id")
        facts = keys.facts_space(self._tenant, user_id)
        history = keys.fact_history_space(self._tenant, user_id)
        for attempt in range(cas.ATTEMPTS):
            read_at = self._decoded.mark()
            current = self._kv.scan(facts)
            past = [
                (key, data, decode(UserFact, data, where=f"{history}/{key}"))
                for key, data in self._kv.scan(history)
            ]
            writes: list[Write] = []
            checks: list[Check] = []
            removed = 0
            for key, data, version in past:
                if version.source == source:
                    writes.append(Delete(history, key))
                    checks.append(Check(history, key, data))
                    removed += 1
            for name, data in current:
                fact = self._decoded.decode(facts, name, data, read_at=read_at)
                if fact.source != source:
                    continue
                removed += 1
                checks.append(Check(facts, name, data))
                earlier = sorted(
                    (
                        entry
                        for entry in past
                        if entry[2].key == fact.key and entry[2].source != source
                    ),
                    key=lambda entry: entry[2].updated_at,
                )
                if earlier and earlier[-1][2].source != _TOMBSTONE_SOURCE:
                    history_key, version_data, _ = earlier[-1]
                    # Back to current; kept once (a history never holds the current version).
                    writes.append(Put(facts, name, version_data))
                    writes.append(Delete(history, history_key))
                    checks.append(Check(history, history_key, version_data))
                else:
                    writes.append(Delete(facts, name))
            if not writes:
                return 0
            try:
                self._commit_deleting(facts, writes, checks)
            except ConflictError:
                cas.backoff(attempt)
                continue
            return removed
        raise ConflictError(f"the facts of user {user_id!r} are changing too fast; retry")

    def _commit_deleting(
        self, facts: str, writes: Sequence[Write], checks: Sequence[Check] = ()
    ) -> None:
        """Commit writes deleting from the facts space ``facts``, then drop its decoded facts.

        Also when the commit raised: it may have applied, and a deleted fact
        must not stay in this process's memory (invariant 8).
        """
        try:
            self._kv.commit(writes, checks)
        finally:
            self._decoded.forget(facts)

    def _name(self, space: str, key: str) -> str:
        """The name fact ``key`` is stored under in ``space`` (a facts space; module docstring)."""
        return key if self._key_token is None else self._key_token(space, key)

    def _history_put(self, fact: UserFact, name: str) -> Put:
        """The write adding ``fact`` to the history of the fact stored as ``name``."""
        micros = int(fact.updated_at.timestamp() * 1_000_000)
        space = keys.fact_history_space(self._tenant, fact.user_id)
        data = encode(fact)
        # The digest keeps two versions with the same timestamp apart.
        digest = hashlib.sha256(data).hexdigest()[:12]
        return Put(space, keys.fact_history_key(name, micros, digest), data)

    def _build(
        self,
        user_id: str,
        key: str,
        value: JsonValue,
        *,
        source: str,
        confidence: float,
        evidence: str,
        updated_at: datetime | None,
        now: datetime,
        field: str,
    ) -> UserFact:
        """A validated fact; ``field`` names the value in errors (``value`` or ``facts.<key>``)."""
        check_id(user_id, "user_id")
        check_id(key, "key")
        # NaN, infinities and lone surrogates: pydantic would store null or fail to serialise.
        canonical_json(value, field=field)
        if self._redactor.enabled:
            value = self._redactor.redact_json(value, key=key)
            if isinstance(evidence, str):
                redacted = self._redactor.redact(evidence)
                # A placeholder longer than a short secret never makes valid evidence too long.
                evidence = redacted[:MAX_TEXT] if len(evidence) <= MAX_TEXT else redacted
        when = now if updated_at is None else min(check_datetime(updated_at, "updated_at"), now)
        try:
            fact = UserFact(
                user_id=user_id,
                key=key,
                value=value,
                source=source,
                confidence=confidence,
                evidence=evidence,
                updated_at=when,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "value"
            name = field if where == "value" else where
            raise InvalidInputError(
                f"invalid fact {key!r}: {name}: {first['msg']}", field=name
            ) from exc
        size = len(encode(fact))
        if size > self._kv.max_value_bytes:
            raise ValueTooLargeError(
                f"fact {key!r} is {size} bytes stored, over the limit of "
                f"{self._kv.max_value_bytes} bytes: store large data elsewhere and keep a "
                "reference",
                field=field,
            )
        return fact
