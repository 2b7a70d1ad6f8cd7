"""Fixtures of the memory-facade tests."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["embedded", "redis"])
def backend(request: pytest.FixtureRequest) -> str | None:
    """``None`` for the embedded default, else the URL of a flushed Redis (``kv_url``).

    A module that needs another Redis (one of its own) defines its own ``backend``.
    """
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        return url
    return None
