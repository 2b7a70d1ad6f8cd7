"""Redaction before persistence, end to end, on the embedded default and on a real Redis.

Secrets pasted into a chat, returned by a tool or put in a run's state go through the
public API; afterwards every file of the data directory (SQLite, its WAL, the Chroma
folder) and every Redis key are searched for them, byte for byte, and the records read
back hold placeholders. With ``redact="off"`` the same data is stored verbatim.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from memory import InputMismatchError, Memory, Redactor, ScopeManager
from memory.settings import Settings
from summarizer import ExtractiveSummarizer, Summarization
from tests.memory.test_erasure import found_in_files, found_in_redis
from tiers.models import FactCandidate, Message
from tiers.redaction import luhn_valid
from tiers.task import Charged, output_digest

_rng = random.Random(1414)
ALNUM = string.ascii_letters + string.digits


def rand(n: int) -> str:
    while True:
        value = "".join(_rng.choice(ALNUM) for _ in range(n))
        if any(c.isdigit() for c in value) and any(c.isalpha() for c in value):
            return value


def card() -> str:
    body = "4" + "".join(_rng.choice(string.digits) for _ in range(14))
    return next(body + d for d in string.digits if luhn_valid(body + d))


API_KEY = "sk-proj-" + rand(64)
BEARER = rand(40)
PASSWORD = "Tr0ub4dor&3x"
CARD = card()
AWS = "AKIA" + "".join(_rng.choice(string.ascii_uppercase + string.digits) for _ in range(16))
SUMMARY_LEAK = "sk-" + rand(48)  # what a careless model might write into a summary
FACT_LEAK = "ghp_" + rand(36)
STEP_SECRET = rand(32)
EFFECT_TOKEN = "xoxb-1234567890-" + rand(24)
SECRETS = (API_KEY, BEARER, PASSWORD, CARD, AWS, SUMMARY_LEAK, FACT_LEAK, STEP_SECRET, EFFECT_TOKEN)
# Words stored next to the secrets: finding them proves the raw search reads the stores.
CANARY = "quetzalcanaryoaxaca"


def transcript() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"Hi! I'm planning a {CANARY} trip. My api key is {API_KEY}"},
        {"role": "assistant", "content": "Thanks. Please don't share keys; I'll use it once."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "http_get",
                        "arguments": f'{{"url": "https://api.example.com", '
                        f'"headers": {{"Authorization": "Bearer {BEARER}"}}}}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "200 OK"},
        {
            "role": "user",
            "content": f"Also my bank password is {PASSWORD} and card {CARD}, "
            f"and the AWS key is {AWS}.",
        },
    ]


class LeakySummarizer:
    """The extractive summarizer, plus a model that writes secrets into what it returns.

    It records what it was shown, so a test can check the summarizer never saw a secret.
    """

    name = "leaky"

    def __init__(self) -> None:
        self.inner = ExtractiveSummarizer()
        self.seen: list[str] = []

    def summarize(
        self,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        user_id: str,
        session_id: str,
        created_at: datetime | None = None,
    ) -> Summarization:
        for message in transcript:
            assert isinstance(message, Message)  # the facade passes the stored transcript
            self.seen.append(message.content + "".join(c.arguments for c in message.tool_calls))
        result = self.inner.summarize(
            transcript, user_id=user_id, session_id=session_id, created_at=created_at
        )
        summary = result.summary.model_copy(
            update={"decisions_made": [f"Use key {SUMMARY_LEAK} for the {CANARY} trip"]}
        )
        fact = FactCandidate(
            key="github_token",
            value=FACT_LEAK,
            confidence=0.9,
            evidence=f"user pasted {FACT_LEAK} for the {CANARY} repo",
        )
        return Summarization(summary=summary, facts=[*result.facts, fact], usage=result.usage)


def open_memory(backend: str | None, root: Path, **settings: Any) -> Memory:
    return Memory.from_settings(Settings(data_dir=root, kv_url=backend, **settings))


@pytest.fixture
def memory(backend: str | None, tmp_path: Path) -> Iterator[Memory]:
    mem = open_memory(backend, tmp_path / "data")
    yield mem
    mem.close()


def stored(memory: Memory, backend: str | None, root: Path, needles: Sequence[str]) -> set[str]:
    """Which of ``needles`` the raw stores hold: every file under ``root``, or every Redis key."""
    memory.flush(60)
    hits = found_in_redis(backend, needles) if backend else found_in_files(root, needles)
    return set(hits)


def write_secrets(memory: Memory, user: str) -> None:
    """Secrets through every tier: a session, facts, a run (steps, state, scope, effect, result)."""
    memory.end_session(user, "s-1", transcript())
    memory.set_fact(user, "wifi_password", "Zx9#kLm2", evidence=f"said so, {CANARY}")
    run = memory.start_run(user, f"run-{user}")
    scopes = ScopeManager("You book trips.", redactor=memory.redactor)
    scopes.record("tool", f"login ok with password: {PASSWORD}")
    run.step(
        "login",
        lambda: Charged(
            {"user": "maria", "password": STEP_SECRET, "note": CANARY},
            state={"api_key": STEP_SECRET},
        ),
        scope=scopes.snapshot,
    )
    run.effect("slack_token", lambda: {"token": EFFECT_TOKEN, "note": CANARY})
    run.complete({"card": CARD})
    memory.items.put(("memories", user), "creds", {"api_key": API_KEY, "note": CANARY})


def test_no_secret_reaches_any_store_and_records_hold_placeholders(
    memory: Memory, backend: str | None, tmp_path: Path
) -> None:
    leaky = LeakySummarizer()
    memory.summarizer = leaky
    write_secrets(memory, "maria")

    # The summarizer (a hosted model, in production) was shown the redacted transcript.
    shown = "\n".join(leaky.seen)
    assert not [s for s in SECRETS if s in shown]
    assert "[REDACTED:api_key]" in shown
    assert "[REDACTED:token]" in shown  # the Authorization header in the tool call

    text = "\n".join(m.content for m in memory.sessions.get_transcript("maria", "s-1"))
    assert "My api key is [REDACTED:api_key]" in text
    assert "password is [REDACTED:password] and card [REDACTED:card_number]" in text
    summary = memory.get_session("maria", "s-1")
    assert summary.decisions_made == [f"Use key [REDACTED:api_key] for the {CANARY} trip"]
    fact = memory.get_fact("maria", "github_token")
    assert fact.value == "[REDACTED:token]"  # its key says what it is
    assert fact.evidence == f"user pasted [REDACTED:api_key] for the {CANARY} repo"
    assert memory.get_fact("maria", "wifi_password").value == "[REDACTED:password]"

    info = memory.get_run("run-maria")
    assert info.result == {"card": "[REDACTED:card_number]"}
    (login, effect) = memory.run_history("run-maria")
    assert login.output == {"user": "maria", "password": "[REDACTED:password]", "note": CANARY}
    assert login.state_delta == {"api_key": "[REDACTED:api_key]"}
    assert login.scope is not None
    assert login.scope["trace"][0]["text"] == "login ok with password: [REDACTED:password]"
    assert effect.output == {"token": "[REDACTED:token]", "note": CANARY}
    (ledger,) = memory.run_effects("run-maria")
    # The ledger keeps the digest of the response as it was, not the credential.
    assert ledger.output == effect.output
    assert ledger.response_hash == output_digest({"token": EFFECT_TOKEN, "note": CANARY})
    item = memory.items.get(("memories", "maria"), "creds")
    assert item is not None
    assert item.value == {"api_key": "[REDACTED:api_key]", "note": CANARY}

    root = tmp_path / "data"
    assert stored(memory, backend, root, [CANARY]) == {CANARY}  # the search does find data
    assert stored(memory, backend, root, SECRETS) == set()


def test_a_step_returns_what_it_stored_and_a_resumed_run_replays_it(memory: Memory) -> None:
    first = memory.start_run("maria", "run-1")
    creds = {"user": "maria", "password": STEP_SECRET}
    out = first.step("login", lambda: dict(creds), input=creds)
    assert out == {"user": "maria", "password": "[REDACTED:password]"}
    token = first.effect("issue", lambda: {"token": EFFECT_TOKEN}, input=creds)
    assert token == {"token": "[REDACTED:token]"}

    # A new worker resumes the run: the same calls match their checkpoints (input hashes are
    # of the inputs as given) and return what the first execution returned, without running.
    resumed = memory.start_run("maria", "run-1")

    def never() -> object:
        raise AssertionError("a committed step ran again")

    assert resumed.step("login", never, input=creds) == out
    assert resumed.effect("issue", never, input=creds) == token
    with pytest.raises(InputMismatchError):
        # Another password is another input, though both are stored as the same placeholder.
        memory.start_run("maria", "run-1").step(
            "login", never, input={"user": "maria", "password": "0ther-Passw0rd"}
        )


def test_a_retried_record_effect_matches_by_the_digest_of_the_real_output(
    memory: Memory,
) -> None:
    run = memory.start_run("maria", "run-2")
    started = run.begin_effect("create_key", idempotency_key="create-key-1")
    assert started.invoke
    output = {"key": API_KEY}
    assert run.record_effect("create-key-1", output) == {"key": "[REDACTED:api_key]"}
    # The client retries the request (it never saw the answer): the same output is accepted.
    assert run.record_effect("create-key-1", output) == {"key": "[REDACTED:api_key]"}


def test_redaction_off_stores_everything_verbatim(backend: str | None, tmp_path: Path) -> None:
    root = tmp_path / "data"
    memory = open_memory(backend, root, redact="off")
    try:
        memory.summarizer = LeakySummarizer()
        write_secrets(memory, "maria")
        text = "\n".join(m.content for m in memory.sessions.get_transcript("maria", "s-1"))
        assert API_KEY in text
        assert memory.get_fact("maria", "wifi_password").value == "Zx9#kLm2"
        assert memory.run_history("run-maria")[0].output["password"] == STEP_SECRET  # type: ignore[index,call-overload]
        assert stored(memory, backend, root, [API_KEY, STEP_SECRET, EFFECT_TOKEN]) == {
            API_KEY,
            STEP_SECRET,
            EFFECT_TOKEN,
        }
    finally:
        memory.close()


def test_pii_mode_and_custom_patterns_from_settings(tmp_path: Path) -> None:
    memory = Memory.open(
        tmp_path / "data",
        redact="secrets+pii",
        redact_patterns={"employee_id": r"EMP-\d{6}"},
        redact_placeholder="<{kind}>",
    )
    try:
        memory.save_transcript(
            "maria",
            "s-1",
            [
                {
                    "role": "user",
                    "content": "I'm EMP-004217, mail me at maria.lopez@example.org "
                    "or call +1 (415) 555-0132.",
                }
            ],
        )
        (message,) = memory.sessions.get_transcript("maria", "s-1")
        assert message.content == "I'm <employee_id>, mail me at <email> or call <phone>."
        assert memory.redactor.mode == "secrets+pii"
        # A tenant view redacts the same way.
        memory.for_tenant("acme").set_fact("maria", "badge", "EMP-000001")
        assert memory.for_tenant("acme").get_fact("maria", "badge").value == "<employee_id>"
    finally:
        memory.close()


def test_the_scope_manager_redacts_what_it_takes_in_and_restores_exactly() -> None:
    scopes = ScopeManager({"rules": f"never print {API_KEY}"})
    scopes.working.put("login", {"user": "maria", "password": PASSWORD})
    entry = scopes.record("tool", f"GET /me -> Authorization: Bearer {BEARER}")
    assert entry.text == "GET /me -> Authorization: Bearer [REDACTED:token]"
    assert scopes.working.get("login") == {"user": "maria", "password": "[REDACTED:password]"}
    assert scopes.system.sections["rules"] == "never print [REDACTED:api_key]"
    snapshot = scopes.snapshot()
    assert not [s for s in SECRETS if s in str(snapshot)]
    restored = ScopeManager.restore(snapshot)
    assert restored.snapshot() == snapshot
    # Redaction off: held as given, and a restore does not change it either.
    verbatim = ScopeManager("sys", redactor=Redactor("off"))
    verbatim.record("note", f"key {API_KEY}")
    again = ScopeManager.restore(verbatim.snapshot())
    assert again.trace.entries()[0].text == f"key {API_KEY}"


def test_an_agents_session_reads_back_what_it_stored(memory: Memory) -> None:
    """The object that wrote the items serves them as stored, like any other reader."""
    pytest.importorskip("agents")
    import asyncio

    from memory.integrations.openai_agents import TiermemSession

    item = {"role": "user", "content": f"my api key is {API_KEY}"}
    expected = [{"role": "user", "content": "my api key is [REDACTED:api_key]"}]

    async def scenario() -> None:
        writer = TiermemSession(memory, "chat-1", user_id="maria")
        await writer.add_items([item])
        assert await writer.get_items() == expected
        assert await TiermemSession(memory, "chat-1", user_id="maria").get_items() == expected

    asyncio.run(scenario())
