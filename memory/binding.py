"""Callers bound to one user: the checks the HTTP routes and the MCP tools share.

An API key may be bound to one user of its tenant (``tiermem keys create
--user``), for an agent that acts for one end user. Such a caller is refused
every other user's data in two ways, chosen so that it learns nothing about
users or objects it may not reach:

- a request that names another user (a path, body or query ``user_id``) is
  refused outright (HTTP 403); the message names the key's own user, never the
  other one, and is the same whether that user has data or not
  (:func:`refusal`);
- an object addressed by its own id (a run, and its checkpoints, events,
  effects and approval gates) is looked up, and one of another user is
  reported exactly as an absent one (HTTP 404, :func:`owned_run`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiers.errors import RunNotFoundError
from tiers.models import RunInfo

if TYPE_CHECKING:
    from memory.facade import Memory

__all__ = ["allowed", "owned_run", "refusal", "user_filter"]


def refusal(bound_user: str, caller: str | None) -> str:
    """Why a caller bound to ``bound_user`` may not act for the user a request named.

    Args:
        bound_user: The one user the caller may act for.
        caller: How to name the caller (``"API key 0123456789ab"``), or ``None``.
    """
    who = "this API key" if caller is None else caller
    return (
        f"{who} is bound to user {bound_user!r}: it may act only for that user "
        "(use a key created without --user for other users)"
    )


def allowed(bound_user: str | None, user_id: str | None) -> bool:
    """Whether a caller bound to ``bound_user`` (``None``: to no user) may name ``user_id``.

    ``user_id`` ``None`` (a listing of no particular user) is allowed: see
    :func:`user_filter`.
    """
    return bound_user is None or user_id is None or user_id == bound_user


def user_filter(bound_user: str | None, user_id: str | None) -> str | None:
    """The user a listing is restricted to: the one asked for, else the caller's own.

    A caller bound to a user lists that user's objects only (check
    :func:`allowed` first); ``None`` only for a caller bound to no user that
    asked for every user.
    """
    return bound_user if user_id is None else user_id


def owned_run(memory: Memory, run_id: str, user_id: str) -> RunInfo:
    """The head of a run of ``user_id``; a run of another user is not found.

    The error for another user's run is the one for a run that does not exist
    (same type, same message), so a bound caller cannot tell them apart.

    Raises:
        InvalidInputError: Bad ``run_id``.
        RunNotFoundError: No such run, or it belongs to another user.
    """
    info = memory.get_run(run_id)
    if info.user_id != user_id:
        raise RunNotFoundError.absent(run_id, memory.tenant)
    return info
