"""A flush the disk refuses (ASYNC_FLUSH on a full disk) is one log line with the cause, not a "flush failed"
traceback every round; a recovery is said once."""

from __future__ import annotations

import asyncio
import errno
import logging
import threading

from ferrymq.broker.flush import FlushService
from support.aio import wait_for


class FullDiskStore:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.flushed_phy_offset = 0
        self._lock = threading.Lock()

    def flush(self) -> None:
        with self._lock:
            self.calls += 1
            if self.calls <= self.failures:
                raise OSError(errno.ENOSPC, "No space left on device")

    def flush_consume_queues(self) -> None:
        pass


async def test_full_disk_flush_failures_are_one_line_without_traceback(caplog) -> None:
    caplog.set_level(logging.INFO, logger="ferrymq.broker.flush")
    store = FullDiskStore(failures=5)
    service = FlushService(store, sync_flush=False, interval_ms=5)
    service.start(asyncio.get_running_loop())
    try:
        await wait_for(lambda: any("succeeded again" in r.getMessage() for r in caplog.records), timeout_s=10,
                       what="the flush to succeed again")
    finally:
        await asyncio.get_running_loop().run_in_executor(None, service.stop)
    failed = [r for r in caplog.records if "flush failed" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in failed]
    assert failed[0].levelno == logging.ERROR and failed[0].exc_info is None
    assert "No space left on device" in failed[0].getMessage()
    assert "\n" not in failed[0].getMessage()
