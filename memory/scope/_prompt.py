"""Assembly of the scopes into a prompt context within a token budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memory.scope._base import SECTION_SEPARATOR


@dataclass(frozen=True, slots=True)
class PromptContext:
    """An assembled prompt context and what went into it.

    Attributes:
        text: The prompt context.
        tokens: Tokens of ``text`` (always ``<= max_tokens``).
        max_tokens: The budget it was assembled for.
        working_keys: Working-memory keys included, oldest write first.
        omitted_working: Working-memory entries left out for lack of room.
        trace_seqs: Sequence numbers of the trace entries included.
        omitted_trace: Trace entries left out for lack of room (the oldest).
    """

    text: str
    tokens: int
    max_tokens: int
    working_keys: tuple[str, ...]
    omitted_working: int
    trace_seqs: tuple[int, ...]
    omitted_trace: int


def _omitted_marker(count: int, what: str) -> str:
    noun = "entry" if count == 1 else "entries"
    return f"[{count} {what} {noun} omitted to fit the context budget]"


def _fit_newest(
    head: Sequence[str],
    header: str,
    lines: Sequence[str],
    what: str,
    max_tokens: int,
    count: Callable[[str], int],
) -> tuple[str | None, int]:
    """The section holding the most recent ``lines`` that fit after ``head``.

    Returns ``(section, kept)``; ``section`` is ``None`` when not even the
    header and the omitted-marker fit. The kept lines are a suffix of
    ``lines``: the whole assembled text fits with them, and would not with one
    more.
    """
    total = len(lines)
    if total == 0:
        return None, 0

    def section(kept: int) -> str:
        omitted = total - kept
        parts = [header]
        if omitted:
            parts.append(_omitted_marker(omitted, what))
        parts.extend(lines[omitted:])
        return "\n".join(parts)

    def fits(kept: int) -> bool:
        return count(SECTION_SEPARATOR.join([*head, section(kept)])) <= max_tokens

    # Estimate from per-line counts, then settle on exact counts of the whole
    # text: BPE tokens are not additive across the joins.
    room = max_tokens - count(SECTION_SEPARATOR.join([*head, section(0)]))
    kept = 0
    for line in reversed(lines):
        cost = count(line) + 1
        if cost > room:
            break
        room -= cost
        kept += 1
    if fits(kept):
        while kept < total and fits(kept + 1):
            kept += 1
    else:
        while kept > 0 and not fits(kept):
            kept -= 1
        if kept == 0 and not fits(0):
            return None, 0
    return section(kept), kept
