"""Messages pulled for one queue and not yet consumed; flow control by count and bytes."""

from __future__ import annotations

import asyncio
import time

from ferrymq.common.aio import wait_event
from ferrymq.common.message import MessageExt
from ferrymq.common.route import MessageQueue


class ProcessQueue:
    def __init__(self, mq: MessageQueue) -> None:
        self.mq = mq
        self.msgs: dict[int, MessageExt] = {}  # queue_offset -> message, insertion = offset order
        self.msg_bytes = 0
        self.max_offset_seen = -1
        self.dropped = False
        self.locked = False
        self.last_lock_ms = 0.0
        self.last_pull_ms = 0.0
        self.last_consume_ms = 0.0
        self.consuming = False  # orderly: a consume task runs for this queue
        self._changed = asyncio.Event()

    @property
    def count(self) -> int:
        return len(self.msgs)

    def put(self, msgs: list[MessageExt]) -> None:
        for m in msgs:
            if m.queue_offset not in self.msgs:
                self.msgs[m.queue_offset] = m
                self.msg_bytes += len(m.body)
            self.max_offset_seen = max(self.max_offset_seen, m.queue_offset)
        self.last_pull_ms = time.time() * 1000

    def remove(self, msgs: list[MessageExt]) -> int:
        """Drop consumed messages; returns the offset safe to commit (smallest still pending, else
        one past the largest seen), or -1 if nothing was ever added."""
        for m in msgs:
            if self.msgs.pop(m.queue_offset, None) is not None:
                self.msg_bytes -= len(m.body)
        self.last_consume_ms = time.time() * 1000
        self._changed.set()
        return self.commit_offset()

    def commit_offset(self) -> int:
        if self.msgs:
            return min(self.msgs)
        return self.max_offset_seen + 1 if self.max_offset_seen >= 0 else -1

    def take_in_order(self, n: int) -> list[MessageExt]:
        """The ``n`` lowest-offset pending messages (orderly consumption), left in the queue."""
        return [self.msgs[o] for o in sorted(self.msgs)[:n]]

    def over_limit(self, max_count: int, max_bytes: int) -> bool:
        return self.count >= max_count or self.msg_bytes >= max_bytes

    async def wait_change(self, timeout_s: float) -> None:
        self._changed.clear()
        await wait_event(self._changed, timeout_s)

    def wake(self) -> None:
        """Wake ``wait_change`` waiters without dropping the queue (the consumer is closing)."""
        self._changed.set()

    def drop(self) -> None:
        self.dropped = True
        self._changed.set()
