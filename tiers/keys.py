"""Every storage space and key format of the tiers, in one place.

A space groups what is read in order or written together. Each starts with the
tenant, so one tenant's data can never be addressed by another's ids (ids are
validated by :mod:`tiers.ids` and cannot contain ``:``).
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote

SEQ_WIDTH = 12


def runs_space(tenant: str) -> str:
    """Index of a tenant's runs: key run_id -> RunInfo."""
    return f"{tenant}:runs"


def run_space(tenant: str, run_id: str) -> str:
    """Everything of one run: its checkpoints and idempotency index."""
    return f"{tenant}:run:{run_id}"


def checkpoint_key(seq: int) -> str:
    """Zero-padded so key order is sequence order."""
    return f"ckpt:{seq:0{SEQ_WIDTH}d}"


CHECKPOINT_PREFIX = "ckpt:"


def idempotency_key(key: str) -> str:
    """Maps an idempotency key to the checkpoint that committed it."""
    return f"idem:{key}"


IDEMPOTENCY_PREFIX = "idem:"


def event_key(seq: int) -> str:
    """One event of a run's append-only log; zero-padded so key order is seq order."""
    return f"ev:{seq:0{SEQ_WIDTH}d}"


EVENT_PREFIX = "ev:"


def effect_key(key: str) -> str:
    """The ledger entry of one external effect, by its idempotency key."""
    return f"eff:{key}"


EFFECT_PREFIX = "eff:"


def snapshot_key(seq: int) -> str:
    """The run's state as of checkpoint ``seq`` (written every K events and at branch roots)."""
    return f"snap:{seq:0{SEQ_WIDTH}d}"


SNAPSHOT_PREFIX = "snap:"


def approval_key(key: str) -> str:
    """One approval gate of a run, by its key."""
    return f"appr:{key}"


APPROVAL_PREFIX = "appr:"


def sessions_space(tenant: str, user_id: str) -> str:
    """One user's session summaries: key session_id -> SessionSummary."""
    return f"{tenant}:user:{user_id}:sessions"


def facts_space(tenant: str, user_id: str) -> str:
    """One user's current facts: key fact name -> UserFact.

    A fact's *name* is its key, or on a store that keeps key names opaque (an
    encrypted one: :class:`~tiers.backends.base.TokenizesKeys`) the store's
    token of the key in this space; the key itself is inside the UserFact.
    """
    return f"{tenant}:user:{user_id}:facts"


def fact_history_space(tenant: str, user_id: str) -> str:
    """Every earlier version of a user's facts: key :func:`fact_history_key`."""
    return f"{tenant}:user:{user_id}:fact-history"


def fact_history_key(fact_name: str, micros: int, digest: str) -> str:
    """One earlier version of a fact: ``<fact name>/<epoch micros, 20 digits>-<digest>``.

    The name is the fact's in :func:`facts_space` (its key or token), so one
    prefix scan (:func:`fact_history_prefix`) finds a fact's history; ``/``
    occurs in no fact key or token, so no other fact's versions match.
    """
    return f"{fact_name}/{micros:020d}-{digest}"


def fact_history_prefix(fact_name: str) -> str:
    """What every history key of the fact named ``fact_name`` starts with."""
    return f"{fact_name}/"


def fact_name_of_history_key(key: str) -> tuple[str, str]:
    """A :func:`fact_history_key` split into the fact's name and the rest (``/`` included)."""
    name, slash, rest = key.partition("/")
    return name, slash + rest


def fact_names_space(space: str) -> str | None:
    """The facts space whose fact names the keys of ``space`` hold, if it is a user's facts space
    (itself) or fact history space (its facts space); ``None`` for every other space.

    For maintenance that renames facts (``tiermem encrypt``): a fact's history
    keys use the name the fact has in the facts space.
    """
    parts = space.split(":")
    if len(parts) != 4 or parts[1] != "user":
        return None
    if parts[3] == "facts":
        return space
    if parts[3] == "fact-history":
        return facts_space(parts[0], parts[2])
    return None


def users_space(tenant: str) -> str:
    """Index of a tenant's users that have anything stored: key user_id -> b"1"."""
    return f"{tenant}:users"


def session_outbox_space(tenant: str) -> str:
    """Session index work not yet confirmed done: key :func:`session_outbox_key` -> a write token."""
    return f"{tenant}:session-outbox"


def session_windows_outbox_space(tenant: str) -> str:
    """Sessions searchable by their base vector whose other window vectors are still to come.

    Key :func:`session_outbox_key` -> a token; the second, lower-priority pass of
    the session index (:mod:`tiers.session._index`) embeds the windows and removes it.
    """
    return f"{tenant}:session-windows-outbox"


def session_outbox_key(user_id: str, session_id: str) -> str:
    """Outbox key of one session (ids cannot contain ``/``, so this is unambiguous)."""
    return f"{user_id}/{session_id}"


def session_vector_id(tenant: str, user_id: str, session_id: str) -> str:
    """Id of a session's document in the vector index: deterministic, so re-saves replace it."""
    return f"{tenant}/{user_id}/{session_id}"


# -- namespaced items (tiers.items): a key-value store of JSON documents under string-tuple
# namespaces (what LangGraph's BaseStore holds). A namespace is encoded by item_namespace_code(),
# whose alphabet has no "#", so "<code>#<key>" names exactly one item, and the code of a
# namespace is a string prefix of the codes of exactly the namespaces below it.


def item_label_code(label: str) -> str:
    """One namespace label, percent-encoded (RFC 3986 unreserved characters kept), then ``/``.

    Raises:
        UnicodeEncodeError: The label holds a lone surrogate (the caller names the field).
    """
    return quote(label, safe="") + "/"


def item_namespace_code(namespace: tuple[str, ...]) -> str:
    """A namespace as a key: ``("a", "b/c")`` -> ``a/b%2Fc/``; a prefix of its descendants' codes."""
    return "".join(item_label_code(label) for label in namespace)


def item_address(namespace_code: str, key: str) -> str:
    """Key of one item in :func:`items_space`: ``<namespace code>#<item key>`` (the key as is)."""
    return f"{namespace_code}#{key}"


def items_space(tenant: str) -> str:
    """Every item of a tenant: key :func:`item_address` -> the item record (JSON)."""
    return f"{tenant}:items"


def item_vectors_space(tenant: str) -> str:
    """The embeddings of a tenant's items (authoritative; the vector index is rebuilt from them).

    Key :func:`item_vector_key` -> one float32 little-endian vector.
    """
    return f"{tenant}:item-vectors"


def item_vector_key(address: str, n: int) -> str:
    """The ``n``-th (from 0) vector of the item at ``address`` (read by exact key, never scanned)."""
    return f"{address}#{n:04d}"


def item_namespaces_space(tenant: str) -> str:
    """Index of a tenant's namespaces that hold items: key namespace code -> a write token."""
    return f"{tenant}:item-namespaces"


def user_item_namespaces_space(tenant: str, user_id: str) -> str:
    """Namespaces holding items owned by one user: key namespace code -> b""."""
    return f"{tenant}:user:{user_id}:item-namespaces"


def item_expiry_space(tenant: str) -> str:
    """Items with a TTL by expiry time: key ``<expiry epoch micros, 20 digits>/<address>`` -> b""."""
    return f"{tenant}:item-expiry"


def item_expiry_key(micros: int, address: str) -> str:
    """Zero-padded so key order is expiry order."""
    return f"{micros:020d}/{address}"


def item_outbox_space(tenant: str) -> str:
    """Items whose vectors the index may not hold yet: key address -> how many it may hold."""
    return f"{tenant}:item-outbox"


def item_vector_id(tenant: str, address: str, n: int) -> str:
    """Id of an item's ``n``-th vector in the index.

    ``|`` is outside the id alphabet, so no session vector id
    (:func:`session_vector_id`) can ever equal one; the digest keeps ids short.
    """
    digest = hashlib.sha256(address.encode()).hexdigest()[:40]
    return f"{tenant}|item|{digest}#{n}"


def tenant_config_space(tenant: str) -> str:
    """A tenant's own settings, stored with its data: key ``retention`` -> its retention overrides,
    ``task-format`` -> the layout version of its runs (:data:`TASK_FORMAT_KEY`)."""
    return f"{tenant}:config"


RETENTION_KEY = "retention"

TASK_FORMAT_KEY = "task-format"
"""Key in :func:`tenant_config_space` of the layout version the tenant's runs are written in."""


def api_keys_space() -> str:
    """API keys of every tenant: key key_id -> the key's record (a SHA-256 of the secret, never the secret).

    Not under a tenant: a key is looked up before its tenant is known. Tenants are
    ids, which start with a letter or digit, so ``_system`` can never be a tenant's space.
    """
    return "_system:api-keys"


def tenants_space() -> str:
    """Every tenant a :class:`memory.Memory` was opened for: key tenant -> b"1".

    What a check or repair of every tenant (``tiermem reindex --all-tenants``,
    the service's index check) goes through.
    """
    return "_system:tenants"


def keyring_space() -> str:
    """The data keys of an encrypted store, each wrapped by the master key (see ``encrypted_kv``).

    Key ``master`` -> the master key's id; key ``dek:<tenant>`` -> that tenant's wrapped data key.
    Outside every tenant, like :func:`api_keys_space`; an encrypted store refuses callers' reads
    and writes of it.
    """
    return "_system:keyring"


def opaque_names_space() -> str:
    """Which key names of an encrypted store are opaque tokens (see ``encrypted_kv``).

    Key ``facts`` present: fact names are the store's tokens of the fact keys
    (a store encrypted by an earlier tiermem kept fact keys readable until
    ``tiermem encrypt`` renamed them). Outside every tenant, like
    :func:`keyring_space`, and closed to callers of an encrypted store as it is.
    """
    return "_system:opaque-names"


def transcripts_space(tenant: str, user_id: str) -> str:
    """One user's raw session transcripts: a header per session id plus ``<session_id>/<page>``."""
    return f"{tenant}:user:{user_id}:transcripts"


def session_vectors_space(tenant: str, user_id: str) -> str:
    """How many window vectors each session of a user may have in the index (an upper bound).

    Key session_id -> the count as ASCII digits; vector ids are
    :func:`session_vector_id` and :func:`session_chunk_vector_id` 1..count.
    """
    return f"{tenant}:user:{user_id}:session-vectors"


def session_terms_space(tenant: str, user_id: str) -> str:
    """Each session's keyword term counts, kept so recall need not re-read every transcript.

    Key session_id -> a term-count record (:mod:`tiers.session._terms`), written
    by the index pass and deleted in the commit of any change of the session.
    """
    return f"{tenant}:user:{user_id}:session-terms"


def session_revisions_space(tenant: str) -> str:
    """A token per user, replaced in the same commit as any change of the user's sessions.

    Lets a process tell whether what it cached about a user's sessions is still current.
    """
    return f"{tenant}:session-revisions"


def session_chunk_vector_id(tenant: str, user_id: str, session_id: str, n: int) -> str:
    """Id of the ``n``-th extra window vector of a session (``n`` >= 1)."""
    return f"{session_vector_id(tenant, user_id, session_id)}#{n}"


# -- graph threads (tiers.threads): checkpoint DAGs of graph frameworks such as LangGraph --------
#
# Inside a thread's space every key is "<kind>:" + components joined by ":", each component passed
# through key_part() so that no caller-chosen string (namespace, channel, id) can contain the
# separator: a prefix scan of one namespace never reaches another.


def key_part(text: str) -> str:
    """One component of a thread key: ``%`` and ``:`` percent-encoded, everything else as is.

    Order-preserving for strings without those two characters (LangGraph's UUID checkpoint ids),
    so a reverse scan of a namespace's checkpoints is newest first.
    """
    if "%" in text or ":" in text:
        return text.replace("%", "%25").replace(":", "%3A")
    return text


def threads_space(tenant: str) -> str:
    """Index of a tenant's graph threads: key thread key -> the thread id (UTF-8)."""
    return f"{tenant}:threads"


def thread_space(tenant: str, thread_key: str) -> str:
    """Everything of one graph thread: heads, checkpoints, channel blobs, pending writes, effects."""
    return f"{tenant}:thread:{thread_key}"


def thread_runs_space(tenant: str) -> str:
    """Which threads a framework run wrote to: key ``<run>:<thread key>`` -> b"" (for delete-by-run)."""
    return f"{tenant}:thread-runs"


def thread_head_key(ns: str) -> str:
    """The newest checkpoint of a namespace of a thread: what the next writer must build on."""
    return f"h:{key_part(ns)}"


def thread_checkpoint_prefix(ns: str) -> str:
    """Every checkpoint of one namespace, in checkpoint-id order."""
    return f"c:{key_part(ns)}:"


THREAD_CHECKPOINT_PREFIX = "c:"
THREAD_HEAD_PREFIX = "h:"


def thread_checkpoint_key(ns: str, checkpoint_id: str) -> str:
    """One checkpoint record."""
    return f"{thread_checkpoint_prefix(ns)}{key_part(checkpoint_id)}"


def thread_blob_key(ns: str, channel: str, version: str) -> str:
    """One channel value at one version: stored once, shared by every checkpoint that has it."""
    return f"b:{key_part(ns)}:{key_part(channel)}:{key_part(version)}"


THREAD_BLOB_PREFIX = "b:"


def thread_writes_prefix(ns: str, checkpoint_id: str) -> str:
    """Every pending write recorded against one checkpoint."""
    return f"w:{key_part(ns)}:{key_part(checkpoint_id)}:"


THREAD_WRITES_PREFIX = "w:"


def thread_write_key(ns: str, checkpoint_id: str, task_id: str, idx: int) -> str:
    """One pending write: task and index within the task (negative for special channels)."""
    return f"{thread_writes_prefix(ns, checkpoint_id)}{key_part(task_id)}:{idx}"


def thread_run_key(run_id: str, ns: str, checkpoint_id: str) -> str:
    """Marks a checkpoint of a thread as written by a framework run (for delete-by-run)."""
    return f"r:{key_part(run_id)}:{key_part(ns)}:{key_part(checkpoint_id)}"


THREAD_RUN_PREFIX = "r:"


def thread_effect_key(key: str) -> str:
    """The ledger entry of one external effect run from inside a graph node."""
    return f"e:{key_part(key)}"


def thread_chunk_key(key: str, n: int) -> str:
    """Chunk ``n`` (from 0) of a value over the store's per-value limit, outside every scanned prefix."""
    return f"x:{key}#{n}"


# -- durable summary jobs (tiers.session._jobs) ----------------------------------------------------------


def jobs_space(tenant: str) -> str:
    """A tenant's summary jobs: key job_id -> SummaryJob (read by id from any replica)."""
    return f"{tenant}:jobs"


def user_jobs_space(tenant: str, user_id: str) -> str:
    """One user's summary jobs: key job_id -> b"" (what erasure deletes with the user)."""
    return f"{tenant}:user:{user_id}:jobs"


def job_queue_space(tenant: str) -> str:
    """A tenant's unfinished jobs: key :func:`job_queue_key` -> when it may be claimed (epoch µs).

    Keys group by user and sort by age within a user, so a scan can take users in turn.
    """
    return f"{tenant}:job-queue"


def job_queue_key(user_id: str, created_micros: int, job_id: str) -> str:
    """Queue key of one job: ``<user>/<created epoch µs, 20 digits>/<job_id>``."""
    return f"{user_id}/{created_micros:020d}/{job_id}"


def job_queue_past_user(user_id: str) -> str:
    """A ``start_after`` that skips every queue key of ``user_id`` (digits sort before ``~``)."""
    return f"{user_id}/~"


def jobs_done_space(tenant: str) -> str:
    """A tenant's finished jobs by finishing time: key :func:`job_done_key` -> b"" (for purging)."""
    return f"{tenant}:jobs-done"


def job_done_key(finished_micros: int, job_id: str) -> str:
    """Zero-padded so key order is finishing order."""
    return f"{finished_micros:020d}/{job_id}"


def job_tenants_space() -> str:
    """Tenants that may have unfinished jobs: key tenant -> a token replaced by every submission.

    Not under a tenant: every replica's workers read it to find work. Like
    :func:`api_keys_space`, ``_system`` can never be a tenant's space.
    """
    return "_system:job-tenants"


# -- placement: which spaces a sharded store must keep together ---------------------------------

SYSTEM_PREFIX = "_system:"


def placement(space: str) -> str:
    """The slot group of ``space``: spaces with one placement are kept on one shard.

    Every space of a tenant starts with the tenant and a ``:``, so its placement is the
    tenant: a run, a user's facts, sessions and outboxes, and the tenant-wide indexes
    share one, and no operation of a tenant spans shards. A space outside every tenant
    (``_system:...``, or one without a tenant part) is its own placement. A store that
    shards (Redis Cluster) refuses a commit whose spaces have different placements.
    """
    tenant, colon, _ = space.partition(":")
    if not colon or not tenant or space.startswith(SYSTEM_PREFIX):
        return space
    return tenant
