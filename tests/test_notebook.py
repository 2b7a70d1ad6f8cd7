"""The notebooks run top to bottom on the embedded default, offline, and show what they claim.

The LangGraph and Agents SDK notebooks are stored with their outputs (they are
read on the code host); the quickstart is stored without.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(path: Path, cwd: Path) -> Any:
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",  # the ipykernel of the interpreter running the tests
        resources={"metadata": {"path": str(cwd)}},
    ).execute()
    return notebook


def output_text(cell: Any) -> str:
    return "".join(
        str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
        for out in cell.get("outputs", [])
    )


def check_quickstart(cells: list[str]) -> None:
    text = "\n".join(cells)
    assert "charge ran 1 time(s)" in text
    assert "'concise'" in text
    assert "Lisbon" in text


def check_langgraph(cells: list[str]) -> None:
    text = "\n".join(cells)
    # The first run stops at the approval gate, with the question pending.
    assert "waiting at: ('ask_approval',)" in text
    assert "question:   Refund $42.50 for ORD-1042?" in text
    assert "{'content': 'wants refund receipts by email'}" in text
    # The first approver was killed right after paying; the second resumed in another process.
    assert "first approver exited with -9 (killed)" in text
    notebook_pid = re.search(r"this notebook is pid (\d+)", text)
    resumed = re.search(
        r"approver \(pid (\d+)\) resumed the thread: approved=True, receipt=(rf_\w+)", text
    )
    assert notebook_pid is not None
    assert resumed is not None
    assert resumed.group(1) != notebook_pid.group(1)
    # Paid once: after the crash and again after the resume that re-ran the node.
    assert re.findall(r"payment provider called (\d+) time\(s\)", text) == ["1", "1"]
    assert len(re.findall(r"^  refund ORD-1042 \$42\.50 key=\w+$", text, re.MULTILINE)) == 2
    # Back in the notebook: finished, with the approver's receipt and steps.
    assert "next: ()" in text
    assert f"'receipt': '{resumed.group(2)}'" in text
    steps = re.findall(r"^step +(-?\d+) ", text, re.MULTILINE)
    assert steps == ["1", "0", "-1", "3", "2", "1", "0", "-1"]
    context = next(c for c in cells if c.startswith("## What I know about this user"))
    assert "- receipts: wants refund receipts by email" in context


def check_agents(cells: list[str]) -> None:
    text = "\n".join(cells)
    base = "You are Acme's support agent. Be brief."
    # Session 1: two turns, the tool call among the stored items; nothing recalled yet.
    assert 'tool call  track_order({"order_id": "A-17"})' in text
    assert "tool out   A-17: held at the Porto depot, new delivery date Friday" in text
    assert f'{{"{base}"}}' in text
    summary = next(c for c in cells if c.startswith("Session support-chat-1 ("))
    assert "Decisions made:\n- We decided to keep A-17 on the Friday delivery." in summary
    assert "Next recommended steps:\n- Next, I'll email you the strap's tracking number" in summary
    assert "items left: []" in text
    assert "('preference.email_updates', 'prefers email updates')" in text
    # Session 2: the model's system instructions carry the user's fact and session 1's summary.
    (instructions,) = [
        c for c in cells if c.startswith(f"{base}\n\n## What I know about this user")
    ]
    assert "- preference.email_updates: prefers email updates" in instructions
    assert "Session support-chat-1 (" in instructions
    assert "- We decided to keep A-17 on the Friday delivery." in instructions
    assert "Next, I'll email you the strap's tracking number tomorrow." in instructions


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "check", "stored_with_outputs"),
    [
        pytest.param("quickstart.ipynb", check_quickstart, False, id="quickstart"),
        pytest.param("langgraph_agent.ipynb", check_langgraph, True, id="langgraph"),
        pytest.param("openai_agents_session.ipynb", check_agents, True, id="openai-agents"),
    ],
)
def test_notebook_executes(
    name: str, check: Callable[[list[str]], None], stored_with_outputs: bool, tmp_path: Path
) -> None:
    stored = nbformat.read(NOTEBOOKS / name, as_version=4)
    notebook = execute(NOTEBOOKS / name, tmp_path)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outputs = [out for cell in code for out in cell.get("outputs", [])]
    assert [out for out in outputs if out.get("output_type") == "error"] == []
    assert [out for out in outputs if out.get("name") == "stderr"] == []  # no warnings either
    check([output_text(cell) for cell in code])
    # The code host shows what the notebook prints today (pids, ids and timestamps aside).
    kinds = [sorted({out["output_type"] for out in cell.get("outputs", [])}) for cell in code]
    stored_kinds = [
        sorted({out["output_type"] for out in cell.get("outputs", [])})
        for cell in stored.cells
        if cell.cell_type == "code"
    ]
    assert stored_kinds == (kinds if stored_with_outputs else [[] for _ in code])
