"""Adapters that plug tiermem into the agent frameworks people already run.

Each adapter sits above the :class:`memory.Memory` facade and uses only its
public API (as ``api/`` does). Each needs the framework, installed by an extra
of its own; importing an adapter without it raises :class:`MissingExtraError`
naming the extra to install:

============================  =========================  ==============================
module                        what it provides           install
============================  =========================  ==============================
``integrations.langgraph``    checkpointer and store     ``pip install 'tiermem[langgraph]'``
``integrations.openai_agents``  Agents SDK session       ``pip install 'tiermem[openai-agents]'``
``integrations.mcp``          MCP server (``tiermem mcp``)  ``pip install 'tiermem[mcp]'``
============================  =========================  ==============================
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Defined beside the storage drivers (the lowest layer that raises it); one class for both.
from tiers.backends import MissingExtraError

__all__ = ["MissingExtraError", "require"]


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``tiermem[extra]``.

    Adapters call this before their own imports of the framework, so a missing
    framework fails with the one fix, not with a bare ``ModuleNotFoundError``.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise MissingExtraError(
            f"{module!r} is not installed: this adapter needs the {extra!r} extra, "
            f"install it with: pip install 'tiermem[{extra}]'"
        ) from exc
