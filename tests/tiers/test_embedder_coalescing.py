"""Small embedding calls of concurrent threads run together (``Coalescer``), results unchanged."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
import pytest

from tests.waiting import wait_until
from tiers.backends.embedders import Coalescer, MiniLMEmbedder

QUERIES = [
    "how did the billing database migration go",
    "what is left to do for the Kubernetes upgrade",
    "remind me of the open questions on rate limiting",
    "which next steps did you recommend for backups",
    "who owns the onboarding guide",
    "why is checkout slow on mobile",
    "tls certificates expire next month",
    "clean up unused feature flags",
]


class Recorder:
    """A model stand-in: a vector per text (its length, twice), recording each call."""

    def __init__(self, *, gate: threading.Event | None = None, fail_on: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()
        self._gate = gate
        self._fail_on = fail_on

    def __call__(self, texts: list[str]) -> npt.NDArray[np.float32]:
        with self._lock:
            self.calls.append(list(texts))
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            if self._gate is not None:
                assert self._gate.wait(30), "the test never opened the gate"
            if self._fail_on is not None and self._fail_on in texts:
                raise RuntimeError("model failed")
            return np.array([[len(t), len(t)] for t in texts], dtype=np.float32)
        finally:
            with self._lock:
                self.running -= 1


def queued_texts(coalescer: Coalescer) -> int:
    """How many texts callers' requests hold that wait for a model call."""
    with coalescer._changed:  # the callers append under it
        return sum(len(request.texts) for request in coalescer._queue)


def wait_until_queued(coalescer: Coalescer, texts: int) -> None:
    """Wait until callers' requests of ``texts`` texts in all wait for a model call."""
    wait_until(
        lambda: queued_texts(coalescer) >= texts,
        60,
        what=lambda: f"{texts} texts queued ({queued_texts(coalescer)} are)",
    )


def test_a_lone_caller_runs_at_once_as_one_call() -> None:
    model = Recorder()
    vectors = Coalescer(model).embed(["ab", "abc"])
    assert vectors.tolist() == [[2, 2], [3, 3]]
    assert model.calls == [["ab", "abc"]]


def test_concurrent_callers_share_calls_and_each_gets_its_own_rows() -> None:
    gate = threading.Event()
    model = Recorder(gate=gate)
    coalescer = Coalescer(model, max_batch=32, max_running=1)
    texts = [["x" * n] * (1 + n % 3) for n in range(1, 25)]
    with ThreadPoolExecutor(len(texts)) as pool:
        futures = [pool.submit(coalescer.embed, t) for t in texts]
        # Let every caller queue up behind the first call, then let the model run.
        while sum(len(c) for c in model.calls) == 0:
            threading.Event().wait(0.001)
        wait_until_queued(coalescer, sum(len(t) for t in texts) - len(model.calls[0]))
        gate.set()
        results = [f.result(timeout=30) for f in futures]
    for t, rows in zip(texts, results, strict=True):
        assert rows.tolist() == [[len(s), len(s)] for s in t]
    assert len(model.calls) < len(texts)  # queued callers were run together
    assert all(len(call) <= 32 for call in model.calls)
    assert sum(len(call) for call in model.calls) == sum(len(t) for t in texts)
    assert model.most_running == 1


def test_no_more_calls_in_flight_than_max_running() -> None:
    model = Recorder()
    coalescer = Coalescer(model, max_batch=2, max_running=2)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda n: coalescer.embed(["y" * n]), range(1, 200)))
    assert [r.tolist() for r in results] == [[[n, n]] for n in range(1, 200)]
    assert model.most_running <= 2


def test_a_failed_call_fails_its_callers_only() -> None:
    gate = threading.Event()
    model = Recorder(gate=gate, fail_on="boom")
    coalescer = Coalescer(model, max_batch=2, max_running=1)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(coalescer.embed, ["first"])
        while not model.calls:
            threading.Event().wait(0.001)
        bad = pool.submit(coalescer.embed, ["boom"])
        wait_until_queued(coalescer, 1)
        good = pool.submit(coalescer.embed, ["fine", "also fine"])  # over max_batch: own call
        wait_until_queued(coalescer, 3)
        gate.set()
        assert first.result(timeout=30).tolist() == [[5, 5]]
        with pytest.raises(RuntimeError, match="model failed"):
            bad.result(timeout=30)
        assert good.result(timeout=30).tolist() == [[4, 4], [9, 9]]


def test_the_real_model_gives_the_same_vectors_coalesced_or_not() -> None:
    direct = MiniLMEmbedder(coalesce_up_to=0)
    together = MiniLMEmbedder(coalesce_up_to=8, max_running=1)
    expected = direct.embed(QUERIES)
    with ThreadPoolExecutor(len(QUERIES)) as pool:
        got = list(pool.map(lambda q: together.embed([q])[0], QUERIES))
    # Padding to a batch's longest text changes float rounding only.
    assert np.allclose(np.array(got), np.array(expected), atol=1e-4)
    assert not np.allclose(np.array(got[0]), np.array(got[1]), atol=1e-2)
