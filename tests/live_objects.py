"""Which live Python objects of this process hold a given text: deleted data must not stay in caches.

Invariant 8 (deleting means gone) holds for the stores' files (tests/memory/test_erasure.py) and
for the process's memory: no cache, memo or view may keep a forgotten user's words.
"""

from __future__ import annotations

import gc
import types


def holders(needle: str) -> list[str]:
    """What holds a ``str`` or ``bytes`` containing ``needle``: each holder's type and a glimpse.

    Every object the garbage collector tracks is searched, with the containers
    it does not track (tuples, dicts and frozensets of atomic values, such as an
    ``lru_cache`` key) opened. Frames are skipped: the caller's locals are not a cache.
    """
    gc.collect()
    encoded = needle.encode()
    found: list[str] = []
    for obj in gc.get_objects():
        if isinstance(obj, types.FrameType):
            continue
        stack = [obj]
        held = False
        while stack and not held:
            for ref in gc.get_referents(stack.pop()):
                if (type(ref) is str and needle in ref) or (type(ref) is bytes and encoded in ref):
                    held = True
                    break
                if isinstance(ref, tuple | dict | frozenset) and not gc.is_tracked(ref):
                    stack.append(ref)
        if held:
            wrapped = getattr(obj, "__wrapped__", None)
            what = getattr(wrapped, "__qualname__", None) or repr(obj)[:120]
            found.append(f"{type(obj).__qualname__}: {what}")
    return found
