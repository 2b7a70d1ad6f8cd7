"""A scriptable OpenAI-compatible chat-completions server on 127.0.0.1, for tests.

It speaks just enough of ``POST /v1/chat/completions`` for litellm's OpenAI
provider (and the ``openai`` SDK under it) to run their real code paths:
responses are taken from a queue of :class:`StubReply` (then from an optional
``fallback`` callable), and every request body is recorded so a test can
check what the client actually sent.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass(frozen=True)
class StubReply:
    """One scripted HTTP answer.

    Attributes:
        status: HTTP status code.
        body: The exact response body (JSON text).
        headers: Extra response headers, e.g. ``{"Retry-After": "0"}``.
        delay: Seconds to wait before answering (a slow upstream).
    """

    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0

    @classmethod
    def chat(
        cls,
        content: str,
        *,
        prompt_tokens: int = 120,
        completion_tokens: int = 40,
        delay: float = 0.0,
    ) -> StubReply:
        """A successful chat completion whose assistant message is ``content``."""
        body = {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "stub-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        return cls(200, json.dumps(body), delay=delay)

    @classmethod
    def json(cls, payload: Any, **kwargs: Any) -> StubReply:
        """A successful chat completion whose content is ``payload`` as JSON text."""
        return cls.chat(json.dumps(payload), **kwargs)

    @classmethod
    def error(
        cls, status: int, message: str, *, headers: dict[str, str] | None = None
    ) -> StubReply:
        """An OpenAI-style error body with ``status``."""
        kind = {429: "rate_limit_error", 400: "invalid_request_error"}.get(status, "server_error")
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        return cls(status, json.dumps(body), headers=dict(headers or {}))


Fallback = Callable[[dict[str, Any]], StubReply]


class StubLLMServer:
    """The stub server; use as a context manager or call :meth:`start`/:meth:`stop`.

    Args:
        fallback: Answers a request (given its JSON body) once the queue is
            empty. Without it an empty queue answers HTTP 500, so a test that
            makes more calls than it scripted fails loudly.
    """

    def __init__(self, fallback: Fallback | None = None) -> None:
        self.fallback = fallback
        self._queue: deque[StubReply] = deque()
        self._requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        # Daemon handler threads: a client that timed out must not keep stop() waiting.
        self._server.daemon_threads = True
        # A short poll interval keeps stop() (and so each test's teardown) quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        """The loopback port the server listens on."""
        return int(self._server.server_address[1])

    @property
    def api_base(self) -> str:
        """Base URL to pass as litellm's ``api_base``."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """JSON bodies of the chat-completion requests received so far, in order."""
        with self._lock:
            return list(self._requests)

    def enqueue(self, *replies: StubReply) -> None:
        """Append replies to the script, answered in order."""
        with self._lock:
            self._queue.extend(replies)

    def start(self) -> Self:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (if started), close the socket and wake any reply still sleeping."""
        self._closing.set()
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _next_reply(self, body: dict[str, Any]) -> StubReply:
        with self._lock:
            self._requests.append(body)
            if self._queue:
                return self._queue.popleft()
        if self.fallback is not None:
            return self.fallback(body)
        return StubReply.error(500, "stub server: no scripted reply left")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        stub = self
        counter = itertools.count(1)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(StubReply.error(404, f"no route {self.path}"))
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._send(StubReply.error(400, "request body is not JSON"))
                    return
                body["_stub_request_no"] = next(counter)
                reply = stub._next_reply(body)
                if reply.delay and stub._closing.wait(reply.delay):
                    return
                self._send(reply)

            def _send(self, reply: StubReply) -> None:
                data = reply.body.encode()
                # The client may have hung up already (timeout test): that is expected.
                with contextlib.suppress(OSError):
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler
