"""A new queue's first consume queue file, made on a thread before the send that needs it.

A put to a queue the store has never written first creates the queue's consume queue file: its directories,
an inode, the sparse file and its first reserved chunk (``MessageStore.prepare_put``). On a busy file system each
of those may wait for a read of a directory block, an inode table block or a block bitmap, tens of milliseconds
each, and the broker's event loop waited with it: while an estate of 100,000 queues was built, single calls held
the loop 50-900 ms (measured with ``FERRYMQ_STALL_TRACE_MS``).

``QueueFileGate.defer`` takes such a send off the loop's path: the file is made by ``make_consume_queue_file`` on
the gate's one thread, and the send runs on the loop once it is made. The preparation the send then does finds
the file in place (an open and a map, no allocation). The thread only makes the file; the store's objects are
touched on the loop alone, as before. A file the thread could not make (no room, no descriptor) is met again by
the loop's own preparation, which refuses the send with its status, so nothing is acknowledged that could not be
stored.

Order: every send to a queue whose file is being made waits in that queue's line and runs in arrival order once
it is made, so one producer's messages to one queue keep their order. Sends to other queues are not held.

Only a queue's first file is made here (a new file of a queue in use, every ``mappedFileSizeConsumeQueue`` bytes,
is still made on the loop), and only for messages stored in the queue they name (not delayed, timer or
transactional ones, and not retries, which the store puts elsewhere).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from ferrymq.broker.writer import STORED_ELSEWHERE_MARKS

log = logging.getLogger(__name__)

#: queues whose first file may be in the making at once; a send to a further new queue prepares its file on the
#: loop, as before (bounds the lines of waiting sends)
MAX_QUEUES_IN_THE_MAKING = 10_000

QueueKey = tuple[str, int]


class QueueFileStore(Protocol):
    def consume_queue_file_to_make(self, topic: str, queue_id: int) -> str | None: ...

    def make_consume_queue_file(self, path: str) -> bool: ...


def stored_in_named_queue(properties: str) -> bool:
    """Whether a message with these (encoded) properties is stored in the queue its send names."""
    return not any(mark in properties for mark in STORED_ELSEWHERE_MARKS)


class QueueFileGate:
    def __init__(self, store: QueueFileStore, queue_table: dict[QueueKey, Any]) -> None:
        """``queue_table``: the store's consume queues by key (a queue in it needs no first file). ``queues`` and
        ``lines`` are read by the send path's first look (``may_defer`` written out)."""
        self._store = store
        self.queues = queue_table
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        #: queue -> the sends waiting for its file, in arrival order: (the future answered with the send's
        #: result, the send)
        self.lines: dict[QueueKey, list[tuple[asyncio.Future[Any], Callable[[], Any]]]] = {}
        #: files the thread made, and sends that waited for one (metrics and tests)
        self.made_total = 0
        self.deferred_total = 0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ferrymq-queue-files")

    def stop(self) -> None:
        """No more files are made on the thread; sends waiting in lines run once their file's job ends."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    def may_defer(self, topic: str, queue_id: int) -> bool:
        """Cheap first look for a send: False when its queue exists and no file of it is in the making (the
        usual case: ``defer`` would return None)."""
        key = (topic, queue_id)
        return key in self.lines or key not in self.queues

    @property
    def in_the_making(self) -> int:
        return len(self.lines)

    def defer(self, topic: str, queue_id: int, send: Callable[[], Any]) -> asyncio.Future[Any] | None:
        """None: run ``send`` now. Otherwise a future answered with ``send()``'s result (or its exception),
        run on the loop once the queue's first file is made."""
        key = (topic, queue_id)
        line = self.lines.get(key)
        if line is None:
            if key in self.queues:
                return None
            executor = self._executor
            loop = self._loop
            if executor is None or loop is None or len(self.lines) >= MAX_QUEUES_IN_THE_MAKING:
                return None
            path = self._store.consume_queue_file_to_make(topic, queue_id)
            if path is None:
                return None
            try:
                job = loop.run_in_executor(executor, self._store.make_consume_queue_file, path)
            except RuntimeError:  # the executor shut down meanwhile
                return None
            line = self.lines[key] = []
            job.add_done_callback(functools.partial(self._made, key))
        assert self._loop is not None
        fut: asyncio.Future[Any] = self._loop.create_future()
        line.append((fut, send))
        self.deferred_total += 1
        return fut

    def _made(self, key: QueueKey, job: asyncio.Future[bool]) -> None:
        line = self.lines.pop(key, [])
        if job.cancelled():
            pass
        elif job.exception() is not None:
            log.warning("making the first consume queue file of %s failed: %s", key, job.exception())
        elif job.result():
            self.made_total += 1
        for fut, send in line:
            if fut.done():  # its connection went: the send is not run (nothing was acknowledged)
                continue
            try:
                fut.set_result(send())
            except Exception as exc:
                fut.set_exception(exc)
