"""Request and response bodies of the continuation-context route."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from api.schemas.common import RequestModel, ResponseModel, UtcDatetime
from tiers.models import MAX_TEXT
from tiers.session import MAX_TOP_K

MAX_CONTEXT_TOKENS = 1_000_000


class ContextRequest(RequestModel):
    """What the new session is about, and how many tokens the context may use."""

    query: Annotated[str, Field(max_length=MAX_TEXT)] = Field(
        default="", description="The new session's topic; empty: the most recent sessions."
    )
    max_tokens: Annotated[int, Field(ge=1, le=MAX_CONTEXT_TOKENS)] | None = Field(
        default=None, description="Token budget; default: the server's context_max_tokens."
    )
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] = 5
    now: UtcDatetime | None = Field(
        default=None,
        description=(
            "When the query is asked, for the times it names relative to it ('last March', "
            "'two weeks ago'); default: the server's current time."
        ),
    )


class ContextSectionOut(ResponseModel):
    """One part of the context and what it cost."""

    name: str
    text: str
    tokens: int
    items: list[str] = Field(description="Fact keys or session ids in this section.")


class ContextOut(ResponseModel):
    """A prompt-ready continuation context and how it was assembled."""

    user_id: str
    text: str
    tokens: int
    max_tokens: int
    sections: list[ContextSectionOut]
    omitted_session_ids: list[str]
    omitted_fact_keys: list[str]
