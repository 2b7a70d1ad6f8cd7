"""A scripted model for the OpenAI Agents SDK, and a worker process that runs one turn with it.

``python -m tests.integrations.agents_worker DATA_DIR SESSION_ID USER_ID "question"``
opens the embedded Memory in DATA_DIR, runs one ``Runner.run`` turn of an
agent whose model is :class:`ScriptedModel` (no network) with a
``TiermemSession``, and prints one JSON object: the session's items before the
turn, the input the model got, and the items after it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import (
    ModelResponse,
    TResponseInputItem,
    TResponseOutputItem,
    TResponseStreamEvent,
)
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam

from memory import Memory
from memory.integrations.openai_agents import TiermemSession

set_tracing_disabled(True)  # tracing would export to OpenAI's servers


class ScriptedModel(Model):
    """A model that first calls the ``lookup_order`` tool, then answers with the tool's output.

    Each call records the system instructions and input it got, so a test can
    see what history the SDK passed in.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, list[Any]]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: ResponsePromptParam | None = None,
    ) -> ModelResponse:
        items: list[Any] = (
            [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        )
        self.calls.append((system_instructions, items))
        n = len(self.calls)
        last = items[-1]
        output: list[TResponseOutputItem]
        if last.get("type") == "function_call_output":
            text = f"Your order: {last['output']}"
            output = [
                ResponseOutputMessage(
                    id=f"msg_{n}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
                )
            ]
        else:
            output = [
                ResponseFunctionToolCall(
                    type="function_call",
                    id=f"fc_{n}",
                    call_id=f"call_{n}",
                    name="lookup_order",
                    arguments=json.dumps({"order_id": "A-17"}),
                    status="completed",
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: ResponsePromptParam | None = None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the scripted model does not stream")


@function_tool
def lookup_order(order_id: str) -> str:
    """Look an order up by its id."""
    return f"order {order_id} ships on Tuesday"


def make_agent(model: ScriptedModel, session: TiermemSession, base: str = "Be brief.") -> Agent:
    """An agent on the scripted model whose instructions carry the session's continuation context."""
    return Agent(
        name="support",
        instructions=session.instructions(base),
        model=model,
        tools=[lookup_order],
    )


async def one_turn(data_dir: str, session_id: str, user_id: str, question: str) -> dict[str, Any]:
    memory = Memory.open(data_dir)
    try:
        session = TiermemSession(memory, session_id, user_id=user_id)
        before = await session.get_items()
        model = ScriptedModel()
        result = await Runner.run(make_agent(model, session), question, session=session)
        return {
            "before": before,
            "model_input": model.calls[0][1],
            "final_output": result.final_output,
            "after": await session.get_items(),
        }
    finally:
        memory.close()


if __name__ == "__main__":
    data_dir, session_id, user_id, question = sys.argv[1:5]
    print(json.dumps(asyncio.run(one_turn(data_dir, session_id, user_id, question))))
