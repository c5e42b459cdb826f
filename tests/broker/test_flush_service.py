"""FlushService's ASYNC_FLUSH period follows flushIntervalCommitLog changed at runtime (it was read once, so a
broker started with a long period kept it until restarted)."""

from __future__ import annotations

import asyncio
import threading

from ferrymq.broker.flush import FlushService
from support.aio import wait_for


class CountingStore:
    def __init__(self) -> None:
        self.flushes = 0
        self.flushed_phy_offset = 0
        self._lock = threading.Lock()

    def flush(self) -> None:
        with self._lock:
            self.flushes += 1

    def flush_consume_queues(self) -> None:
        pass


async def test_a_shorter_period_set_at_runtime_applies_without_a_restart() -> None:
    store = CountingStore()
    service = FlushService(store, sync_flush=False, interval_ms=600_000)
    service.start(asyncio.get_running_loop())
    try:
        service.interval_ms = 10
        before = store.flushes
        await wait_for(lambda: store.flushes >= before + 5, timeout_s=10, what="five flushes at the new period")
    finally:
        await asyncio.get_running_loop().run_in_executor(None, service.stop)
