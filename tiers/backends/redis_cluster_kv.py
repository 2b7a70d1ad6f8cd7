"""Redis Cluster implementation of :class:`~tiers.backends.base.KVStore`.

The same store as :class:`~tiers.backends.redis_kv.RedisKVStore` (a space is a
values hash and a key zset; commits and scans are the same Lua scripts), on a
cluster. Its Redis keys are ``<prefix>:{<placement>}:<space>:v`` and ``:k``,
where the placement (:func:`tiers.keys.placement`) is the space's tenant: every
space of a tenant hashes to one slot, so a run, a user and the tenant-wide
indexes are on one primary and every commit of a tenant is one script there. A
commit whose spaces have different placements is refused before anything is
sent. The trade-off: one tenant's data and throughput are one primary's; the
cluster scales out across tenants.

Reads go through redis-py's cluster client, which follows ``MOVED``/``ASK``
redirections and refreshes its slot map after a failover. A commit is sent by
this module to the primary of its slot, in one pipeline with the optional
``WAIT``: a ``MOVED``/``ASK``/``TRYAGAIN`` answer means the script did not
run, so it is re-sent where the cluster points; a dropped connection or
timeout is never re-sent (the script may have run; see ``redis_kv``) and
becomes :class:`BackendUnavailableError` after the slot map is refreshed.

Durability. Each node is durable only with ``appendonly yes`` and
``appendfsync always``. Replication is asynchronous: a commit a primary
acknowledged is lost if the primary dies before its replica has it and the
replica is promoted (the old primary, back, resyncs from the new one and drops
it too). With ``wait=N`` in the URL every commit is followed by ``WAIT N
<wait_timeout_ms>`` on the same connection and acknowledged only once ``N``
replicas hold it in memory; a commit not replicated in time is reported
:class:`BackendUnavailableError` (applied on the primary, not acknowledged).
Redis 7.0's ``WAIT`` does not wait for the replica's fsync (``WAITAOF`` is
7.2's), so losing a primary and its replica's host at once can still lose it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    TryAgainError,
)
from redis.retry import Retry

from tiers.backends import redact_url
from tiers.backends._redis_scripts import COMMIT, guessed_read
from tiers.backends.base import DEFAULT_MAX_VALUE_BYTES
from tiers.backends.redis_kv import RedisKVStore
from tiers.errors import BackendUnavailableError, InvalidInputError
from tiers.keys import placement

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

# How often one commit follows MOVED/ASK/TRYAGAIN before giving up (redis-py uses 16).
_REDIRECTS = 16


class RedisClusterKVStore(RedisKVStore):
    """A :class:`KVStore` on a Redis Cluster.

    Args:
        url: ``redis+cluster://[user:password@]host:port[,host:port...][/]`` (or
            ``rediss+cluster://`` for TLS): some nodes of the cluster (the rest are
            discovered). Query settings: ``wait=N`` (every commit waits for ``N``
            replicas, default 0) and ``wait_timeout_ms`` (how long, default 1000).
        key_prefix: Prefix of every Redis key this store touches.
        max_value_bytes: Largest value accepted by :meth:`commit`.

    Raises:
        InvalidInputError: The URL or ``key_prefix`` is malformed.
        BackendUnavailableError: No node of the cluster answered.
    """

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "tm",
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self.wait_replicas, self.wait_timeout_ms = _wait_settings(url)
        try:
            super().__init__(url, key_prefix=key_prefix, max_value_bytes=max_value_bytes)
        except (redis.RedisError, RedisClusterException) as exc:
            raise BackendUnavailableError(
                f"no node of the Redis Cluster {redact_url(url)!r} answered: {exc}"
            ) from exc

    def _connect(self, url: str) -> RedisCluster:
        parts = urlsplit(url)
        if parts.scheme not in CLUSTER_SCHEMES:
            raise ValueError(f"a Redis Cluster URL starts with {' or '.join(CLUSTER_SCHEMES)}://")
        if parts.path not in ("", "/", "/0"):
            raise ValueError("a Redis Cluster has only database 0")
        userinfo, _, hosts = parts.netloc.rpartition("@")
        username, _, password = userinfo.partition(":")
        nodes = []
        for address in hosts.split(","):
            host, colon, port = address.rpartition(":")
            if not colon or not host or not port.isdigit():
                raise ValueError(f"{address!r} is not host:port")
            nodes.append(ClusterNode(host.strip("[]"), int(port)))
        # No automatic retry of a command after a dropped connection (see the module
        # docstring); redirections and topology refreshes are followed regardless.
        self._cluster = RedisCluster(
            startup_nodes=nodes,
            username=unquote(username) or None,
            password=unquote(password) or None,
            ssl=parts.scheme == "rediss+cluster",
            socket_timeout=10,
            socket_connect_timeout=5,
            health_check_interval=30,
            retry=Retry(NoBackoff(), 0),
        )
        return self._cluster

    def _keys(self, space: str) -> tuple[str, str]:
        # All Redis key formats of a cluster store live here. The tag holds no brace, so the
        # key reads back unambiguously (_space_of_key) and Redis hashes exactly the tag.
        tag = placement(space)
        if not tag or "{" in tag or "}" in tag:
            tag = "#" + tag.replace("{", "(").replace("}", ")")
        return f"{self._prefix}:{{{tag}}}:{space}:v", f"{self._prefix}:{{{tag}}}:{space}:k"

    def _space_of_key(self, name: str) -> str | None:
        head, tail = f"{self._prefix}:{{", ":k"
        if not (name.startswith(head) and name.endswith(tail)):
            return None
        close = name.find("}:", len(head))
        return None if close < 0 else name[close + 2 : -len(tail)]

    def _check_spaces(self, spaces: list[str]) -> None:
        placements = {placement(space) for space in spaces}
        if len(placements) > 1:
            raise InvalidInputError(
                f"a commit on a Redis Cluster must keep to one placement (tenant), but spaces "
                f"{sorted(spaces)} have placements {sorted(placements)}: commit each "
                "placement's writes separately",
                field="space",
            )

    def _hmget(self, name: str, fields: Sequence[str]) -> list[Any]:
        # Through the cluster client, which follows the slot map and its redirections.
        values: list[Any] = self._cluster.hmget(name, list(fields))
        return values

    def _read_listed(
        self, hash_name: str, index_name: str, listed: list[Any], span: tuple[bytes, bytes]
    ) -> tuple[list[Any], Any]:
        # One MULTI on the slot's primary (both keys share the space's hash tag), through
        # the cluster client, which follows the slot map and its redirections.
        pipe = self._cluster.pipeline(transaction=True)
        pipe.hmget(hash_name, listed)
        pipe.zlexcount(index_name, span[0], span[1])
        values, count = pipe.execute()
        return values, count

    def _read_guessed(
        self, hash_name: str, index_name: str, args: list[bytes], guess: list[Any]
    ) -> tuple[list[Any], Any]:
        # The commands of guessed_read in one MULTI through the cluster client (as above).
        pipe = self._cluster.pipeline(transaction=True)
        for command, *words in guessed_read(hash_name, index_name, args, guess)[1:-1]:
            pipe.execute_command(command.decode(), *words)  # the client looks names up as str
        listed, values = pipe.execute()
        return listed, values

    def _run_scan(self, keys: list[str], args: list[bytes]) -> list[Any]:
        flat: list[Any] = self._scan_script(keys=keys, args=args)
        return flat

    def _run_commit(self, keys: list[str], args: list[bytes]) -> Any:
        cluster = self._cluster
        slot = key_slot(keys[0].encode())
        asked: ClusterNode | None = None
        for _ in range(_REDIRECTS):
            node = asked or cluster.nodes_manager.get_node_from_slot(slot)
            server = cluster.get_redis_connection(node)
            # One pipeline, so WAIT runs on the connection that sent the commit.
            pipe = server.pipeline(transaction=False)
            if asked is not None:
                pipe.execute_command("ASKING")
            pipe.evalsha(self._commit_script.sha, len(keys), *keys, *args)
            if self.wait_replicas:
                pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            try:
                replies = pipe.execute()
            except NoScriptError:
                server.script_load(COMMIT)  # a node that never ran it (new, or restarted)
                continue
            except MovedError:
                cluster.nodes_manager.initialize()
                asked = None
                continue
            except AskError as exc:
                asked = cluster.nodes_manager.get_node(host=exc.host, port=exc.port) or ClusterNode(
                    exc.host, exc.port
                )
                continue
            except TryAgainError:
                time.sleep(0.05)
                continue
            except (redis.ConnectionError, redis.TimeoutError):
                # Perhaps a failover: the next commit goes where the cluster now points.
                cluster.nodes_manager.initialize(last_failed_node_name=node.name)
                raise
            reply: Any = replies[1 if asked is not None else 0]
            if self.wait_replicas and reply == 1:
                acked = int(replies[-1])
                if acked < self.wait_replicas:
                    raise BackendUnavailableError(
                        f"Redis Cluster commit reached {acked} of {self.wait_replicas} "
                        f"replicas within {self.wait_timeout_ms} ms, so it is not "
                        "acknowledged (it was applied on the primary and may not survive a "
                        "failover); re-read before retrying"
                    )
            return reply
        raise BackendUnavailableError(
            f"Redis Cluster commit was redirected {_REDIRECTS} times (slots moving); retry"
        )

    def volatility(self) -> str | None:
        """Why an acknowledged commit could be lost, or ``None`` if none can be.

        Every node must run ``appendonly yes`` and ``appendfsync always`` (see
        :meth:`RedisKVStore.volatility`), and a primary with replicas loses the
        commits they have not copied when one of them is promoted, unless the
        store waits for them (``wait=1`` in the URL).

        Raises:
            BackendUnavailableError: A node cannot be reached.
        """
        reason = super().volatility()
        if reason is not None or self.wait_replicas:
            return reason
        with self._translate("durability check"):
            replicated = any(
                int(server.info("replication").get("connected_slaves", 0))
                for server in self._servers(primaries_only=True)
            )
        if replicated:
            return (
                "Redis Cluster primaries acknowledge a commit before their replicas have it, so "
                "a failover (a replica promoted after its primary died) loses the last "
                "acknowledged commits; add wait=1 to the URL (redis+cluster://...?wait=1) to "
                "acknowledge a commit only once a replica holds it"
            )
        return None

    def describe(self) -> str:
        """The cluster's shape and the commit acknowledgement in effect, for ``tiermem info``.

        Raises:
            BackendUnavailableError: The cluster cannot be reached.
        """
        with self._translate("topology read"):
            self._cluster.nodes_manager.initialize()
            primaries = len(self._servers(primaries_only=True))
            replicas = len(self._servers()) - primaries
        waits = (
            f"each commit waits for {self.wait_replicas} replica(s) (WAIT, "
            f"{self.wait_timeout_ms} ms)"
            if self.wait_replicas
            else "commits do not wait for replicas"
        )
        return f"Redis Cluster: {primaries} primaries, {replicas} replicas; {waits}"


def _wait_settings(url: str) -> tuple[int, int]:
    """``wait`` and ``wait_timeout_ms`` of a cluster URL's query.

    Raises:
        InvalidInputError: An unknown setting, or one that is not a whole number.
    """
    settings = {"wait": 0, "wait_timeout_ms": 1000}
    for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if name not in settings:
            raise InvalidInputError(
                f"unknown Redis Cluster URL setting {name!r}: use wait and wait_timeout_ms",
                field="kv_url",
            )
        if not value.isdigit() or (name == "wait_timeout_ms" and int(value) == 0):
            raise InvalidInputError(
                f"Redis Cluster URL setting {name}={value!r} must be a whole number"
                + (" above 0" if name == "wait_timeout_ms" else ""),
                field="kv_url",
            )
        settings[name] = int(value)
    return settings["wait"], settings["wait_timeout_ms"]
