"""common.aio: wait_event, a bounded wait on an asyncio.Event that never loses a cancellation; the stall tracer
(FERRYMQ_STALL_TRACE_MS) that names where a held event loop was."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from ferrymq.common.aio import STALL_TRACE_ENV, LoopLagProbe, wait_event


async def test_wait_event_reports_set_or_timeout() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5) is True
    assert await wait_event(event, 0) is True  # already set


@pytest.mark.parametrize("yields", [0, 1, 2, 3])
async def test_a_cancel_that_races_the_event_is_never_lost(yields: int) -> None:
    """The event is set and the waiting loop cancelled at (nearly) the same moment: the loop must end.
    asyncio.wait_for(event.wait(), t) on Python 3.11 returned the result here and the loop ran on."""
    event = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            await wait_event(event, 60)
            event.clear()
            rounds += 1

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)  # the loop now waits on the event
    event.set()
    for _ in range(yields):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert task.cancelled()


async def test_a_loop_on_a_set_event_still_yields() -> None:
    event = asyncio.Event()
    event.set()
    other_ran = asyncio.Event()
    asyncio.get_running_loop().call_soon(other_ran.set)
    for _ in range(3):
        assert await wait_event(event, 1)
    assert other_ran.is_set()


def _hold_the_loop_for(seconds: float) -> None:
    time.sleep(seconds)  # a blocking call on the loop thread: the stall the tracer must name


async def test_the_stall_tracer_logs_where_the_loop_was_held(monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(STALL_TRACE_ENV, "30")
    probe = LoopLagProbe(interval_s=0.005)
    probe.start()
    try:
        assert probe.tracer is not None
        await asyncio.sleep(0.05)  # the probe ticks
        with caplog.at_level(logging.WARNING, logger="ferrymq.common.aio"):
            _hold_the_loop_for(0.25)
            deadline = time.monotonic() + 10
            while probe.tracer.stalls_logged < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        assert probe.tracer.stalls_logged == 1
        (record,) = [r for r in caplog.records if "stalled" in r.getMessage()]
        assert "_hold_the_loop_for" in record.getMessage()
    finally:
        await probe.stop()


async def test_no_stall_tracer_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STALL_TRACE_ENV, raising=False)
    probe = LoopLagProbe()
    probe.start()
    try:
        assert probe.tracer is None
    finally:
        await probe.stop()


def test_a_stall_no_sample_caught_is_still_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A stall the tracer's thread could not sample (it needs the GIL too) is logged from the probe's lag."""
    import threading

    from ferrymq.common.aio import StallTracer

    tracer = StallTracer(0.02, threading.get_ident())
    with caplog.at_level(logging.WARNING, logger="ferrymq.common.aio"):
        tracer.start()
        try:
            tracer.tick(0.5)
            deadline = time.monotonic() + 10
            while tracer.stalls_logged < 1 and time.monotonic() < deadline:
                tracer.tick(0.0)  # the loop runs on
                time.sleep(0.005)
        finally:
            tracer.stop()
    assert tracer.stalls_logged == 1
    assert any("about 500 ms; no sample" in r.getMessage() for r in caplog.records)
