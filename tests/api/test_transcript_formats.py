"""One table of transcripts in the formats agent frameworks produce, run through every entry point.

Each row is a transcript and what must come of it: accepted, with the exact
messages stored (and, for some, the lines a summarizer is shown), or refused
with the field named. The same rows go through ``Memory.end_session`` (the
library), ``POST /v1/users/{user}/sessions`` (the service, over the real app)
and ``MemoryClient.end_session`` (against a real ``tiermem serve``), which must
all give the same answer. Responses-API rows are built with the OpenAI SDK's
own types and dumped with ``model_dump(exclude_unset=True)``; one is the input
list of a real OpenAI Agents SDK run (its model scripted, its tool real).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.items import ModelResponse, TResponseInputItem
from agents.models.interface import Model
from agents.usage import Usage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import (
    ResponseCodeInterpreterToolCall,
    ResponseComputerToolCall,
    ResponseCustomToolCall,
    ResponseFileSearchToolCall,
    ResponseFunctionToolCall,
    ResponseFunctionWebSearch,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_code_interpreter_tool_call import OutputLogs
from openai.types.responses.response_computer_tool_call import ActionClick
from openai.types.responses.response_file_search_tool_call import Result
from openai.types.responses.response_function_web_search import ActionSearch
from openai.types.responses.response_input_item_param import (
    ComputerCallOutput,
    FunctionCallOutput,
    ItemReference,
    McpApprovalResponse,
)
from openai.types.responses.response_output_item import (
    ImageGenerationCall,
    LocalShellCall,
    LocalShellCallAction,
    McpApprovalRequest,
    McpCall,
    McpListTools,
    McpListToolsTool,
)
from openai.types.responses.response_reasoning_item import Summary

from memory import InvalidTranscriptError, Memory
from memory.client import MemoryClient
from summarizer.formats import (
    CHAT_ROLES,
    CONTENT_PART_TYPES,
    ITEM_TYPES,
    parse_transcript,
    render_lines,
)
from tests.api.conftest import Api, new_tenant
from tests.api.test_client import Served, served  # noqa: F401  (a real `tiermem serve`)
from tests.summarizer.stub_server import StubLLMServer, StubReply
from tests.summarizer.test_llm import GOOD, stub_summarizer
from tiers.errors import SessionNotFoundError
from tiers.models import Message

pytestmark = pytest.mark.usefixtures("no_network")


def dump(*items: Any) -> list[Any]:
    """SDK objects as the JSON-ready dicts frameworks hand over (TypedDict params are dicts)."""
    return [
        item.model_dump(exclude_unset=True) if hasattr(item, "model_dump") else dict(item)
        for item in items
    ]


# --------------------------------------------------------------------------- a real Agents SDK run


class ScriptedModel(Model):
    """A model answering with fixed Responses output items, turn by turn (no network)."""

    def __init__(self, turns: Sequence[list[Any]]) -> None:
        self.turns = list(turns)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the test runs the agent without streaming")


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"18C and sunny in {city}"


def agents_sdk_run() -> list[TResponseInputItem]:
    """The input list of a finished Agents SDK run: reasoning, a real tool call, an answer."""
    model = ScriptedModel(
        [
            [
                ResponseReasoningItem(
                    id="rs_1",
                    type="reasoning",
                    summary=[Summary(type="summary_text", text="The user wants the weather.")],
                ),
                ResponseFunctionToolCall(
                    id="fc_1",
                    type="function_call",
                    call_id="call_w1",
                    name="get_weather",
                    arguments='{"city":"Paris"}',
                    status="completed",
                ),
            ],
            [
                ResponseOutputMessage(
                    id="msg_1",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[
                        ResponseOutputText(
                            type="output_text", text="We decided on Paris: sunny.", annotations=[]
                        )
                    ],
                )
            ],
        ]
    )
    agent = Agent(name="helper", instructions="Be brief.", tools=[get_weather], model=model)
    result = Runner.run_sync(
        agent, "What is the weather in Paris?", run_config=RunConfig(tracing_disabled=True)
    )
    return result.to_input_list()


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Row:
    """A transcript and its expected outcome.

    ``stored`` (the messages' JSON as stored) and ``lines`` (what a summarizer
    is shown) are checked when given; ``refused`` is the field an error names.
    """

    id: str
    transcript: list[Any] | Callable[[], list[Any]]
    stored: list[dict[str, Any]] | None = None
    lines: list[str] | None = None
    refused: str | None = None
    never_stored: list[str] = field(default_factory=list)
    # httpx cannot encode a lone surrogate at all (UnicodeEncodeError before sending), so such a
    # row cannot reach the service through MemoryClient; the route gets it as a JSON escape.
    via_client: bool = True

    def items(self) -> list[Any]:
        return self.transcript() if callable(self.transcript) else self.transcript


IMAGE_B64 = base64.b64encode(b"\x89PNG not really an image").decode()

CHAT_WITH_TOOLS: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a support agent."},
    {"role": "user", "content": "Where is my order A1? I need it by Friday."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'},
            }
        ],
        "refusal": None,
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
    {"role": "assistant", "content": "Your order A1 has shipped and arrives Thursday."},
]

ROWS: list[Row] = [
    Row(
        "plain-chat",
        [
            {"role": "user", "content": "Help me move billing to Postgres."},
            {"role": "assistant", "content": "We decided to use logical replication.", "name": "a"},
        ],
        stored=[
            {"role": "user", "content": "Help me move billing to Postgres."},
            {"role": "assistant", "content": "We decided to use logical replication.", "name": "a"},
        ],
        lines=[
            "user: Help me move billing to Postgres.",
            "assistant (a): We decided to use logical replication.",
        ],
    ),
    Row(
        "chat-completions-with-tool-calls",
        CHAT_WITH_TOOLS,
        stored=[
            {"role": "system", "content": "You are a support agent."},
            {"role": "user", "content": "Where is my order A1? I need it by Friday."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_1", "name": "lookup_order", "arguments": '{"order_id": "A1"}'}
                ],
            },
            {"role": "tool", "content": '{"status": "shipped"}', "tool_call_id": "call_1"},
            {"role": "assistant", "content": "Your order A1 has shipped and arrives Thursday."},
        ],
        lines=[
            "system: You are a support agent.",
            "user: Where is my order A1? I need it by Friday.",
            'assistant called tool lookup_order({"order_id": "A1"}) -> {"status": "shipped"}',
            "assistant: Your order A1 has shipped and arrives Thursday.",
        ],
    ),
    Row(
        "chat-content-parts-legacy-roles-and-refusal",
        [
            {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is on this receipt?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:image/png;base64,{IMAGE_B64}"},
                    },
                    {"type": "input_audio", "input_audio": {"data": IMAGE_B64, "format": "wav"}},
                    {"type": "file", "file": {"filename": "receipt.pdf", "file_data": IMAGE_B64}},
                ],
            },
            {"role": "assistant", "content": None, "refusal": "I can't read that image."},
            {
                "role": "assistant",
                "content": [{"type": "refusal", "refusal": "No."}, {"type": "text", "text": "Ok"}],
                "function_call": {"name": "ocr", "arguments": "{}"},
            },
            {"role": "function", "name": "ocr", "content": "TOTAL 12.50"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c9", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c9", "content": [{"type": "text", "text": "1"}]},
        ],
        stored=[
            {"role": "system", "content": "Answer in French."},
            {
                "role": "user",
                "content": "What is on this receipt?",
                "attachments": ["image", "audio", "file:receipt.pdf"],
            },
            {"role": "assistant", "content": "I can't read that image."},
            {
                "role": "assistant",
                "content": "No.\nOk",
                "tool_calls": [{"name": "ocr", "arguments": "{}"}],
            },
            {"role": "tool", "content": "TOTAL 12.50", "name": "ocr"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c9", "name": "sql", "arguments": "SELECT 1"}],
            },
            {"role": "tool", "content": "1", "tool_call_id": "c9"},
        ],
        lines=[
            "system: Answer in French.",
            "user: What is on this receipt? [image] [audio] [file:receipt.pdf]",
            "assistant: I can't read that image.",
            "assistant: No.\nOk",
            "assistant called tool ocr({})",
            "tool (ocr): TOTAL 12.50",
            "assistant called tool sql(SELECT 1) -> 1",
        ],
        never_stored=[IMAGE_B64],
    ),
    Row(
        "responses-easy-and-typed-messages",
        [
            {"role": "user", "content": [{"type": "input_text", "text": "Plan my trip."}]},
            {"type": "message", "role": "developer", "content": "Be concise."},
            *dump(
                ResponseOutputMessage(
                    id="msg_9",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[
                        ResponseOutputText(type="output_text", text="Book Lisbon.", annotations=[]),
                        ResponseOutputRefusal(type="refusal", refusal="Not Mars."),
                    ],
                )
            ),
        ],
        stored=[
            {"role": "user", "content": "Plan my trip."},
            {"role": "system", "content": "Be concise."},
            {"role": "assistant", "content": "Book Lisbon.\nNot Mars."},
        ],
    ),
    Row(
        "responses-items-from-sdk-types",
        dump(
            ResponseReasoningItem(
                id="rs_2",
                type="reasoning",
                summary=[Summary(type="summary_text", text="Check the order first.")],
                encrypted_content="gAAAAB-opaque",
            ),
            ResponseFunctionToolCall(
                type="function_call",
                call_id="call_7",
                name="refund",
                arguments='{"order":"A1"}',
                namespace="billing",
            ),
            FunctionCallOutput(type="function_call_output", call_id="call_7", output="refunded"),
            ResponseFunctionWebSearch(
                id="ws_1",
                type="web_search_call",
                status="completed",
                action=ActionSearch(type="search", query="refund policy"),
            ),
            ItemReference(type="item_reference", id="msg_0"),
        ),
        stored=[
            {
                "role": "assistant",
                "content": "Check the order first.",
                "item_type": "reasoning",
                "attachments": ["encrypted"],
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_7", "name": "billing.refund", "arguments": '{"order":"A1"}'}
                ],
                "item_type": "function_call",
            },
            {
                "role": "tool",
                "content": "refunded",
                "tool_call_id": "call_7",
                "item_type": "function_call_output",
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "ws_1",
                        "name": "web_search",
                        "arguments": '{"type":"search","query":"refund policy"}',
                    }
                ],
                "item_type": "web_search_call",
            },
            {"role": "system", "content": "msg_0", "item_type": "item_reference"},
        ],
        lines=[  # reasoning and the reference are stored but not shown to a summarizer
            'assistant called tool billing.refund({"order":"A1"}) -> refunded',
            'assistant called tool web_search({"type":"search","query":"refund policy"})',
        ],
        never_stored=["gAAAAB-opaque"],
    ),
    Row(
        "agents-sdk-run",
        agents_sdk_run,
        stored=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": "The user wants the weather.",
                "item_type": "reasoning",
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_w1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
                ],
                "item_type": "function_call",
            },
            {
                "role": "tool",
                "content": "18C and sunny in Paris",
                "tool_call_id": "call_w1",
                "item_type": "function_call_output",
            },
            {"role": "assistant", "content": "We decided on Paris: sunny."},
        ],
        lines=[
            "user: What is the weather in Paris?",
            'assistant called tool get_weather({"city":"Paris"}) -> 18C and sunny in Paris',
            "assistant: We decided on Paris: sunny.",
        ],
    ),
    Row(
        "hosted-tools-mcp-and-notes",
        [
            *dump(
                ResponseFileSearchToolCall(
                    id="fs_1",
                    type="file_search_call",
                    status="completed",
                    queries=["refund policy"],
                    results=[Result(filename="policy.md", text="Refunds within 30 days.")],
                ),
                ResponseComputerToolCall(
                    id="cu_1",
                    type="computer_call",
                    call_id="cc_1",
                    status="completed",
                    pending_safety_checks=[],
                    action=ActionClick(type="click", button="left", x=3, y=4),
                ),
                ComputerCallOutput(
                    type="computer_call_output",
                    call_id="cc_1",
                    output={"type": "computer_screenshot", "image_url": "data:image/png;base64,x"},
                ),
                ResponseCodeInterpreterToolCall(
                    id="ci_1",
                    type="code_interpreter_call",
                    status="completed",
                    container_id="cnt",
                    code="print(6*7)",
                    outputs=[OutputLogs(type="logs", logs="42")],
                ),
                ImageGenerationCall(
                    id="ig_1", type="image_generation_call", status="completed", result=IMAGE_B64
                ),
                LocalShellCall(
                    id="ls_1",
                    type="local_shell_call",
                    call_id="sh_1",
                    status="completed",
                    action=LocalShellCallAction(type="exec", command=["ls"], env={}),
                ),
                McpListTools(
                    id="ml_1",
                    type="mcp_list_tools",
                    server_label="crm",
                    tools=[McpListToolsTool(name="find_customer", input_schema={})],
                ),
                McpApprovalRequest(
                    id="ar_1",
                    type="mcp_approval_request",
                    server_label="crm",
                    name="delete_customer",
                    arguments='{"id":7}',
                ),
                McpApprovalResponse(
                    type="mcp_approval_response", approval_request_id="ar_1", approve=False
                ),
                McpCall(
                    id="mc_1",
                    type="mcp_call",
                    server_label="crm",
                    name="find_customer",
                    arguments='{"q":"Ada"}',
                    output="Ada Lovelace, #7",
                ),
                ResponseCustomToolCall(
                    type="custom_tool_call", call_id="ct_1", name="grep", input="TODO"
                ),
            ),
            {"type": "local_shell_call_output", "id": "sh_1", "output": "README.md"},
            {"type": "custom_tool_call_output", "call_id": "ct_1", "output": "3 matches"},
            {"type": "compaction", "encrypted_content": "opaque"},
            {"id": "msg_ref"},  # an item reference may leave out its type
        ],
        lines=[
            'assistant called tool file_search(["refund policy"]) -> policy.md: Refunds within 30 days.',
            'assistant called tool computer({"action":{"button":"left","type":"click","x":3,"y":4}})'
            " -> [image]",
            "assistant called tool code_interpreter(print(6*7)) -> 42",
            "assistant called tool image_generation() -> [image]",
            'assistant called tool local_shell({"command":["ls"],"env":{},"type":"exec"}) -> README.md',
            'assistant: asks approval to call crm.delete_customer({"id":7})',
            "user: denied ar_1",
            'assistant called tool crm.find_customer({"q":"Ada"}) -> Ada Lovelace, #7',
            "assistant called tool grep(TODO) -> 3 matches",
        ],
        never_stored=[IMAGE_B64],
    ),
    # ---- refused, each naming the field
    Row("empty", [], refused="transcript"),
    Row("not-an-object", [{"role": "user", "content": "hi"}, "oops"], refused="transcript[1]"),
    Row("unknown-role", [{"role": "robot", "content": "beep"}], refused="transcript[0].role"),
    Row(
        "unknown-item-type",
        [{"role": "user", "content": "hi"}, {"type": "hologram_call", "id": "h1"}],
        refused="transcript[1].type",
    ),
    Row("item-type-not-a-string", [{"type": 5}], refused="transcript[0].type"),
    Row(
        "unknown-content-part",
        [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "video"}]}],
        refused="transcript[0].content[1].type",
    ),
    Row(
        "unknown-tool-call-type",
        [{"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "magic"}]}],
        refused="transcript[0].tool_calls[0].type",
    ),
    Row(
        "tool-call-without-function",
        [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}],
        refused="transcript[0].tool_calls[0].function",
    ),
    Row(
        "tool-calls-on-a-user-message",
        [
            {
                "role": "user",
                "content": "x",
                "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
            }
        ],
        refused="transcript[0].tool_calls",
    ),
    Row(
        "function-call-without-name",
        [{"type": "function_call", "call_id": "c", "arguments": "{}"}],
        refused="transcript[0].name",
    ),
    Row(
        "function-call-output-without-output",
        [{"type": "function_call_output", "call_id": "c"}],
        refused="transcript[0].output",
    ),
    Row(
        "reasoning-with-an-unknown-part",
        [{"type": "reasoning", "summary": [{"type": "poem", "text": "x"}]}],
        refused="transcript[0].summary[0].type",
    ),
    Row(
        "approval-that-is-not-a-boolean",
        [{"type": "mcp_approval_response", "approval_request_id": "a", "approve": "yes"}],
        refused="transcript[0].approve",
    ),
    Row(
        "content-over-the-limit",
        [{"role": "user", "content": "x" * 200_001}],
        refused="transcript[0].content",
    ),
    Row(
        "parts-over-the-limit-together",
        [{"role": "user", "content": [{"type": "input_text", "text": "x" * 100_000}] * 3}],
        refused="transcript[0].content",
    ),
    Row(
        "arguments-over-the-limit",
        [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "x" * 200_001}],
        refused="transcript[0].arguments",
    ),
    Row(
        "output-over-the-limit",
        [{"type": "function_call_output", "call_id": "c", "output": "x" * 200_001}],
        refused="transcript[0].output",
    ),
    Row(
        "tool-name-over-the-limit",
        [{"type": "function_call", "call_id": "c", "name": "f" * 257, "arguments": "{}"}],
        refused="transcript[0].name",
    ),
    Row(
        "too-many-tool-calls",
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}] * 129,
            }
        ],
        refused="transcript[0].tool_calls",
    ),
    Row(
        "lone-surrogate-in-arguments",
        [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "\ud800"}],
        refused="transcript[0].arguments",
        via_client=False,
    ),
]


def stored_json(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [m.model_dump(mode="json", exclude_defaults=True) for m in messages]


def check_accepted(row: Row, stored: list[Message]) -> None:
    if row.stored is not None:
        assert stored_json(stored) == row.stored
    if row.lines is not None:
        assert render_lines(stored) == row.lines
    text = json.dumps(stored_json(stored))
    for secret in row.never_stored:
        assert secret not in text


# --------------------------------------------------------------------------- the three entry points


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_library_end_session(memory: Memory, row: Row) -> None:
    tenant = memory.for_tenant(new_tenant())
    if row.refused is not None:
        with pytest.raises(InvalidTranscriptError) as info:
            tenant.end_session("u1", "s1", row.items())
        assert info.value.field == row.refused
        assert row.refused in str(info.value)
        with pytest.raises(SessionNotFoundError):  # nothing was written
            tenant.sessions.transcript_header("u1", "s1")
        return
    summary = tenant.end_session("u1", "s1", row.items())
    check_accepted(row, tenant.sessions.get_transcript("u1", "s1"))
    assert tenant.get_session("u1", "s1") == summary


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_http_route(api: Api, memory: Memory, row: Row) -> None:
    tenant = new_tenant()
    headers = api.key(tenant)
    # Encoded as JSON with escapes, so every row's text (a lone surrogate too) arrives as sent.
    body = json.dumps({"session_id": "s1", "transcript": row.items()})
    r = api.client.post(
        "/v1/users/u1/sessions?wait=true",
        content=body,
        headers={**headers, "Content-Type": "application/json"},
    )
    if row.refused is not None:
        assert r.status_code == 422, r.text
        assert r.headers["content-type"] == "application/problem+json"
        problem = r.json()
        assert problem["field"] == row.refused
        assert problem["type"] == "urn:tiermem:problem:invalid-transcript"
        assert row.refused in problem["detail"]
        pending = api.client.get("/v1/users/u1/sessions:pending", headers=headers)
        assert pending.json() == {"session_ids": []}  # nothing was written
        return
    assert r.status_code == 201, r.text
    check_accepted(row, memory.for_tenant(tenant).sessions.get_transcript("u1", "s1"))
    # The service stored and summarized exactly what the library makes of the same items.
    library = memory.for_tenant(new_tenant())
    expected = library.end_session("u1", "s1", row.items())
    assert r.json()["work_completed"] == expected.work_completed
    assert r.json()["task_description"] == expected.task_description


CLIENT_ROWS = [row for row in ROWS if row.via_client]


@pytest.mark.parametrize("row", CLIENT_ROWS, ids=[row.id for row in CLIENT_ROWS])
def test_memory_client(served: Served, row: Row) -> None:  # noqa: F811
    with MemoryClient(served.base_url, served.key) as client:
        session = f"s-{row.id}"
        if row.refused is not None:
            with pytest.raises(InvalidTranscriptError) as info:
                client.end_session("formats", session, row.items())
            assert info.value.field == row.refused
            assert session not in client.pending_summaries("formats")
            return
        summary = client.end_session("formats", session, row.items())
        # Messages read back by the library go through the client unchanged (tool data included).
        again = client.end_session("formats", f"{session}-again", parse_transcript(row.items()))
    assert again.model_dump(exclude={"session_id", "created_at"}) == summary.model_dump(
        exclude={"session_id", "created_at"}
    )


# --------------------------------------------------------------------------- what summarizers see


def test_extractive_summary_lists_tool_calls_as_work_done(memory: Memory) -> None:
    summary = memory.for_tenant(new_tenant()).end_session("u1", "s1", CHAT_WITH_TOOLS)
    assert 'Called tool lookup_order({"order_id": "A1"}) -> {"status": "shipped"}' in (
        summary.work_completed
    )
    assert summary.task_description.startswith("Where is my order A1?")


def test_plain_transcripts_are_stored_as_before(memory: Memory) -> None:
    """A plain transcript encodes to the bytes it always did, so old and new data read the same."""
    tenant = memory.for_tenant(new_tenant())
    plain = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "Hello."}]
    tenant.save_transcript("u1", "s1", plain)
    header = tenant.sessions.transcript_header("u1", "s1")
    old_encoding = json.dumps(plain, ensure_ascii=False, separators=(",", ":")).encode()
    assert header.size == len(old_encoding)
    assert header.sha256 == hashlib.sha256(old_encoding).hexdigest()


def test_a_stored_transcript_saves_again_unchanged(memory: Memory) -> None:
    tenant = memory.for_tenant(new_tenant())
    row = next(row for row in ROWS if row.id == "hosted-tools-mcp-and-notes")
    tenant.save_transcript("u1", "s1", row.items())
    first = tenant.sessions.get_transcript("u1", "s1")
    tenant.save_transcript("u1", "s2", stored_json(first))  # as dumped JSON
    assert tenant.sessions.get_transcript("u1", "s2") == first
    assert (
        tenant.sessions.transcript_header("u1", "s2").sha256
        == tenant.sessions.transcript_header("u1", "s1").sha256
    )


def test_llm_summarizer_is_shown_tool_calls_not_reasoning() -> None:
    with StubLLMServer() as stub:
        stub.enqueue(StubReply.json(GOOD))
        stub_summarizer(stub).summarize(agents_sdk_run(), user_id="u1", session_id="s1")
        (request,) = stub.requests
    prompt = request["messages"][-1]["content"]
    assert "user: What is the weather in Paris?" in prompt
    assert 'assistant called tool get_weather({"city":"Paris"}) -> 18C and sunny in Paris' in prompt
    assert "assistant: We decided on Paris: sunny." in prompt
    assert "The user wants the weather." not in prompt  # reasoning is stored, not summarized


# --------------------------------------------------------------------------- any JSON at all

_KEYS = st.sampled_from(
    [
        "type", "role", "content", "text", "refusal", "tool_calls", "function", "custom", "name",
        "arguments", "input", "id", "call_id", "tool_call_id", "output", "outputs", "summary",
        "results", "action", "approve", "approval_request_id", "server_label", "namespace",
        "tools", "file", "filename", "logs", "stdout", "item_type", "attachments", "error",
    ]
)  # fmt: skip
_WORDS = st.sampled_from(
    [*ITEM_TYPES, *CHAT_ROLES, *CONTENT_PART_TYPES, "function", "custom", "logs", "summary_text"]
)
_SCALARS = st.none() | st.booleans() | st.integers() | _WORDS | st.text(max_size=8)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=5),
    max_leaves=20,
)


_PARTS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(CONTENT_PART_TYPES), "text": st.text(), "refusal": st.text()}
    )
    | _JSON,
    max_size=3,
)


def _merged(base: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Items that look right (``base``) with random other keys added (base wins)."""
    return st.builds(lambda extra, good: {**extra, **good}, st.dictionaries(_KEYS, _JSON), base)


_ITEM = (
    _merged(
        st.fixed_dictionaries(
            {"role": st.sampled_from(list(CHAT_ROLES)), "content": st.none() | st.text() | _PARTS}
        )
    )
    | _merged(st.fixed_dictionaries({"type": st.sampled_from(ITEM_TYPES)}))
    | _JSON
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ITEM, min_size=1, max_size=4))
def test_any_json_is_read_or_refused_naming_a_field(transcript: list[Any]) -> None:
    """Whatever arrives, the parser answers with messages that can be stored, or a typed error."""
    refused: InvalidTranscriptError | None = None
    try:
        messages = parse_transcript(transcript)
    except InvalidTranscriptError as exc:
        refused = exc
    if refused is not None:
        assert refused.field is not None
        assert refused.field.startswith("transcript")
        assert refused.field in str(refused)
        return
    assert messages
    encoded = json.dumps(stored_json(messages), ensure_ascii=False).encode()
    again = [Message.model_validate(item) for item in json.loads(encoded)]
    assert again == messages
    assert parse_transcript(stored_json(messages)) == messages  # the stored form reads back
    render_lines(messages)  # and a summarizer can be shown it
