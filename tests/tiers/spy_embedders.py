"""Embedders that wrap the real model for tests: every call reaches it unchanged.

``HoldingEmbedder`` holds chosen calls until the test lets them go: tests of the
background index worker stop a pass inside its embedding call (before the pass
writes anything), change the stores under it, then let it finish.
``CountingEmbedder`` records every text that reaches the model.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from tiers.backends.base import Embedder


class HoldingEmbedder:
    """The real model; a call whose texts ``holds`` picks waits until ``release`` is set.

    ``held`` is set when a call starts waiting. Once ``release`` is set no call waits.
    """

    def __init__(
        self, inner: Embedder, holds: Callable[[Sequence[str]], bool], *, timeout: float
    ) -> None:
        """Wrap ``inner``; a held call fails its test after ``timeout`` seconds unreleased."""
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.holds = holds
        self.timeout = timeout
        self.held = threading.Event()
        self.release = threading.Event()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """See :meth:`Embedder.embed`; waits first when ``holds(texts)``."""
        if self.holds(texts) and not self.release.is_set():
            self.held.set()
            assert self.release.wait(self.timeout), "the test never released the held call"
        return self.inner.embed(texts)


class CountingEmbedder:
    """The real model, recording every text that reaches it (a spy that calls through)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.texts.extend(texts)
        return self.inner.embed(list(texts))
