"""Prints LangGraph's conformance report of every backend at the end of the test run."""

from __future__ import annotations

import contextlib
import io

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.integrations.test_langgraph import REPORTS

    for report in REPORTS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            report.print_report()
        terminalreporter.write(out.getvalue())
