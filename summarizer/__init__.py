"""tiermem summarizer: transcript -> SessionSummary (+ user-fact candidates).

Two implementations of the :class:`Summarizer` protocol:

- :class:`ExtractiveSummarizer`, the offline default: rules, no model, deterministic;
- :class:`LiteLLMSummarizer`: any chat model litellm can call, with validated
  structured output. litellm itself is imported only when it first summarizes.
"""

from __future__ import annotations

from summarizer.base import Summarization, Summarizer, parse_transcript
from summarizer.errors import (
    InvalidSummarizerConfigError,
    InvalidTranscriptError,
    SummarizerError,
    SummarizerRateLimitError,
    SummarizerTimeoutError,
    SummarizerUnavailableError,
    SummaryGenerationError,
)
from summarizer.extractive import ExtractiveSummarizer
from summarizer.llm import LiteLLMSummarizer
from summarizer.tokens import count_tokens
from tiers.models import SummaryUsage

__all__ = [
    "ExtractiveSummarizer",
    "InvalidSummarizerConfigError",
    "InvalidTranscriptError",
    "LiteLLMSummarizer",
    "Summarization",
    "Summarizer",
    "SummarizerError",
    "SummarizerRateLimitError",
    "SummarizerTimeoutError",
    "SummarizerUnavailableError",
    "SummaryGenerationError",
    "SummaryUsage",
    "count_tokens",
    "parse_transcript",
]
