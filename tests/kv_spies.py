"""Wrappers of a real KV store that tests put between a tier and the store.

Not stand-ins: every call reaches the wrapped store unchanged. A wrapper only
narrows what the tier sees of the store to the :class:`~tiers.backends.base.KVStore`
protocol, or counts what a call cost, so a test can assert how much an
operation read or how many commits it made.
"""

from __future__ import annotations

from collections.abc import Sequence

from tiers.backends.base import Check, KVStore, Write


class PassThroughKV:
    """A real store seen through the ``KVStore`` protocol alone.

    Whatever else the store offers (``flush``, ``scrub``, an encrypted store's
    key tokens) is hidden, so a tier behaves as it would on a store without it.
    """

    def __init__(self, inner: KVStore) -> None:
        self.inner = inner
        self.max_value_bytes = inner.max_value_bytes

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        """See :meth:`KVStore.get_many`."""
        return self.inner.get_many(space, keys)

    def scan(
        self,
        space: str,
        *,
        prefix: str = "",
        start_after: str | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[tuple[str, bytes]]:
        """See :meth:`KVStore.scan`."""
        return self.inner.scan(
            space, prefix=prefix, start_after=start_after, limit=limit, reverse=reverse
        )

    def commit(self, writes: Sequence[Write], checks: Sequence[Check] = ()) -> None:
        """See :meth:`KVStore.commit`."""
        self.inner.commit(writes, checks)

    def ping(self) -> None:
        """See :meth:`KVStore.ping`."""
        self.inner.ping()

    def close(self) -> None:
        """See :meth:`KVStore.close`."""
        self.inner.close()


class CountingKV(PassThroughKV):
    """A real store, passed through, that counts what reaches it.

    The counters are plain attributes: a test sets one to 0 before the
    operation it measures, or takes the difference of two readings.

    Attributes:
        reads: Calls of ``get_many`` and ``scan`` (round trips to the store).
        rows_scanned: Rows the scans returned (how much of the store a read touched).
        commits: Calls of ``commit`` (what an operation costs in fsyncs).
    """

    def __init__(self, inner: KVStore) -> None:
        super().__init__(inner)
        self.reads = 0
        self.rows_scanned = 0
        self.commits = 0

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        """See :meth:`KVStore.get_many`; counts a read."""
        self.reads += 1
        return super().get_many(space, keys)

    def scan(
        self,
        space: str,
        *,
        prefix: str = "",
        start_after: str | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[tuple[str, bytes]]:
        """See :meth:`KVStore.scan`; counts a read and the rows it returned."""
        self.reads += 1
        rows = super().scan(
            space, prefix=prefix, start_after=start_after, limit=limit, reverse=reverse
        )
        self.rows_scanned += len(rows)
        return rows

    def commit(self, writes: Sequence[Write], checks: Sequence[Check] = ()) -> None:
        """See :meth:`KVStore.commit`; counts a commit (also one a check refuses)."""
        self.commits += 1
        super().commit(writes, checks)
