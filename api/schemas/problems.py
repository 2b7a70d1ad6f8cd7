"""The one error shape of the API: RFC 9457 problem details."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class FieldError(BaseModel):
    """One invalid field of a request."""

    field: str = Field(description="Dotted path of the field, e.g. 'summary.decisions_made.0'.")
    location: str = Field(description="Where the field is: body, path, query or header.")
    message: str
    type: str = Field(description="Machine-readable kind of the error, e.g. 'string_too_long'.")


class Problem(BaseModel):
    """An RFC 9457 problem details object; every failure of the API has this shape.

    Extra members carry details of some problems (``step`` and ``idempotency_key``
    of an input mismatch, ``reason`` of an unavailable summarizer, ``checks`` of
    a failed readiness probe).
    """

    model_config = ConfigDict(extra="allow")

    type: str = Field(
        description="URI naming the kind of problem, e.g. 'urn:tiermem:problem:fact-not-found'."
    )
    title: str = Field(description="Short summary of the kind of problem.")
    status: int = Field(ge=400, le=599, description="The HTTP status code.")
    detail: str = Field(description="What went wrong this time, and how to fix it.")
    instance: str | None = Field(default=None, description="The request path.")
    request_id: str | None = Field(default=None, description="The X-Request-ID of the request.")
    field: str | None = Field(default=None, description="The offending field, when there is one.")
    errors: list[FieldError] | None = Field(
        default=None, description="Every invalid field (validation errors)."
    )
