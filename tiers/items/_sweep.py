"""The TTL sweep: deletes the items whose time ran out, through the expiry index.

Every read treats an expired item as absent already; the sweep removes it
(with its vectors) unless it was refreshed or rewritten meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from tiers import keys
from tiers.backends.base import Check, Delete
from tiers.errors import ConflictError
from tiers.items._outbox import PAGE, IndexOutbox
from tiers.items._records import ItemSpaces, is_expired, micros
from tiers.items._writes import ItemWriter


class ExpirySweeper:
    """Deletes expired items (see :meth:`ItemStore.sweep`).

    Args:
        spaces: The tenant's item spaces.
        outbox: Brings the index in line after a sweep.
        writer: Deletes the expired items.
        clock: Current UTC time.
    """

    def __init__(
        self,
        spaces: ItemSpaces,
        outbox: IndexOutbox,
        writer: ItemWriter,
        clock: Callable[[], datetime],
    ) -> None:
        self._spaces = spaces
        self._kv = spaces.kv
        self._items = spaces.items
        self._expiry = spaces.expiry
        self._index_outbox = outbox
        self._writer = writer
        self._clock = clock

    def sweep(self, *, now: datetime | None = None) -> int:
        """See :meth:`ItemStore.sweep`."""
        now = self._clock() if now is None else now
        horizon = micros(now)
        deleted = 0
        start: str | None = None
        while True:
            page = self._kv.scan(self._expiry, start_after=start, limit=PAGE)
            due = [k for k, _ in page if int(k.partition("/")[0]) <= horizon]
            if due:
                deleted += self._sweep_page(due, now)
            if len(due) < len(page) or len(page) < PAGE:
                break
            start = page[-1][0]
        self._index_outbox.repair()
        return deleted

    def _sweep_page(self, due: list[str], now: datetime) -> int:
        addresses = list(dict.fromkeys(k.partition("/")[2] for k in due))
        stored = dict(zip(addresses, self._kv.get_many(self._items, addresses), strict=True))
        expired: dict[str, bytes] = {}
        stale: list[tuple[str, str, bytes | None]] = []
        for expiry_key in due:
            address = expiry_key.partition("/")[2]
            data = stored[address]
            record = self._spaces.decode(address, data) if data is not None else None
            if (
                data is not None
                and record is not None
                and record.expires_at is not None
                and keys.item_expiry_key(micros(record.expires_at), address) == expiry_key
                and is_expired(record, now)
            ):
                expired[address] = data
            else:
                stale.append((expiry_key, address, data))
        for expiry_key, address, data in stale:
            # The entry of an item gone, refreshed or rewritten: drop it unless the item changed.
            try:
                self._kv.commit(
                    [Delete(self._expiry, expiry_key)], [Check(self._items, address, data)]
                )
            except ConflictError:
                continue
        if not expired:
            return 0
        plans = [self._writer.delete_plan(address) for address in expired]
        return self._writer.apply(plans, expected=expired)
