"""common.aio.wait_event: a bounded wait on an asyncio.Event that never loses a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from ferrymq.common.aio import wait_event


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
