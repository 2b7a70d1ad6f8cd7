"""Fixtures of the session-tier tests: the real local embedding model and an embedded Chroma."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder


@pytest.fixture(scope="session")
def embedder() -> MiniLMEmbedder:
    """The MiniLM embedder, loaded once for every test that asks for it."""
    embedder = MiniLMEmbedder()
    embedder.load()
    return embedder


@pytest.fixture
def index(tmp_path: Path, embedder: MiniLMEmbedder) -> Iterator[ChromaVectorIndex]:
    """An embedded Chroma index of this test's own."""
    ix = ChromaVectorIndex(tmp_path / "chroma", embedder=embedder)
    yield ix
    ix.close()
