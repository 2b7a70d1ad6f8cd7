"""Errors raised by summarizers.

Hierarchy::

    SummarizerError                  root of every summarizer error
    ├── InvalidTranscriptError       the transcript is malformed; nothing was summarized
    └── SummaryGenerationError       the model failed or never produced a valid summary
        └── (``raw_output`` keeps the last thing the model said, for debugging)
"""

from __future__ import annotations


class SummarizerError(Exception):
    """Root of every error raised by ``summarizer``."""


class InvalidTranscriptError(SummarizerError):
    """The transcript is not a list of ``{"role", "content"}`` messages.

    Attributes:
        field: The offending field, e.g. ``transcript[3].role``.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SummaryGenerationError(SummarizerError):
    """The summarizer could not produce a valid summary.

    Attributes:
        raw_output: The model's last raw output, if any.
    """

    def __init__(self, message: str, *, raw_output: str | None = None) -> None:
        super().__init__(message)
        self.raw_output = raw_output
