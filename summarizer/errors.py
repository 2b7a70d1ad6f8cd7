"""Errors raised by summarizers.

Hierarchy::

    SummarizerError                  root of every summarizer error
    ├── InvalidSummarizerConfigError a constructor argument is refused (also a ValueError)
    ├── InvalidTranscriptError       the transcript is malformed; nothing was summarized
    └── SummaryGenerationError       the model failed or never produced a valid summary
        │   (``raw_output`` keeps the last thing the model said, for debugging)
        └── SummarizerUnavailableError   the model could not be reached; retrying later may work
            ├── SummarizerTimeoutError       every attempt timed out
            └── SummarizerRateLimitError     the provider kept answering "rate limited" (HTTP 429)
"""

from __future__ import annotations

from typing import Literal

UnavailableReason = Literal["timeout", "rate_limit", "connection", "server_error"]


class SummarizerError(Exception):
    """Root of every error raised by ``summarizer``."""


class InvalidSummarizerConfigError(SummarizerError, ValueError):
    """A summarizer was built with an argument it refuses (e.g. ``timeout=0``).

    Also a :class:`ValueError`, which is what the constructors raised before
    this class existed, so older ``except ValueError`` clauses keep working.
    """


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


class SummarizerUnavailableError(SummaryGenerationError):
    """The model stayed unreachable through every transient-error retry.

    Raised after timeouts, rate limits (HTTP 429), connection failures or
    provider-side errors (HTTP 5xx) outlasted the retry budget. Nothing was
    summarized; the same call may succeed later.

    Attributes:
        reason: What the last attempt ran into: ``"timeout"``, ``"rate_limit"``,
            ``"connection"`` or ``"server_error"``.
        attempts: How many calls were made.
        retry_after: Seconds the provider asked to wait (``Retry-After``), if it said.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: UnavailableReason,
        attempts: int,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.reason: UnavailableReason = reason
        self.attempts = attempts
        self.retry_after = retry_after

    @property
    def is_timeout(self) -> bool:
        """True if the last attempt timed out."""
        return self.reason == "timeout"

    @property
    def is_rate_limit(self) -> bool:
        """True if the last attempt was rate limited."""
        return self.reason == "rate_limit"


class SummarizerTimeoutError(SummarizerUnavailableError):
    """Every attempt timed out; raise ``timeout`` or use a faster model."""


class SummarizerRateLimitError(SummarizerUnavailableError):
    """The provider kept rate limiting; retry later or lower the request rate."""
