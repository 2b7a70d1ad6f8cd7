"""Embedded Chroma's HNSW files: zeroing the capacity no vector uses yet.

When Chroma creates a collection's HNSW index it writes the index's whole
capacity to ``data_level0.bin`` (vectors and links) and ``length.bin`` (norms)
straight from freshly ``malloc``-ed memory (hnswlib's ``initPersistentIndex``),
and later writes only the slots of vectors it adds. The slots past the last
vector therefore hold whatever the process's heap held before: bytes of text
this process handled and freed, possibly of a user deleted since. So right
after Chroma creates the files, and when an index is opened, tiermem zeroes
those slots. A slot is written again by Chroma (in full) when a vector is
added to it, so the zeros are never read as data.

The layout read here is hnswlib's persisted index, version 1 (``header.bin``:
the fields of ``HEADER_FIELDS``); a segment directory in any other layout is
left alone, with a warning.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

__all__ = ["hnsw_segments", "zero_unused_slots"]

logger = logging.getLogger(__name__)

# version, offsetLevel0, max_elements, cur_element_count, size_data_per_element, label_offset,
# offsetData, maxlevel, enterpoint_node, maxM, maxM0, M, mult, ef_construction
_HEADER = struct.Struct("<iQQQQQQiIQQQdQ")
_VERSION = 1
_LENGTH_BYTES = 4  # one float32 norm per slot
_ZEROS = bytes(1 << 16)


def hnsw_segments(root: Path) -> list[Path]:
    """The HNSW segment directories under an embedded Chroma data directory."""
    return sorted(header.parent for header in root.glob("*/header.bin"))


def zero_unused_slots(segment: Path) -> int:
    """Zero the slots past the index's last vector in ``segment``'s files; returns bytes changed.

    Only while Chroma writes nothing to the segment (its files are written in
    place, slot by slot).
    """
    try:
        raw = (segment / "header.bin").read_bytes()[: _HEADER.size]
        fields = _HEADER.unpack(raw)
    except (OSError, struct.error) as exc:
        logger.warning("not zeroing unused HNSW slots in %s: unreadable header (%s)", segment, exc)
        return 0
    version, _, capacity, used, slot_bytes = fields[:5]
    if version != _VERSION or slot_bytes == 0 or used > capacity:
        logger.warning("not zeroing unused HNSW slots in %s: unknown layout", segment)
        return 0
    return _zero_from(segment / "data_level0.bin", used * slot_bytes) + _zero_from(
        segment / "length.bin", used * _LENGTH_BYTES
    )


def _zero_from(path: Path, offset: int) -> int:
    """Zero ``path`` from ``offset`` to its end, durably; returns the bytes that were not zero."""
    zeroed = 0
    try:
        with path.open("r+b") as file:
            position = file.seek(offset)
            while chunk := file.read(len(_ZEROS)):
                if chunk.strip(b"\x00"):
                    file.seek(position)
                    file.write(_ZEROS[: len(chunk)])  # ends where the read ended
                    zeroed += len(chunk)
                position += len(chunk)
            if zeroed:
                file.flush()
                os.fsync(file.fileno())  # gone from the disk, not only from the page cache
    except FileNotFoundError:
        return 0
    except OSError as exc:
        logger.warning("could not zero unused HNSW slots in %s: %s", path, exc)
    return zeroed
