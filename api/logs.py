"""Structured JSON logs, each line carrying the id of the request it belongs to."""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("tiermem_request_id", default=None)
"""The current request's id; set by the middleware, read by every log line."""

# Attributes every LogRecord has; anything else on a record is an ``extra`` field.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured copy of msg
}
# A record's own attributes come first in its __dict__ (insertion order), extras after them:
# only the tail needs checking, which keeps a log line cheap (one per request).
_OWN_ATTRIBUTES = len(logging.LogRecord("", 0, "", 0, "", None, None).__dict__)
_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id and extra fields."""

    # (second, its text): one attribute, so threads sharing the formatter never mix two.
    _second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self._timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id is not None:
            entry["request_id"] = request_id
        attributes = record.__dict__
        if len(attributes) > _OWN_ATTRIBUTES:
            for key, value in list(attributes.items())[_OWN_ATTRIBUTES:]:
                if key not in _STANDARD and not key.startswith("_"):
                    entry[key] = value
        if record.exc_info:
            # Tracebacks go to the operator's logs, never to a client.
            entry["exc_info"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry)

    def _timestamp(self, created: float) -> str:
        """ISO 8601 UTC with milliseconds, like ``datetime.isoformat(timespec="milliseconds")``.

        The part up to the second is formatted once a second.
        """
        second = int(created)
        millis = round((created - second) * 1_000_000) // 1000  # microseconds, as datetime rounds
        if millis >= 1000:
            return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
        cached, text = self._second
        if cached != second:
            text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            self._second = (second, text)
        return f"{text}.{millis:03d}+00:00"


def logging_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` mapping: JSON lines on stderr for tiermem and uvicorn."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"stderr": handler},
        "loggers": {
            "tiermem": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            # Access lines come from tiermem.access, with the request id and route template.
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        },
        "root": {"handlers": ["stderr"], "level": "WARNING"},
    }
