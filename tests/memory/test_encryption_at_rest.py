"""Encryption at rest end to end (issue 14, item 1), on the embedded default and on Redis.

A memory opened with a master key stores facts, a summarized session (transcript,
summary, learned facts), a pending transcript, a run (step output, state, effect,
result), an item and an API key's metadata, each holding a string written nowhere
else. Then every file of the data directory (SQLite file and ``-wal``, the Chroma
folder) and every Redis key, value and append-only file is searched for them: none
may be there, and neither may the fact keys, set or learned from the transcript
(``preference.green_tea``): they name what a fact is about. A user id (ids are not
encrypted) is the control that the search finds what is there. Rotating the master
key keeps every record readable; a wrong or missing key fails at open with
:class:`EncryptionKeyError`. A store encrypted by the previous release, which left
fact keys readable, is refused until ``tiermem encrypt`` renames them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory import Charged, Memory
from memory.apikeys import ApiKeyRegistry
from memory.cli import app as cli
from memory.settings import Settings
from tests.conftest import RedisServer
from tests.memory.test_erasure import found_in_files, found_in_redis, redis_aof_dir, said
from tests.tiers.test_user_encrypted import write_as_the_previous_release
from tiers.backends import open_kv_backend
from tiers.backends.encrypted_kv import EncryptedKVStore, MasterKey, rotate_master_key
from tiers.errors import EncryptionKeyError
from tiers.models import FactCandidate
from tiers.user import UserTier

FACT = "quokkafactzanzibar"
EVIDENCE = "lemurevidencehobart"
SESSION = "marmosetsessionlagos"
PENDING = "axolotlpendingtromso"
STEP = "okapistepvaduz"
STATE = "bisonstatetallinn"
EFFECT = "tapireffectmaseru"
RESULT = "ibexresultwindhoek"
ITEM = "narwhalitemthimphu"
KEY_NAME = "caracalkeynamebern"
FACT_KEY = "wifi_network_name"  # a fact key set by the app
LEARNED_KEY = "green_tea"  # of "preference.green_tea", learned from "I prefer green tea."
EVERY = (
    FACT,
    EVIDENCE,
    SESSION,
    PENDING,
    STEP,
    STATE,
    EFFECT,
    RESULT,
    ITEM,
    KEY_NAME,
    FACT_KEY,
    LEARNED_KEY,
)
USER = "ocelotcontroluser"  # an id: stored in key names, so the search must find it


@pytest.fixture(params=["embedded", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str | None]:
    """``None`` for the embedded default, else the URL of a Redis server of this test's own.

    Not the shared server: its append-only files keep what earlier tests wrote in the
    clear (test_erasure's markers), which the raw-bytes search would find.
    """
    if request.param != "redis":
        yield None
        return
    server = RedisServer(tmp_path / "redis")
    try:
        yield server.url
    finally:
        server.stop()


def open_memory(data: Path, backend: str | None, key: str | None) -> Memory:
    return Memory.from_settings(Settings(data_dir=data, kv_url=backend, master_key=key))


def write_everything(memory: Memory) -> str:
    """Every kind of record, each with its own marker; returns the API key made."""
    memory.set_fact(USER, "nickname", FACT, evidence=f"they said {EVIDENCE}")
    memory.set_fact(USER, FACT_KEY, "HomeNet")
    memory.set_fact(USER, FACT_KEY, "CafeNet")  # and a past version, keyed by the fact too
    # A learned fact's key names its subject ("preference.green_tea").
    memory.end_session(
        USER,
        "done",
        said(
            "I prefer green tea.", f"Noted. Plan the {SESSION} trip?", f"Yes, the {SESSION} trip."
        ),
    )
    memory.save_transcript(USER, "pending", said(f"Remember {PENDING} for me."))
    run = memory.start_run(USER, "run-1")
    run.step("note", lambda: {"note": STEP})
    run.step("remember", lambda: Charged({"ok": True}, state={"memo": STATE}))
    run.effect("send", lambda: {"sent": EFFECT})
    run.complete({"result": RESULT})
    memory.items.put(("memories", USER), "k1", {"content": ITEM}, user_id=USER)
    api_key, _ = ApiKeyRegistry(memory.kv).create("default", name=KEY_NAME)
    assert memory.flush(60)
    return api_key


def assert_everything_readable(memory: Memory, api_key: str) -> None:
    assert memory.get_fact(USER, "nickname").value == FACT
    assert EVIDENCE in (memory.get_fact(USER, "nickname").evidence or "")
    summary = memory.get_session(USER, "done")
    assert SESSION in summary.model_dump_json()
    assert [m.content for m in memory.sessions.get_transcript(USER, "pending")] == [
        f"Remember {PENDING} for me."
    ]
    assert memory.pending_summaries(USER) == ["pending"]
    history = memory.run_history("run-1", newest_first=False, limit=100)
    assert STEP in "".join(c.model_dump_json() for c in history)
    last = history[-1]
    assert STATE in str(memory.run_state_at("run-1", last.checkpoint_id))
    assert EFFECT in "".join(e.model_dump_json() for e in memory.run_effects("run-1"))
    assert RESULT in memory.get_run("run-1").model_dump_json()
    item = memory.items.get(("memories", USER), "k1")
    assert item is not None
    assert item.value == {"content": ITEM}
    info = ApiKeyRegistry(memory.kv).verify(api_key)
    assert info.name == KEY_NAME
    learned = memory.get_fact(USER, "preference.green_tea")
    assert "done" in learned.source
    assert [f.key for f in memory.get_facts(USER)] == [
        "nickname",
        "preference.green_tea",
        FACT_KEY,
    ]
    assert [f.value for f in memory.fact_history(USER, FACT_KEY)] == ["HomeNet", "CafeNet"]
    hits = memory.recall_relevant(USER, f"{SESSION} trip")
    assert [hit.summary.session_id for hit in hits][:1] == ["done"]


def plaintext_found(data: Path, backend: str | None) -> dict[str, list[str]]:
    """Where the markers (and the control id) are in the stores' files and keys."""
    hits = found_in_files(data, [*EVERY, USER])
    if backend is not None:
        for source in (
            found_in_redis(backend, [*EVERY, USER]),
            found_in_files(redis_aof_dir(backend), [*EVERY, USER]),
        ):
            for needle, where in source.items():
                hits.setdefault(needle, []).extend(where)
    return hits


def test_an_encrypted_store_holds_no_plaintext_and_survives_rotation(
    backend: str | None, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    old, old_text = MasterKey.generate()
    new, new_text = MasterKey.generate()
    memory = open_memory(data, backend, old_text)
    try:
        assert isinstance(memory.kv, EncryptedKVStore)
        api_key = write_everything(memory)
        assert_everything_readable(memory, api_key)
        # While open: the SQLite WAL holds the latest writes.
        hits = plaintext_found(data, backend)
        assert hits.pop(USER, None), "the search finds not even the ids: it is broken"
        assert hits == {}, f"plaintext at rest: {hits}"
    finally:
        memory.close()
    hits = plaintext_found(data, backend)
    assert hits.pop(USER, None)
    assert hits == {}, f"plaintext at rest after close: {hits}"

    with pytest.raises(EncryptionKeyError, match="wrong master key"):
        open_memory(data, backend, new_text)
    with pytest.raises(EncryptionKeyError, match="TIERMEM_MASTER_KEY"):
        open_memory(data, backend, None)

    kv = open_kv_backend(backend or str(data / "tiermem.sqlite3"))
    try:
        assert rotate_master_key(kv, old, new) >= 2  # the tenant's and the API keys'
    finally:
        kv.close()
    with pytest.raises(EncryptionKeyError, match="wrong master key"):
        open_memory(data, backend, old_text)
    memory = open_memory(data, backend, new_text)
    try:
        assert_everything_readable(memory, api_key)
    finally:
        memory.close()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(tmp_path / "data"))
    for name in ("KV_URL", "VECTOR_URL", "MASTER_KEY", "MASTER_KEY_FILE"):
        monkeypatch.delenv(f"TIERMEM_{name}", raising=False)
    return tmp_path


def test_encrypting_a_plaintext_store_and_rotating_from_the_command_line(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = env / "data"
    with Memory.open(data) as memory:
        memory.set_fact(USER, "nickname", FACT)
        memory.end_session(USER, "done", said("I prefer green tea.", f"The {SESSION} trip."))
        api_key, _ = ApiKeyRegistry(memory.kv).create("default", name=KEY_NAME)
    assert found_in_files(data, [FACT])

    runner = CliRunner()
    made = runner.invoke(cli, ["new-master-key", "--out", str(env / "old.key")])
    assert made.exit_code == 0, made.output
    assert (env / "old.key").stat().st_mode & 0o077 == 0
    monkeypatch.setenv("TIERMEM_MASTER_KEY_FILE", str(env / "old.key"))
    # Opening the plaintext store with a key is refused, naming the command that fixes it.
    with pytest.raises(EncryptionKeyError, match="tiermem encrypt"):
        Memory.open(data)
    done = runner.invoke(cli, ["encrypt"])
    assert done.exit_code == 0, done.output
    assert "with master key" in done.stdout
    with Memory.open(data) as memory:
        assert SESSION in str(memory.sessions.get_transcript(USER, "done"))
        assert memory.get_fact(USER, "nickname").value == FACT
        assert ApiKeyRegistry(memory.kv).verify(api_key).name == KEY_NAME
    # The plaintext the values replaced is gone from the files too (zeroed, WAL truncated),
    # and so are the fact keys, renamed to opaque tokens.
    assert found_in_files(data, [FACT, SESSION, KEY_NAME, LEARNED_KEY, USER]).keys() == {USER}
    assert runner.invoke(cli, ["encrypt"]).stdout.startswith("encrypted 0 values")

    assert runner.invoke(cli, ["new-master-key", "--out", str(env / "new.key")]).exit_code == 0
    rotated = runner.invoke(cli, ["rotate-master-key", "--new-key-file", str(env / "new.key")])
    assert rotated.exit_code == 0, rotated.output
    assert "re-wrapped 2 data keys" in rotated.stdout
    with pytest.raises(EncryptionKeyError, match="wrong master key"):
        Memory.open(data)
    monkeypatch.setenv("TIERMEM_MASTER_KEY_FILE", str(env / "new.key"))
    with Memory.open(data) as memory:
        assert memory.get_fact(USER, "nickname").value == FACT
        assert memory.get_session(USER, "done").task_description == "I prefer green tea."
        assert SESSION in str(memory.sessions.get_transcript(USER, "done"))
    # The key commands go through the same store, encrypted.
    listed = runner.invoke(cli, ["keys", "list"])
    assert listed.exit_code == 0, listed.output
    assert KEY_NAME in listed.stdout


def test_a_store_encrypted_by_the_previous_release_is_upgraded_by_encrypt(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = env / "data"
    runner = CliRunner()
    assert runner.invoke(cli, ["new-master-key", "--out", str(env / "k.key")]).exit_code == 0
    monkeypatch.setenv("TIERMEM_MASTER_KEY_FILE", str(env / "k.key"))
    master = MasterKey.from_file(env / "k.key")
    with Memory.open(data):
        pass  # the data directory as tiermem makes it (an encrypted store)

    def old_facts(users: UserTier) -> None:
        users.set_fact(USER, FACT_KEY, "HomeNet")
        users.set_fact(USER, FACT_KEY, FACT, evidence=f"they said {EVIDENCE}")
        learned = FactCandidate(key="preference.green_tea", value=True, evidence="I prefer it")
        users.set_learned_facts(USER, [learned], source="session:done")

    kv = open_kv_backend(str(data / "tiermem.sqlite3"))
    try:
        write_as_the_previous_release(kv, master, old_facts)
    finally:
        kv.close()
    assert found_in_files(data, [FACT_KEY, LEARNED_KEY]).keys() == {FACT_KEY, LEARNED_KEY}
    with pytest.raises(EncryptionKeyError, match="tiermem encrypt"):
        Memory.open(data)

    done = runner.invoke(cli, ["encrypt"])
    assert done.exit_code == 0, done.output
    assert "renamed 3 fact keys" in done.stdout  # two facts, one past version
    with Memory.open(data) as memory:
        assert memory.get_fact(USER, FACT_KEY).value == FACT
        assert [f.value for f in memory.fact_history(USER, FACT_KEY)] == ["HomeNet", FACT]
        assert [f.key for f in memory.get_facts(USER)] == ["preference.green_tea", FACT_KEY]
    assert found_in_files(data, [FACT_KEY, LEARNED_KEY, FACT, USER]).keys() == {USER}
