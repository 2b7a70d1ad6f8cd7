"""The client's connection to the tiermem service: requests out, typed errors back.

Every answer of 400 or more becomes the library's typed error through the
shared problem table (:func:`memory.problems.error_from_problem`); a service
that cannot be reached is :class:`~tiers.errors.BackendUnavailableError`, like
an unreachable store in the library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from memory.problems import error_from_problem
from tiers.errors import BackendUnavailableError, NotFoundError


class ServiceConnection:
    """HTTP requests to one tiermem service with one API key. Thread-safe.

    Args:
        base_url: Where the service listens, e.g. ``http://127.0.0.1:8080``.
        api_key: The key sent as a bearer token (``None``: none is sent).
        timeout: Seconds per HTTP request.
        transport: Another httpx transport (e.g. ``httpx.ASGITransport``).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float,
        transport: httpx.BaseTransport | None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json: object = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        """Send a request; a failure answer raises its typed error.

        Query parameters that are ``None`` are left out.

        Raises:
            BackendUnavailableError: The service cannot be reached.
            Exception: The typed error of a failure answer (see :mod:`memory.problems`).
        """
        try:
            response = self._http.request(
                method,
                path,
                json=json,
                params={k: v for k, v in (params or {}).items() if v is not None},
            )
        except httpx.TransportError as exc:
            raise BackendUnavailableError(
                f"cannot reach the tiermem service at {self.base_url}: {exc}; check that "
                "`tiermem serve` runs there, then retry"
            ) from exc
        if response.status_code >= 400:
            raise _error(response)
        return response

    def json(
        self,
        method: str,
        path: str,
        *,
        json: object = None,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        """Send a request and return its answer's JSON body (see :meth:`request`)."""
        return self.request(method, path, json=json, params=params).json()

    def deleted(self, path: str) -> bool:
        """``DELETE`` a resource: ``True`` if it existed, ``False`` for a 404."""
        try:
            self.request("DELETE", path)
        except NotFoundError:
            return False
        return True

    def close(self) -> None:
        """Close the HTTP connections. Idempotent."""
        self._http.close()


def _error(response: httpx.Response) -> Exception:
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    header = response.headers.get("retry-after")
    retry_after = float(header) if header and header.isdigit() else None
    return error_from_problem(response.status_code, problem, retry_after)
