"""Waiting on conditions inside a test's event loop: a polling loop with a deadline, never a bare sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

#: Deadline of a wait unless the caller gives one.
WAIT_TIMEOUT_S = 10.0
#: Polling period.
POLL_INTERVAL_S = 0.01


async def wait_for(cond: Callable[[], Any], timeout_s: float = WAIT_TIMEOUT_S, interval_s: float = POLL_INTERVAL_S,
                   what: str = "condition") -> Any:
    """Poll ``cond()`` (sync or async) until it is truthy and return that value; AssertionError naming
    ``what`` after ``timeout_s``. Returns as soon as the condition holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = cond()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met in {timeout_s} s")
        await asyncio.sleep(interval_s)
