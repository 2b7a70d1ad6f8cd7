"""What of a session gets embedded and keyword-indexed: its summary and windows of its transcript.

A single vector per session reads only its start (the embedding model stops
after a few hundred word pieces), and a summary alone drops most details. So a
session is indexed as several vectors: the summary first, then overlapping
word windows of the raw transcript, each small enough for the model to read
whole. A session is scored by its best window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tiers.models import Message, SessionSummary

__all__ = [
    "MAX_WINDOWS",
    "TRANSCRIPT_WINDOWS",
    "WINDOW_OVERLAP",
    "WINDOW_WORDS",
    "keyword_text",
    "session_windows",
    "summary_text",
    "transcript_text",
    "windows",
]

# About 160 word pieces: inside what all-MiniLM-L6-v2 was trained on, so nothing is cut off.
WINDOW_WORDS = 120
# A fact split by a window edge is still whole in the neighbouring window.
WINDOW_OVERLAP = 30
# Bounds the work of one call on a huge text; past it, windows are spread over the text.
MAX_WINDOWS = 200
# Windows of a transcript embedded when a session is indexed, at most; past it, they are spread
# evenly over the text. Embedding is most of the ingest cost, so this bounds it per session: a
# LongMemEval-sized session (~1,650 words, 18 windows on the full grid) costs 9 model inputs
# instead of 19, and recall quality on the dev sets held (trade-off table in bench/README.md);
# keyword search still reads every word. Changing it changes the stored layout: bump
# ``_SCHEME`` in :mod:`tiers.session._index` so the index check finds the old vectors stale.
TRANSCRIPT_WINDOWS = 8


def summary_text(summary: SessionSummary) -> str:
    """The summary's content as plain text: task, then every item (no id or date header)."""
    parts = [
        summary.task_description,
        *summary.decisions_made,
        *summary.work_completed,
        *summary.open_questions,
        *summary.next_recommended_steps,
    ]
    return "\n".join(part for part in parts if part)


def transcript_text(messages: Sequence[Message]) -> str:
    """The transcript as ``speaker: text`` lines (the speaker is the name when given, else the role)."""
    return "\n".join(
        f"{message.name or message.role}: {message.content}"
        for message in messages
        if message.content.strip()
    )


def windows(
    text: str,
    *,
    size: int = WINDOW_WORDS,
    overlap: int = WINDOW_OVERLAP,
    max_windows: int = MAX_WINDOWS,
) -> list[str]:
    """Split ``text`` into windows of ``size`` words, consecutive windows sharing ``overlap`` words.

    A text of at most ``size`` words is one window; an empty text is none.
    When more than ``max_windows`` windows would be needed, the stride grows
    so that ``max_windows`` windows are spread evenly over the whole text.

    Raises:
        ValueError: ``size`` < 1, ``overlap`` not in ``[0, size)`` or ``max_windows`` < 1.
    """
    if size < 1 or not 0 <= overlap < size or max_windows < 1:
        raise ValueError("need size >= 1, 0 <= overlap < size and max_windows >= 1")
    words = text.split()
    if len(words) <= size:
        return [" ".join(words)] if words else []
    stride = size - overlap
    count = math.ceil((len(words) - overlap) / stride)
    if count > max_windows:
        count = max_windows
        stride = math.ceil((len(words) - size) / (count - 1)) if count > 1 else len(words)
    starts = [min(n * stride, len(words) - size) for n in range(count)]
    return [" ".join(words[start : start + size]) for start in dict.fromkeys(starts)]


def session_windows(summary: SessionSummary, messages: Sequence[Message] | None) -> list[str]:
    """Texts to embed for a session: summary window(s) first, then transcript windows.

    At most ``TRANSCRIPT_WINDOWS`` transcript windows, spread over a longer text.

    The first text always comes from the summary (a summary with no content
    gives its rendering), so every session has at least one vector.
    """
    texts = windows(summary_text(summary)) or [summary.render()]
    if messages:
        texts.extend(windows(transcript_text(messages), max_windows=TRANSCRIPT_WINDOWS))
    return texts


def keyword_text(summary_or_text: SessionSummary | str, messages: Sequence[Message] | None) -> str:
    """Everything keyword search should see of a session: summary content plus full transcript."""
    head = (
        summary_text(summary_or_text)
        if isinstance(summary_or_text, SessionSummary)
        else summary_or_text
    )
    if not messages:
        return head
    return f"{head}\n{transcript_text(messages)}"
