"""Commit log flushing on a dedicated thread (protocol §6.5 "Flush").

* ASYNC_FLUSH: every ``flushIntervalCommitLog`` ms the thread calls ``store.flush()``; sends never
  wait and never fsync per message.
* SYNC_FLUSH (group commit): a send registers ``(end_phy_offset, future)`` and wakes the thread; the
  thread flushes once for everything written so far and resolves every satisfied future with one
  ``loop.call_soon_threadsafe`` callback. Waiters time out in the send path (syncFlushTimeout).

The store's ``flush()`` is safe to call concurrently with puts on the event loop thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from ferrymq.store.errors import StoreError

log = logging.getLogger(__name__)

#: SYNC_FLUSH: the thread also wakes this often without requests (to flush stragglers)
SYNC_FLUSH_IDLE_WAIT_MS = 10
#: consume queues are flushed this often (flushIntervalConsumeQueue)
FLUSH_CONSUME_QUEUE_INTERVAL_MS = 1000
#: waiters queued at once before new waits resolve as timed out
MAX_SYNC_FLUSH_WAITERS = 100_000


class FlushService:
    def __init__(self, store: Any, *, sync_flush: bool, interval_ms: int) -> None:
        self._store = store
        self.sync_flush = sync_flush
        self._wake = threading.Event()
        self._interval_ms = interval_ms
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def interval_ms(self) -> int:
        """ASYNC_FLUSH period (flushIntervalCommitLog); a change at runtime applies from the next round."""
        return self._interval_ms

    @interval_ms.setter
    def interval_ms(self, value: int) -> None:
        self._interval_ms = value
        self._wake.set()  # a thread waiting out the old, longer period starts the new one now

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="ferrymq-flush", daemon=True)
        self._thread.start()

    def request_flush(self, end_phy_offset: int) -> asyncio.Future[bool]:
        """SYNC_FLUSH: a future resolving True once the commit log is flushed up to ``end_phy_offset``."""
        assert self._loop is not None, "flush service not started"
        fut: asyncio.Future[bool] = self._loop.create_future()
        with self._lock:
            if len(self._waiters) >= MAX_SYNC_FLUSH_WAITERS:
                fut.set_result(False)
                return fut
            self._waiters.append((end_phy_offset, fut))
        self._wake.set()
        return fut

    def _run(self) -> None:
        last_cq_flush = 0.0
        failing: str | None = None  # the cause of the failing flushes, logged once (a full disk: every round)
        while not self._stopping:
            self._wake.wait((SYNC_FLUSH_IDLE_WAIT_MS if self.sync_flush else self._interval_ms) / 1000)
            self._wake.clear()
            try:
                self._store.flush()
                now = time.monotonic()
                if now - last_cq_flush >= FLUSH_CONSUME_QUEUE_INTERVAL_MS / 1000:
                    last_cq_flush = now
                    self._store.flush_consume_queues()
            except (OSError, StoreError) as exc:  # the disk refused (full, I/O error): one line, not a traceback
                cause = f"{type(exc).__name__}: {exc}"
                if cause != failing:
                    failing = cause
                    log.error("flush failed (retried every round until it succeeds): %s", cause)
                continue
            except Exception:
                log.exception("flush failed")
                continue
            if failing is not None:
                failing = None
                log.warning("flush succeeded again")
            if self.sync_flush:
                self._resolve(self._store.flushed_phy_offset)
        self._resolve(None)

    def _resolve(self, flushed: int | None) -> None:
        with self._lock:
            if not self._waiters:
                return
            if flushed is None:
                done, self._waiters = self._waiters, []
            else:
                done = [w for w in self._waiters if w[0] <= flushed]
                if not done:
                    return
                self._waiters = [w for w in self._waiters if w[0] > flushed]
        ok = flushed is not None
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def settle() -> None:
            for _, fut in done:
                if not fut.done():
                    fut.set_result(ok)

        loop.call_soon_threadsafe(settle)

    def stop(self) -> None:
        """Stop the thread after a final flush (blocking; call from a thread or at shutdown)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        try:
            self._store.flush()
            self._store.flush_consume_queues()
        except Exception:
            log.exception("final flush failed")
