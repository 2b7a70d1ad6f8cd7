"""Cold-recall workers lent between readers: the cap's threads serve every tenant.

Each :class:`~tiers.session._reads.SessionReader` (one per tenant's tier in a
service) keeps a crew of worker threads that read cold views beside the query's
embedding, and every crew of the process shares one cap on threads. Without
lending, the first tenants asked within the workers' idle time held every place
in the cap, mostly with idle threads, and every later tenant's cold recall read
its view in the caller. Here a recall whose crew may start no thread borrows a
worker counted free in another crew (:meth:`Lenders.borrow`): only a free one,
so it waits behind no other tenant's reads, and none otherwise (its caller
reads). The lent job stays its owner's: the owner's ``close`` waits for those
of its jobs running in other crews' workers, and one not yet started by then
is not run (:class:`Loan`), so none reads a store closed after that ``close``.
"""

from __future__ import annotations

import threading
from typing import Protocol

__all__ = ["Job", "Lender", "Lenders", "Loan", "OnLoan"]


class Job(Protocol):
    """What a worker runs: reads that keep their own error, then a release of their caller."""

    def read(self) -> None:
        """Do the reads (an ``Exception`` is kept for the caller, not raised)."""

    def finish(self) -> None:
        """Let the caller waiting for the reads go on."""


class OnLoan:
    """One crew's jobs running in other crews' workers, for its ``close`` to wait for."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._stopped = False

    def begin(self) -> bool:
        """Count a lent job starting; False (do not run it) once :meth:`stop` was called."""
        with self._changed:
            if self._stopped:
                return False
            self._running += 1
            return True

    def end(self) -> None:
        """Count a lent job ended."""
        with self._changed:
            self._running -= 1
            self._changed.notify_all()

    def stop(self) -> None:
        """Refuse every lent job not yet begun."""
        with self._changed:
            self._stopped = True

    def wait(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` for the lent jobs that have begun to end."""
        with self._changed:
            self._changed.wait_for(lambda: not self._running, timeout)


class Loan:
    """A job run by a worker of a crew other than its owner's.

    Args:
        job: The reads.
        owner: The owner crew's count of its jobs on loan.
    """

    def __init__(self, job: Job, owner: OnLoan) -> None:
        self._job = job
        self._owner = owner

    def read(self) -> None:
        """The job's reads, unless its owner has stopped (its caller then reads)."""
        if self._owner.begin():
            try:
                self._job.read()
            finally:
                self._owner.end()

    def finish(self) -> None:
        """Let the job's caller go on."""
        self._job.finish()


class Lender(Protocol):
    """A crew that can run another crew's job on a worker of its own counted free."""

    def lend(self, loan: Loan) -> bool:
        """Queue ``loan`` for a free worker; False if none is free (or the crew is stopped)."""


class Lenders:
    """The crews with a worker running, so at most the process cap of them.

    A crew adds itself when it starts its first worker and discards itself when
    its last one ends; its lock may be held meanwhile, never while borrowing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._crews: set[Lender] = set()

    def add(self, crew: Lender) -> None:
        """``crew`` has a worker running."""
        with self._lock:
            self._crews.add(crew)

    def discard(self, crew: Lender) -> None:
        """``crew`` has no worker running any more."""
        with self._lock:
            self._crews.discard(crew)

    def borrow(self, job: Job, borrower: Lender, owner: OnLoan) -> bool:
        """Hand ``job`` to a free worker of a crew other than ``borrower``; False if none is free.

        Called without any crew's lock held: each lender's is taken in turn.
        """
        with self._lock:
            crews = [crew for crew in self._crews if crew is not borrower]
        loan = Loan(job, owner)
        return any(crew.lend(loan) for crew in crews)
