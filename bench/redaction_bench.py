"""Redaction benchmark: recall on realistic secrets, false positives on ordinary dialogue, speed.

1. **Recall.** A table of realistic secrets of every kind the redactor knows
   (provider keys, tokens, passwords, card numbers, private keys, URL
   credentials; e-mails and phones for the PII mode), each embedded in a
   sentence a user or a tool would write in a chat. A case counts as caught
   when none of its secret's characters survive (the secret is not a
   substring of the output, nor is any 6-character piece of it). The secrets
   are made at run time from a seeded generator, so no credential-shaped
   string is committed.
2. **False positives.** Every turn of the recall-dev transcripts (LoCoMo and
   LongMemEval_S, read from ``../shared/data/recall-dev/``, never copied into
   the repo; sessions repeated across LongMemEval haystacks are counted once)
   is redacted; these are ordinary conversations, so every finding is
   counted as a false positive (a sample is printed for a human to judge:
   some may be real-looking example data the chats contain).
3. **Throughput** of :meth:`Redactor.redact` on that text, in MB/s.
4. **Chat-state checkpoints.** :meth:`Redactor.redact_json` on ~5 KB agent
   checkpoints (messages with role/content, tool results, an effect log of
   ``idempotency_key``/``effect``/``status``/``ts`` records, the shape the
   peers harness writes): CPU microseconds per payload, and which rules the
   narrowing keeps. Nothing in them is a secret, so every rule kept is work
   spent for nothing.
5. **A growing chat thread** (``--thread``; the LongMemEval_S turns
   ``langgraph_bench.py`` replays): CPU per state as a step redacts it, and
   how many of the walk's strings were tested again rather than known clean
   from an earlier state (the history a chat state repeats every step).

Usage::

    python bench/redaction_bench.py                 # both modes, all data
    python bench/redaction_bench.py --mode secrets --sample 40
    python bench/redaction_bench.py --chat-state    # only part 4
    python bench/redaction_bench.py --thread --turns 60   # only part 5
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import string
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import orjson
from _payloads import ChatShape, Vocabulary

from tiers.redaction import RedactMode, Redactor, luhn_valid, redact_dumped_json
from tiers.redaction._redactor import _RuleSet

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "recall-dev"
FILES = ("locomo.sessions.jsonl", "longmemeval_s.sessions.jsonl.gz")

_rng = random.Random(20261125)
ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "-_"
HEX = "0123456789abcdef"


def rand(alphabet: str, n: int) -> str:
    """A random string that has at least one letter and one digit (as real keys do)."""
    while True:
        value = "".join(_rng.choice(alphabet) for _ in range(n))
        if any(c.isdigit() for c in value) and any(c.isalpha() for c in value):
            return value


def card(prefix: str, length: int, sep: str = "") -> str:
    """A Luhn-valid card number with ``prefix``, grouped 4-4-4-4 (or 4-6-5 for 15 digits)."""
    while True:
        body = prefix + "".join(_rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
        for check in string.digits:
            if luhn_valid(body + check):
                digits = body + check
                break
        if not sep:
            return digits
        groups = (
            [4, 6, 5]
            if length == 15
            else [4] * (length // 4) + ([length % 4] if length % 4 else [])
        )
        out, pos = [], 0
        for g in groups:
            out.append(digits[pos : pos + g])
            pos += g
        return sep.join(out)


def pem(kind: str) -> str:
    lines = [rand(B64, 64) for _ in range(6)] + [rand(B64, 28) + "=="]
    return (
        f"-----BEGIN {kind}PRIVATE KEY-----\n"
        + "\n".join(lines)
        + f"\n-----END {kind}PRIVATE KEY-----"
    )


def jwt() -> str:
    return "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJ" + rand(URLSAFE, 60) + "." + rand(URLSAFE, 43)


@dataclass(frozen=True)
class Case:
    kind: str  # the table's own category (what a reader expects to be caught)
    secret: str
    text: str
    pii: bool = False


def secret_cases() -> list[Case]:
    """Realistic secrets in realistic sentences: >= 60 secrets, every kind."""
    cases: list[Case] = []

    def add(kind: str, secret: str, template: str, pii: bool = False) -> None:
        cases.append(Case(kind, secret, template.format(s=secret), pii))

    # Provider API keys.
    add(
        "openai",
        "sk-" + rand(ALNUM, 48),
        "Here's my OpenAI key: {s} - can you check why it returns 401?",
    )
    add("openai", "sk-proj-" + rand(URLSAFE, 156), "export OPENAI_API_KEY={s}")
    add(
        "openai",
        "sk-proj-" + rand(URLSAFE, 120),
        'I set openai.api_key = "{s}" in config.py but it still fails',
    )
    add(
        "openai",
        "sk-svcacct-" + rand(URLSAFE, 90),
        "the service account key is {s}, rotate it after the demo",
    )
    add(
        "anthropic",
        "sk-ant-api03-" + rand(URLSAFE, 93) + "AA",
        "my anthropic key {s} stopped working today",
    )
    add("anthropic", "sk-ant-api03-" + rand(URLSAFE, 95), 'client = Anthropic(api_key="{s}")')
    add("aws", "AKIA" + rand(UPPER_DIGITS, 16), "Access key ID: {s}")
    add(
        "aws",
        "ASIA" + rand(UPPER_DIGITS, 16),
        "the temporary creds start with {s}, session expires in an hour",
    )
    add("aws", rand(B64, 40), "aws_secret_access_key = {s}")
    add("aws", rand(B64, 40), "AWS_SECRET_ACCESS_KEY={s}")
    add("github", "ghp_" + rand(ALNUM, 36), "I pasted my token ghp by mistake: {s}")
    add("github", "gho_" + rand(ALNUM, 36), "the oauth app gave me {s}, is that normal?")
    add(
        "github",
        "github_pat_" + rand(ALNUM + "_", 82),
        "git clone https://{s}@github.com/acme/private-repo.git",
    )
    add("gitlab", "glpat-" + rand(URLSAFE, 20), "GITLAB_TOKEN={s} in the CI variables")
    add(
        "slack",
        "xoxb-"
        + "".join(_rng.choice(string.digits) for _ in range(12))
        + "-"
        + "".join(_rng.choice(string.digits) for _ in range(13))
        + "-"
        + rand(ALNUM, 24),
        "Slack bot token: {s}",
    )
    add(
        "slack",
        "xoxp-" + "".join(_rng.choice(string.digits) for _ in range(12)) + "-" + rand(ALNUM, 40),
        "use {s} for the user scope",
    )
    add(
        "slack",
        "T0" + rand(UPPER_DIGITS, 8) + "/B0" + rand(UPPER_DIGITS, 8) + "/" + rand(ALNUM, 24),
        "post it to https://hooks.slack.com/services/{s}",
    )
    add("stripe", "sk_live_" + rand(ALNUM, 24), "Our Stripe secret is {s}, don't share it")
    add("stripe", "rk_live_" + rand(ALNUM, 99), "restricted key for the webhook worker: {s}")
    add("stripe", "whsec_" + rand(ALNUM, 32), "STRIPE_WEBHOOK_SECRET={s}")
    add("google", "AIza" + rand(URLSAFE, 35), "the Maps API key AIza... full one is {s}")
    add("google", "ya29." + rand(URLSAFE, 120), "got this access token from gcloud: {s}")
    add("google", "GOCSPX-" + rand(URLSAFE, 28), "client secret from the console: {s}")
    add("huggingface", "hf_" + rand(ALNUM, 34), "huggingface-cli login --token {s}")
    add("npm", "npm_" + rand(ALNUM, 36), "//registry.npmjs.org/:_authToken={s}")
    add("tiermem", "tmk_" + rand(HEX, 12) + "_" + rand(URLSAFE, 43), "TIERMEM_API_KEY={s}")
    add("sendgrid", "SG." + rand(URLSAFE, 22) + "." + rand(URLSAFE, 43), "SENDGRID_API_KEY='{s}'")
    add("jwt", jwt(), "the session cookie holds {s}")
    add("jwt", jwt(), '{{"id_token": "{s}", "expires_in": 3600}}')
    # Bearer / Authorization headers.
    add(
        "bearer",
        rand(ALNUM, 40),
        "curl -H 'Authorization: Bearer {s}' https://api.example.com/v1/me",
    )
    add("bearer", rand(URLSAFE, 64), "Authorization: Bearer {s}")
    add("bearer", rand(B64, 32) + "==", "headers = {{'Authorization': 'Basic {s}'}}")
    add("bearer", rand(ALNUM, 32), "I tried Bearer {s} but the API says unauthorized")
    add("bearer", rand(HEX, 40), 'fetch(url, {{headers: {{"X-API-Key": "{s}"}}}})')
    # Generic labelled secrets.
    add("api_key", rand(ALNUM, 32), "The API key for the weather service is {s}")
    add("api_key", rand(HEX, 32), "api_key: {s}")
    add("api_key", rand(ALNUM, 24), '{{"apiKey": "{s}", "region": "eu-west-1"}}')
    add("api_key", rand(URLSAFE, 40), "MAILGUN_API_KEY={s}")
    add("secret", rand(ALNUM, 40), "client_secret={s}&grant_type=client_credentials")
    add("secret", rand(HEX, 64), "JWT_SECRET={s}")
    add("secret", rand(B64, 44), "the webhook signing secret is {s}")
    add("token", rand(ALNUM, 40), "TELEGRAM_BOT_TOKEN={s}")
    add("token", rand(URLSAFE, 48), "refresh_token: {s}")
    add("token", rand(ALNUM, 30), "access token = {s}")
    # Passwords.
    add("password", "Tr0ub4dor&3", "my password is {s}, please remember it for me")
    add("password", "hunter2", "password: {s}")
    add("password", "S3cure!Pass", "The wifi password for the guest network is {s}")
    add("password", "correct-horse-42", "DB_PASSWORD={s}")
    add("password", "Winter2024!", '{{"username": "maria", "password": "{s}"}}')
    add(
        "password",
        "p@ssw0rd123",
        "login with user admin and password {s}".replace("password {s}", "password: {s}"),
    )
    add("password", "Zx9#kLm2", "Here are my credentials - pwd: {s}")
    add("password", "blue-Falcon-77", "I changed my bank password to {s} yesterday")
    add("password", "MyDog$Rex2019", "the password was {s} but I think I reset it")
    add("password", "s3cr3tP4ss", "postgres://app_user:{s}@db.internal:5432/orders")
    add("password", "Qwerty!234", "mysql -u root --password={s}")
    add("password", "letmein99", "PASSWORD='{s}'")
    add("pin", "4821", "my debit card PIN is {s}")
    add("pin", "9034", "PIN: {s}")
    # Cards (Luhn-valid).
    add("card", card("4", 16, " "), "my card number is {s}, expiry 09/27")
    add("card", card("5", 16, "-"), "charge it to {s} please")
    add("card", card("37", 15, " "), "Amex {s} exp 11/26")
    add("card", card("6011", 16, ""), "card: {s}")
    add("card", card("4", 16, ""), "I typed {s} into the checkout form and it failed")
    add("card", card("2221", 16, " "), "the new Mastercard is {s}")
    add("card_cvv", "123", "and the CVV is {s}")
    add("card_cvv", "8841", "security code: {s}")
    # Private keys.
    add("private_key", pem("RSA "), "here is the deploy key:\n{s}\nadd it to the server")
    add("private_key", pem("OPENSSH "), "{s}")
    add("private_key", pem(""), "key.pem contains\n{s}")
    add(
        "private_key",
        pem("EC "),
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n{s}",
    )
    # PII (only in secrets+pii).
    add("email", "maria.gonzalez@example.com", "you can email me at {s}", pii=True)
    add("email", "j.smith+billing@acme-corp.co.uk", "send the invoice to {s} please", pii=True)
    add("phone", "+1 (415) 555-0132", "my number is {s}", pii=True)
    add("phone", "+44 20 7946 0958", "call the London office on {s}", pii=True)
    add("phone", "(212) 555-7788", "reach me at {s} after 6pm", pii=True)
    add("phone", "415-555-0199", "phone: {s}", pii=True)
    add("phone", "07700 900123", "text me on {s}", pii=True)
    add("phone", "+4915112345678", "WhatsApp: {s}", pii=True)
    return cases


def hard_cases() -> list[Case]:
    """Secrets the redactor is known to miss or only partly catch (printed, not counted):
    no format of their own and no label it trusts."""
    cases: list[Case] = []

    def add(kind: str, secret: str, template: str) -> None:
        cases.append(Case(kind, secret, template.format(s=secret)))

    add("password", "sunshine", "my password is {s}, all lowercase")
    add("password", "hunter2", "pw: {s}")
    add("password", "Hunter2!", "my password is {s}")
    add("api_key", rand(HEX, 32), "the key for the staging api is {s}")
    add("api_key", rand(B64, 40), "here is the AWS secret you asked for {s}")
    add("password", "correct horse battery staple", "my passphrase is {s}")
    add("token", rand(ALNUM, 30), "paste this into the app: {s}")
    return cases


def caught(case: Case, redacted: str) -> bool:
    """No part of the secret survives: neither the whole nor a 6-character piece of it
    (pieces the sentence has anyway, such as "github" in a github.com URL, do not count)."""
    secret = case.secret
    if secret in redacted:
        return False
    around = case.text.replace(secret, "\0")
    return not any(
        secret[i : i + 6] in redacted and secret[i : i + 6] not in around
        for i in range(len(secret) - 5)
    )


def dialogue(data: Path) -> Iterator[tuple[str, str]]:
    """(where, text) of every turn; a session repeated across haystacks only once."""
    seen: set[str] = set()
    for name in FILES:
        path = data / name
        with (
            gzip.open(path, "rt", encoding="utf-8")
            if name.endswith(".gz")
            else path.open(encoding="utf-8")
        ) as fh:
            for line in fh:
                session = json.loads(line)
                turns = session["turns"]
                digest = hashlib.sha256("\n".join(t["text"] for t in turns).encode()).hexdigest()
                if digest in seen:
                    continue
                seen.add(digest)
                for turn in turns:
                    where = f"{session['dataset']}/{session['user_id']}/{session['session_id']}"
                    yield where, turn["text"]


def bench_recall(mode: str) -> tuple[int, int]:
    redactor = Redactor(mode)  # type: ignore[arg-type]
    cases = [c for c in secret_cases() if mode == "secrets+pii" or not c.pii]
    by_kind: Counter[str] = Counter()
    missed: list[tuple[Case, str]] = []
    for case in cases:
        out = redactor.redact(case.text)
        if caught(case, out):
            by_kind[case.kind] += 1
        else:
            missed.append((case, out))
    total = Counter(c.kind for c in cases)
    ok = sum(by_kind.values())
    print(f"\n== recall, mode {mode}: {ok}/{len(cases)} = {ok / len(cases):.1%}")
    print("   " + ", ".join(f"{k} {by_kind[k]}/{n}" for k, n in total.items()))
    for case, out in missed:
        print(f"   MISSED {case.kind}: {out[:160]!r}")
    if mode == "secrets":
        print("   known limits (not counted above):")
        for case in hard_cases():
            out = redactor.redact(case.text)
            verdict = "caught" if caught(case, out) else "MISSED"
            print(f"     {verdict:6} {case.kind:9} {out[:110]!r}")
    return ok, len(cases)


def bench_dialogue(mode: str, data: Path, sample: int) -> None:
    redactor = Redactor(mode)  # type: ignore[arg-type]
    turns = list(dialogue(data))
    chars = sum(len(t) for _, t in turns)
    size_mb = sum(len(t.encode()) for _, t in turns) / 1e6
    findings: Counter[str] = Counter()
    rules: Counter[str] = Counter()
    examples: list[str] = []
    messages_hit = 0
    start = time.process_time()  # CPU time: the figure does not depend on the machine's load
    for _, text in turns:
        redactor.redact(text)
    elapsed = time.process_time() - start
    for where, text in turns:
        found = redactor.findings(text)
        if not found:
            continue
        messages_hit += 1
        for f in found:
            findings[f.kind] += 1
            rules[f.rule] += 1
            left = text[max(0, f.start - 50) : f.start].replace("\n", " ")
            right = text[f.end : f.end + 30].replace("\n", " ")
            examples.append(
                f"{f.kind:12} {where}: ...{left}<<{text[f.start : f.end][:60]}>>{right}..."
            )
    n = sum(findings.values())
    print(
        f"\n== ordinary dialogue, mode {mode}: {len(turns):,} messages, {size_mb:.1f} MB, "
        f"{chars:,} characters"
    )
    print(
        f"   findings (all counted as false positives): {n} in {messages_hit} messages = "
        f"{1000 * n / len(turns):.2f} per 1,000 messages, {n / size_mb:.2f} per MB; "
        f"{messages_hit / len(turns):.3%} of messages changed"
    )
    print("   by kind: " + ", ".join(f"{k} {v}" for k, v in findings.most_common()))
    print("   by rule: " + ", ".join(f"{k} {v}" for k, v in rules.most_common()))
    print(
        f"   throughput: {size_mb / elapsed:.1f} MB/s ({chars / elapsed / 1e6:.1f} M chars/s) of CPU time on one core"
    )
    if examples:
        pick = random.Random(7).sample(examples, min(sample, len(examples)))
        print(f"   sample of {len(pick)} findings:")
        for line in sorted(pick):
            print("     " + line)


# The shape this bench was first measured with: 40% of the size in messages, a tenth in each
# tool output; the peers' tools, effects and parent link.
SHAPE = ChatShape(
    message_share=0.4,
    tool_share=0.1,
    tools=["search", "fetch", "python"],
    effects=["http.post", "email.send", "db.write", "fs.write"],
    parent_link=True,
)


def chat_state(rng: random.Random, step: int, target: int = 5000) -> dict[str, object]:
    """An agent checkpoint of about ``target`` bytes of JSON at ``step`` of a run."""
    vocabulary = Vocabulary.zipf(rng)  # a fresh one each payload: drawn before the run's id
    run_id = f"run-{rng.randrange(100000):05d}"
    return SHAPE.state(rng, vocabulary, run_id, step, target)


def bench_chat_state(mode: str, rounds: int = 2) -> None:
    redactor = Redactor(mode)  # type: ignore[arg-type]
    rng = random.Random(16)
    payloads = [chat_state(rng, step) for _ in range(10) for step in range(40)]
    size = sum(len(json.dumps(p)) for p in payloads) / len(payloads)
    kept: Counter[str] = Counter()
    walked = 0
    narrow = getattr(redactor, "_narrow", None)  # what the narrowing keeps, where it exists
    if narrow is not None:
        for p in payloads:
            rule_set, by_key = narrow(p, None)
            kept.update(rule.name for rule in rule_set.rules)
            walked += bool(rule_set.rules) or by_key
    # A new redactor each round: the strings it keeps as clean would make a second round
    # over the same payloads cheaper than any run of fresh steps.
    best = float("inf")
    for _ in range(rounds):
        fresh = Redactor(cast(RedactMode, mode))
        start = time.process_time()
        for p in payloads:
            fresh.redact_json(p)
        best = min(best, time.process_time() - start)
    # As a step calls it: with the output's JSON text, which the step wrote already.
    texts = [orjson.dumps(p) for p in payloads]
    best_text = float("inf")
    for _ in range(rounds):
        fresh = Redactor(cast(RedactMode, mode))
        start = time.process_time()
        for p, text in zip(payloads, texts, strict=True):
            redact_dumped_json(fresh, p, text)
        best_text = min(best_text, time.process_time() - start)
    print(
        f"\n== chat-state checkpoints, mode {mode}: {len(payloads)} payloads of {size:,.0f} bytes: "
        f"redact_json {best / len(payloads) * 1e6:.1f} us CPU per payload, "
        f"{best_text / len(payloads) * 1e6:.1f} us given its JSON text (best of {rounds})"
    )
    print(
        f"   walked {walked}/{len(payloads)}; rules kept by the narrowing: "
        + (", ".join(f"{k} {v}" for k, v in kept.most_common()) or "none")
    )


def thread_states(data: Path, turns: int) -> list[dict[str, object]]:
    """A growing chat thread's states, one per node step (``langgraph_bench.py``'s conversation).

    The first ``turns`` (user, assistant) pairs of the LongMemEval_S haystacks,
    each turn adding the user's message and three of the agent's (a plan, the
    answer, a review), as the LangGraph bench's three-node graph does. Each
    state is decoded afresh from JSON, as a worker restoring it would have it:
    its history is equal text, not the same objects.
    """
    pairs: list[tuple[str, str]] = []
    with gzip.open(data / FILES[1], "rt") as lines:
        user = None
        for line in lines:
            for turn in json.loads(line)["turns"]:
                if turn["speaker"] == "user":
                    user = turn["text"]
                elif user is not None:
                    pairs.append((user, turn["text"]))
                    user = None
            if len(pairs) >= turns:
                break
    messages: list[dict[str, str]] = []
    states: list[dict[str, object]] = []
    for n, (user_text, answer) in enumerate(pairs[:turns]):
        messages.append({"type": "human", "content": user_text, "id": f"human-{n}"})
        for node, text in (
            ("plan", "Plan: answer the question using the thread so far."),
            ("answer", answer),
            ("review", "Reviewed: ok."),
        ):
            messages.append({"type": "ai", "content": text, "id": f"{node}-{n}"})
            states.append(orjson.loads(orjson.dumps({"messages": messages, "step": len(states)})))
    return states


class _CountingRedactor(Redactor):
    """A redactor counting the strings its walk meets (6+ characters) and those it tests."""

    def __init__(self, mode: RedactMode) -> None:
        super().__init__(mode)
        self.walked = self.tested = 0

    def _walk(self, value: object, key: str | None, rule_set: _RuleSet, by_key: bool) -> object:
        self.walked += isinstance(value, str) and len(value) >= 6
        return super()._walk(value, key, rule_set, by_key)

    def _redact(self, text: str, rule_set: _RuleSet) -> str:
        self.tested += 1
        return super()._redact(text, rule_set)


def bench_thread(mode: str, data: Path, turns: int) -> None:
    """CPU per state of a growing thread, and how many strings the walk tested afresh."""
    redact_mode = cast(RedactMode, mode)
    states = thread_states(data, turns)
    texts = [orjson.dumps(state) for state in states]
    best = float("inf")
    for _ in range(2):
        redactor = Redactor(redact_mode)
        start = time.process_time()
        for state, text in zip(states, texts, strict=True):
            redact_dumped_json(redactor, state, text)
        best = min(best, time.process_time() - start)
    counting = _CountingRedactor(redact_mode)
    for state, text in zip(states, texts, strict=True):
        redact_dumped_json(counting, state, text)
    walked, tested = counting.walked, counting.tested
    size = sum(map(len, texts)) / len(texts)
    print(
        f"\n== a growing chat thread, mode {mode}: {len(states)} states ({turns} turns, "
        f"{size / 1000:,.0f} KB of JSON on average): redact_dumped_json "
        f"{best / len(states) * 1e6:,.0f} us CPU per state (a new redactor each run, best of 2)"
    )
    print(
        f"   strings walked {walked:,}, tested with the rules {tested:,}: "
        f"{1 - tested / max(walked, 1):.1%} known clean from earlier states"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--mode", choices=["secrets", "secrets+pii", "both"], default="both")
    parser.add_argument("--sample", type=int, default=30, help="findings printed per mode")
    parser.add_argument("--chat-state", action="store_true", help="only the chat-state part")
    parser.add_argument("--turns", type=int, default=60, help="turns of the growing thread")
    parser.add_argument("--thread", action="store_true", help="only the growing-thread part")
    args = parser.parse_args(argv)
    modes = ["secrets", "secrets+pii"] if args.mode == "both" else [args.mode]
    if args.thread:
        for mode in modes:
            bench_thread(mode, args.data, args.turns)
        return 0
    for mode in modes:
        bench_chat_state(mode)
    if args.chat_state:
        return 0
    if (args.data / FILES[1]).exists():
        for mode in modes:
            bench_thread(mode, args.data, args.turns)
    for mode in modes:
        bench_recall(mode)
    if not (args.data / FILES[0]).exists():
        print(f"\nno dialogue data at {args.data}: false-positive figures skipped", file=sys.stderr)
        return 0
    for mode in modes:
        bench_dialogue(mode, args.data, args.sample)
    return 0


if __name__ == "__main__":
    sys.exit(main())
