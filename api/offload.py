"""Short blocking calls off the event loop, handed back in batches: :class:`Offloader`.

A plain ``def`` route costs a thread hop through anyio's worker pool per
request (a capacity limiter, a cancel scope, one loop wake-up per call):
measured at about 0.25 ms of CPU, more than a whole fact lookup. The hot read
routes instead queue their store call here. A few dedicated threads take every
queued call at once, run them, and hand all results back to the event loop in
one callback, so under load one wake-up serves many requests. The event loop
itself never blocks on the store.

Meant for calls that take well under a millisecond (a KV read and a decode);
slow work (embedding a query) stays on anyio's pool, where it can run on every
core at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from api.errors import ApiError

T = TypeVar("T")

_Outcome = tuple["asyncio.Future[Any]", bool, Any]
_Call = tuple[
    Callable[..., Any], tuple[Any, ...], contextvars.Context, asyncio.AbstractEventLoop, Any
]


# Calls one thread takes at once: big enough to amortise the hand-back, small enough that
# the other threads share a burst.
_BATCH = 32


class OffloaderClosedError(ApiError):
    """A call was queued after :meth:`Offloader.close`."""


def _settle(outcomes: list[_Outcome]) -> None:
    for future, ok, value in outcomes:
        if future.cancelled():
            continue  # the request went away; nothing waits for this result
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


class Offloader:
    """Runs short blocking calls on a few dedicated threads. Thread-safe.

    Each call runs in a copy of the caller's context (request id, log fields).
    Calls run in the order they were queued, up to ``threads`` at a time; a
    call that raises hands its exception to its awaiting caller only.

    Args:
        threads: Worker threads; more than one keeps a single slow call (a
            stalled network store) from holding up every other request.
        name: Prefix of the threads' names.
    """

    def __init__(self, threads: int = 2, *, name: str = "tiermem-offload") -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self._queue: deque[_Call] = deque()
        self._ready = threading.Condition(threading.Lock())
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread; its result (or exception) here.

        Raises:
            OffloaderClosedError: The offloader was closed.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        call: _Call = (fn, args, contextvars.copy_context(), loop, future)
        with self._ready:
            if self._closed:
                raise OffloaderClosedError("the service is shutting down")
            self._queue.append(call)
            self._ready.notify()
        return await future

    def close(self, timeout: float | None = 10.0) -> None:
        """Run what is queued, then stop the threads (waits up to ``timeout`` seconds each)."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if not self._queue:
                    return  # closed and drained
                # Take what is queued (up to a batch): one hand-back to the loop serves them all.
                calls = [self._queue.popleft() for _ in range(min(len(self._queue), _BATCH))]
            by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
            for fn, args, context, loop, future in calls:
                try:
                    outcome: _Outcome = (future, True, context.run(fn, *args))
                except BaseException as exc:  # handed to the caller, which re-raises it
                    outcome = (future, False, exc)
                by_loop.setdefault(loop, []).append(outcome)
            for loop, outcomes in by_loop.items():
                # A closed loop raises RuntimeError: its callers are gone.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, outcomes)
