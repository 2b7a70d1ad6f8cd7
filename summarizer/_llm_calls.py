"""One summarize call's state, and what a failed litellm call means (retry, shrink or fail)."""

from __future__ import annotations

import email.utils
import importlib
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from summarizer.errors import (
    SummarizerError,
    SummarizerRateLimitError,
    SummarizerTimeoutError,
    SummarizerUnavailableError,
    UnavailableReason,
)

_Mode = Literal["json_schema", "json_object", "none"]

# --------------------------------------------------------------------------- one run


@dataclass
class _Run:
    """Mutable state of one summarize() call (never shared between threads)."""

    mode: _Mode
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = 0.0
    calls: int = 0

    def record(self, litellm: Any, response: Any, model: str) -> None:
        self.calls += 1
        usage = getattr(response, "usage", None)
        self.prompt_tokens += int(getattr(usage, "prompt_tokens", 0) or 0)
        self.completion_tokens += int(getattr(usage, "completion_tokens", 0) or 0)
        if self.cost is not None:
            cost = _cost(litellm, response, model)
            self.cost = None if cost is None else self.cost + cost


def _cost(litellm: Any, response: Any, model: str) -> float | None:
    # The price of the model the response names, else of the one asked for: an
    # OpenAI-compatible proxy may answer with its own name for a priced model.
    for extra in ({}, {"model": model}):
        try:
            return float(litellm.completion_cost(completion_response=response, **extra))
        except Exception:  # noqa: S112 - no price known: try the next name
            continue
    return None  # unknown price (self-hosted, custom name): unknown, not zero


def _import_litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        litellm: Any = importlib.import_module("litellm")
    except ImportError as exc:
        raise SummarizerError(
            "LiteLLMSummarizer needs the litellm package: pip install 'litellm>=1.50'"
        ) from exc
    litellm.suppress_debug_info = True
    return litellm


def _transient_reason(litellm: Any, exc: Exception) -> UnavailableReason | None:
    if isinstance(exc, litellm.Timeout):
        return "timeout"
    if isinstance(exc, litellm.RateLimitError):
        return "rate_limit"
    if isinstance(exc, litellm.APIConnectionError) or _caused_by_connection_failure(exc):
        return "connection"
    server_errors = (
        litellm.ServiceUnavailableError,
        litellm.InternalServerError,
        getattr(litellm, "BadGatewayError", litellm.InternalServerError),
    )
    if isinstance(exc, server_errors):
        return "server_error"
    return None


def _caused_by_connection_failure(exc: BaseException) -> bool:
    # litellm reports a refused connection to an OpenAI-compatible server as an HTTP 500
    # ("Connection error."); the cause chain still holds the socket error.
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ConnectionError) or type(cause).__name__ in (
            "ConnectError",
            "APIConnectionError",
        ):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _retry_after(exc: Exception) -> float | None:
    """Seconds the provider asked to wait, from ``retry-after-ms`` or ``retry-after``."""
    response = getattr(exc, "response", None)
    headers: Any = getattr(response, "headers", None) or getattr(
        exc, "litellm_response_headers", None
    )
    if not headers:
        return None
    try:
        millis = headers.get("retry-after-ms")
        if millis is not None:
            return max(float(millis) / 1000, 0.0)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(float(value), 0.0)
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max((when - datetime.now(UTC)).total_seconds(), 0.0)
    except (TypeError, ValueError, AttributeError):
        return None


def _window_exceeded(litellm: Any, exc: Exception) -> bool:
    if isinstance(exc, litellm.ContextWindowExceededError):
        return True
    # OpenAI-compatible servers that only send the error code are not mapped by litellm.
    return isinstance(exc, litellm.BadRequestError) and "context_length_exceeded" in str(exc)


def _rejects_format(litellm: Any, exc: Exception) -> bool:
    if not isinstance(exc, litellm.BadRequestError) or isinstance(
        exc, litellm.ContextWindowExceededError
    ):
        return False
    text = str(exc).lower()
    return any(word in text for word in ("response_format", "json_schema", "json_object"))


_UNAVAILABLE: dict[UnavailableReason, type[SummarizerUnavailableError]] = {
    "timeout": SummarizerTimeoutError,
    "rate_limit": SummarizerRateLimitError,
    "connection": SummarizerUnavailableError,
    "server_error": SummarizerUnavailableError,
}
