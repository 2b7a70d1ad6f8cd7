"""Stored keyword term counts per session, so a cold recall need not re-read every transcript.

Keyword search (BM25, :mod:`tiers.session._recall`) needs each session's term
counts over its summary text and full transcript. Counting them means reading
and tokenising every transcript of the user: most of a user's first recall
after a restart. So the index pass, which reads the summary and transcript
anyway, stores the counts as one small record per session in
``session_terms_space`` (:func:`tiers.keys.session_terms_space`), and the view
(:mod:`tiers.session._view`) reads them in one batched call.

**Record** (JSON): ``{"schema_version": 1, "fingerprint": ..., "n": ..., "terms": {term: count}}``.
``fingerprint`` names the stored bytes the counts were made from (summary
record, transcript header) and the counting scheme; ``n`` is the total count
(also a cheap integrity check). A record is used only when its version is
known and its fingerprint is that of the session's records as read now;
anything else (no record, a stale, damaged or newer one) is counted from the
transcript instead, exactly as before records existed. So sessions stored by
older releases need no migration: they are counted on a cold recall until
their next index pass (any save or change of the session) writes their record.

**Lifecycle** ("deleting means gone"): only the index pass writes a record, in
the commit that clears the session's outbox entry under a check of the token
it read (see :mod:`tiers.session._index`): any change of the session since
(every change writes a new token) makes that commit fail, so a deleted or
replaced session never gets a record back. Every commit that saves a summary,
replaces or drops a transcript or deletes the session deletes the record with
it; erasing a user deletes the whole space.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

import orjson

from tiers import keys
from tiers.backends.base import Delete, Put, Write
from tiers.models import Message
from tiers.session._chunking import keyword_text
from tiers.session._keyword import term_counts

__all__ = [
    "TERMS_SCHEMA_VERSION",
    "count_terms",
    "encode_terms",
    "read_terms",
    "summary_digest",
    "summary_fields",
    "terms_fingerprint",
    "terms_write",
]

logger = logging.getLogger(__name__)

TERMS_SCHEMA_VERSION = 1
"""Layout of a term-count record; a reader ignores records of any other version."""

# Part of every fingerprint: change it when the counted text or the tokenizer changes
# (stopwords, stemming), and every stored record counts as stale.
_SCHEME = b"tiermem-session-terms/1"

_TEXT_FIELDS = (
    "decisions_made",
    "work_completed",
    "open_questions",
    "next_recommended_steps",
)


def summary_fields(data: bytes) -> tuple[str, float] | None:
    """Content text and creation timestamp of a stored summary, or None if it is unreadable.

    Plain JSON parsing: about ten times cheaper than validating the record,
    which only the sessions actually returned need.
    """
    try:
        raw = json.loads(data)
        parts = [raw.get("task_description") or ""]
        for name in _TEXT_FIELDS:
            parts.extend(item for item in raw.get(name) or [] if isinstance(item, str))
        created = datetime.fromisoformat(raw["created_at"]).timestamp()
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return "\n".join(part for part in parts if isinstance(part, str) and part), created


def summary_digest(data: bytes) -> bytes:
    """A short fingerprint of a stored summary record (to tell whether it changed)."""
    return hashlib.blake2b(data, digest_size=16).digest()


def terms_fingerprint(digest: bytes, raw_header: bytes | None) -> str:
    """What a session's term counts are made from: its summary's digest and transcript header.

    Args:
        digest: :func:`summary_digest` of the stored summary record.
        raw_header: The stored transcript header (it holds the transcript's
            checksum), or ``None`` when the session has no transcript.
    """
    hasher = hashlib.blake2b(_SCHEME, digest_size=16)
    hasher.update(digest)
    hasher.update(b"\xff" if raw_header is None else b"\x00" + raw_header)
    return hasher.hexdigest()


def count_terms(text: str, messages: Sequence[Message] | None) -> dict[str, int]:
    """Term counts of a session: its summary content ``text`` plus its transcript, if any."""
    return term_counts(keyword_text(text, messages))


def encode_terms(fingerprint: str, counts: Mapping[str, int]) -> bytes:
    """The stored bytes of a term-count record."""
    return orjson.dumps(
        {
            "schema_version": TERMS_SCHEMA_VERSION,
            "fingerprint": fingerprint,
            "n": sum(counts.values()),
            "terms": dict(counts),
        }
    )


def read_terms(raw: bytes | None, fingerprint: str, *, where: str) -> dict[str, int] | None:
    """The counts of a stored record if it is current (made from ``fingerprint``), else None.

    A missing, stale or newer record is simply not used (the caller counts the
    session instead); a damaged one is logged too.
    """
    if raw is None:
        return None
    try:
        record = orjson.loads(raw)
        if record.get("schema_version") != TERMS_SCHEMA_VERSION:
            return None
        if record.get("fingerprint") != fingerprint:
            return None
        terms = record["terms"]
        # Sums in C; a count that is not a number, or a lost term, fails here.
        if not isinstance(terms, dict) or sum(terms.values()) != record["n"]:
            raise ValueError("the counts do not add up to the record's total")
    except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        logger.error("ignoring an unreadable term-count record at %s: %s", where, exc)
        return None
    return terms


def terms_write(tenant: str, user_id: str, session_id: str, record: bytes | None) -> Write:
    """The write storing a session's term-count record, or deleting it (``record`` None)."""
    space = keys.session_terms_space(tenant, user_id)
    return Delete(space, session_id) if record is None else Put(space, session_id, record)
