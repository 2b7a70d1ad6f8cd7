"""The user operations of :class:`~memory.Memory`: a user's standing facts, and forgetting a user.

:class:`UserOperations` is composed into ``Memory`` around its user tier; every
``Memory`` user method delegates to the method of the same name here, which
holds its contract.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from memory.tenant import TenantTiers
from tiers.erasure import scrub
from tiers.ids import check_id
from tiers.models import UserFact


class UserOperations:
    """A tenant's users, as :class:`~memory.Memory` offers them.

    Args:
        tiers: The tenant's tiers.
    """

    def __init__(self, tiers: TenantTiers) -> None:
        self._kv = tiers.kv
        self._users = tiers.users
        self._sessions = tiers.sessions
        self._jobs = tiers.jobs
        self._items = tiers.items
        self._tasks = tiers.tasks
        self._scrub_deleted = tiers.scrub_deleted

    def set_fact(
        self,
        user_id: str,
        key: str,
        value: JsonValue,
        *,
        source: str = "api",
        confidence: float = 1.0,
        evidence: str = "",
    ) -> UserFact:
        """Set a user fact or preference; the old value goes to its history.

        Raises:
            InvalidInputError: A bad id, or a value JSON cannot hold (NaN,
                infinity, a lone surrogate), source or confidence; ``field``
                names it and nothing was written.
            ValueTooLargeError: The fact is over the store's size limit.
        """
        return self._users.set_fact(
            user_id, key, value, source=source, confidence=confidence, evidence=evidence
        )

    def set_facts(
        self, user_id: str, facts: Mapping[str, JsonValue], *, source: str = "api"
    ) -> list[UserFact]:
        """Set several user facts in one atomic commit (all or nothing).

        Raises:
            InvalidInputError: ``facts`` is not a mapping, or a key or value is
                invalid (``field`` is ``facts.<key>``); nothing was written.
            ValueTooLargeError: A fact is over the store's size limit; nothing was written.
        """
        return self._users.set_facts(user_id, facts, source=source)

    def get_fact(self, user_id: str, key: str) -> UserFact:
        """One user fact (``FactNotFoundError`` if none)."""
        return self._users.get_fact(user_id, key)

    def get_facts(self, user_id: str) -> list[UserFact]:
        """Every current fact of a user, sorted by key."""
        return self._users.get_facts(user_id)

    def fact_history(self, user_id: str, key: str) -> list[UserFact]:
        """Every version of a fact, oldest first."""
        return self._users.fact_history(user_id, key)

    def delete_fact(self, user_id: str, key: str) -> bool:
        """Delete a fact (its history keeps a tombstone). Returns whether it existed."""
        return self._users.delete_fact(user_id, key)

    def delete_facts(self, user_id: str) -> None:
        """Forget every fact of the user, history included; sessions, runs and items stay.

        Raises:
            InvalidInputError: A bad id.
        """
        self._users.delete_user(user_id)

    def forget_user(self, user_id: str) -> None:
        """Delete everything stored about a user, and keep work in flight from bringing it back.

        Gone when this returns: sessions (summaries, transcripts, vectors),
        facts with their history, items the user owns (e.g. under a LangGraph
        store's ``user_namespace``), the user's runs (checkpoints, events,
        effect ledgers, approvals), the user's summary jobs (queued, running
        or finished) and the user's entry in the tenant's user
        index. Transcripts go first: a summary still being made from one
        can then store neither its summary nor its facts (both are committed
        only while their transcript is stored), and a worker still running
        one of the runs gets ``RunNotFoundError`` on its next write. With
        ``scrub_deleted`` the KV store then drops the deleted data from its
        files (see the README for what each backend guarantees). Graph
        threads (``memory.threads``) are not owned by users: delete them by
        thread id.

        Raises:
            InvalidInputError: A bad id.
        """
        check_id(user_id, "user_id")
        self._sessions.delete_user_sessions(user_id)
        self._jobs.delete_user(user_id)
        self._users.delete_user(user_id)
        self._items.delete_user(user_id)
        for run in self._tasks.list_runs(user_id=user_id):
            self._tasks.delete_run(run.run_id)
        self._users.unlist_user(user_id)
        if self._scrub_deleted:
            scrub(self._kv)
