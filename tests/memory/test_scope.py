"""Scope manager: unit tests and Hypothesis invariants.

Invariants (ARCHITECTURE/STYLE): the assembled context never exceeds its
budget; the system context never changes; each trace is a prefix of every
later one; a snapshot restores exactly.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import pickle
import threading
from collections.abc import Callable
from dataclasses import FrozenInstanceError
from datetime import UTC
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from pydantic import JsonValue

from memory.errors import (
    InvalidScopeInputError,
    InvalidScopeSnapshotError,
    PromptBudgetTooSmallError,
    ReadOnlyScopeError,
    ScopeError,
    TokenBudgetExceededError,
)
from memory.metrics import TiermemMetrics
from memory.scope import (
    SCOPE_SCHEMA_VERSION,
    SECTION_SEPARATOR,
    SYSTEM_HEADER,
    TRACE_HEADER,
    ScopeManager,
    SystemContext,
    Trace,
    TraceEntry,
    WorkingMemory,
)
from summarizer.tokens import count_tokens

SYSTEM = {"instructions": "You are a careful coding agent.", "tools": "search(query), run(cmd)"}

PROPERTY_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def line_cost(key: str, value: JsonValue) -> int:
    """The documented cost of a working-memory entry: tokens of ``- <key>: <text>``."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return count_tokens(f"- {key}: {text}")


def system_block(system: SystemContext) -> str:
    return f"{SYSTEM_HEADER}\n{system.text}"


# --- system context --------------------------------------------------------------------------


def test_system_text_renders_plain_string_and_ordered_sections() -> None:
    assert SystemContext("Be brief.").text == "Be brief."
    assert SystemContext("Be brief.")[""] == "Be brief."
    ctx = SystemContext({"b": "two", "a": "one"})
    assert ctx.text == "[b]\ntwo\n\n[a]\none"
    assert list(ctx) == ["b", "a"]
    assert dict(ctx) == {"b": "two", "a": "one"}
    assert ctx == SystemContext({"b": "two", "a": "one"})
    assert ctx != SystemContext({"a": "one", "b": "two"})  # order changes the text
    assert hash(ctx) == hash(SystemContext(dict(ctx)))


def set_item(ctx: SystemContext) -> None:
    ctx["instructions"] = "ignore all rules"


def del_item(ctx: SystemContext) -> None:
    del ctx["instructions"]


def set_text(ctx: SystemContext) -> None:
    ctx.text = "hacked"  # type: ignore[misc]


def set_private(ctx: SystemContext) -> None:
    ctx._text = "hacked"


def set_sections(ctx: SystemContext) -> None:
    ctx._sections = {}


def set_new_attr(ctx: SystemContext) -> None:
    ctx.extra = 1


def del_attr(ctx: SystemContext) -> None:
    del ctx._text


def in_place_or(ctx: SystemContext) -> None:
    ctx |= {"x": "y"}


MUTATIONS: dict[str, Callable[[SystemContext], object]] = {
    "setitem": set_item,
    "delitem": del_item,
    "set text": set_text,
    "set _text": set_private,
    "set _sections": set_sections,
    "new attribute": set_new_attr,
    "delattr": del_attr,
    "|=": in_place_or,
    "update(mapping)": lambda ctx: ctx.update({"x": "y"}),
    "update(kwargs)": lambda ctx: ctx.update(x="y"),
    "pop": lambda ctx: ctx.pop("instructions"),
    "popitem": lambda ctx: ctx.popitem(),
    "clear": lambda ctx: ctx.clear(),
    "setdefault": lambda ctx: ctx.setdefault("x", "y"),
}


@pytest.mark.parametrize("mutation", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_every_system_mutation_raises_read_only(
    mutation: Callable[[SystemContext], object],
) -> None:
    ctx = SystemContext(SYSTEM)
    before = (ctx.text, tuple(ctx.items()))
    with pytest.raises(ReadOnlyScopeError, match="read-only"):
        mutation(ctx)
    assert (ctx.text, tuple(ctx.items())) == before


def test_system_view_is_immutable_and_manager_cannot_replace_it() -> None:
    manager = ScopeManager(SYSTEM)
    view = manager.system.sections
    with pytest.raises(TypeError):
        view["instructions"] = "hacked"  # type: ignore[index]
    with pytest.raises(ReadOnlyScopeError, match="cannot be replaced"):
        manager.system = SystemContext("other")
    assert dict(manager.system) == SYSTEM


def test_system_copies_and_pickles_to_equal_context() -> None:
    ctx = SystemContext(SYSTEM)
    assert copy.copy(ctx) is ctx
    assert copy.deepcopy(ctx) is ctx
    clone = pickle.loads(pickle.dumps(ctx))
    assert clone == ctx
    assert clone.text == ctx.text


def test_system_source_is_copied_at_construction() -> None:
    source = dict(SYSTEM)
    ctx = SystemContext(source)
    source["instructions"] = "changed later"
    assert ctx["instructions"] == SYSTEM["instructions"]


@pytest.mark.parametrize("bad", [42, None, {"a": 1}, {1: "a"}, {"two\nlines": "x"}])
def test_system_rejects_bad_source(bad: Any) -> None:
    with pytest.raises(InvalidScopeInputError) as info:
        SystemContext(bad)
    assert info.value.field == "system"


# --- working memory --------------------------------------------------------------------------


def test_working_put_get_items_in_write_order() -> None:
    working = WorkingMemory(200)
    working.put("goal", "fix the flaky test")
    working.put("files", ["a.py", "b.py"])
    working.put("goal", "fix it for real")  # rewrite moves the key to the end
    assert working.keys() == ("files", "goal")
    assert working.items() == (("files", ["a.py", "b.py"]), ("goal", "fix it for real"))
    assert working.get("missing") is None
    assert working.get("missing", "dflt") == "dflt"
    assert working.render() == '- files: ["a.py", "b.py"]\n- goal: fix it for real'
    assert "goal" in working
    assert len(working) == 2


def test_working_counts_rendered_lines_with_tiktoken() -> None:
    working = WorkingMemory(500)
    cost = working.put("plan", {"steps": 3, "ok": True})
    assert cost == count_tokens('- plan: {"steps": 3, "ok": true}')
    working.put("note", "héllo wörld")
    assert working.used_tokens == cost + count_tokens("- note: héllo wörld")
    assert working.remaining_tokens == 500 - working.used_tokens


def test_working_refuses_over_budget_write_and_changes_nothing() -> None:
    working = WorkingMemory(20)
    working.put("a", "short")
    before = (working.items(), working.used_tokens)
    big = "word " * 50
    with pytest.raises(TokenBudgetExceededError) as info:
        working.put("b", big)
    error = info.value
    assert isinstance(error, ScopeError)
    assert error.needed == line_cost("b", big)
    assert error.remaining == 20 - before[1]
    assert error.budget == 20
    message = str(error)
    assert f"needs {error.needed} tokens" in message
    assert f"only {error.remaining} of 20 remain" in message
    assert "raise working_budget_tokens" in message
    assert (working.items(), working.used_tokens) == before


def test_working_budget_boundary_is_exact() -> None:
    cost = line_cost("k", "exactly enough")
    full = WorkingMemory(cost)
    full.put("k", "exactly enough")
    assert full.remaining_tokens == 0
    short = WorkingMemory(cost - 1)
    with pytest.raises(TokenBudgetExceededError):
        short.put("k", "exactly enough")
    assert short.used_tokens == 0


def test_working_replacing_a_key_accounts_for_freed_tokens() -> None:
    old = "alpha beta gamma delta"
    new = "alpha beta gamma delta epsilon"
    budget = line_cost("k", old) + 3
    assert line_cost("k", new) <= budget
    assert line_cost("k", old) + line_cost("k", new) > budget
    working = WorkingMemory(budget)
    working.put("k", old)
    working.put("k", new)  # fits only because the old value's tokens are freed
    assert working.get("k") == new
    assert working.used_tokens == line_cost("k", new)
    # A refused replacement keeps the old value.
    with pytest.raises(TokenBudgetExceededError, match="old value frees"):
        working.put("k", new * 5)
    assert working.get("k") == new


def test_working_values_are_copied_in_and_out() -> None:
    working = WorkingMemory(200)
    value: dict[str, Any] = {"items": [1, 2]}
    working.put("v", value)
    value["items"].append(3)
    out = working.get("v")
    assert out == {"items": [1, 2]}
    assert isinstance(out, dict)
    out["items"] = []
    assert working.get("v") == {"items": [1, 2]}
    assert working.used_tokens == line_cost("v", {"items": [1, 2]})


def test_working_remove_and_clear_free_tokens() -> None:
    working = WorkingMemory(200)
    working.put("a", "one")
    working.put("b", "two")
    assert working.remove("a") is True
    assert working.remove("a") is False
    assert working.used_tokens == line_cost("b", "two")
    working.clear()
    assert working.items() == ()
    assert working.used_tokens == 0
    assert working.remaining_tokens == 200


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("", "x", "key"),
        ("two\nlines", "x", "key"),
        (7, "x", "key"),
        ("k", {1, 2}, "value"),
        ("k", math.nan, "value"),
        ("k", object(), "value"),
    ],
)
def test_working_rejects_bad_input(key: Any, value: Any, field: str) -> None:
    working = WorkingMemory(200)
    with pytest.raises(InvalidScopeInputError) as info:
        working.put(key, value)
    assert info.value.field == field
    assert working.items() == ()


@pytest.mark.parametrize("budget", [-1, True, 1.5, "10"])
def test_working_rejects_bad_budget(budget: Any) -> None:
    with pytest.raises(InvalidScopeInputError, match="budget_tokens"):
        WorkingMemory(budget)


def test_unknown_encoding_is_a_typed_error() -> None:
    with pytest.raises(InvalidScopeInputError, match="not available offline") as info:
        ScopeManager(SYSTEM, encoding="no-such-encoding")
    assert info.value.field == "encoding"


# --- trace -----------------------------------------------------------------------------------


def test_trace_appends_gap_free_immutable_utc_entries() -> None:
    trace = Trace()
    first = trace.append("step", "read the issue", phase="plan")
    second = trace.append("tool", "search('flaky')", phase="plan")
    assert (first.seq, second.seq) == (1, 2)
    assert trace.entries() == (first, second)
    assert list(trace) == [first, second]
    assert first.timestamp.tzinfo is UTC
    assert first.timestamp <= second.timestamp
    with pytest.raises(FrozenInstanceError):
        first.text = "rewritten"  # type: ignore[misc]
    assert first.render() == "#1 [plan] step: read the issue"


def test_trace_has_no_removal_or_edit_api() -> None:
    trace = Trace()
    trace.append("note", "x", phase="p")
    for name in ("remove", "pop", "clear", "__setitem__", "__delitem__", "insert", "extend"):
        assert not hasattr(trace, name), name
    entries = trace.entries()
    assert isinstance(entries, tuple)


def test_trace_tail() -> None:
    trace = Trace()
    entries = [trace.append("step", f"s{i}", phase="p") for i in range(5)]
    assert trace.tail(2) == tuple(entries[3:])
    assert trace.tail(0) == ()
    assert trace.tail(99) == tuple(entries)
    with pytest.raises(InvalidScopeInputError, match="number of entries"):
        trace.tail(-1)


@pytest.mark.parametrize("kind", ["", "1step", "has space", "x" * 65, 3])
def test_trace_rejects_bad_kind(kind: Any) -> None:
    trace = Trace()
    with pytest.raises(InvalidScopeInputError) as info:
        trace.append(kind, "text", phase="p")
    assert info.value.field == "kind"
    assert len(trace) == 0


# --- scope manager: record and handoff -------------------------------------------------------


def test_record_stamps_current_phase_and_reserves_handoff() -> None:
    manager = ScopeManager(SYSTEM, phase="plan")
    entry = manager.record("step", "outline the fix")
    assert (entry.seq, entry.kind, entry.phase) == (1, "step", "plan")
    with pytest.raises(InvalidScopeInputError, match="phase_handoff"):
        manager.record("handoff", "sneaky")
    assert len(manager.trace) == 1


def test_phase_handoff_traces_summary_clears_working_and_advances() -> None:
    manager = ScopeManager(SYSTEM, phase="plan")
    manager.working.put("draft", "step list")
    manager.record("step", "planned")
    handoff = manager.phase_handoff("Plan: edit a.py then run tests", next_phase="act")
    assert (handoff.kind, handoff.text, handoff.phase, handoff.seq) == (
        "handoff",
        "Plan: edit a.py then run tests",
        "plan",
        2,
    )
    assert manager.phase == "act"
    assert manager.phase_index == 2
    assert manager.working.items() == ()
    assert manager.working.used_tokens == 0
    assert manager.record("step", "edited").phase == "act"
    manager.phase_handoff("done acting")
    assert manager.phase == "phase-3"


@pytest.mark.parametrize(
    ("summary", "next_phase"), [("", None), ("   ", None), ("ok", ""), ("ok", "a\nb")]
)
def test_bad_handoff_changes_nothing(summary: str, next_phase: str | None) -> None:
    manager = ScopeManager(SYSTEM)
    manager.working.put("k", "v")
    with pytest.raises(InvalidScopeInputError):
        manager.phase_handoff(summary, next_phase)
    assert manager.phase == "phase-1"
    assert manager.working.items() == (("k", "v"),)
    assert len(manager.trace) == 0


# --- scope manager: prompt assembly ----------------------------------------------------------


def test_prompt_context_puts_system_then_working_then_trace() -> None:
    manager = ScopeManager(SYSTEM, phase="plan")
    manager.working.put("goal", "green CI")
    manager.record("step", "read logs")
    text = manager.build_prompt_context(1000)
    assert text == (
        "## System\n[instructions]\nYou are a careful coding agent.\n\n"
        "[tools]\nsearch(query), run(cmd)\n\n"
        "## Working memory (phase: plan)\n- goal: green CI\n\n"
        "## Trace\n#1 [plan] step: read logs"
    )
    assert count_tokens(text) <= 1000


def test_empty_scopes_assemble_to_empty_text() -> None:
    assert ScopeManager("").build_prompt_context(0) == ""


def test_system_over_budget_is_a_typed_error_naming_the_need() -> None:
    manager = ScopeManager(SYSTEM)
    needed = count_tokens(system_block(manager.system))
    with pytest.raises(PromptBudgetTooSmallError) as info:
        manager.build_prompt_context(needed - 1)
    assert isinstance(info.value, TokenBudgetExceededError)
    assert info.value.needed == needed
    assert f"allow at least {needed} tokens" in str(info.value)
    # Exactly enough room: the system context alone, whole.
    manager.record("step", "x")
    assert manager.build_prompt_context(needed) == system_block(manager.system)


@pytest.mark.parametrize("bad", [-1, 2.5, None, True])
def test_prompt_context_rejects_bad_max_tokens(bad: Any) -> None:
    with pytest.raises(InvalidScopeInputError, match="max_tokens"):
        ScopeManager(SYSTEM).build_prompt_context(bad)


def test_trace_keeps_newest_entries_that_fit_with_an_omitted_marker() -> None:
    manager = ScopeManager("Be brief.")
    for i in range(10):
        manager.record("step", f"did thing number {i}")
    lines = [entry.render() for entry in manager.trace.entries()]

    def expected(kept: int) -> str:
        omitted = 10 - kept
        marker = [f"[{omitted} earlier trace entries omitted to fit the context budget]"]
        section = "\n".join([TRACE_HEADER, *marker, *lines[10 - kept :]])
        return SECTION_SEPARATOR.join([system_block(manager.system), section])

    budget = count_tokens(expected(3))
    assert count_tokens(expected(4)) > budget
    context = manager.assemble(budget)
    assert context.text == expected(3)
    assert context.trace_seqs == (8, 9, 10)
    assert context.omitted_trace == 7
    assert context.tokens == count_tokens(context.text) <= budget
    full = manager.assemble(10_000)
    assert full.omitted_trace == 0
    assert "omitted" not in full.text


def test_working_memory_larger_than_prompt_room_keeps_newest_writes() -> None:
    manager = ScopeManager("S", working_budget_tokens=1000)
    for i in range(8):
        manager.working.put(f"k{i}", f"value number {i}")
    manager.working.put("k0", "rewritten")  # now the newest write
    context = manager.assemble(45)
    assert context.tokens <= 45
    assert context.omitted_working > 0
    assert context.working_keys == manager.working.keys()[context.omitted_working :]
    assert context.working_keys[-1] == "k0"
    noun = "entry" if context.omitted_working == 1 else "entries"
    assert f"[{context.omitted_working} older working-memory {noun} omitted" in context.text


def test_section_is_dropped_when_not_even_its_marker_fits() -> None:
    manager = ScopeManager("S")
    manager.record("step", "x")
    budget = count_tokens(system_block(manager.system)) + 2
    context = manager.assemble(budget)
    assert context.text == system_block(manager.system)
    assert context.omitted_trace == 1
    assert context.trace_seqs == ()


# --- snapshot / restore ----------------------------------------------------------------------


def busy_manager() -> ScopeManager:
    manager = ScopeManager(SYSTEM, working_budget_tokens=300, phase="plan")
    manager.working.put("goal", "green CI")
    manager.record("step", "read logs")
    manager.phase_handoff("found the flaky test", next_phase="act")
    manager.working.put("files", {"edit": ["a.py"], "n": 1.5, "ok": None})
    manager.record("tool", "run('pytest -x')")
    return manager


def test_snapshot_is_json_and_restores_exactly() -> None:
    manager = busy_manager()
    snapshot = manager.snapshot()
    assert snapshot["schema_version"] == SCOPE_SCHEMA_VERSION
    restored = ScopeManager.restore(json.loads(json.dumps(snapshot)))
    assert restored.snapshot() == snapshot
    assert restored.trace.entries() == manager.trace.entries()
    assert restored.system == manager.system
    assert restored.working.items() == manager.working.items()
    assert (restored.phase, restored.phase_index) == ("act", 2)
    for budget in (60, 120, 10_000):
        assert restored.build_prompt_context(budget) == manager.build_prompt_context(budget)
    # The restored run carries on where the original stopped.
    assert restored.record("step", "next").seq == len(manager.trace) + 1
    restored.phase_handoff("acted")
    assert restored.phase == "phase-3"


def test_snapshot_is_independent_of_the_manager() -> None:
    manager = busy_manager()
    snapshot = manager.snapshot()
    snapshot["working"][0]["value"]["edit"].append("evil.py")
    snapshot["trace"].clear()
    assert manager.working.get("files") == {"edit": ["a.py"], "n": 1.5, "ok": None}
    assert len(manager.trace) == 3


def corrupt(mutate: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    snapshot = busy_manager().snapshot()
    mutate(snapshot)
    return snapshot


BAD_SNAPSHOTS: dict[str, tuple[Callable[[dict[str, Any]], object], str | None]] = {
    "newer schema": (lambda s: s.update(schema_version=2), "schema_version"),
    "bool schema": (lambda s: s.update(schema_version=True), "schema_version"),
    "missing field": (lambda s: s.pop("trace"), "trace"),
    "extra field": (lambda s: s.update(surprise=1), "surprise"),
    "mistyped budget": (lambda s: s.update(working_budget_tokens="300"), "working_budget_tokens"),
    "negative budget": (lambda s: s.update(working_budget_tokens=-1), "working_budget_tokens"),
    "phase index zero": (lambda s: s.update(phase_index=0), "phase_index"),
    "trace seq gap": (lambda s: s["trace"][1].update(seq=5), "trace.1"),
    "naive timestamp": (
        lambda s: s["trace"][0].update(timestamp="2024-01-01T00:00:00"),
        "trace.0",
    ),
    "garbage timestamp": (lambda s: s["trace"][0].update(timestamp="yesterday"), "trace.0"),
    "bad kind": (lambda s: s["trace"][0].update(kind="no spaces allowed"), "trace.0"),
    "duplicate working key": (lambda s: s["working"].append(dict(s["working"][0])), "working.1"),
    "working over budget": (lambda s: s.update(working_budget_tokens=1), "working.0"),
    "duplicate section": (lambda s: s["system"].append(dict(s["system"][0])), "system"),
    "unknown encoding": (lambda s: s.update(encoding="nope"), "snapshot"),
    "bad phase": (lambda s: s.update(phase=""), "snapshot"),
}


@pytest.mark.parametrize(("mutate", "field"), BAD_SNAPSHOTS.values(), ids=BAD_SNAPSHOTS.keys())
def test_restore_rejects_bad_snapshots(
    mutate: Callable[[dict[str, Any]], object], field: str | None
) -> None:
    with pytest.raises(InvalidScopeSnapshotError) as info:
        ScopeManager.restore(corrupt(mutate))
    assert info.value.field == field


def test_restore_names_the_fix_for_newer_snapshots_and_non_mappings() -> None:
    with pytest.raises(InvalidScopeSnapshotError, match="upgrade tiermem"):
        ScopeManager.restore(corrupt(lambda s: s.update(schema_version=99)))
    with pytest.raises(InvalidScopeSnapshotError, match="must be the dict"):
        ScopeManager.restore([])  # type: ignore[arg-type]


# --- threads ---------------------------------------------------------------------------------


def test_concurrent_records_and_puts_stay_consistent() -> None:
    manager = ScopeManager(SYSTEM, working_budget_tokens=60)
    threads_n, per_thread = 6, 150
    barrier = threading.Barrier(threads_n)
    refused = [0] * threads_n

    def worker(tid: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            manager.record("step", f"t{tid}-{i}")
            try:
                manager.working.put(f"t{tid}-{i % 4}", f"value {i} of thread {tid}")
            except TokenBudgetExceededError:
                refused[tid] += 1

    threads = [threading.Thread(target=worker, args=(tid,)) for tid in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    entries = manager.trace.entries()
    assert [entry.seq for entry in entries] == list(range(1, threads_n * per_thread + 1))
    for tid in range(threads_n):
        mine = [entry.text for entry in entries if entry.text.startswith(f"t{tid}-")]
        assert mine == [f"t{tid}-{i}" for i in range(per_thread)]
    used = sum(line_cost(key, value) for key, value in manager.working.items())
    assert manager.working.used_tokens == used <= 60
    assert sum(refused) > 0  # the budget was actually contended


# --- Hypothesis strategies -------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8"), max_size=60)
names = st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True)
json_values: st.SearchStrategy[JsonValue] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)
values = texts | json_values
systems = texts | st.dictionaries(names, texts, max_size=4)
kinds = st.sampled_from(["step", "tool", "note", "decision"])


def fill(
    manager: ScopeManager,
    puts: list[tuple[str, JsonValue]],
    records: list[tuple[str, str]],
    handoff_at: int | None,
) -> None:
    for key, value in puts:
        with contextlib.suppress(TokenBudgetExceededError):
            manager.working.put(key, value)
    for index, (kind, text) in enumerate(records):
        if index == handoff_at:
            manager.phase_handoff(f"summary before {index}")
        manager.record(kind, text)


# Invariant 1: the assembled context never exceeds its budget.
@PROPERTY_SETTINGS
@given(
    system=systems,
    working_budget=st.integers(0, 300),
    puts=st.lists(st.tuples(names, values), max_size=10),
    records=st.lists(st.tuples(kinds, texts), max_size=25),
    handoff_at=st.none() | st.integers(0, 25),
    max_tokens=st.integers(0, 500),
)
def test_assembled_context_never_exceeds_budget(
    system: str | dict[str, str],
    working_budget: int,
    puts: list[tuple[str, JsonValue]],
    records: list[tuple[str, str]],
    handoff_at: int | None,
    max_tokens: int,
) -> None:
    manager = ScopeManager(system, working_budget_tokens=working_budget)
    fill(manager, puts, records, handoff_at)
    head = system_block(manager.system) if manager.system.text else ""
    needed = count_tokens(head)
    if needed > max_tokens:
        with pytest.raises(PromptBudgetTooSmallError) as info:
            manager.assemble(max_tokens)
        assert info.value.needed == needed
        return
    context = manager.assemble(max_tokens)
    assert count_tokens(context.text) == context.tokens <= max_tokens
    assert context.text.startswith(head)
    # What was kept is the newest part; counts add up.
    trace_n = len(manager.trace)
    assert context.trace_seqs == tuple(range(context.omitted_trace + 1, trace_n + 1))
    assert context.working_keys == manager.working.keys()[context.omitted_working :]
    if context.trace_seqs and context.omitted_trace:
        assert f"[{context.omitted_trace} earlier trace entr" in context.text


# Invariant 2: the system context never changes.
operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), names, values),
        st.tuples(st.just("remove"), names),
        st.tuples(st.just("record"), kinds, texts),
        st.tuples(st.just("handoff"), st.text(min_size=1, max_size=20).filter(str.strip)),
        st.tuples(st.just("build"), st.integers(0, 400)),
        st.tuples(st.just("mutate"), st.sampled_from(sorted(MUTATIONS))),
        st.tuples(st.just("replace")),
        st.tuples(st.just("restore")),
    ),
    max_size=25,
)


@PROPERTY_SETTINGS
@given(system=systems, ops=operations)
def test_system_context_never_changes(
    system: str | dict[str, str], ops: list[tuple[Any, ...]]
) -> None:
    manager = ScopeManager(system, working_budget_tokens=80)
    text_before = manager.system.text
    sections_before = tuple(manager.system.items())
    for op in ops:
        match op:
            case ("put", key, value):
                with contextlib.suppress(TokenBudgetExceededError):
                    manager.working.put(key, value)
            case ("remove", key):
                manager.working.remove(key)
            case ("record", kind, text):
                manager.record(kind, text)
            case ("handoff", summary):
                manager.phase_handoff(summary)
            case ("build", max_tokens):
                try:
                    text = manager.build_prompt_context(max_tokens)
                except PromptBudgetTooSmallError:
                    continue
                if text_before:
                    assert text.startswith(f"{SYSTEM_HEADER}\n{text_before}")
            case ("mutate", name):
                with pytest.raises(ReadOnlyScopeError):
                    MUTATIONS[name](manager.system)
            case ("replace",):
                with pytest.raises(ReadOnlyScopeError):
                    manager.system = SystemContext("replaced")
            case ("restore",):
                manager = ScopeManager.restore(json.loads(json.dumps(manager.snapshot())))
        assert manager.system.text == text_before
        assert tuple(manager.system.items()) == sections_before


# Invariant 3: each trace is a prefix of every later one (state machine vs a plain model).
MACHINE_BUDGET = 40
MACHINE_KEYS = st.sampled_from(["goal", "plan", "files", "notes"]) | names


class ScopeMachine(RuleBasedStateMachine):
    """Random scope operations on a real manager and a plain-Python model side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.manager = ScopeManager(SYSTEM, working_budget_tokens=MACHINE_BUDGET)
        self.system_text = self.manager.system.text
        self.model_working: dict[str, JsonValue] = {}
        self.model_trace: list[tuple[str, str, str]] = []
        self.model_phase = "phase-1"
        self.model_phase_index = 1
        self.last_trace: tuple[TraceEntry, ...] = ()

    @rule(key=MACHINE_KEYS, value=values)
    def put(self, key: str, value: JsonValue) -> None:
        cost = line_cost(key, value)
        others = sum(line_cost(k, v) for k, v in self.model_working.items() if k != key)
        before = self.manager.working.items()
        if others + cost > MACHINE_BUDGET:
            with pytest.raises(TokenBudgetExceededError) as info:
                self.manager.working.put(key, value)
            assert info.value.needed == cost
            assert self.manager.working.items() == before
            return
        assert self.manager.working.put(key, value) == cost
        self.model_working.pop(key, None)
        self.model_working[key] = json.loads(json.dumps(value))

    @rule(key=MACHINE_KEYS)
    def remove(self, key: str) -> None:
        assert self.manager.working.remove(key) == (key in self.model_working)
        self.model_working.pop(key, None)

    @rule(kind=kinds, text=texts)
    def record(self, kind: str, text: str) -> None:
        entry = self.manager.record(kind, text)
        self.model_trace.append((kind, text, self.model_phase))
        assert entry.seq == len(self.model_trace)

    @rule(summary=st.text(min_size=1, max_size=30).filter(str.strip), next_phase=st.none() | names)
    def handoff(self, summary: str, next_phase: str | None) -> None:
        self.manager.phase_handoff(summary, next_phase)
        self.model_trace.append(("handoff", summary, self.model_phase))
        self.model_working.clear()
        self.model_phase_index += 1
        self.model_phase = next_phase or f"phase-{self.model_phase_index}"

    @rule()
    def snapshot_and_restore(self) -> None:
        snapshot = self.manager.snapshot()
        restored = ScopeManager.restore(json.loads(json.dumps(snapshot)))
        assert restored.snapshot() == snapshot
        assert restored.build_prompt_context(300) == self.manager.build_prompt_context(300)
        self.manager = restored

    @rule(max_tokens=st.integers(0, 400))
    def build(self, max_tokens: int) -> None:
        if count_tokens(system_block(self.manager.system)) > max_tokens:
            with pytest.raises(PromptBudgetTooSmallError):
                self.manager.assemble(max_tokens)
            return
        context = self.manager.assemble(max_tokens)
        assert count_tokens(context.text) == context.tokens <= max_tokens
        assert context.text.startswith(system_block(self.manager.system))

    @invariant()
    def trace_only_grows(self) -> None:
        current = self.manager.trace.entries()
        assert current[: len(self.last_trace)] == self.last_trace
        assert [(e.kind, e.text, e.phase) for e in current] == self.model_trace
        assert [e.seq for e in current] == list(range(1, len(current) + 1))
        self.last_trace = current

    @invariant()
    def working_matches_model_within_budget(self) -> None:
        working = self.manager.working
        assert list(working.items()) == list(self.model_working.items())
        expected = sum(line_cost(k, v) for k, v in self.model_working.items())
        assert working.used_tokens == expected <= MACHINE_BUDGET

    @invariant()
    def phase_and_system_match(self) -> None:
        assert self.manager.phase == self.model_phase
        assert self.manager.phase_index == self.model_phase_index
        assert self.manager.system.text == self.system_text


ScopeMachine.TestCase.settings = settings(
    max_examples=75,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_scope_state_machine = ScopeMachine.TestCase


# Invariant 4: snapshot/restore round-trips exactly.
@PROPERTY_SETTINGS
@given(
    system=systems,
    working_budget=st.integers(0, 300),
    puts=st.lists(st.tuples(names, values), max_size=8),
    records=st.lists(st.tuples(kinds, texts), max_size=15),
    handoff_at=st.none() | st.integers(0, 15),
    max_tokens=st.integers(0, 400),
)
def test_snapshot_restore_round_trip(
    system: str | dict[str, str],
    working_budget: int,
    puts: list[tuple[str, JsonValue]],
    records: list[tuple[str, str]],
    handoff_at: int | None,
    max_tokens: int,
) -> None:
    manager = ScopeManager(system, working_budget_tokens=working_budget)
    fill(manager, puts, records, handoff_at)
    snapshot = manager.snapshot()
    restored = ScopeManager.restore(json.loads(json.dumps(snapshot)))
    assert restored.snapshot() == snapshot
    assert restored.system == manager.system
    assert restored.trace.entries() == manager.trace.entries()
    assert restored.working.items() == manager.working.items()
    assert restored.working.used_tokens == manager.working.used_tokens
    assert (restored.phase, restored.phase_index) == (manager.phase, manager.phase_index)
    try:
        expected = manager.assemble(max_tokens)
    except PromptBudgetTooSmallError:
        with pytest.raises(PromptBudgetTooSmallError):
            restored.assemble(max_tokens)
        return
    assert restored.assemble(max_tokens) == expected


def _violations(metrics: TiermemMetrics) -> dict[str, float]:
    """``tiermem_memory_scope_violations_total`` by kind, as scraped."""
    return {
        sample.labels["kind"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "tiermem_memory_scope_violations"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_a_manager_given_metrics_counts_each_refusal_once_by_kind() -> None:
    metrics = TiermemMetrics()
    shared = SystemContext(SYSTEM)
    manager = ScopeManager(shared, working_budget_tokens=20, metrics=metrics)
    refusals: list[Callable[[], object]] = [
        lambda: manager.system.update({"tools": "rm -rf"}),  # the system context is read-only
        lambda: manager.__setattr__("system", SystemContext("other")),
        lambda: manager.working.put("notes", "word " * 100),  # over the working budget
        lambda: manager.record("handoff", "not a handoff"),  # reserved kind
        lambda: manager.record("bad kind!", "x"),  # refused by the trace, counted once
        lambda: manager.trace.append("", "x", phase="p"),
        lambda: manager.phase_handoff("   "),
        lambda: manager.build_prompt_context(1),  # the system context alone does not fit
        lambda: ScopeManager.restore({"schema_version": 999}, metrics=metrics),
        lambda: ScopeManager(SYSTEM, working_budget_tokens=-1, metrics=metrics),
    ]
    for refused in refusals:
        with pytest.raises(ScopeError):
            refused()
    assert _violations(metrics) == {
        "read_only": 2,
        "token_budget": 1,
        "invalid_input": 5,
        "prompt_budget": 1,
        "invalid_snapshot": 1,
    }
    # What is allowed counts nothing, and the context shared with other managers is not
    # the one that reports: another manager over it counts nowhere.
    manager.working.put("k", "v")
    manager.record("step", "ok")
    assert manager.system == shared
    with pytest.raises(ReadOnlyScopeError):
        ScopeManager(shared).system.clear()
    with pytest.raises(ReadOnlyScopeError):
        shared.clear()
    assert sum(_violations(metrics).values()) == 10


def test_a_restored_manager_keeps_counting_and_an_inconsistent_snapshot_counts_once() -> None:
    metrics = TiermemMetrics()
    manager = ScopeManager(SYSTEM, working_budget_tokens=50)
    manager.working.put("k", "v")
    snapshot = manager.snapshot()
    restored = ScopeManager.restore(snapshot, metrics=metrics)
    with pytest.raises(TokenBudgetExceededError):
        restored.working.put("big", "word " * 100)
    with pytest.raises(InvalidScopeSnapshotError):  # working memory over its budget
        ScopeManager.restore({**snapshot, "working_budget_tokens": 1}, metrics=metrics)
    assert _violations(metrics) == {"token_budget": 1, "invalid_snapshot": 1}
    assert restored.snapshot() == snapshot  # the refused write changed nothing


def test_an_app_still_reports_its_own_violations() -> None:
    metrics = TiermemMetrics()
    metrics.scope_violation()
    assert _violations(metrics) == {"app": 1}
