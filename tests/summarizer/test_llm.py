"""LiteLLMSummarizer through litellm's real code path.

Two ways in, both offline: litellm's own ``mock_response`` (happy path,
malformed output, mocked rate limits and timeouts), and a scriptable
OpenAI-compatible stub server on 127.0.0.1 that records every request
(retry with feedback, 429/500/timeouts, format fallback, map-reduce).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from summarizer import (
    LiteLLMSummarizer,
    SummarizerRateLimitError,
    SummarizerTimeoutError,
    SummarizerUnavailableError,
    SummaryGenerationError,
    count_tokens,
)
from summarizer.llm import (
    _REDUCE_SYSTEM,
    DEFAULT_MAX_INPUT_TOKENS,
    _import_litellm,
    summary_json_schema,
)
from tests.summarizer.stub_server import StubLLMServer, StubReply
from tests.waiting import wait_until
from tiers.errors import InvalidInputError

pytestmark = pytest.mark.usefixtures("no_network")

WHEN = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)

TRANSCRIPT = [
    {"role": "user", "content": "Hi! My name is Dana and my blender arrived cracked."},
    {"role": "assistant", "content": "Sorry! I've issued a full refund to your Visa."},
    {"role": "user", "content": "Thanks. Will it show up by Friday?"},
]

GOOD = {
    "task_description": "Get a refund for a blender that arrived cracked.",
    "decisions_made": ["Refund to the original Visa card instead of store credit."],
    "work_completed": ["Issued a full refund.", "  issued a full refund  ", ""],
    "open_questions": ["Will the refund arrive by Friday?"],
    "next_recommended_steps": ["Check the card statement on Friday."],
    "facts": [
        {"key": "Name", "value": "Dana", "confidence": 0.9, "evidence": "My name is Dana"},
        {"key": "favorite color!", "value": 7, "confidence": 0.4, "evidence": "7 is my number"},
        {"key": "!!!", "value": "dropped: no usable key", "confidence": 0.5, "evidence": ""},
    ],
}


class SleepLog:
    """Records backoff waits instead of sleeping, so retry tests are instant."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def stub() -> Iterator[StubLLMServer]:
    with StubLLMServer() as server:
        yield server


@pytest.fixture
def sleeps() -> SleepLog:
    return SleepLog()


def stub_summarizer(
    stub: StubLLMServer, sleeps: SleepLog | None = None, **options: Any
) -> LiteLLMSummarizer:
    options.setdefault("timeout", 5.0)
    options.setdefault("retry_base_delay", 0.001)
    options.setdefault("retry_max_delay", 0.01)
    return LiteLLMSummarizer(
        options.pop("model", "openai/stub-model"),
        api_base=stub.api_base,
        api_key="test",
        sleep=sleeps if sleeps is not None else SleepLog(),
        **options,
    )


def run(summarizer: LiteLLMSummarizer, transcript: Any = None) -> Any:
    return summarizer.summarize(
        TRANSCRIPT if transcript is None else transcript,
        user_id="dana",
        session_id="sess-1",
        created_at=WHEN,
    )


# --------------------------------------------------------------------------- import and config


def test_importing_the_package_does_not_import_litellm() -> None:
    code = (
        "import sys, summarizer\n"
        "assert summarizer.LiteLLMSummarizer('gpt-4o-mini').name == 'litellm:gpt-4o-mini'\n"
        "assert 'litellm' not in sys.modules, 'litellm imported eagerly'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"completion_kwargs": {"messages": []}}, "messages"),
        ({"completion_kwargs": {"response_format": {}}}, "structured_output"),
        ({"max_input_tokens": 10}, "max_input_tokens"),
        ({"timeout": 0}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
        ({"structured_output": "xml"}, "structured_output"),
    ],
)
def test_bad_configuration_is_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LiteLLMSummarizer("gpt-4o-mini", **options)


def test_strict_schema_requires_every_key() -> None:
    schema = summary_json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {
        "task_description",
        "decisions_made",
        "work_completed",
        "open_questions",
        "next_recommended_steps",
        "facts",
    }
    fact = schema["$defs"]["LLMFact"]
    assert fact["additionalProperties"] is False
    assert set(fact["required"]) == {"key", "value", "confidence", "evidence"}
    assert "maximum" not in json.dumps(schema)


# --------------------------------------------------------------------------- litellm mock_response


def test_mock_response_happy_path() -> None:
    summarizer = LiteLLMSummarizer(
        "gpt-4o-mini", completion_kwargs={"mock_response": json.dumps(GOOD)}
    )
    result = run(summarizer)
    summary = result.summary
    assert (summary.user_id, summary.session_id, summary.created_at) == ("dana", "sess-1", WHEN)
    assert summary.task_description == GOOD["task_description"]
    assert summary.decisions_made == GOOD["decisions_made"]
    assert summary.work_completed == ["Issued a full refund."]  # blank and duplicate dropped
    assert summary.open_questions == ["Will the refund arrive by Friday?"]
    facts = {fact.key: fact for fact in result.facts}
    assert set(facts) == {"name", "favorite_color"}
    assert facts["name"].value == "Dana"
    assert facts["name"].confidence == 0.9
    assert facts["favorite_color"].value == "7"
    usage = result.usage
    assert usage is not None
    # litellm's mock reports 10 prompt and 20 completion tokens; gpt-4o-mini has a known price.
    assert (usage.prompt_tokens, usage.completion_tokens, usage.calls) == (10, 20, 1)
    assert usage.model == "gpt-4o-mini"
    assert usage.cost_usd is not None
    assert usage.cost_usd > 0


def test_mock_response_malformed_output_raises_with_raw_output() -> None:
    raw = "Sure! The user wanted a refund and got one."
    summarizer = LiteLLMSummarizer(
        "gpt-4o-mini", max_retries=1, completion_kwargs={"mock_response": raw}
    )
    with pytest.raises(SummaryGenerationError, match="not valid JSON") as info:
        run(summarizer)
    assert info.value.raw_output == raw
    assert "2 attempt(s)" in str(info.value)
    assert not isinstance(info.value, SummarizerUnavailableError)


def test_mock_response_fenced_json_is_accepted() -> None:
    raw = "Here you go:\n```json\n" + json.dumps(GOOD) + "\n```"
    summarizer = LiteLLMSummarizer("gpt-4o-mini", completion_kwargs={"mock_response": raw})
    assert run(summarizer).summary.task_description == GOOD["task_description"]


def test_mock_rate_limit_persists(sleeps: SleepLog) -> None:
    summarizer = LiteLLMSummarizer(
        "gpt-4o-mini",
        max_transient_retries=2,
        retry_base_delay=0.5,
        retry_max_delay=0.75,
        sleep=sleeps,
        completion_kwargs={"mock_response": "litellm.RateLimitError"},
    )
    with pytest.raises(SummarizerRateLimitError) as info:
        run(summarizer)
    assert info.value.is_rate_limit
    assert not info.value.is_timeout
    assert info.value.attempts == 3
    # Exponential with equal jitter: [0.25, 0.5] then [0.375, 0.75] (capped).
    assert len(sleeps.delays) == 2
    assert 0.25 <= sleeps.delays[0] <= 0.5
    assert 0.375 <= sleeps.delays[1] <= 0.75


def test_mock_timeout(sleeps: SleepLog) -> None:
    summarizer = LiteLLMSummarizer(
        "gpt-4o-mini",
        timeout=0.2,
        max_transient_retries=1,
        sleep=sleeps,
        completion_kwargs={"mock_response": "{}", "mock_timeout": True},
    )
    with pytest.raises(SummarizerTimeoutError) as info:
        run(summarizer)
    assert info.value.is_timeout
    assert info.value.reason == "timeout"
    assert len(sleeps.delays) == 1


# --------------------------------------------------------------------------- stub server


def test_stub_happy_path_uses_json_mode_for_unknown_models(stub: StubLLMServer) -> None:
    stub.enqueue(StubReply.json(GOOD, prompt_tokens=321, completion_tokens=54))
    result = run(stub_summarizer(stub))
    assert result.summary.decisions_made == GOOD["decisions_made"]
    (request,) = stub.requests
    assert request["model"] == "stub-model"
    assert request["response_format"] == {"type": "json_object"}
    assert request["temperature"] == 0.0
    system, user = request["messages"]
    assert system["role"] == "system"
    assert "JSON" in system["content"]
    assert "user: Hi! My name is Dana and my blender arrived cracked." in user["content"]
    assert "assistant: Sorry! I've issued a full refund to your Visa." in user["content"]
    usage = result.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.calls) == (321, 54, 1)
    assert usage.cost_usd is None  # litellm has no price for a self-hosted model


def test_stub_json_schema_for_models_that_support_it(stub: StubLLMServer) -> None:
    stub.enqueue(StubReply.json(GOOD, prompt_tokens=1000, completion_tokens=100))
    result = run(stub_summarizer(stub, model="openai/gpt-4o-mini"))
    response_format = stub.requests[0]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["strict"] is True
    assert response_format["json_schema"]["schema"] == summary_json_schema()
    assert result.usage is not None
    assert result.usage.cost_usd is not None
    assert result.usage.cost_usd > 0


def test_stub_retry_feeds_the_validation_error_back(stub: StubLLMServer) -> None:
    malformed = '{"task_description": "Refund", "decisions_made": ['
    violating = {**GOOD, "decisions_made": "refund to Visa", "task_description": 42}
    stub.enqueue(
        StubReply.chat(malformed, prompt_tokens=100, completion_tokens=10),
        StubReply.json(violating, prompt_tokens=110, completion_tokens=20),
        StubReply.json(GOOD, prompt_tokens=120, completion_tokens=30),
    )
    result = run(stub_summarizer(stub, max_retries=2))
    assert result.summary.task_description == GOOD["task_description"]
    first, second, third = stub.requests
    assert len(first["messages"]) == 2
    # The model sees its own bad reply, then what was wrong with it.
    assert second["messages"][:2] == first["messages"]
    assert second["messages"][2] == {"role": "assistant", "content": malformed}
    assert second["messages"][3]["role"] == "user"
    assert "not valid JSON" in second["messages"][3]["content"]
    assert third["messages"][2]["content"] == json.dumps(violating)
    feedback = third["messages"][3]["content"]
    assert "decisions_made: Input should be a valid list" in feedback
    assert "task_description: Input should be a valid string" in feedback
    usage = result.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.calls) == (330, 60, 3)


def test_stub_persistent_schema_violation_raises(stub: StubLLMServer) -> None:
    bad = {**GOOD, "facts": [{"key": "k", "value": "v", "confidence": 7}]}
    stub.enqueue(*[StubReply.json(bad)] * 2)
    with pytest.raises(SummaryGenerationError, match=r"facts\.0\.confidence") as info:
        run(stub_summarizer(stub, max_retries=1))
    assert info.value.raw_output == json.dumps(bad)
    assert len(stub.requests) == 2


def test_stub_truncated_reply_is_retried(stub: StubLLMServer) -> None:
    body = json.loads(StubReply.json(GOOD).body)
    body["choices"][0]["finish_reason"] = "length"
    stub.enqueue(StubReply(200, json.dumps(body)), StubReply.json(GOOD))
    result = run(stub_summarizer(stub))
    assert result.summary.task_description == GOOD["task_description"]
    assert "cut off" in stub.requests[1]["messages"][-1]["content"]


def test_stub_429_then_success_honours_retry_after(stub: StubLLMServer, sleeps: SleepLog) -> None:
    stub.enqueue(
        StubReply.error(429, "Rate limit reached", headers={"Retry-After": "0.25"}),
        StubReply.json(GOOD),
    )
    result = run(stub_summarizer(stub, sleeps, retry_max_delay=5.0))
    assert result.summary.decisions_made == GOOD["decisions_made"]
    assert len(stub.requests) == 2
    assert sleeps.delays == [0.25]  # the provider's wait, not the 1 ms backoff
    assert result.usage is not None
    assert result.usage.calls == 1


def test_stub_persistent_429_is_a_typed_error(stub: StubLLMServer, sleeps: SleepLog) -> None:
    stub.enqueue(*[StubReply.error(429, "slow down", headers={"Retry-After": "30"})] * 3)
    with pytest.raises(SummarizerRateLimitError) as info:
        run(stub_summarizer(stub, sleeps, max_transient_retries=2, retry_max_delay=0.02))
    assert info.value.attempts == 3
    assert info.value.retry_after == 30.0
    assert "rate limit" in str(info.value)
    assert len(stub.requests) == 3
    assert sleeps.delays == [0.02, 0.02]  # Retry-After is capped by retry_max_delay


def test_stub_500_then_success(stub: StubLLMServer, sleeps: SleepLog) -> None:
    stub.enqueue(StubReply.error(500, "upstream exploded"), StubReply.json(GOOD))
    result = run(stub_summarizer(stub, sleeps))
    assert result.summary.work_completed == ["Issued a full refund."]
    assert len(stub.requests) == 2
    assert len(sleeps.delays) == 1


def test_stub_persistent_500_is_unavailable(stub: StubLLMServer) -> None:
    stub.enqueue(*[StubReply.error(503, "overloaded")] * 2)
    with pytest.raises(SummarizerUnavailableError) as info:
        run(stub_summarizer(stub, max_transient_retries=1))
    assert info.value.reason == "server_error"
    assert not info.value.is_rate_limit
    assert not info.value.is_timeout


def test_stub_slow_reply_times_out(stub: StubLLMServer, sleeps: SleepLog) -> None:
    stub.enqueue(*[StubReply.json(GOOD, delay=600)] * 2)
    with pytest.raises(SummarizerTimeoutError) as info:
        run(stub_summarizer(stub, sleeps, timeout=0.3, max_transient_retries=1))
    assert info.value.is_timeout
    assert info.value.attempts == 2
    # The client gave up after 0.3 s, maybe before the stub's thread read the second request.
    wait_until(
        lambda: len(stub.requests) >= 2,
        60,
        what="the stub to read the second request",
        every_s=0.01,
    )
    assert len(stub.requests) == 2


def test_stub_timeout_then_success(stub: StubLLMServer) -> None:
    # The timeout also bounds the second, prompt, answer: 0.3 s was less than a loaded CI
    # machine can take for one round trip through litellm. The first answer never comes.
    stub.enqueue(StubReply.json(GOOD, delay=600), StubReply.json(GOOD))
    result = run(stub_summarizer(stub, timeout=3.0))
    assert result.summary.task_description == GOOD["task_description"]


def test_stub_connection_refused_is_unavailable() -> None:
    with StubLLMServer() as server:
        api_base = server.api_base
    # The server is closed: nothing listens on that port any more.
    summarizer = LiteLLMSummarizer(
        "openai/stub-model",
        api_base=api_base,
        api_key="test",
        max_transient_retries=1,
        sleep=SleepLog(),
    )
    with pytest.raises(SummarizerUnavailableError) as info:
        run(summarizer)
    assert info.value.reason == "connection"


def test_stub_format_rejection_falls_back_to_json_mode(stub: StubLLMServer) -> None:
    stub.enqueue(
        StubReply.error(400, "response_format 'json_schema' is not supported by this server"),
        StubReply.json(GOOD),
    )
    result = run(stub_summarizer(stub, structured_output="json_schema"))
    assert result.summary.task_description == GOOD["task_description"]
    assert stub.requests[0]["response_format"]["type"] == "json_schema"
    assert stub.requests[1]["response_format"] == {"type": "json_object"}


def test_stub_auth_error_is_not_retried(stub: StubLLMServer) -> None:
    stub.enqueue(StubReply.error(401, "Incorrect API key provided"))
    with pytest.raises(SummaryGenerationError, match="api_key") as info:
        run(stub_summarizer(stub))
    assert not isinstance(info.value, SummarizerUnavailableError)
    assert len(stub.requests) == 1


def test_invalid_ids_fail_before_any_call(stub: StubLLMServer) -> None:
    summarizer = stub_summarizer(stub)
    with pytest.raises(InvalidInputError, match="user_id"):
        summarizer.summarize(TRANSCRIPT, user_id="dana smith", session_id="s")
    assert stub.requests == []


def test_concurrent_calls_share_nothing(stub: StubLLMServer) -> None:
    stub.fallback = lambda body: StubReply.json(GOOD)
    summarizer = stub_summarizer(stub)
    results: list[Any] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(run(summarizer))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(results) == 4
    assert all(r.usage.calls == 1 for r in results)


# --------------------------------------------------------------------------- map-reduce

PART = re.compile(r"part (\d+) of (\d+)")


def scripted_model(body: dict[str, Any]) -> StubReply:
    """A fake model: each part names itself; a merge concatenates what it was given."""
    system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
    if system.startswith("You merge"):
        payload = user.split("<partial_summaries>\n", 1)[1].split("\n</partial_summaries>")[0]
        partials = json.loads(payload)
        merged = {
            "task_description": partials[0]["task_description"],
            "decisions_made": [d for p in partials for d in p["decisions_made"]],
            "work_completed": [w for p in partials for w in p["work_completed"]],
            "open_questions": [],
            "next_recommended_steps": partials[-1]["next_recommended_steps"],
            "facts": [],  # a merge that forgets facts: the summarizer must keep them
        }
        return StubReply.json(merged, prompt_tokens=50, completion_tokens=25)
    match = PART.search(user)
    assert match is not None, "a chunk request must say which part it is"
    number = int(match.group(1))
    facts = []
    if number == 1:
        facts = [{"key": "name", "value": "Dana", "confidence": 0.9, "evidence": "I'm Dana"}]
    if number == 2:
        facts = [{"key": "diet", "value": "vegan", "confidence": 0.8, "evidence": "I'm vegan"}]
    partial = {
        "task_description": f"Task seen in part {number}",
        "decisions_made": [f"Decision from part {number}"],
        "work_completed": [f"Work from part {number}"],
        "open_questions": [],
        "next_recommended_steps": [f"Next step from part {number}"],
        "facts": facts,
    }
    return StubReply.json(partial, prompt_tokens=100, completion_tokens=20)


def long_transcript() -> list[dict[str, str]]:
    topics = ["flights", "hotels", "rail passes", "restaurants", "museums", "packing"]
    messages = []
    for turn in range(12):
        topic = topics[turn % len(topics)]
        messages.append(
            {
                "role": "user",
                "content": f"Turn {turn}: what should we do about {topic} for the Kyoto trip? "
                "We care about price, comfort and being close to the station.",
            }
        )
        messages.append(
            {
                "role": "assistant",
                "content": f"For {topic}, I compared three options and picked the best value one; "
                "it is near Kyoto Station and fits the budget we agreed on.",
            }
        )
    # One message larger than a whole chunk: it must be split, not sent whole.
    messages.append({"role": "user", "content": "Here are my notes. " + "Sakura season. " * 300})
    return messages


def test_map_reduce_for_a_long_transcript(stub: StubLLMServer) -> None:
    stub.fallback = scripted_model
    budget = 300
    transcript = long_transcript()
    total = sum(count_tokens(m["content"]) for m in transcript)
    assert total > 4 * budget
    result = run(stub_summarizer(stub, max_input_tokens=budget), transcript)

    requests = stub.requests
    maps = [r for r in requests if not r["messages"][0]["content"].startswith("You merge")]
    reduces = [r for r in requests if r["messages"][0]["content"].startswith("You merge")]
    parts = int(PART.search(maps[0]["messages"][-1]["content"]).group(2))  # type: ignore[union-attr]
    assert parts >= 5
    assert len(maps) == parts
    assert len(reduces) >= 2  # the partials do not fit one merge: merged in rounds
    for request in maps:
        chunk = request["messages"][-1]["content"].split("<transcript>\n", 1)[1]
        assert count_tokens(chunk.split("\n</transcript>")[0]) <= budget
    # Every part's content reached the end, in order, through the merges.
    summary = result.summary
    assert summary.decisions_made == [f"Decision from part {n}" for n in range(1, parts + 1)]
    assert summary.work_completed == [f"Work from part {n}" for n in range(1, parts + 1)]
    assert summary.next_recommended_steps == [f"Next step from part {parts}"]
    assert summary.task_description == "Task seen in part 1"
    # Facts found in chunks survive a merge that dropped them.
    assert {f.key: f.value for f in result.facts} == {"name": "Dana", "diet": "vegan"}
    usage = result.usage
    assert usage is not None
    assert usage.calls == len(requests)
    assert usage.prompt_tokens == 100 * len(maps) + 50 * len(reduces)


def test_short_transcript_is_one_call(stub: StubLLMServer) -> None:
    stub.fallback = lambda body: StubReply.json(GOOD)
    run(stub_summarizer(stub, max_input_tokens=2000))
    assert len(stub.requests) == 1
    assert "part 1 of" not in stub.requests[0]["messages"][-1]["content"]


def test_tool_call_only_transcript_needs_no_call(stub: StubLLMServer) -> None:
    result = run(stub_summarizer(stub), [{"role": "assistant", "content": None}])
    assert result.summary.task_description == ""
    assert result.usage is not None
    assert result.usage.calls == 0
    assert stub.requests == []


# --------------------------------------------------------------------------- context window

WINDOW_ERROR = (
    "This model's maximum context length is {window} tokens. However, your messages resulted "
    "in {used} tokens. Please reduce the length of the messages."
)


def small_window_model(window: int) -> Callable[[dict[str, Any]], StubReply]:
    """A model with a ``window``-token context that litellm does not know about."""

    def answer(body: dict[str, Any]) -> StubReply:
        used = sum(count_tokens(m["content"]) for m in body["messages"])
        if used > window:
            return StubReply.error(400, WINDOW_ERROR.format(window=window, used=used))
        return scripted_model(body)

    return answer


def test_a_context_window_error_re_chunks_smaller(stub: StubLLMServer) -> None:
    # An unknown model gets the default budget (8000 tokens); its real window is 1500.
    stub.fallback = small_window_model(1500)
    transcript = long_transcript()
    assert 1500 < sum(count_tokens(m["content"]) for m in transcript) < 8000
    result = run(stub_summarizer(stub, model="openai/my-local-4k"), transcript)

    requests = stub.requests
    too_big = [r for r in requests if sum(count_tokens(m["content"]) for m in r["messages"]) > 1500]
    assert 1 <= len(too_big) <= 4  # bounded: a few halvings of the budget
    assert requests[: len(too_big)] == too_big  # refused first, then smaller chunks succeed
    maps = [
        r
        for r in requests[len(too_big) :]
        if not r["messages"][0]["content"].startswith("You merge")
    ]
    assert len(maps) >= 2
    summary = result.summary
    assert summary.decisions_made == [f"Decision from part {n}" for n in range(1, len(maps) + 1)]
    assert result.usage is not None
    assert result.usage.calls == len(requests) - len(too_big)  # refused calls cost nothing


def test_a_context_window_error_that_persists_is_a_bounded_typed_error(
    stub: StubLLMServer,
) -> None:
    stub.fallback = small_window_model(10)  # not even the instructions fit
    with pytest.raises(SummaryGenerationError, match="TIERMEM_SUMMARIZER_MAX_INPUT_TOKENS") as info:
        run(stub_summarizer(stub, model="openai/my-local-4k"), long_transcript())
    assert not isinstance(info.value, SummarizerUnavailableError)
    assert len(stub.requests) == 5  # 8000, 4000, 2000, 1000, 500 tokens per chunk, then it stops


def test_the_budget_is_the_window_litellm_knows_less_room_for_instructions() -> None:
    litellm = _import_litellm()  # offline: litellm's bundled model list
    window = litellm.get_model_info("gpt-4o-mini")["max_input_tokens"]
    assert window > DEFAULT_MAX_INPUT_TOKENS
    overhead = count_tokens(_REDUCE_SYSTEM) + 2000
    assert LiteLLMSummarizer("gpt-4o-mini")._budget(litellm) == window - overhead
    assert LiteLLMSummarizer("openai/gpt-4o-mini")._budget(litellm) == window - overhead
    # A model litellm does not know gets the default; an explicit budget always wins.
    assert LiteLLMSummarizer("openai/my-local-4k")._budget(litellm) == DEFAULT_MAX_INPUT_TOKENS
    explicit = LiteLLMSummarizer("gpt-4o-mini", max_input_tokens=3000)
    assert explicit._budget(litellm) == 3000
