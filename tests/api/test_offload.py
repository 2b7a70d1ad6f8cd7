"""``Offloader``: short blocking calls on dedicated threads, results handed back in batches."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from api.offload import Offloader, OffloaderClosedError

request_name: contextvars.ContextVar[str] = contextvars.ContextVar("request_name", default="none")


def test_results_and_errors_reach_their_own_callers() -> None:
    offloader = Offloader(threads=2)

    def work(n: int) -> int:
        if n % 7 == 0:
            raise ValueError(f"bad {n}")
        return n * n

    async def main() -> list[object]:
        return await asyncio.gather(
            *(offloader.run(work, n) for n in range(1, 200)), return_exceptions=True
        )

    try:
        results = asyncio.run(main())
    finally:
        offloader.close()
    for n, result in zip(range(1, 200), results, strict=True):
        if n % 7 == 0:
            assert isinstance(result, ValueError)
            assert str(result) == f"bad {n}"
        else:
            assert result == n * n


def test_calls_run_off_the_loop_in_the_callers_context() -> None:
    offloader = Offloader(threads=1)

    def where() -> tuple[str, str]:
        return threading.current_thread().name, request_name.get()

    async def one(name: str) -> tuple[str, str]:
        request_name.set(name)
        return await offloader.run(where)

    async def main() -> list[tuple[str, str]]:
        return await asyncio.gather(*(one(f"r{n}") for n in range(20)))

    try:
        results = asyncio.run(main())
    finally:
        offloader.close()
    assert [name for _, name in results] == [f"r{n}" for n in range(20)]
    assert {thread for thread, _ in results} == {"tiermem-offload-0"}


def test_close_runs_what_is_queued_then_refuses_more() -> None:
    offloader = Offloader(threads=1)
    gate = threading.Event()
    done: list[int] = []

    def slow(n: int) -> int:
        gate.wait(30)
        done.append(n)
        return n

    async def main() -> list[int]:
        calls = [asyncio.ensure_future(offloader.run(slow, n)) for n in range(5)]
        await asyncio.sleep(0.05)  # all five queued or running
        closer = asyncio.get_running_loop().run_in_executor(None, offloader.close)
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.gather(*calls)
        await closer
        with pytest.raises(OffloaderClosedError):
            await offloader.run(slow, 99)
        return results

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]
    assert done == [0, 1, 2, 3, 4]


def test_it_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="threads"):
        Offloader(threads=0)
