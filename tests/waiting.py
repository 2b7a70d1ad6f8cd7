"""Polling a condition a test waits for, without asserting how long it took."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None],
    timeout_s: float = 30.0,
    *,
    what: str | Callable[[], str] = "the condition",
    every_s: float = 0.001,
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    The timeout only bounds a wait that would otherwise hang the suite; no test
    asserts how long the wait took.

    Args:
        condition: What to poll; its first truthy answer is returned (a test may
            wait for a value, such as a response body, rather than a flag).
        timeout_s: How long to poll before failing.
        what: What the test waits for, named in the failure message; or a callable
            that says it when the wait fails, with what was seen by then (the state
            polled last, a server's log).
        every_s: The pause between polls: short for a thread's state, longer
            where a poll costs something (an HTTP request, a metrics page).

    Returns:
        The first truthy value ``condition`` returned.

    Raises:
        AssertionError: ``condition`` was still falsy after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            named = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out waiting for {named}")
        time.sleep(every_s)
