"""The quickstart notebook runs top to bottom on the embedded default."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"


@pytest.mark.slow
def test_quickstart_notebook_executes(tmp_path: Path) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    outputs = [
        "".join(
            str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
            for out in cell.get("outputs", [])
        )
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]
    text = "\n".join(outputs)
    assert "charge ran 1 time(s)" in text
    assert "'concise'" in text
    assert "Lisbon" in text
    assert not any(
        out.get("output_type") == "error" for c in notebook.cells for out in c.get("outputs", [])
    )
