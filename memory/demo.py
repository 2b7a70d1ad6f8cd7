"""``tiermem demo``: the three tiers end to end, with a real crash and resume.

The story: a support agent helps Maria with a refund. Her preferences are
stored; a 6-step refund workflow runs in a worker process that is killed with
SIGKILL after step 4; a fresh process resumes it and every side effect runs
exactly once; the session is summarized and saved; the next session starts
with a continuation context built from what was remembered.

The worker is this module run as ``python -m memory.demo worker ...``.

The demo can run again on the same folder: each run starts a refund
workflow of its own (a fresh run id, and its own effect log), while the
user's facts and sessions are saved again idempotently.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn

from pydantic import JsonValue
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from memory.facade import Memory
from tiers.task import NOT_DONE, NotDone

USER = "maria"
RUN_PREFIX = "refund-ord-5521"
STEPS = (
    "authenticate",
    "validate_order",
    "compute_amount",
    "issue_credit",
    "send_confirmation",
    "update_crm",
)
KILL_AFTER_STEP = 4
OUTPUTS: dict[str, JsonValue] = {
    "authenticate": {"customer": USER, "verified": True},
    "validate_order": {"order": "ORD-5521", "item": "blender", "eligible": True},
    "compute_amount": {"amount": 89.99, "currency": "USD"},
    "issue_credit": {"credit_id": "CR-88213", "amount": 89.99},
    "send_confirmation": {"email": "sent", "to": "maria@example.org"},
    "update_crm": {"crm_case": "CASE-1203", "status": "resolved"},
}

TRANSCRIPT = [
    {
        "role": "user",
        "content": "Hi, I need a refund for order ORD-5521. The blender arrived broken.",
    },
    {
        "role": "assistant",
        "content": "Sorry to hear that, Maria. I've verified your identity and found order ORD-5521.",
    },
    {
        "role": "user",
        "content": "I prefer store credit rather than a card refund, it's faster for me.",
    },
    {
        "role": "assistant",
        "content": "Understood. We decided to issue the refund as store credit of $89.99.",
    },
    {
        "role": "assistant",
        "content": "I've issued the credit and sent you a confirmation email. The CRM record is updated.",
    },
    {
        "role": "user",
        "content": "Thanks. Can I also get the replacement shipped to my new address in Lyon?",
    },
    {
        "role": "assistant",
        "content": "I'm not sure the warehouse ships to France yet, I need to check with logistics.",
    },
    {
        "role": "assistant",
        "content": "Next step: follow up with logistics about shipping the replacement to Lyon.",
    },
]

EARLIER_SESSIONS: list[dict[str, JsonValue]] = [
    {
        "session_id": "s-2026-09-02",
        "task_description": "Maria asked how to change the email address on her account.",
        "work_completed": ["Updated the account email to maria@example.org."],
        "next_recommended_steps": ["Confirm the new email is verified."],
        "days_ago": 80,
    },
    {
        "session_id": "s-2026-10-15",
        "task_description": "Maria reported a late delivery for order ORD-4410 (coffee grinder).",
        "decisions_made": ["Offered a $10 voucher for the late delivery."],
        "work_completed": ["Voucher VCH-10 applied to her account."],
        "days_ago": 38,
    },
]


def run_step(step: str, effects_log: Path) -> Callable[[str], JsonValue]:
    """The external call of one refund step: logs its side effect under its idempotency key."""

    def call(idempotency_key: str) -> JsonValue:
        if step == "send_confirmation" and os.environ.get("TIERMEM_DEMO_HANG") == "1":
            # The worker that is about to be killed parks here: the call is invoked, not done.
            print("HANGING", flush=True)
            time.sleep(600)
        with effects_log.open("a") as log:
            log.write(f"{step} {idempotency_key}\n")
            log.flush()
            os.fsync(log.fileno())
        return OUTPUTS[step]

    return call


def probe(step: str, effects_log: Path) -> Callable[[str], JsonValue | NotDone]:
    """Reconcile an effect whose outcome is unknown: ask the 'external system' by key."""

    def check(idempotency_key: str) -> JsonValue | NotDone:
        done = effects_log.exists() and f"{step} {idempotency_key}" in effects_log.read_text()
        print(json.dumps({"reconciled": step, "was_done": done}), flush=True)
        return OUTPUTS[step] if done else NOT_DONE

    return check


def effects_log(data_dir: Path, run_id: str) -> Path:
    """Where the 'external system' logs the side effects of one run."""
    return data_dir / f"effects-{run_id}.log"


def worker(data_dir: Path, run_id: str) -> None:
    """Run (or resume) the refund workflow; prints one line per committed step."""
    with Memory.open(data_dir) as memory:
        run = memory.start_run(USER, run_id)
        for index, step in enumerate(STEPS, start=1):
            log = effects_log(data_dir, run_id)
            output = run.effect(step, run_step(step, log), reconcile=probe(step, log))
            print(json.dumps({"step": index, "name": step, "output": output}), flush=True)
        run.complete({"refund": "done"})


def main(data_dir: Path | None = None) -> None:
    """Run the scripted story and print it."""
    console = Console(highlight=False)
    workdir = data_dir or Path(tempfile.mkdtemp(prefix="tiermem-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    console.print(
        Panel.fit(f"[bold]tiermem demo[/] - data in [cyan]{workdir}[/]", border_style="blue")
    )

    console.rule("[bold blue]1. User tier: Maria's standing preferences")
    with Memory.open(workdir) as memory:
        memory.set_facts(USER, {"language": "en", "tone": "concise", "contact": "email"})
        now = datetime.now(UTC)
        for earlier in EARLIER_SESSIONS:
            fields = {k: v for k, v in earlier.items() if k != "days_ago"}
            days = earlier["days_ago"]
            assert isinstance(days, int)
            memory.save_session(
                {"user_id": USER, **fields, "created_at": now - timedelta(days=days)}
            )
        for fact in memory.get_facts(USER):
            console.print(
                f"  [green]{fact.key}[/] = {fact.value!r}  [dim](source: {fact.source})[/]"
            )
        console.print(f"  [dim]+ {len(EARLIER_SESSIONS)} earlier sessions backfilled[/]")

    # A run of its own each time, so the demo runs again on a folder it used before.
    run_id = f"{RUN_PREFIX}-{secrets.token_hex(4)}"
    console.rule("[bold blue]2. Task tier: a 6-step refund workflow, killed after step 4")
    worker_cmd = [sys.executable, "-m", "memory.demo", "worker", str(workdir), run_id]
    env = {**os.environ, "TIERMEM_DEMO_HANG": "1"}
    proc = subprocess.Popen(
        worker_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    hanging = False
    for line in proc.stdout:
        if line.startswith("HANGING"):
            hanging = True
            break
        event = json.loads(line)
        console.print(
            f"  [green]✔[/] step {event['step']} [bold]{event['name']}[/] -> {event['output']}"
        )
    if not hanging:
        # It ended on its own before the step it was to be killed in: say why, not "killed".
        proc.wait()
        _worker_failed(console, proc.returncode, proc.stderr.read())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    console.print(
        f"  [bold red]✘ worker pid {proc.pid} killed with SIGKILL[/] during step "
        f"{KILL_AFTER_STEP + 1} (exit {proc.returncode})"
    )

    console.print("  [yellow]↻ a new worker process resumes the run[/]")
    resumed = subprocess.run(worker_cmd, capture_output=True, text=True, check=False)
    if resumed.returncode != 0:
        _worker_failed(console, resumed.returncode, resumed.stderr)
    for line in resumed.stdout.splitlines():
        event = json.loads(line)
        if "reconciled" in event:
            verdict = "it had happened" if event["was_done"] else "it had not happened: run it now"
            console.print(
                f"  [yellow]? step {event['reconciled']} was in flight at the crash (outcome "
                f"unknown): reconciled by idempotency key -> {verdict}[/]"
            )
            continue
        replayed = event["step"] <= KILL_AFTER_STEP
        mark = "[dim]↺ replayed from checkpoint[/]" if replayed else "[green]✔ executed[/]"
        console.print(f"  {mark} step {event['step']} [bold]{event['name']}[/]")

    effects = Counter(
        line.split()[0] for line in effects_log(workdir, run_id).read_text().splitlines()
    )
    table = Table(title="side effects executed", title_style="bold")
    table.add_column("step")
    table.add_column("times", justify="right")
    for step in STEPS:
        count = effects[step]
        table.add_row(step, f"[green]{count}[/]" if count == 1 else f"[bold red]{count}[/]")
    console.print(table)

    with Memory.open(workdir) as memory:
        info = memory.get_run(run_id)
        history = memory.run_history(run_id)
        console.print(
            f"  run [bold]{run_id}[/]: status [green]{info.status.value}[/], "
            f"{len(history)} checkpoints, seq {[c.seq for c in history]}"
        )

        console.rule("[bold blue]3. Session tier: end of session, summarized and saved")
        summary = memory.end_session(USER, "s-refund-5521", TRANSCRIPT)
        console.print(Panel(summary.render(), title="stored summary", border_style="green"))
        learned = [f for f in memory.get_facts(USER) if f.source.startswith("session:")]
        for fact in learned:
            console.print(
                f"  [green]learned fact[/] {fact.key} = {fact.value!r} [dim]({fact.source})[/]"
            )

        console.rule("[bold blue]4. Next session: continuation context")
        query = "Maria is back: any news on her replacement blender shipping?"
        console.print(f"  query: [italic]{query}[/]")
        context = memory.continuation_context(USER, query, max_tokens=320)
        console.print(
            Panel(
                context.text,
                title=f"continuation context ({context.tokens} tokens)",
                border_style="magenta",
            )
        )

    ok = all(effects[step] == 1 for step in STEPS)
    console.print(
        "[bold green]All side effects ran exactly once across the crash.[/]"
        if ok
        else "[bold red]A side effect ran more than once![/]"
    )
    if not ok:
        raise SystemExit(1)


def _worker_failed(console: Console, returncode: int, stderr: str) -> NoReturn:
    """Report a worker that failed on its own (not the planned kill) and stop the demo."""
    console.print(f"  [bold red]✘ the worker failed on its own (exit {returncode}):[/]")
    console.print(stderr.strip()[-2000:] or "(no output)", markup=False)
    raise SystemExit(1)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        worker(Path(sys.argv[2]), sys.argv[3])
    else:
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
