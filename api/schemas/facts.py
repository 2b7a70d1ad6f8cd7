"""Request and response bodies of the user-fact routes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field, JsonValue

from api.schemas.common import Id, RequestModel, ResponseModel
from tiers.models import MAX_TEXT

MAX_FACTS_PER_REQUEST = 1000

Source = Annotated[
    str, Field(min_length=1, max_length=256, description="Provenance, e.g. 'api' or 'crm-sync'.")
]


class FactPut(RequestModel):
    """Set one fact."""

    value: JsonValue = Field(description="Any JSON value.")
    source: Source = "api"
    confidence: Annotated[float, Field(ge=0.0, le=1.0, description="How sure the source is.")] = 1.0
    evidence: Annotated[
        str, Field(max_length=MAX_TEXT, description="What the source based it on.")
    ] = ""


class FactsPut(RequestModel):
    """Set several facts; each keeps its own history."""

    facts: dict[Id, JsonValue] = Field(
        max_length=MAX_FACTS_PER_REQUEST, description="Fact key -> JSON value."
    )
    source: Source = "api"


class FactOut(ResponseModel):
    """A fact (or one version of it) with its provenance."""

    user_id: str
    key: str
    value: JsonValue
    source: str
    confidence: float
    evidence: str = Field(default="", description="What the source based it on.")
    updated_at: datetime


class FactList(ResponseModel):
    """Facts, in the order the route documents."""

    facts: list[FactOut]
