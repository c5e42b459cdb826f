"""Timer messages: delivery at any time up to ``timerMaxDelaySec`` (RocketMQ 5), and their recall. Masters only.

A send whose properties ask for a delivery time (common/timer.py) is stored in ``rmq_sys_wheel_timer`` queue 0
with TIMER_OUT_MS = its delivery time and REAL_TOPIC/REAL_QID = where it goes (processors/send.py). This
service reads that queue's new units as they are dispatched into a heap ordered by (delivery time, queue
offset) and keeps one loop timer at the earliest delivery time: when it fires, the due messages are re-stored
under their real topic and queue (TIMER_OUT_MS, REAL_TOPIC, REAL_QID, TIMER_DELAY_SEC/MS removed). Each message
costs O(log n) (one heap push and pop, one record read at each); no tick walks the pending set.

A recall (processors/recall.py) stores a marker record in the same queue (TIMER_DEL_UNIQKEY = ``topic+id``,
TIMER_OUT_MS = the recalled message's delivery time). A message whose key has a marker is dropped when due;
the marker is done when it is due itself (after the message: same time, higher queue offset).

Progress checkpoint, ``config/timerCheckpoint.json`` (persisted every flushDelayOffsetInterval and at stop;
a slave copies its master's with GET_TIMER_CHECK_POINT, broker/slave_sync.py, once its own commit log reaches
phyOffset, so a promoted slave never counts as done a message whose re-stored copy it does not hold):

| field        | meaning                                                                        |
|--------------|--------------------------------------------------------------------------------|
| queueOffset  | every unit of the timer queue below it is done (delivered, recalled or bad)    |
| doneOffsets  | units at or above queueOffset already done (at most CHECKPOINT_DONE_MAX kept)  |
| phyOffset    | the commit log's end when it was taken: the re-stored messages it counts as done lie below |

At start the heap is rebuilt from queueOffset (skipping doneOffsets); nothing is delivered before the rebuild
reached the queue's end, so every marker is known before its message is due. A message delivered after the
last checkpoint is delivered again after a crash (at least once, like RocketMQ), as is a done unit beyond
CHECKPOINT_DONE_MAX.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from ferrymq.broker.config_file import JsonPersisted
from ferrymq.common.message import (
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageExt,
    MessageExtBrokerInner,
    properties_to_string,
    tags_hash_code,
)
from ferrymq.common.timer import (
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_OUT_MS,
    TIMER_QUEUE_ID,
    TIMER_TOPIC,
    delete_key,
)
from ferrymq.remoting import jsonx

log = logging.getLogger(__name__)

#: timer queue units read into the heap per loop turn (a rebuild after a restart yields between steps)
SCAN_UNITS_PER_STEP = 400
#: due messages re-stored per loop turn
DELIVER_PER_STEP = 64
#: back-off after a failed re-store (full disk, no descriptor): the message stays pending
ERROR_BACKOFF_MS = 1_000
#: done units at or above the checkpoint's queueOffset kept in the file (beyond: delivered again after a crash)
CHECKPOINT_DONE_MAX = 20_000
CHECKPOINT_FILE = "timerCheckpoint.json"


class _Pending(NamedTuple):
    deliver_ms: int
    queue_offset: int
    phy_offset: int
    #: ``topic+UNIQ_KEY`` (None: a message without UNIQ_KEY, which cannot be recalled)
    key: str | None
    marker: bool


def inner_from_timer(msg: MessageExt) -> MessageExtBrokerInner | None:
    """The real message behind a timer record (None when it names no real topic/queue)."""
    props = dict(msg.properties)
    real_topic = props.pop(PROPERTY_REAL_TOPIC, None)
    real_qid = props.pop(PROPERTY_REAL_QUEUE_ID, None)
    if not real_topic or real_qid is None:
        return None
    try:
        queue_id = int(real_qid)
    except ValueError:
        return None
    for name in (PROPERTY_TIMER_OUT_MS, PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS):
        props.pop(name, None)
    props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
    keys = []
    if props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX):
        keys.append(props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX])
    keys.extend(k for k in props.get(PROPERTY_KEYS, "").split(" ") if k)
    return MessageExtBrokerInner(
        topic=real_topic, queue_id=queue_id, body=msg.body, flag=msg.flag,
        properties_string=properties_to_string(props), tags_code=tags_hash_code(props.get(PROPERTY_TAGS)),
        sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
        store_host=msg.store_host, reconsume_times=msg.reconsume_times,
        index_keys=tuple(keys), wait_store_msg_ok=False,
    )


class TimerMessageService(JsonPersisted):
    def __init__(self, store: Any, put: Callable[[MessageExtBrokerInner], Any], config_dir: str,
                 clock_ms: Callable[[], int]) -> None:
        super().__init__(config_dir, CHECKPOINT_FILE)
        self._store = store
        self._put = put
        self._clock_ms = clock_ms
        #: checkpoint: every timer queue unit below this is done
        self.committed_offset = 0
        #: checkpoint: done units at or above ``committed_offset``
        self._done: set[int] = set()
        # ---- runtime (rebuilt by ``start``) ----
        self._scan_offset = 0
        self._heap: list[_Pending] = []
        #: key -> [delivery time, pending messages with that key]
        self._pending: dict[str, list[int]] = {}
        #: key -> delivery time of its recall marker (until the marker is due)
        self._recalled: dict[str, int] = {}
        #: the heap holds every unit up to the queue's end (set after the rebuild; deliveries wait for it)
        self.caught_up = False
        self._running = False
        self._soon: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.delivered_total = 0
        self.recalled_total = 0

    # ---- checkpoint (load, persist: JsonPersisted) ----------------------------------------------
    def decode(self, obj: dict[str, Any]) -> None:
        self.committed_offset = max(0, int(obj.get("queueOffset") or 0))
        self._done = {int(o) for o in (obj.get("doneOffsets") or []) if int(o) >= self.committed_offset}

    def encode(self) -> dict[str, Any]:
        done = self._done
        kept = sorted(done) if len(done) <= CHECKPOINT_DONE_MAX else heapq.nsmallest(CHECKPOINT_DONE_MAX, done)
        return {"queueOffset": self.committed_offset, "doneOffsets": kept, "phyOffset": self._phy_end()}

    def _phy_end(self) -> int:
        return int(getattr(self._store, "max_phy_offset", 0) or 0)

    def write_raw(self, data: bytes) -> None:
        """Slave sync: the master's checkpoint verbatim (read again by ``start`` when this broker becomes master)."""
        self._file.write_raw(data)
        self.load()

    async def persist_async(self) -> None:
        """``persist_if_dirty`` with the encoding and the file write (fsync) in a worker thread."""
        if not self._dirty:
            return
        self._dirty = False
        committed, done, phy_end = self.committed_offset, set(self._done), self._phy_end()
        gen = self._next_generation()

        def write() -> None:
            kept = sorted(done) if len(done) <= CHECKPOINT_DONE_MAX else heapq.nsmallest(CHECKPOINT_DONE_MAX, done)
            obj = {"queueOffset": committed, "doneOffsets": kept, "phyOffset": phy_end}
            self._file.write_raw(jsonx.dumps_pretty(obj), gen)

        await asyncio.to_thread(write)

    # ---- state ------------------------------------------------------------------------------------
    @property
    def pending_count(self) -> int:
        """Units in the heap (messages and recall markers not yet due)."""
        return len(self._heap)

    def next_deliver_ms(self) -> int | None:
        return self._heap[0].deliver_ms if self._heap else None

    def _mark_done(self, queue_offset: int) -> None:
        self._dirty = True
        if queue_offset != self.committed_offset:
            if queue_offset > self.committed_offset:
                self._done.add(queue_offset)
            return
        committed = queue_offset + 1
        done = self._done
        while committed in done:
            done.discard(committed)
            committed += 1
        self.committed_offset = committed

    # ---- reading the timer queue --------------------------------------------------------------------
    def scan(self, max_units: int = SCAN_UNITS_PER_STEP) -> bool:
        """Read up to ``max_units`` new timer queue units into the heap; True when the queue's end is reached."""
        store = self._store
        min_offset = store.get_min_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        if self._scan_offset < min_offset:  # units removed with their commit log files (older than retention)
            self._scan_offset = min_offset
        if self.committed_offset < min_offset:
            self.committed_offset = min_offset
            self._done = {o for o in self._done if o >= min_offset}
            self._dirty = True
        units = store.get_consume_queue_units(TIMER_TOPIC, TIMER_QUEUE_ID, self._scan_offset, max_units)
        for phy_offset, _size, _tags in units:
            queue_offset = self._scan_offset
            self._scan_offset += 1
            if queue_offset < self.committed_offset or queue_offset in self._done:
                continue
            self._take(queue_offset, phy_offset)
        if len(units) < max_units:
            return self._scan_offset >= store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        return False

    def _take(self, queue_offset: int, phy_offset: int) -> None:
        msg = self._store.look_message_by_offset(phy_offset)
        props = msg.properties if msg is not None else {}
        try:
            deliver_ms = int(props[PROPERTY_TIMER_OUT_MS])
        except (KeyError, ValueError):
            log.warning("timer queue unit %d (commit log offset %d) has no delivery time: skipped", queue_offset,
                        phy_offset)
            self._mark_done(queue_offset)
            return
        marker_key = props.get(PROPERTY_TIMER_DEL_UNIQKEY)
        if marker_key:
            self._recalled[marker_key] = deliver_ms
            heapq.heappush(self._heap, _Pending(deliver_ms, queue_offset, phy_offset, marker_key, True))
            return
        uniq = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        real_topic = props.get(PROPERTY_REAL_TOPIC)
        key = delete_key(real_topic, uniq) if uniq and real_topic else None
        if key is not None:
            entry = self._pending.get(key)
            if entry is None:
                self._pending[key] = [deliver_ms, 1]
            else:
                entry[0] = deliver_ms
                entry[1] += 1
        heapq.heappush(self._heap, _Pending(deliver_ms, queue_offset, phy_offset, key, False))

    def _forget(self, key: str | None) -> None:
        if key is None:
            return
        entry = self._pending.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._pending[key]

    # ---- delivery ---------------------------------------------------------------------------------------
    def deliver_due(self, now_ms: int, max_count: int = DELIVER_PER_STEP) -> tuple[int, bool]:
        """Re-store up to ``max_count`` due messages: (how many were looked at, whether a re-store failed)."""
        heap = self._heap
        handled = 0
        while heap and heap[0].deliver_ms <= now_ms and handled < max_count:
            item = heap[0]
            handled += 1
            if item.marker:
                heapq.heappop(heap)
                if self._recalled.get(item.key or "") == item.deliver_ms:
                    del self._recalled[item.key or ""]
                self._mark_done(item.queue_offset)
                continue
            if item.key is not None and item.key in self._recalled:
                heapq.heappop(heap)
                self._forget(item.key)
                self._mark_done(item.queue_offset)
                log.debug("timer message %s recalled: not delivered", item.key)
                continue
            msg = self._store.look_message_by_offset(item.phy_offset)
            inner = inner_from_timer(msg) if msg is not None else None
            if inner is not None:
                result = self._put(inner)
                if result.append_result is None:
                    log.warning("re-storing timer message at %d failed: %s (again in %d ms)", item.phy_offset,
                                result.status, ERROR_BACKOFF_MS)
                    return handled, True
                self.delivered_total += 1
            else:
                log.warning("timer message at commit log offset %d cannot be read back: skipped", item.phy_offset)
            heapq.heappop(heap)
            self._forget(item.key)
            self._mark_done(item.queue_offset)
        return handled, False

    # ---- recall ---------------------------------------------------------------------------------------
    def pending_deliver_ms(self, key: str) -> int | None:
        """The delivery time of a pending, not recalled message with ``key`` (None: none is pending)."""
        if key in self._recalled:
            return None
        entry = self._pending.get(key)
        return entry[0] if entry is not None else None

    def recalled(self, key: str, deliver_ms: int) -> None:
        """A recall marker for ``key`` was stored: the message is not delivered (before the marker is read back)."""
        self._recalled[key] = deliver_ms
        self.recalled_total += 1

    # ---- scheduling on the event loop ----------------------------------------------------------------
    def wake(self) -> None:
        """New timer queue units were dispatched (or a start): scan them and re-arm soon."""
        if not self._running or self._soon is not None:
            return
        loop = self._loop or asyncio.get_running_loop()
        self._soon = loop.call_soon(self._step)

    def _step(self) -> None:
        self._soon = None
        if not self._running:
            return
        loop = self._loop or asyncio.get_running_loop()
        try:
            if not self.scan():
                self._soon = loop.call_soon(self._step)  # more to read: again after other work
                return
            self.caught_up = True
            handled, failed = self.deliver_due(self._clock_ms())
        except Exception:
            log.exception("timer delivery failed")
            handled, failed = 0, True
        if failed:
            self._arm(loop, ERROR_BACKOFF_MS)
            return
        if handled >= DELIVER_PER_STEP:
            self._soon = loop.call_soon(self._step)
            return
        nxt = self.next_deliver_ms()
        if nxt is None:
            self._cancel_timer()
        else:
            self._arm(loop, max(0, nxt - self._clock_ms()))

    def _arm(self, loop: asyncio.AbstractEventLoop, delay_ms: int) -> None:
        self._cancel_timer()
        self._timer = loop.call_later(delay_ms / 1000, self._step)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def start(self) -> None:
        """Rebuild the pending set from the checkpoint and deliver (a master; again after a promotion)."""
        if self._running:
            return
        self._loop = asyncio.get_running_loop()
        self._heap = []
        self._pending = {}
        self._recalled = {}
        self._scan_offset = self.committed_offset
        self.caught_up = False
        self._running = True
        self.wake()

    async def stop(self) -> None:
        if self._running:
            self._running = False
            if self._soon is not None:
                self._soon.cancel()
                self._soon = None
            self._cancel_timer()
            self.caught_up = False
        self.persist()
