"""Erasure down to the files: deleted data leaves the stores' files, not only every read.

Invariant 8 (deleting means gone). A KV delete removes a record from every
read at once; what stays on disk depends on the backend (see the README's
"What deleting guarantees"). :func:`scrub` asks a store that can
(:class:`~tiers.backends.base.Scrubbable`) to drop deleted data from its files now.
"""

from __future__ import annotations

import logging

from tiers.backends.base import KVStore, Scrubbable
from tiers.errors import BackendUnavailableError

__all__ = ["scrub"]

logger = logging.getLogger(__name__)


def scrub(kv: KVStore) -> bool:
    """Have ``kv`` drop deleted data from its files, if it can; never raises.

    Called after deletes that are committed already: a store that cannot
    scrub now is logged, not an error (its files lose the data when it
    compacts on its own).

    Returns:
        Whether the store scrubbed (or started to, for a server).
    """
    if not isinstance(kv, Scrubbable):
        return False
    try:
        done = kv.scrub()
    except BackendUnavailableError as exc:
        logger.warning("deleted data may stay in the KV store's files for now: %s", exc)
        return False
    if not done:
        logger.warning(
            "the KV store could not drop deleted data from its files now (busy, not allowed, "
            "or no files to rewrite); it stays on disk until the store compacts on its own"
        )
    return done
