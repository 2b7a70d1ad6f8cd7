"""Redis implementation of :class:`~tiers.backends.base.KVStore`.

A space is two Redis keys sharing one hash tag (so a cluster keeps them on one
slot): a hash of key -> value and a sorted set of keys (all score 0, ordered
lexicographically by bytes) for ordered scans. Commits and scans run as Lua
scripts, so checks and writes are atomic and a scan is a consistent snapshot.
All checks run before the first write, and no write command of a commit can
fail on keys of the right type, so a script never stops half-way (Redis does
not roll a script back).

A commit is never re-sent by the client after a timeout or dropped connection:
the first attempt may have been applied, and a re-sent checked commit would
then report a conflict with itself. Such a failure is a
:class:`BackendUnavailableError` (not acknowledged; the caller re-reads).

Durability is the server's: run it with ``appendonly yes`` and
``appendfsync always`` for commits that survive a power cut.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import ConnectionInterface
from redis.exceptions import NoScriptError, RedisClusterException
from redis.retry import Retry

from tiers.backends import redact_url
from tiers.backends._redis_ranges import Listings, tighter_high, tighter_low
from tiers.backends._redis_scripts import (
    COMMIT,
    SCAN,
    SCAN_INLINE_BYTES,
    exec_replies,
    guessed_read,
    resp_command,
    scan_pairs,
    write_groups,
)
from tiers.backends.base import DEFAULT_MAX_VALUE_BYTES, Check, Write
from tiers.backends.common import (
    check_checks,
    check_reads,
    check_scan,
    check_writes,
    prefix_upper_bound,
)
from tiers.errors import BackendUnavailableError, ConflictError, InvalidInputError, StoreClosedError

# The most bytes a connection takes from its socket per read (redis-py's default 64 KiB):
# a page of history (100 checkpoints of 5 KB) then arrives in a few reads, not one per
# 64 KiB, which saved about a tenth of such a scan's client CPU.
_READ_BYTES = 256 * 1024

# Listings a scan reads the values of outside the script (each one changed by a commit
# before its values were read) before the script reads them itself (see _scan_range).
_RELISTS = 2


class RedisKVStore:
    """A :class:`KVStore` on a Redis server.

    Args:
        url: A ``redis://`` or ``rediss://`` URL.
        key_prefix: Prefix of every Redis key this store touches.
        max_value_bytes: Largest value accepted by :meth:`commit`.
        client: An existing client to use instead of connecting to ``url``. It
            must not decode responses; its retry policy is the caller's (give it
            none, or a failed commit may be re-sent), and :meth:`close` leaves
            it open.

    Raises:
        InvalidInputError: The URL or ``key_prefix`` is malformed.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        key_prefix: str = "tm",
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        client: redis.Redis | None = None,
    ) -> None:
        if ":" in key_prefix or "{" in key_prefix:
            raise InvalidInputError("key_prefix must not contain ':' or '{'", field="key_prefix")
        self.max_value_bytes = max_value_bytes
        self._prefix = key_prefix
        self._closed = False
        self._owns_client = client is None
        try:
            self._client: redis.Redis | RedisCluster = client or self._connect(url)
        except ValueError as exc:
            raise InvalidInputError(
                f"invalid Redis URL {redact_url(url)!r}: {exc}", field="url"
            ) from exc
        self._commit_script = self._client.register_script(COMMIT)
        self._scan_script = self._client.register_script(SCAN)
        # This store's idle connections (see _send), and the process that opened them (a
        # forked child must not share their sockets).
        self._connections: list[ConnectionInterface] = []
        self._connections_pid = os.getpid()
        self._listings = Listings()

    def _connect(self, url: str) -> redis.Redis | RedisCluster:
        # No automatic retry (see the module docstring). A connection the
        # server dropped while idle is still replaced before use: the pool
        # checks each connection it hands out.
        return redis.Redis.from_url(
            url,
            socket_timeout=10,
            socket_connect_timeout=5,
            health_check_interval=30,
            retry=Retry(NoBackoff(), 0),
            socket_read_size=_READ_BYTES,
        )

    def _keys(self, space: str) -> tuple[str, str]:
        # All Redis key formats of this store live here.
        return f"{self._prefix}:{{{space}}}:v", f"{self._prefix}:{{{space}}}:k"

    def _ensure_open(self) -> None:
        if self._closed:
            raise StoreClosedError(
                "the Redis store is closed; open it again (Memory.open, or a new RedisKVStore)"
            )

    def _translate(self, what: str) -> _Translating:
        """``with`` it around a ``what`` (a read, a commit...): Redis's errors as this store's."""
        return _Translating(self, what)

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        """See :meth:`KVStore.get_many`."""
        check_reads(space, keys)
        if not keys:
            self._ensure_open()
            return []
        with self._translate("read"):
            values = self._hmget(self._keys(space)[0], keys)
        return [None if v is None else bytes(v) for v in values]

    def scan(
        self,
        space: str,
        *,
        prefix: str = "",
        start_after: str | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[tuple[str, bytes]]:
        """See :meth:`KVStore.scan`."""
        check_scan(space, prefix, start_after)
        # Lex ranges compare bytes; UTF-8 bytes order like code points, like str comparison.
        low = f"[{prefix}" if prefix else "-"
        upper = prefix_upper_bound(prefix) if prefix else None
        high = f"({upper}" if upper is not None else "+"
        if start_after is not None:
            if reverse:
                high = tighter_high(high, start_after)
            else:
                low = tighter_low(low, start_after)
        if limit is not None and limit <= 0:
            self._ensure_open()
            return []
        with self._translate("scan"):
            return self._scan_range(self._keys(space), low, high, reverse, limit)

    def _scan_range(
        self, names: tuple[str, str], low: str, high: str, reverse: bool, limit: int | None
    ) -> list[tuple[str, bytes]]:
        """The pairs of the lex range ``low``..``high`` of the space ``names``, a snapshot.

        The scan script lists the keys and, when their values are (estimated) at
        most ``SCAN_INLINE_BYTES``, reads them too: one round trip. Larger values are
        read in one ``MULTI``: ``HMGET`` of the listed keys and ``ZLEXCOUNT``
        of the range they span. Every key still there and no other key in that
        span means the listing is the range's at ``EXEC`` too, so keys and
        values are one snapshot (``EXEC``'s). Otherwise (a commit came between)
        the range is listed again; after ``_RELISTS`` listings the script reads
        the values itself, however many. A range read so before and unchanged since
        is one ``MULTI`` listing it and reading the keys listed last time (``Listings``).

        Raises:
            redis.RedisError: Redis failed.
        """
        hash_name, index_name = names
        args = [low.encode(), high.encode(), b"1" if reverse else b"0"]
        args += [b"%d" % (-1 if limit is None else limit), b"%d" % SCAN_INLINE_BYTES]
        asked = (hash_name, low, high, reverse, limit)
        listed: list[Any] | None = None
        guess = self._listings.guess(asked)
        if guess is not None:
            # One round trip: the range listed and the guessed keys' values, one snapshot.
            listed, values = self._read_guessed(hash_name, index_name, args, guess)
            if listed == guess and None not in values:
                return [(k.decode(), v) for k, v in zip(listed, values, strict=True)]
            if not listed:  # the range is empty at EXEC: its old names must not stay
                self._listings.forget(asked)
                return []
        for _ in range(_RELISTS):
            if listed is None:
                flat = self._run_scan([hash_name, index_name], args)
                if len(flat) != 1 or not isinstance(flat[0], list):
                    return scan_pairs(flat)
                listed = flat[0]
            # The span the listing covers: the range, cut at its last key by the limit.
            span = (args[0], args[1])
            if limit is not None and len(listed) >= limit:
                last = b"[" + bytes(listed[-1])
                span = (last, span[1]) if reverse else (span[0], last)
            values, count = self._read_listed(hash_name, index_name, listed, span)
            if int(count) == len(listed) and None not in values:
                self._listings.note(asked, listed)
                return [(k.decode(), v) for k, v in zip(listed, values, strict=True)]
            listed = None
        args[-1] = b"-1"
        return scan_pairs(self._run_scan([hash_name, index_name], args))

    def commit(self, writes: Sequence[Write], checks: Sequence[Check] = ()) -> None:
        """See :meth:`KVStore.commit`."""
        check_writes(writes, self.max_value_bytes)
        check_checks(checks)
        if not writes and not checks:
            self._ensure_open()
            return
        spaces: dict[str, int] = {}
        for item in (*checks, *writes):
            spaces.setdefault(item.space, len(spaces) + 1)
        self._check_spaces(list(spaces))
        keys: list[str] = []
        for space in spaces:
            keys.extend(self._keys(space))
        args: list[bytes] = [b"%d" % len(checks)]
        for check in checks:
            expected = check.expected
            args += (
                b"%d" % spaces[check.space],
                check.key.encode(),
                b"0" if expected is None else b"1",
                expected or b"",
            )
        args += write_groups(writes, spaces)
        try:
            with self._translate("commit"):
                reply = self._run_commit(keys, args)
        finally:  # applied, or maybe (an error can come after it was)
            self._listings.forget_deleted(writes, self._keys)
        if reply != 1:
            space_no, key = reply
            space = list(spaces)[int(space_no) - 1]
            raise ConflictError(
                f"check failed on {space!r}/{bytes(key).decode()!r}: the value changed; "
                "re-read and retry"
            )

    def _check_spaces(self, spaces: list[str]) -> None:
        """Refuse, before anything is sent, a commit this store cannot apply atomically.

        One server applies any commit; a sharded store overrides this.
        """

    def _run_commit(self, keys: list[str], args: list[bytes]) -> Any:
        """Run the commit script with ``args`` (one ``EVALSHA``, see :meth:`_send`); its reply.

        The reply is 1 (written) or ``[space number, key]`` of the check that failed.
        """
        return self._run_script(self._commit_script.sha, COMMIT, keys, args)

    def _run_scan(self, keys: list[str], args: list[bytes]) -> list[Any]:
        """Run the scan script with ``args`` (one ``EVALSHA``, see :meth:`_send`)."""
        reply: list[Any] = self._run_script(self._scan_script.sha, SCAN, keys, args)
        return reply

    def _read_listed(
        self, hash_name: str, index_name: str, listed: list[Any], span: tuple[bytes, bytes]
    ) -> tuple[list[Any], Any]:
        """``HMGET`` of the ``listed`` keys and ``ZLEXCOUNT`` of ``span``, in one ``MULTI``."""
        replies = self._send_all(
            [
                [b"MULTI"],
                [b"HMGET", hash_name.encode(), *listed],
                [b"ZLEXCOUNT", index_name.encode(), *span],
                [b"EXEC"],
            ]
        )
        return exec_replies(replies[-1])

    def _read_guessed(
        self, hash_name: str, index_name: str, args: list[bytes], guess: list[Any]
    ) -> tuple[list[Any], Any]:
        """The listing of the scan ``args``' range and the ``guess``ed keys' values, one ``MULTI``."""
        return exec_replies(self._send_all(guessed_read(hash_name, index_name, args, guess))[-1])

    def _hmget(self, name: str, fields: Sequence[str]) -> list[Any]:
        """``HMGET`` of ``fields`` of the hash ``name`` (see :meth:`_send`)."""
        reply: list[Any] = self._send([b"HMGET", name.encode(), *(f.encode() for f in fields)])
        return reply

    def _run_script(self, sha: str, source: str, keys: list[str], args: list[bytes]) -> Any:
        """``EVALSHA``; a script the server does not hold is loaded and sent again.

        As redis-py's ``Script`` does: ``NOSCRIPT`` means nothing ran (the
        server restarted or its scripts were flushed).
        """
        words = [b"EVALSHA", sha.encode(), b"%d" % len(keys), *[k.encode() for k in keys], *args]
        try:
            return self._send(words)
        except NoScriptError:
            self._client.script_load(source)
        return self._send(words)

    def _send(self, words: list[bytes]) -> Any:
        """Send one command, packed in one buffer, on a connection this store keeps; its reply.

        redis-py's packer cuts a command holding a value over 6,000 bytes
        into several buffers, one ``sendall`` each (three for a 5 KB
        checkpoint), and its pool's bookkeeping per command cost about half
        a commit's client CPU. So the command is packed here in one piece and
        sent on one of this store's own connections (made by the client's
        pool, checked before each use as the pool checks what it hands out).

        Raises:
            redis.RedisError: The server answered an error or cannot be reached.
        """
        return self._send_all([words])[0]

    def _send_all(self, commands: list[list[bytes]]) -> list[Any]:
        """Send ``commands`` in one buffer (see :meth:`_send`); their replies, in order.

        Raises:
            redis.RedisError: A command's reply is an error, or the server cannot be reached.
        """
        client = self._client
        if not isinstance(client, redis.Redis):
            raise TypeError("a RedisKVStore sends its commands through a redis.Redis client")
        packed = b"".join(resp_command(words) for words in commands)
        connection = self._take_connection(client)
        # redis-py leaves this method unannotated; this is the signature relied on.
        send: Callable[[list[bytes]], None] = connection.send_packed_command
        replies: list[Any] = []
        try:
            send([packed])
            while len(replies) < len(commands):
                replies.append(connection.read_response())
            return replies
        except redis.ResponseError:
            if len(replies) < len(commands) - 1:
                _disconnect(connection)  # later replies are unread: never reuse it as it is
            raise  # the last reply, an error read whole: the connection is clean
        except BaseException:
            # Anything else may leave a reply unread on it: never reuse it as it is.
            _disconnect(connection)
            raise
        finally:
            self._give_back(connection)

    def _take_connection(self, client: redis.Redis) -> ConnectionInterface:
        """An idle connection of this store, checked; or a new one from the client's pool."""
        if self._connections_pid != os.getpid():
            self._connections = []  # the parent's: its sockets are not this process's
            self._connections_pid = os.getpid()
        try:
            connection = self._connections.pop()
        except IndexError:
            return client.connection_pool.make_connection()
        # As the pool does: one the server closed (restart, idle timeout) or with data
        # waiting is reconnected before anything is sent on it.
        try:
            stale = connection.can_read()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            stale = True
        if stale:
            _disconnect(connection)
        return connection

    def _give_back(self, connection: ConnectionInterface) -> None:
        # list.append and pop are atomic: threads share the idle list without a lock.
        if self._closed:
            _disconnect(connection)
        else:
            self._connections.append(connection)

    def _servers(self, *, primaries_only: bool = False) -> list[redis.Redis]:
        """The servers that hold this store's data (one, or every node of a cluster)."""
        if isinstance(self._client, redis.Redis):
            return [self._client]
        nodes = self._client.nodes_manager.nodes_cache.values()
        return [
            self._client.get_redis_connection(node)
            for node in nodes
            if node.server_type == "primary" or not primaries_only
        ]

    def _space_of_key(self, name: str) -> str | None:
        # The inverse of _keys for a key index: the space, or None for another key.
        head, tail = f"{self._prefix}:{{", "}:k"
        if name.startswith(head) and name.endswith(tail):
            return name[len(head) : -len(tail)]
        return None

    def spaces(self, *, limit: int | None = None) -> list[str]:
        """See :meth:`~tiers.backends.base.ListsSpaces.spaces`.

        Walks the keys of the server (of every primary of a cluster) with
        ``SCAN`` (every space has its key index): for maintenance commands,
        not for a request path.
        """
        head = f"{self._prefix}:{{"
        pattern = "".join(f"\\{c}" if c in "\\*?[]^" else c for c in head) + "*:k"
        found: set[str] = set()
        with self._translate("space listing"):
            for server in self._servers(primaries_only=True):
                for name in server.scan_iter(match=pattern, count=1000):
                    space = self._space_of_key(bytes(name).decode())
                    if space is not None:
                        found.add(space)
                        if limit is not None and len(found) >= limit:
                            return sorted(found)[: max(limit, 0)]
        return sorted(found)[: None if limit is None else max(limit, 0)]

    def volatility(self) -> str | None:
        """Why an acknowledged commit could be lost, or ``None`` if Redis fsyncs each one.

        Reads ``appendonly`` and ``appendfsync`` with ``CONFIG GET`` (on every
        node of a cluster). A server that refuses ``CONFIG`` (renamed,
        disabled, or not allowed to this user, as on many managed services)
        cannot be verified: that is reported as volatile too, so the operator
        has to opt in knowingly.

        Raises:
            BackendUnavailableError: Redis cannot be reached.
        """
        self._ensure_open()
        servers = self._servers()
        for server in servers:
            try:
                reason = _server_volatility(server)
            except redis.RedisError as exc:
                raise BackendUnavailableError(f"Redis durability check failed: {exc}") from exc
            if reason is not None:
                return reason if len(servers) == 1 else f"node {_node_name(server)}: {reason}"
        return None

    def ping(self) -> None:
        """See :meth:`KVStore.ping`."""
        with self._translate("ping"):
            self._client.ping()

    def scrub(self, *, wait: float = 5.0) -> bool:
        """Have the server rewrite its files, so deleted keys leave them (see ``Scrubbable``).

        A deleted key is gone from memory at once, but Redis keeps every
        write in its append-only file until the file is rewritten, and in an
        RDB snapshot until the next one. This starts ``BGREWRITEAOF`` (AOF
        on) or, with AOF off and RDB snapshots configured, ``BGSAVE``; both
        write the data as of now, after every delete acknowledged so far. A
        rewrite already running began before those deletes: it is waited for
        (up to ``wait`` seconds) and a new one started. On a cluster every
        node (replicas too) is told. Other replicas and backups are the
        operator's.

        Returns:
            True when a rewrite was started or scheduled (on every node);
            False when a server refused (command renamed or not allowed, as on
            many managed services), stayed busy, or keeps no files to rewrite.

        Raises:
            BackendUnavailableError: Redis cannot be reached.
        """
        deadline = time.monotonic() + wait
        with self._translate("scrub"):
            # Every node is told, even after one refused: each rewrite drops deleted data.
            started = [_scrub_server(server, deadline) for server in self._servers()]
        return all(started)

    def close(self) -> None:
        """See :meth:`KVStore.close`.

        Afterwards every method raises :class:`BackendUnavailableError`. A client
        passed to the constructor is left open.
        """
        if self._closed:
            return
        self._closed = True
        self._listings.clear()
        while self._connections:
            _disconnect(self._connections.pop())
        if self._owns_client:
            self._client.close()


class _Translating:
    """Checks the store is open on entry; raises Redis's errors as the tier's on exit.

    A class, not a ``contextmanager`` generator: every operation of the store
    enters one, and the generator's machinery cost three times as much.
    """

    __slots__ = ("_store", "_what")

    def __init__(self, store: RedisKVStore, what: str) -> None:
        self._store = store
        self._what = what

    def __enter__(self) -> None:
        self._store._ensure_open()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, (redis.RedisError, RedisClusterException)):
            if self._store._closed:
                raise StoreClosedError(
                    f"the Redis store was closed during a {self._what}; open it again "
                    "(Memory.open, or a new RedisKVStore)"
                ) from exc
            raise BackendUnavailableError(f"Redis {self._what} failed: {exc}") from exc


def _disconnect(connection: ConnectionInterface) -> None:
    """Close ``connection``'s socket; its next use connects again."""
    # redis-py leaves this method unannotated; this is the signature relied on.
    disconnect: Callable[[], None] = connection.disconnect
    disconnect()


def _node_name(server: redis.Redis) -> str:
    kwargs = server.get_connection_kwargs()
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def _config_value(server: redis.Redis, name: str) -> str:
    reply: Any = server.config_get(name)
    for key, value in dict(reply).items():
        key = key.decode() if isinstance(key, bytes) else str(key)
        if key == name:
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def _server_volatility(server: redis.Redis) -> str | None:
    """Why ``server`` could lose an acknowledged write, or ``None`` (see ``volatility``).

    Raises:
        redis.RedisError: The server cannot be reached.
    """
    try:
        appendonly = _config_value(server, "appendonly")
        appendfsync = _config_value(server, "appendfsync")
    except redis.ResponseError as exc:
        refusal = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return (
            "the Redis server refused CONFIG GET (renamed, disabled or not allowed: "
            f"{refusal}), so its durability cannot be verified; it is durable only with "
            "appendonly yes and appendfsync always"
        )
    if appendonly != "yes":
        return (
            f"Redis runs with appendonly {appendonly or '?'}: every write acknowledged "
            "since its last snapshot is lost when Redis crashes (durable needs appendonly "
            "yes and appendfsync always)"
        )
    if appendfsync != "always":
        return (
            f"Redis runs with appendfsync {appendfsync or '?'}: a write is acknowledged "
            "before it is fsync'd, so a crash of the Redis host loses the last ones "
            "(durable needs appendfsync always)"
        )
    return None


def _scrub_server(server: redis.Redis, deadline: float) -> bool:
    """Start a rewrite of ``server``'s files (see ``scrub``); whether it was started.

    Raises:
        redis.RedisError: The server cannot be reached.
    """
    aof = bool(server.info("persistence").get("aof_enabled"))
    if not aof:
        try:
            schedule: Any = server.config_get("save")
        except redis.ResponseError:
            return False
        if not any(value for value in dict(schedule).values()):
            return False  # no snapshots: no file to rewrite (nor one to create)
    while True:
        try:
            if aof:
                server.bgrewriteaof()
            else:
                server.bgsave(schedule=True)
            return True
        except redis.ResponseError as exc:
            if "in progress" not in str(exc) or time.monotonic() >= deadline:
                return False
        time.sleep(0.05)
