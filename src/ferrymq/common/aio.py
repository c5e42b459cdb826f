"""asyncio helpers shared by every layer.

``asyncio.wait_for`` on Python 3.11 can lose a cancellation: when the awaited operation finishes (an event
set, a connect refused) at the moment the waiting task is cancelled, it returns or raises the operation's
outcome and drops the cancel (CPython gh-86296, fixed in 3.12). A background loop stopped with
``task.cancel()`` then runs on, and whoever awaits it (a ``stop()``) waits forever. ferrymq code uses
``wait_for`` and ``wait_event`` below instead: they bound the wait with ``asyncio.timeout`` in the caller's own
task, so a cancellation always propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout_s: float | None) -> T:
    """``asyncio.wait_for(aw, timeout_s)`` (TimeoutError when the time is up, the operation cancelled) that
    never loses a cancellation of the caller. None: no time limit."""
    async with asyncio.timeout(timeout_s):
        return await aw


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` seconds pass; True when it is set. A cancellation of the
    caller always propagates (the wait runs in the caller's task, bounded by ``asyncio.timeout``)."""
    if event.is_set():
        await asyncio.sleep(0)  # yield like a wait that finds the event set, so a loop never starves the others
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
