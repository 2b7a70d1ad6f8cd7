"""Running a check in a child of ``fork`` and reading what it reports."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from typing import Any


def in_forked_child(check: Callable[[], Any]) -> Any:
    """Fork, run ``check`` in the child, and return what it returned (through a pipe, as JSON).

    The child exits at once after reporting, without running the parent's
    exit handlers. A child whose check raised reports nothing, and this
    raises ``AssertionError``.
    """
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads running
        child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(write_end, json.dumps(check()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        reported = pipe.read()
    os.waitpid(child, 0)
    if not reported:
        raise AssertionError("the forked child reported nothing: its check raised")
    return json.loads(reported)
