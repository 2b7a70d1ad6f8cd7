"""Polling a condition a test waits for, without asserting how long it took."""

from __future__ import annotations

import threading
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll ``condition`` every millisecond until it holds; fail after ``timeout_s``."""
    pause = threading.Event()
    for _ in range(int(timeout_s * 1000)):
        if condition():
            return
        pause.wait(0.001)
    raise AssertionError("condition not reached")
