"""Embedded Chroma's HNSW files hold no bytes the process freed (invariant 8, down to the files).

hnswlib writes a new index's whole capacity from uninitialised ``malloc`` memory to
``data_level0.bin`` and ``length.bin``; ChromaVectorIndex zeroes the slots no vector uses
(tiers/backends/_chroma_files.py). CI once found a deleted transcript's words in
``data_level0.bin`` (tests/memory/test_erasure.py): they were never written to Chroma, the file
was created from heap memory that had held them.
"""

from __future__ import annotations

import os
import platform
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tiers.backends._chroma_files import hnsw_segments
from tiers.backends.base import VectorItem
from tiers.backends.chroma_index import ChromaVectorIndex

MARK = b"marmosetsessionlagos"
DIM = 8
NAME = "test-embedder"

# Puts MARK in freed heap memory the way a long-lived process ends up with it, then has Chroma
# create its index. With one malloc arena (MALLOC_ARENA_MAX=1) and glibc's mmap threshold
# raised (it rises by itself after any large block is freed), the index's buffers are carved
# from that memory: before the zeroing, data_level0.bin held MARK thousands of times.
FREED_TEXT_THEN_INDEX = textwrap.dedent(
    """
    import ctypes, sys
    from tiers.backends.base import VectorItem
    from tiers.backends.chroma_index import ChromaVectorIndex

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    mark = sys.argv[2].encode()
    index = ChromaVectorIndex(sys.argv[1], dimension=8, embedder_name="test-embedder")
    libc.free(libc.malloc(4_000_000))  # raises the mmap threshold, as any large free does
    blocks, fences = [], []
    for _ in range(40):
        block = libc.malloc(180_000)
        text = mark * (180_000 // len(mark))
        ctypes.memmove(block, text, len(text))
        blocks.append(block)
        fences.append(libc.malloc(64))  # keeps the freed blocks off the top of the heap
    for block in blocks:
        libc.free(block)
    index.upsert([VectorItem(id="a", embedding=[0.5] * 8, document="", metadata={"k": 1})])
    index.close()
    """
)


def files_with(root: Path, needle: bytes) -> list[str]:
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and needle in path.read_bytes()
    )


def vector(n: int) -> list[float]:
    return [float(x) for x in np.random.default_rng(n).normal(size=DIM)]


def items(numbers: range) -> list[VectorItem]:
    return [
        VectorItem(id=f"v{n}", embedding=vector(n), document="", metadata={"n": n}) for n in numbers
    ]


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="reproduces glibc's heap reuse",
)
def test_a_new_index_holds_no_text_the_process_freed(tmp_path: Path) -> None:
    path = tmp_path / "chroma"
    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}
    subprocess.run(
        [sys.executable, "-c", FREED_TEXT_THEN_INDEX, str(path), MARK.decode()],
        check=True,
        env=env,
        timeout=120,
    )
    assert hnsw_segments(path), "Chroma made no HNSW files: the test tests nothing"
    assert files_with(path, MARK) == []


def test_opening_an_index_zeroes_what_an_older_version_left_in_unused_slots(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chroma"
    index = ChromaVectorIndex(path, dimension=DIM, embedder_name=NAME)
    index.upsert(items(range(3)))
    index.close()
    [segment] = hnsw_segments(path)
    # What Chroma's files looked like before the zeroing: freed text past the last vector.
    for name in ("data_level0.bin", "length.bin"):
        with (segment / name).open("r+b") as file:
            end = file.seek(0, 2)
            file.seek(end - 3 * len(MARK))
            file.write(MARK * 3)
    assert files_with(path, MARK) == [
        "/".join((segment.name, "data_level0.bin")),
        "/".join((segment.name, "length.bin")),
    ]
    reopened = ChromaVectorIndex(path, dimension=DIM, embedder_name=NAME)
    try:
        assert files_with(path, MARK) == []
        ids, embeddings = reopened.get_embeddings(["v0", "v1", "v2"])
        assert sorted(ids) == ["v0", "v1", "v2"]
        for vector_id, row in zip(ids, embeddings, strict=True):
            np.testing.assert_allclose(row, vector(int(vector_id[1:])), rtol=1e-6)
        assert reopened.query(vector(1), where={}, top_k=1)[0].id == "v1"
    finally:
        reopened.close()


def test_an_index_grown_past_its_first_capacity_reads_back_whole(tmp_path: Path) -> None:
    """The zeroed slots are filled by Chroma as vectors come: nothing written is lost."""
    path = tmp_path / "chroma"
    count = 1200  # past the first capacity (resized) and past Chroma's sync threshold (persisted)
    index = ChromaVectorIndex(path, dimension=DIM, embedder_name=NAME)
    try:
        for start in range(0, count, 100):
            index.upsert(items(range(start, start + 100)))
        index.delete([f"v{n}" for n in range(0, count, 7)])
    finally:
        index.close()
    [segment] = hnsw_segments(path)
    header = (segment / "header.bin").read_bytes()
    assert struct.unpack_from("<iQQQ", header)[3] > 0  # Chroma persisted vectors into the files
    reopened = ChromaVectorIndex(path, dimension=DIM, embedder_name=NAME)
    try:
        kept = [n for n in range(count) if n % 7]
        assert reopened.count() == len(kept)
        ids, embeddings = reopened.get_embeddings([f"v{n}" for n in kept])
        assert len(ids) == len(kept)
        for vector_id, row in zip(ids, embeddings, strict=True):
            np.testing.assert_allclose(row, vector(int(vector_id[1:])), rtol=1e-6)
        for n in (1, 500, 1199):
            assert reopened.query(vector(n), where={}, top_k=1)[0].id == f"v{n}"
    finally:
        reopened.close()
