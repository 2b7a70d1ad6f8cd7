"""The Redis Cluster backend: placement, URL settings, durability, and a primary killed mid-run.

The KV contract suite and the tier tests run on the cluster through the ``kv``
fixture (tests/conftest.py); these are what only a cluster has. The shared
cluster (``redis_cluster``) has 3 primaries with a replica each; the failover
test starts one of its own, since it kills a node.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import redis

from tests.servers import RedisClusterNodes
from tests.tiers.crash_worker import USER, effect_keys, effects_done, script
from tiers import keys
from tiers.backends import kv_backend_name, open_kv_store, require_durable
from tiers.backends.base import Check, Delete, DeleteSpace, Put
from tiers.backends.redis_cluster_kv import RedisClusterKVStore
from tiers.errors import BackendUnavailableError, InvalidInputError, VolatileStoreError
from tiers.task import TaskTier

TENANT_SPACES = [
    keys.runs_space("acme"),
    keys.run_space("acme", "r1"),
    keys.sessions_space("acme", "u1"),
    keys.facts_space("acme", "u1"),
    keys.fact_history_space("acme", "u1"),
    keys.users_space("acme"),
    keys.session_outbox_space("acme"),
    keys.items_space("acme"),
    keys.job_queue_space("acme"),
    keys.tenant_config_space("acme"),
]
GLOBAL_SPACES = [
    keys.api_keys_space(),
    keys.tenants_space(),
    keys.keyring_space(),
    keys.opaque_names_space(),
    keys.job_tenants_space(),
]


def redis_keys(cluster: RedisClusterNodes) -> list[str]:
    """Every Redis key of the cluster, read from its primaries."""
    found: list[str] = []
    for port in cluster.live_ports():
        client = redis.Redis(port=port, decode_responses=True)
        try:
            if client.info("replication")["role"] == "master":
                found += list(client.scan_iter(count=1000))
        finally:
            client.close()
    return found


def slot(cluster: RedisClusterNodes, key: str) -> int:
    """The hash slot of Redis key ``key``, as the cluster computes it."""
    client = redis.Redis(port=cluster.live_ports()[0])
    try:
        return int(client.cluster("keyslot", key))
    finally:
        client.close()


def test_placement_is_the_tenant_and_a_global_space_its_own() -> None:
    assert {keys.placement(space) for space in TENANT_SPACES} == {"acme"}
    assert [keys.placement(space) for space in GLOBAL_SPACES] == GLOBAL_SPACES
    assert keys.placement("solo") == "solo"
    assert keys.placement(":x") == ":x"  # no tenant part: its own


def test_every_space_of_a_tenant_is_on_one_slot(
    redis_cluster: RedisClusterNodes, redis_cluster_kv: RedisClusterKVStore
) -> None:
    redis_cluster_kv.commit([Put(space, "k", space.encode()) for space in TENANT_SPACES])
    for tenant in ("zeta", "t1", "t2", "t3"):
        redis_cluster_kv.commit([Put(keys.runs_space(tenant), "r", b"1")])
    for space in GLOBAL_SPACES:
        redis_cluster_kv.commit([Put(space, "k", b"g")])
    found = redis_keys(redis_cluster)
    acme = [key for key in found if key.startswith("tm:{acme}:")]
    assert len(acme) == 2 * len(TENANT_SPACES)  # a values hash and a key index each
    assert len({slot(redis_cluster, key) for key in acme}) == 1
    # Tenants spread over the primaries: the cluster scales out across tenants.
    tags = {key.split("}", 1)[0] + "}" for key in found if not key.startswith("tm:{_system")}
    assert len({redis_cluster.primary_of(tag) for tag in tags}) == 3
    for space in TENANT_SPACES + GLOBAL_SPACES:
        assert redis_cluster_kv.get_many(space, ["k"])[0] is not None
    assert set(redis_cluster_kv.spaces()) == {
        *TENANT_SPACES,
        *GLOBAL_SPACES,
        *(keys.runs_space(t) for t in ("zeta", "t1", "t2", "t3")),
    }
    assert len(redis_cluster_kv.spaces(limit=3)) == 3


def test_a_commit_across_placements_is_refused_before_anything_is_sent(
    redis_cluster_kv: RedisClusterKVStore,
) -> None:
    kv = redis_cluster_kv
    kv.commit([Put("acme:s", "k", b"1")])
    spanning = [
        [Put("acme:s", "k", b"2"), Put("zeta:s", "k", b"2")],
        [Put("acme:s", "k", b"2"), Delete(keys.job_tenants_space(), "acme")],
        [DeleteSpace(keys.tenants_space()), Put(keys.api_keys_space(), "k", b"2")],
    ]
    for writes in spanning:
        with pytest.raises(InvalidInputError) as refused:
            kv.commit(writes)
        assert refused.value.field == "space"
        for write in writes:
            assert repr(write.space) in str(refused.value)
    with pytest.raises(InvalidInputError, match="'zeta:s'"):
        kv.commit([Put("acme:s", "k", b"3")], [Check("zeta:s", "k", None)])
    assert kv.scan("acme:s") == [("k", b"1")]
    assert kv.scan("zeta:s") == []
    assert kv.spaces() == ["acme:s"]


@pytest.mark.parametrize("space", ["{a}", "a}", "{", "}x", ":x", "{a}:s", "a:{b}", "_system:{x}"])
def test_spaces_with_braces_or_no_tenant_round_trip(
    redis_cluster_kv: RedisClusterKVStore, space: str
) -> None:
    kv = redis_cluster_kv
    kv.commit([Put(space, "k", space.encode())])
    kv.commit([Put(space, "k2", b"2")], [Check(space, "k", space.encode())])
    assert kv.scan(space) == [("k", space.encode()), ("k2", b"2")]
    assert kv.spaces() == [space]
    kv.commit([DeleteSpace(space)])
    assert kv.spaces() == []


def test_urls_choose_the_cluster_and_its_settings(redis_cluster_url: str) -> None:
    assert kv_backend_name(redis_cluster_url) == "Redis Cluster"
    assert kv_backend_name("rediss+cluster://h:1/") == "Redis Cluster"
    store = open_kv_store(redis_cluster_url + "?wait=1&wait_timeout_ms=2500")
    try:
        assert isinstance(store, RedisClusterKVStore)
        assert (store.wait_replicas, store.wait_timeout_ms) == (1, 2500)
        assert store.describe() == (
            "Redis Cluster: 3 primaries, 3 replicas; each commit waits for 1 replica(s) "
            "(WAIT, 2500 ms)"
        )
        store.commit([Put("acme:s", "k", b"v")])
        assert store.get_many("acme:s", ["k"]) == [b"v"]
    finally:
        store.close()
    host = redis_cluster_url.removeprefix("redis+cluster://").split(",")[0]
    for bad in [
        f"redis+cluster://{host}/1",
        f"redis+cluster://{host}/?wait=yes",
        f"redis+cluster://{host}/?wait_timeout_ms=0",
        f"redis+cluster://{host}/?replicas=1",
        "redis+cluster://no-port/",
    ]:
        with pytest.raises(InvalidInputError):
            RedisClusterKVStore(bad)


def test_tiermem_info_shows_the_cluster_and_its_durability(
    redis_cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from memory.cli import app

    shown = {}
    for url in (redis_cluster_url, redis_cluster_url + "?wait=1"):
        monkeypatch.setenv("TIERMEM_KV_URL", url)
        result = CliRunner().invoke(app, ["info"])
        assert result.exit_code == 0, result.stdout
        lines = dict(line.split(" = ", 1) for line in result.stdout.splitlines())
        assert lines["kv_backend"] == f"Redis Cluster at {url}"
        shown[url] = lines["kv_cluster"]
    assert shown[redis_cluster_url].startswith(
        "Redis Cluster: 3 primaries, 3 replicas; commits do not wait for replicas; volatile: "
    )
    assert shown[redis_cluster_url + "?wait=1"] == (
        "Redis Cluster: 3 primaries, 3 replicas; each commit waits for 1 replica(s) "
        "(WAIT, 1000 ms); durable"
    )


def test_an_unreachable_cluster_is_unavailable() -> None:
    from tests.conftest import free_port

    with pytest.raises(BackendUnavailableError):
        RedisClusterKVStore(f"redis+cluster://127.0.0.1:{free_port()}/")


def test_without_wait_a_failover_may_lose_commits_so_it_is_volatile(
    redis_cluster_url: str,
) -> None:
    loose = RedisClusterKVStore(redis_cluster_url)
    waiting = RedisClusterKVStore(redis_cluster_url + "?wait=1")
    try:
        reason = loose.volatility()
        assert reason is not None
        assert "wait=1" in reason
        assert "failover" in reason
        with pytest.raises(VolatileStoreError):
            require_durable(loose, allow_volatile=False)
        assert require_durable(loose, allow_volatile=True) == reason
        assert waiting.volatility() is None
        assert "commits do not wait for replicas" in loose.describe()
        # Every node, replicas too, is told to rewrite its files.
        assert waiting.scrub() is True
    finally:
        loose.close()
        waiting.close()


# Commits wait for a replica's acknowledgement up to a minute: the default 1 s is a bet that no
# replica's fsync on a loaded CI disk takes longer (the failing waits below are not waits).
PATIENT_WAIT = "{}?wait=1&wait_timeout_ms=60000"


@pytest.mark.slow
def test_a_primary_killed_mid_run_fails_over_and_the_run_resumes(tmp_path: Path) -> None:
    cluster = RedisClusterNodes(tmp_path / "cluster", node_timeout_ms=1000)
    log = str(tmp_path / "effects.log")
    try:
        store = RedisClusterKVStore(PATIENT_WAIT.format(cluster.url), max_value_bytes=64 * 1024)
        tier = TaskTier(store)
        handle = tier.start_run(USER, "r1", worker_id="w1")
        before = script(handle, log, stop=3)  # plan, charge, notify: acknowledged with WAIT
        history = [c.checkpoint_id for c in tier.history("r1")]
        primary = cluster.primary_of("tm:{default}:x")
        (replica,) = cluster.replicas_of(primary)
        cluster.kill(primary)
        with pytest.raises(BackendUnavailableError):
            script(handle, log, start=3, stop=4, outputs=list(before))
        # The replica is promoted once the others miss the primary for node_timeout_ms.
        assert cluster.wait_promoted("tm:{default}:x", primary) == replica
        cluster.wait_healthy([p for p in cluster.ports if p != primary])
        # The old primary comes back as the new one's replica, so commits find a replica
        # to WAIT for again.
        cluster.start(primary)
        cluster.wait_healthy(cluster.ports)
        store.close()

        store = RedisClusterKVStore(PATIENT_WAIT.format(cluster.url), max_value_bytes=64 * 1024)
        tier = TaskTier(store)
        assert [c.checkpoint_id for c in tier.history("r1")][: len(history)] == history
        resumed = tier.start_run(USER, "r1", worker_id="w2", steal=True)
        outputs = script(resumed, log)
        resumed.complete(result=outputs)
        assert outputs[:3] == before
        assert tier.get_run("r1").result == outputs
        assert tier.unknown_effects("r1") == []
        # Every effect ran exactly once: none acknowledged before the kill ran again.
        assert Counter(effects_done(log)) == Counter(effect_keys("r1"))
        store.close()
    finally:
        cluster.stop()


@pytest.mark.slow
def test_with_wait_a_commit_no_replica_acknowledges_is_not_acknowledged(tmp_path: Path) -> None:
    cluster = RedisClusterNodes(tmp_path / "cluster", node_timeout_ms=1000)
    try:
        # Acknowledged by the live replica: a wait as long as a loaded CI disk's fsync may take.
        patient = RedisClusterKVStore(PATIENT_WAIT.format(cluster.url))
        patient.commit([Put("acme:s", "k", b"1")])
        patient.close()
        # A short wait only where no replica can answer: it is the time the commit fails in.
        store = RedisClusterKVStore(cluster.url + "?wait=1&wait_timeout_ms=200")
        (replica,) = cluster.replicas_of(cluster.primary_of("tm:{acme}:x"))
        cluster.kill(replica)
        with pytest.raises(BackendUnavailableError, match="0 of 1 replicas"):
            store.commit([Put("acme:s", "k", b"2")])
        # Applied on the primary, though not acknowledged: a re-read shows it.
        assert store.get_many("acme:s", ["k"]) == [b"2"]
        store.close()
    finally:
        cluster.stop()
