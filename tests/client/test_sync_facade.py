"""The blocking facades' private loop and hand-off (``client/sync.py``): uvloop's loop when installed, and a
blocking call that returns the coroutine's result or raises what ``run_coroutine_threadsafe(...).result()``
raised (the coroutine's exception, TimeoutError, concurrent.futures.CancelledError, TypeError)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator

import pytest

from ferrymq.client.sync import _LoopThread


@pytest.fixture
def loop_thread() -> Iterator[_LoopThread]:
    lt = _LoopThread("test-facade")
    try:
        yield lt
    finally:
        lt.stop()


def test_private_loop_is_uvloop_when_installed(loop_thread: _LoopThread) -> None:
    uvloop = pytest.importorskip("uvloop")
    assert isinstance(loop_thread.loop, uvloop.Loop)


def test_result_runs_on_the_loop_thread(loop_thread: _LoopThread) -> None:
    async def where() -> tuple[str, bool]:
        await asyncio.sleep(0)
        return threading.current_thread().name, asyncio.get_running_loop() is loop_thread.loop

    assert loop_thread.run(where()) == ("test-facade", True)
    assert [loop_thread.run(asyncio.sleep(0, result=i)) for i in range(200)] == list(range(200))


def test_exception_is_raised_in_the_caller(loop_thread: _LoopThread) -> None:
    class Boom(Exception):
        pass

    async def fail() -> None:
        await asyncio.sleep(0)
        raise Boom("no")

    with pytest.raises(Boom, match="no"):
        loop_thread.run(fail())


def test_timeout_leaves_the_coroutine_running(loop_thread: _LoopThread) -> None:
    release = threading.Event()
    finished = threading.Event()

    async def slow() -> None:
        while not release.is_set():
            await asyncio.sleep(0.005)
        finished.set()

    with pytest.raises(TimeoutError):
        loop_thread.run(slow(), 0.05)
    release.set()
    assert finished.wait(10)


def test_cancelled_task_raises_concurrent_cancelled(loop_thread: _LoopThread) -> None:
    async def cancel_self() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)

    with pytest.raises(concurrent.futures.CancelledError):
        loop_thread.run(cancel_self())


def test_not_a_coroutine_is_refused_in_the_caller(loop_thread: _LoopThread) -> None:
    with pytest.raises(TypeError):
        loop_thread.run(lambda: None)  # type: ignore[arg-type]


def test_calls_from_many_threads(loop_thread: _LoopThread) -> None:
    async def double(i: int) -> int:
        await asyncio.sleep(0)
        return 2 * i

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda i: loop_thread.run(double(i)), range(400))) == [2 * i for i in range(400)]
