"""Summaries from any chat model litellm can call, as validated structured output.

How one :meth:`LiteLLMSummarizer.summarize` call runs:

1. The transcript is rendered as ``role: content`` lines, each tool call as
   ``assistant called tool NAME(ARGUMENTS) -> RESULT`` where it was made
   (:func:`summarizer.formats.render_lines`). If it is longer
   than ``max_input_tokens`` it is cut into chunks at message boundaries (a
   single huge message is split by tokens), each chunk is summarized, and the
   partial summaries are merged by further calls (map-reduce), in groups that
   fit the budget, until one is left. If the provider answers that the
   context window is exceeded (litellm's ``ContextWindowExceededError``), the
   whole is done again in chunks half as large, a bounded number of times.
2. Each call asks for JSON matching :class:`LLMSummary`: a JSON schema
   (``response_format`` ``json_schema``) when litellm says the model supports
   it, else JSON mode (``json_object``). A provider that rejects the format
   gets the next weaker one (schema -> JSON mode -> instructions only).
3. The reply is validated with pydantic. Malformed JSON or a schema violation
   is sent back to the model as a follow-up message naming the problem, up to
   ``max_retries`` times, then :class:`SummaryGenerationError` is raised with
   the last raw output.
4. Timeouts, rate limits (honouring ``Retry-After``), connection failures and
   5xx errors are retried with exponential backoff and jitter, up to
   ``max_transient_retries`` times, then a :class:`SummarizerUnavailableError`
   subclass tells which it was.

litellm is imported on first use, never at import time (it takes seconds),
with ``LITELLM_LOCAL_MODEL_COST_MAP=True`` so it never fetches its price list.
Its "Give Feedback / Get Help" banner on errors is switched off
(``litellm.suppress_debug_info``) because every error is translated here.

The output schema, prompts and reply parsing live in :mod:`summarizer._llm_schema`,
the transient-error classification of calls in :mod:`summarizer._llm_calls`;
the chunking and map-reduce are here.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from summarizer._llm_calls import (
    _UNAVAILABLE,
    _import_litellm,
    _Mode,
    _rejects_format,
    _retry_after,
    _Run,
    _transient_reason,
    _window_exceeded,
)
from summarizer._llm_schema import (
    _MAP_SYSTEM,
    _REDUCE_SYSTEM,
    LLMFact,
    LLMSummary,
    _clean_items,
    _feedback,
    _InvalidReplyError,
    _merge_facts,
    _parse_reply,
    _reply_text,
    _WindowExceededError,
    summary_json_schema,
)
from summarizer.base import Summarization, parse_transcript
from summarizer.errors import InvalidSummarizerConfigError, SummaryGenerationError
from summarizer.formats import render_lines
from summarizer.tokens import count_tokens, get_encoding
from tiers.ids import check_id
from tiers.models import MAX_TEXT, FactCandidate, Message, SessionSummary, SummaryUsage, utcnow

__all__ = [
    "DEFAULT_MAX_INPUT_TOKENS",
    "LLMFact",
    "LLMSummary",
    "LiteLLMSummarizer",
    "StructuredOutput",
    "summary_json_schema",
]

DEFAULT_MAX_INPUT_TOKENS = 8000
"""Transcript budget per call when litellm does not know the model's context window."""

StructuredOutput = Literal["auto", "json_schema", "json_object", "none"]

_WEAKER: dict[_Mode, _Mode] = {"json_schema": "json_object", "json_object": "none"}

# Room kept free in the model's window for the instructions and the answer.
_OUTPUT_RESERVE = 2000
_MIN_BUDGET = 100
# A model that says its context window was exceeded gets the transcript again in chunks of
# half the size, at most this many times (8000 tokens -> 500), before it is an error.
_WINDOW_SHRINKS = 4

_RESERVED_KWARGS = frozenset({"model", "messages", "response_format", "stream", "n"})

# --------------------------------------------------------------------------- chunking


def _render(messages: Sequence[Message]) -> list[str]:
    # Plain messages as "role: text"; tool calls as "assistant called tool X(args) -> result"
    # where they were made; reasoning and bookkeeping items left out (summarizer.formats).
    return render_lines(messages)


def _chunk(lines: Sequence[str], budget: int) -> list[str]:
    """Group lines into chunks of at most ``budget`` tokens, splitting any longer line."""
    encoding = get_encoding()
    pieces: list[tuple[str, int]] = []
    for line in lines:
        encoded = encoding.encode(line, disallowed_special=())
        if len(encoded) <= budget:
            pieces.append((line, len(encoded)))
            continue
        for start in range(0, len(encoded), budget):
            window = encoded[start : start + budget]
            pieces.append((encoding.decode(window), len(window)))
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for text, length in pieces:
        if current and size + length + 2 > budget:
            chunks.append("\n\n".join(current))
            current, size = [], 0
        current.append(text)
        size += length + 2
    if current:
        chunks.append("\n\n".join(current))
    return chunks


# --------------------------------------------------------------------------- summarizer


class LiteLLMSummarizer:
    """Summarizes with a chat model through litellm, with validated structured output.

    Thread-safe: all per-call state lives in the call.

    Args:
        model: A litellm model name, e.g. ``"gpt-4o-mini"`` or ``"openai/<name>"``
            for an OpenAI-compatible server at ``api_base``.
        api_base: Base URL of the provider (self-hosted or proxy).
        api_key: Key for the provider; litellm reads the usual environment
            variables when omitted.
        timeout: Seconds per call before it counts as a timeout.
        max_retries: Extra attempts after an invalid reply (bad JSON or schema),
            each telling the model what was wrong.
        max_transient_retries: Extra attempts after a timeout, rate limit,
            connection failure or 5xx error.
        temperature: Sampling temperature.
        max_input_tokens: Largest transcript, in tokens, summarized in one call;
            longer ones are chunked (map-reduce). Default: the model's input
            window less room for instructions and answer when litellm knows the
            model, else :data:`DEFAULT_MAX_INPUT_TOKENS`. When the provider
            still answers that the context window is exceeded, the chunks are
            halved (a few times, bounded) rather than failing.
        completion_kwargs: Extra arguments of ``litellm.completion`` (e.g.
            ``mock_response``, ``max_tokens``, ``extra_headers``); they override
            the defaults above. ``model``, ``messages``, ``response_format``,
            ``stream`` and ``n`` are set by the summarizer.
        structured_output: ``"auto"`` (JSON schema if litellm says the model
            supports it, else JSON mode), or force ``"json_schema"``,
            ``"json_object"`` or ``"none"`` (instructions only).
        retry_base_delay: First backoff delay in seconds; doubles per retry.
        retry_max_delay: Cap of any single wait, ``Retry-After`` included.
        max_items: Cap of each summary list.
        sleep: Waits between retries (injectable so callers can observe or
            skip the backoff).

    Raises:
        InvalidSummarizerConfigError: An argument is out of range or
            ``completion_kwargs`` sets a reserved argument (also a ``ValueError``).
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        max_transient_retries: int = 3,
        temperature: float = 0.0,
        max_input_tokens: int | None = None,
        completion_kwargs: Mapping[str, Any] | None = None,
        structured_output: StructuredOutput = "auto",
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 30.0,
        max_items: int = 20,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not model:
            raise InvalidSummarizerConfigError(
                "model must be a litellm model name, e.g. 'gpt-4o-mini'"
            )
        if timeout <= 0 or retry_base_delay < 0 or retry_max_delay < 0:
            raise InvalidSummarizerConfigError("timeout must be > 0 and retry delays >= 0")
        if max_retries < 0 or max_transient_retries < 0 or max_items < 1:
            raise InvalidSummarizerConfigError(
                "max_retries and max_transient_retries must be >= 0, max_items >= 1"
            )
        if max_input_tokens is not None and max_input_tokens < _MIN_BUDGET:
            raise InvalidSummarizerConfigError(f"max_input_tokens must be at least {_MIN_BUDGET}")
        if structured_output not in ("auto", "json_schema", "json_object", "none"):
            raise InvalidSummarizerConfigError(
                "structured_output must be auto, json_schema, json_object or none"
            )
        reserved = _RESERVED_KWARGS & set(completion_kwargs or {})
        if reserved:
            raise InvalidSummarizerConfigError(
                f"completion_kwargs may not set {', '.join(sorted(reserved))}: the summarizer "
                "sets them (use structured_output to choose the response format)"
            )
        self.model = model
        self.name = f"litellm:{model}"
        self.api_base = api_base
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_transient_retries = max_transient_retries
        self.temperature = temperature
        self.max_input_tokens = max_input_tokens
        self.completion_kwargs = dict(completion_kwargs or {})
        self.structured_output = structured_output
        self.retry_base_delay = retry_base_delay
        self.retry_max_delay = retry_max_delay
        self.max_items = max_items
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"LiteLLMSummarizer(model={self.model!r}, api_base={self.api_base!r})"

    def summarize(
        self,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        user_id: str,
        session_id: str,
        created_at: datetime | None = None,
    ) -> Summarization:
        """Summarize one session with the model (see the module docstring for the steps).

        Args:
            transcript: The session's messages, oldest first.
            user_id: Owner of the session.
            session_id: The session.
            created_at: Timestamp of the summary; defaults to now (UTC).

        Returns:
            The summary, fact candidates proposed by the model, and the usage
            summed over every call made.

        Raises:
            InvalidTranscriptError: The transcript is empty or malformed.
            tiers.errors.InvalidInputError: ``user_id`` or ``session_id`` is not a valid id.
            SummarizerTimeoutError: Every attempt timed out.
            SummarizerRateLimitError: The provider kept rate limiting.
            SummarizerUnavailableError: Connection failures or 5xx errors
                outlasted the retries.
            SummaryGenerationError: The model never returned a valid summary
                (``raw_output`` holds its last reply), or the provider refused
                the request (bad key, unknown model, context window exceeded
                even after re-chunking smaller).
        """
        messages = parse_transcript(transcript)
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        litellm = _import_litellm()
        run = _Run(mode=self._initial_mode(litellm))
        lines = _render(messages)
        if lines:
            result, facts = self._summarize_lines(litellm, run, lines)
        else:
            result, facts = LLMSummary(task_description=""), []  # only tool calls: nothing to say
        usage = SummaryUsage(
            prompt_tokens=run.prompt_tokens,
            completion_tokens=run.completion_tokens,
            cost_usd=run.cost if run.calls else 0.0,
            model=self.model,
            calls=run.calls,
        )
        summary = SessionSummary(
            session_id=session_id,
            user_id=user_id,
            task_description=" ".join(result.task_description.split())[:MAX_TEXT],
            decisions_made=_clean_items(result.decisions_made, self.max_items),
            work_completed=_clean_items(result.work_completed, self.max_items),
            open_questions=_clean_items(result.open_questions, self.max_items),
            next_recommended_steps=_clean_items(result.next_recommended_steps, self.max_items),
            created_at=created_at or utcnow(),
            usage=usage,
        )
        return Summarization(summary=summary, facts=facts, usage=usage)

    # ------------------------------------------------------------------ map-reduce

    def _summarize_lines(
        self, litellm: Any, run: _Run, lines: Sequence[str]
    ) -> tuple[LLMSummary, list[FactCandidate]]:
        """Map-reduce within the budget; halve the budget when the model's window is exceeded.

        The window litellm reports (or :data:`DEFAULT_MAX_INPUT_TOKENS` for a
        model it does not know) can be larger than the model's real one: a
        provider's context-window error then re-runs the summary with chunks
        half as large, at most ``_WINDOW_SHRINKS`` times and never below
        ``_MIN_BUDGET`` tokens, instead of failing.
        """
        budget = self._budget(litellm)
        for shrinks in range(_WINDOW_SHRINKS + 1):
            try:
                return self._map_reduce(litellm, run, lines, budget)
            except _WindowExceededError as exc:
                smaller = max(budget // 2, _MIN_BUDGET)
                if shrinks == _WINDOW_SHRINKS or smaller >= budget:
                    raise SummaryGenerationError(
                        f"{self.model}: the prompt is over the model's context window even in "
                        f"chunks of {budget} tokens ({exc}); set max_input_tokens "
                        "(TIERMEM_SUMMARIZER_MAX_INPUT_TOKENS) to what the model accepts"
                    ) from exc.__cause__
                budget = smaller
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    def _map_reduce(
        self, litellm: Any, run: _Run, lines: Sequence[str], budget: int
    ) -> tuple[LLMSummary, list[FactCandidate]]:
        chunks = _chunk(lines, budget)
        if len(chunks) == 1:
            result = self._generate(
                litellm, run, _MAP_SYSTEM, f"Transcript:\n<transcript>\n{chunks[0]}\n</transcript>"
            )
            return result, _merge_facts(result.facts)
        partials = [
            self._generate(
                litellm,
                run,
                _MAP_SYSTEM,
                f"Transcript, part {number} of {len(chunks)} of one conversation; summarize "
                f"only this part:\n<transcript>\n{chunk}\n</transcript>",
            )
            for number, chunk in enumerate(chunks, start=1)
        ]
        result = self._reduce(litellm, run, partials, budget)
        # The merge may drop a fact a chunk found; keep it unless the merge restated the key.
        return result, _merge_facts(*(p.facts for p in partials), result.facts)

    def _reduce(
        self, litellm: Any, run: _Run, partials: list[LLMSummary], budget: int
    ) -> LLMSummary:
        level = partials
        while len(level) > 1:
            level = [
                group[0] if len(group) == 1 else self._reduce_group(litellm, run, group)
                for group in self._groups(level, budget)
            ]
        return level[0]

    def _reduce_group(self, litellm: Any, run: _Run, group: Sequence[LLMSummary]) -> LLMSummary:
        payload = json.dumps([p.model_dump() for p in group], ensure_ascii=False, indent=1)
        return self._generate(
            litellm,
            run,
            _REDUCE_SYSTEM,
            f"Partial summaries, oldest first:\n<partial_summaries>\n{payload}\n"
            "</partial_summaries>",
        )

    @staticmethod
    def _groups(level: Sequence[LLMSummary], budget: int) -> list[list[LLMSummary]]:
        """Consecutive groups within ``budget`` tokens, each of two or more but maybe the last.

        Two at least, even over budget, so every round shrinks the list and the loop ends.
        """
        groups: list[list[LLMSummary]] = []
        size = 0
        for partial in level:
            tokens = count_tokens(partial.model_dump_json())
            if groups and (len(groups[-1]) < 2 or size + tokens <= budget):
                groups[-1].append(partial)
                size += tokens
            else:
                groups.append([partial])
                size = tokens
        return groups

    def _budget(self, litellm: Any) -> int:
        if self.max_input_tokens is not None:
            return self.max_input_tokens
        window: int | None = None
        try:
            window = litellm.get_model_info(self.model).get("max_input_tokens")
        except Exception:
            try:
                window = litellm.get_max_tokens(self.model)
            except Exception:
                window = None
        if not window:
            return DEFAULT_MAX_INPUT_TOKENS
        overhead = count_tokens(_REDUCE_SYSTEM) + min(_OUTPUT_RESERVE, window // 4)
        return max(int(window) - overhead, _MIN_BUDGET)

    # ------------------------------------------------------------------ one summary

    def _initial_mode(self, litellm: Any) -> _Mode:
        if self.structured_output != "auto":
            return self.structured_output
        try:
            supported = bool(litellm.supports_response_schema(model=self.model))
        except Exception:
            supported = False  # unknown model: JSON mode is the widely supported choice
        return "json_schema" if supported else "json_object"

    def _generate(self, litellm: Any, run: _Run, system: str, prompt: str) -> LLMSummary:
        """One valid :class:`LLMSummary`, feeding validation errors back to the model."""
        base = [
            {"role": "system", "content": system.format(max_items=self.max_items)},
            {"role": "user", "content": prompt},
        ]
        conversation = base
        raw: str | None = None
        problem = ""
        attempts = self.max_retries + 1
        for _ in range(attempts):
            response = self._complete(litellm, run, conversation)
            raw, problem_or_none = _reply_text(response)
            try:
                if problem_or_none is not None:
                    raise _InvalidReplyError(problem_or_none)
                return _parse_reply(raw or "")
            except _InvalidReplyError as exc:
                problem = str(exc)
                conversation = [
                    *base,
                    {"role": "assistant", "content": raw or ""},
                    {"role": "user", "content": _feedback(problem)},
                ]
        raise SummaryGenerationError(
            f"{self.model} returned no valid summary in {attempts} attempt(s); last problem: "
            f"{problem}. Use a model that follows JSON instructions, or raise max_retries",
            raw_output=raw,
        )

    def _complete(self, litellm: Any, run: _Run, messages: list[dict[str, str]]) -> Any:
        """One completion, retrying transient failures; translates litellm's errors."""
        transient_attempts = 0
        while True:
            try:
                response = litellm.completion(**self._kwargs(run.mode, messages))
            except Exception as exc:
                reason = _transient_reason(litellm, exc)
                if reason is None:
                    if run.mode in _WEAKER and _rejects_format(litellm, exc):
                        run.mode = _WEAKER[run.mode]  # this provider refuses the format
                        continue
                    if _window_exceeded(litellm, exc):
                        raise _WindowExceededError(
                            f"{type(exc).__name__}: {str(exc)[:200]}"
                        ) from exc
                    raise self._fatal(litellm, exc) from exc
                transient_attempts += 1
                retry_after = _retry_after(exc)
                if transient_attempts > self.max_transient_retries:
                    raise _UNAVAILABLE[reason](
                        f"{self.model} unavailable after {transient_attempts} attempt(s), "
                        f"last: {reason.replace('_', ' ')} ({type(exc).__name__}: "
                        f"{str(exc)[:300]}); retry later, or raise timeout/max_transient_retries",
                        reason=reason,
                        attempts=transient_attempts,
                        retry_after=retry_after,
                    ) from exc
                self._sleep(self._backoff(transient_attempts, retry_after))
                continue
            run.record(litellm, response, self.model)
            return response

    def _kwargs(self, mode: _Mode, messages: list[dict[str, str]]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "timeout": self.timeout,
            "temperature": self.temperature,
            # Retries are ours (with feedback and typed errors); the SDK's would multiply them.
            "max_retries": 0,
            "drop_params": True,
        }
        if self.api_base is not None:
            kwargs["api_base"] = self.api_base
        if self.api_key is not None:
            kwargs["api_key"] = self.api_key
        if mode == "json_schema":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "session_summary",
                    "schema": summary_json_schema(),
                    "strict": True,
                },
            }
        elif mode == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        kwargs.update(self.completion_kwargs)
        return kwargs

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        ceiling = min(self.retry_max_delay, self.retry_base_delay * 2.0 ** (attempt - 1))
        # "Equal jitter": at least half the exponential delay, so retries stay spread out.
        delay = ceiling / 2 + random.uniform(0, ceiling / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.retry_max_delay))
        return delay

    def _fatal(self, litellm: Any, exc: Exception) -> SummaryGenerationError:
        if isinstance(exc, litellm.AuthenticationError | litellm.PermissionDeniedError):
            hint = "the provider refused the credentials; check api_key"
        elif isinstance(exc, litellm.NotFoundError):
            hint = "the provider does not know this model; check the model name and api_base"
        else:
            hint = "the provider rejected the request"
        return SummaryGenerationError(
            f"{self.model}: {hint} ({type(exc).__name__}: {str(exc)[:300]})"
        )
