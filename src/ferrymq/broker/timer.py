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

Retention never loses a pending message. Rolling (RocketMQ 5's TimerMessageStore "roll"): a pending unit whose
record is older than ``timerRollWindowSec`` is written again at the log's end (same properties, plus
TIMER_ROLL_FROM = the queue offset it replaces and TIMER_ROLL_TIMES), and the old unit is done; a rolled record
read back (a rebuild after a crash mid-roll) marks the unit it replaces done, so a crash never leaves two live
copies. Rolls go oldest first (queue order is store order), at most ROLL_PER_STEP per loop turn. Pinning: the
store deletes no segment at or above ``retained_phy_floor`` (the record of the oldest unit not done), whatever
fileReservedTime or a forced cleanup says (store/message_store.py ``delete_expired_files``); rolling keeps that
floor young, so the pin holds segments past retention only when rolling cannot keep up (a full disk refuses
the rolls' puts as it refuses sends).

Progress checkpoint, ``config/timerCheckpoint.json`` (persisted every flushDelayOffsetInterval and at stop;
a slave copies its master's with GET_TIMER_CHECK_POINT, broker/slave_sync.py, once its own commit log reaches
phyOffset, so a promoted slave never counts as done a message whose re-stored copy it does not hold):

| field        | meaning                                                                        |
|--------------|--------------------------------------------------------------------------------|
| queueOffset  | every unit of the timer queue below it is done (delivered, recalled, rolled or bad) |
| doneFrom     | the queue offset of doneBitmap's first bit (a multiple of 8, at most queueOffset) |
| doneBitmap   | base64: bit ``i % 8`` (least significant first) of byte ``i // 8`` set = unit ``doneFrom + i`` is done; bits below queueOffset mean nothing; at most CHECKPOINT_DONE_SPAN units |
| phyOffset    | the commit log's end when it was taken: the re-stored messages it counts as done lie below |
| doneOffsets  | read only (files of earlier versions): the done units at or above queueOffset, listed |

At start the heap is rebuilt from queueOffset (skipping done units); nothing is delivered before the rebuild
reached the queue's end, so every marker is known before its message is due. A message delivered after the
last checkpoint is delivered again after a crash (at least once, like RocketMQ), as is a done unit
CHECKPOINT_DONE_SPAN or more above queueOffset. In memory the done units above queueOffset are the same bitmap
(one bit per unit up to the highest done one), so a save copies at most CHECKPOINT_DONE_SPAN / 8 bytes on the
loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
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
    PROPERTY_TIMER_ROLL_FROM,
    PROPERTY_TIMER_ROLL_TIMES,
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
#: pending units whose record is older than the roll window re-written per loop turn
ROLL_PER_STEP = 64
#: a unit due within this (or half the roll window, if shorter) is not rolled: it is delivered from where it is
ROLL_DUE_SOON_MS = 10_000
#: back-off after a failed re-store or roll (full disk, no descriptor): the message stays pending
ERROR_BACKOFF_MS = 1_000
#: done units at or above the checkpoint's queueOffset kept in the file, as bits (beyond: delivered again after
#: a crash); 128 KiB of bitmap
CHECKPOINT_DONE_SPAN = 1 << 20
CHECKPOINT_FILE = "timerCheckpoint.json"
#: the roll window's default (``timerRollWindowSec``)
DEFAULT_ROLL_WINDOW_MS = 24 * 3600 * 1000


class _Pending(NamedTuple):
    deliver_ms: int
    #: at the same time messages come before recall markers (a rolled message may follow its marker in the queue)
    marker: bool
    queue_offset: int
    phy_offset: int
    #: ``topic+UNIQ_KEY`` (None: a message without UNIQ_KEY, which cannot be recalled)
    key: str | None


def retention_warning(roll_window_sec: int, file_reserved_hours: int) -> str | None:
    """Why a configuration makes pending timer messages hold commit log segments past fileReservedTime (None:
    it does not). Messages are never lost to retention either way (the segments are pinned)."""
    if roll_window_sec < file_reserved_hours * 3600:
        return None
    return (f"timerRollWindowSec ({roll_window_sec} s) is not below fileReservedTime ({file_reserved_hours} h): "
            "commit log segments holding pending timer messages are kept past fileReservedTime (nothing is lost, "
            "but the disk holds more); set timerRollWindowSec below fileReservedTime")


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
    for name in (PROPERTY_TIMER_OUT_MS, PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_ROLL_FROM,
                 PROPERTY_TIMER_ROLL_TIMES):
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


def rolled_record(msg: MessageExt, queue_offset: int) -> MessageExtBrokerInner:
    """The timer record ``msg`` (unit ``queue_offset`` of the timer queue) written again: same properties, plus
    TIMER_ROLL_FROM = ``queue_offset`` and TIMER_ROLL_TIMES counted up. Not indexed again."""
    props = dict(msg.properties)
    try:
        times = int(props.get(PROPERTY_TIMER_ROLL_TIMES) or 0)
    except ValueError:
        times = 0
    props[PROPERTY_TIMER_ROLL_FROM] = str(queue_offset)
    props[PROPERTY_TIMER_ROLL_TIMES] = str(times + 1)
    props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
    return MessageExtBrokerInner(
        topic=TIMER_TOPIC, queue_id=TIMER_QUEUE_ID, body=msg.body, flag=msg.flag,
        properties_string=properties_to_string(props), tags_code=tags_hash_code(props.get(PROPERTY_TAGS)),
        sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
        store_host=msg.store_host, reconsume_times=msg.reconsume_times, wait_store_msg_ok=False,
    )


class TimerMessageService(JsonPersisted):
    def __init__(self, store: Any, put: Callable[[MessageExtBrokerInner], Any], config_dir: str,
                 clock_ms: Callable[[], int], roll_window_ms: int = DEFAULT_ROLL_WINDOW_MS) -> None:
        super().__init__(config_dir, CHECKPOINT_FILE)
        self._store = store
        self._put = put
        self._clock_ms = clock_ms
        #: a pending unit whose record is older than this is rolled (``timerRollWindowSec``)
        self.roll_window_ms = roll_window_ms
        #: checkpoint: every timer queue unit below this is done
        self.committed_offset = 0
        #: ``committed_offset`` as last saved: retention keeps the records from there, so a rebuild after a crash
        #: reads every unit the saved checkpoint does not count as done (``retained_phy_floor``)
        self.saved_committed_offset = 0
        #: checkpoint: done units at or above ``committed_offset``, one bit per unit from ``_done_from``
        self._done_from = 0
        self._done_bits = bytearray()
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
        #: heap entries of units already done (rolled): skipped when they come up
        self._stale = 0
        #: the next timer queue unit the roll looks at, and when the unit there is old enough (None: unknown)
        self._roll_offset = 0
        self._next_roll_ms: int | None = None
        self.delivered_total = 0
        self.recalled_total = 0
        self.rolled_total = 0

    # ---- checkpoint (load, persist: JsonPersisted) ----------------------------------------------
    def decode(self, obj: dict[str, Any]) -> None:
        committed = max(0, int(obj.get("queueOffset") or 0))
        self.committed_offset = self.saved_committed_offset = committed
        self._done_from = committed - committed % 8
        self._done_bits = bytearray()
        done_from = obj.get("doneFrom")
        bitmap = obj.get("doneBitmap")
        if isinstance(done_from, int) and isinstance(bitmap, str) and bitmap:
            try:
                bits = base64.b64decode(bitmap.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeError, ValueError):
                log.warning("timer checkpoint: doneBitmap is not base64: ignored (done units are delivered again)")
                bits = b""
            if bits and 0 <= done_from <= committed and done_from % 8 == 0:
                self._done_from = done_from
                self._done_bits = bytearray(bits)
        for queue_offset in obj.get("doneOffsets") or []:  # an earlier version's list
            if int(queue_offset) > committed:
                self._set_done_bit(int(queue_offset))
        self._advance_committed(committed)

    def _done_bitmap(self) -> tuple[int, bytes]:
        """(doneFrom, the bitmap's saved bytes): a bounded copy (CHECKPOINT_DONE_SPAN bits at most)."""
        return self._done_from, bytes(self._done_bits[:CHECKPOINT_DONE_SPAN // 8]).rstrip(b"\0")

    @staticmethod
    def _checkpoint(committed: int, done_from: int, bits: bytes, phy_end: int) -> dict[str, Any]:
        return {"queueOffset": committed, "doneFrom": done_from if bits else committed - committed % 8,
                "doneBitmap": base64.b64encode(bits).decode("ascii"), "phyOffset": phy_end}

    def encode(self) -> dict[str, Any]:
        return self._checkpoint(self.committed_offset, *self._done_bitmap(), self._phy_end())

    def done_offsets(self) -> list[int]:
        """The done units above ``committed_offset`` (tests, diagnostics: walks the whole bitmap)."""
        base = self._done_from
        return [base + i * 8 + j for i, byte in enumerate(self._done_bits) if byte for j in range(8)
                if byte >> j & 1 and base + i * 8 + j > self.committed_offset]

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
        committed, phy_end = self.committed_offset, self._phy_end()
        done_from, bits = self._done_bitmap()  # at most CHECKPOINT_DONE_SPAN / 8 bytes copied on the loop
        gen = self._next_generation()

        def write() -> None:
            obj = self._checkpoint(committed, done_from, bits, phy_end)
            self._file.write_raw(jsonx.dumps_pretty(obj), gen)

        await asyncio.to_thread(write)
        self.saved_committed_offset = max(self.saved_committed_offset, committed)

    def persist(self) -> None:
        committed = self.committed_offset
        super().persist()
        self.saved_committed_offset = max(self.saved_committed_offset, committed)

    # ---- state ------------------------------------------------------------------------------------
    @property
    def pending_count(self) -> int:
        """Units pending in the heap (messages and recall markers not yet due; rolled-away entries not counted)."""
        return len(self._heap) - self._stale

    def next_deliver_ms(self) -> int | None:
        return self._heap[0].deliver_ms if self._heap else None

    def retained_phy_floor(self) -> int | None:
        """The commit log offset of the oldest timer queue unit the saved checkpoint does not count as done: the
        store deletes no segment from there (``MessageStore.retained_phy_floor``); None when every unit is done.
        On a slave, from the copied checkpoint. One consume queue read."""
        units = self._store.get_consume_queue_units(TIMER_TOPIC, TIMER_QUEUE_ID, self.saved_committed_offset, 1)
        return int(units[0][0]) if units else None

    def _is_done(self, queue_offset: int) -> bool:
        return queue_offset < self.committed_offset or self._is_done_bit(queue_offset)

    def _is_done_bit(self, queue_offset: int) -> bool:
        i = queue_offset - self._done_from
        byte = i >> 3
        return 0 <= byte < len(self._done_bits) and bool(self._done_bits[byte] >> (i & 7) & 1)

    def _set_done_bit(self, queue_offset: int) -> None:
        i = queue_offset - self._done_from
        byte = i >> 3
        bits = self._done_bits
        if byte >= len(bits):
            bits.extend(bytes(byte + 1 - len(bits)))
        bits[byte] |= 1 << (i & 7)

    def _advance_committed(self, committed: int) -> None:
        """``committed_offset`` = the first unit at or after ``committed`` (not below the bitmap's start) not done;
        the bitmap's bytes below it dropped."""
        while self._is_done_bit(committed):
            committed += 1
        self.committed_offset = committed
        drop = (committed - self._done_from) >> 3
        if drop > 0:
            del self._done_bits[:drop]
            self._done_from += drop * 8
        if self._done_bits:  # the bits below committed_offset in the first byte are cleared (saved as zeros)
            self._done_bits[0] &= 0xFF << (committed - self._done_from) & 0xFF

    def _mark_done(self, queue_offset: int) -> None:
        self._dirty = True
        if queue_offset != self.committed_offset:
            if queue_offset > self.committed_offset:
                self._set_done_bit(queue_offset)
            return
        self._advance_committed(queue_offset + 1)

    # ---- reading the timer queue --------------------------------------------------------------------
    def scan(self, max_units: int = SCAN_UNITS_PER_STEP) -> bool:
        """Read up to ``max_units`` new timer queue units into the heap; True when the queue's end is reached."""
        store = self._store
        min_offset = store.get_min_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        if self._scan_offset < min_offset:  # units removed with their commit log files (truncated away)
            self._scan_offset = min_offset
        if self.committed_offset < min_offset:
            log.error("timer queue units %d to %d were deleted with their commit log segments before they were done",
                      self.committed_offset, min_offset - 1)
            self._advance_committed(min_offset)
            self._dirty = True
        units = store.get_consume_queue_units(TIMER_TOPIC, TIMER_QUEUE_ID, self._scan_offset, max_units)
        for phy_offset, _size, _tags in units:
            queue_offset = self._scan_offset
            self._scan_offset += 1
            if self._is_done(queue_offset):
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
        rolled_from = props.get(PROPERTY_TIMER_ROLL_FROM)
        if rolled_from:  # this record replaces an older unit (a rebuild after a crash mid-roll still holds it)
            try:
                replaced = int(rolled_from)
            except ValueError:
                replaced = queue_offset
            if replaced < queue_offset and not self._is_done(replaced):
                self._mark_done(replaced)
                self._stale += 1  # read before this unit (the scan is in queue order): it is in the heap
        marker_key = props.get(PROPERTY_TIMER_DEL_UNIQKEY)
        if marker_key:
            self._recalled[marker_key] = deliver_ms
            heapq.heappush(self._heap, _Pending(deliver_ms, True, queue_offset, phy_offset, marker_key))
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
        heapq.heappush(self._heap, _Pending(deliver_ms, False, queue_offset, phy_offset, key))

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
            if self._is_done(item.queue_offset):  # rolled: its new unit is in the heap too
                heapq.heappop(heap)
                self._stale -= 1
                if not item.marker:
                    self._forget(item.key)
                continue
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

    # ---- rolling -----------------------------------------------------------------------------------------
    def roll_old(self, now_ms: int, max_count: int = ROLL_PER_STEP) -> tuple[bool, bool]:
        """Re-write up to ``max_count`` pending units whose record is older than the roll window, oldest first:
        (whether more may be due now, whether a put failed). Looks at most SCAN_UNITS_PER_STEP units."""
        if self._next_roll_ms is not None and now_ms < self._next_roll_ms:
            return False, False  # the oldest pending record is younger than the window: later ones are too
        self._next_roll_ms = None
        store = self._store
        window_ms = self.roll_window_ms
        due_soon_ms = min(ROLL_DUE_SOON_MS, window_ms // 2)
        cursor = max(self._roll_offset, self.committed_offset)
        rolled = looked = 0
        try:
            while cursor < self._scan_offset:
                if rolled >= max_count or looked >= SCAN_UNITS_PER_STEP:
                    return True, False
                looked += 1
                if self._is_done(cursor):
                    cursor += 1
                    continue
                units = store.get_consume_queue_units(TIMER_TOPIC, TIMER_QUEUE_ID, cursor, 1)
                msg = store.look_message_by_offset(units[0][0]) if units else None
                if msg is None:  # unreadable: the delivery skips it
                    cursor += 1
                    continue
                if msg.store_timestamp + window_ms > now_ms:
                    self._next_roll_ms = msg.store_timestamp + window_ms
                    return False, False
                try:
                    deliver_ms = int(msg.properties[PROPERTY_TIMER_OUT_MS])
                except (KeyError, ValueError):
                    deliver_ms = now_ms
                if deliver_ms - now_ms <= due_soon_ms:  # delivered from where it is
                    cursor += 1
                    continue
                result = self._put(rolled_record(msg, cursor))
                if result.append_result is None:
                    log.warning("rolling timer record at %d failed: %s (again in %d ms)", units[0][0], result.status,
                                ERROR_BACKOFF_MS)
                    return False, True
                rolled += 1
                self.rolled_total += 1
                self._mark_done(cursor)
                self._stale += 1
                cursor += 1
            return False, False
        finally:
            self._roll_offset = cursor

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
            now_ms = self._clock_ms()
            handled, failed = self.deliver_due(now_ms)
            more_rolls = False
            if not failed and handled < DELIVER_PER_STEP:
                more_rolls, failed = self.roll_old(now_ms)
        except Exception:
            log.exception("timer delivery failed")
            handled, failed, more_rolls = 0, True, False
        if failed:
            self._arm(loop, ERROR_BACKOFF_MS)
            return
        if handled >= DELIVER_PER_STEP or more_rolls:
            self._soon = loop.call_soon(self._step)
            return
        nxt = self.next_deliver_ms()
        if self._next_roll_ms is not None and (nxt is None or self._next_roll_ms < nxt):
            nxt = self._next_roll_ms
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
        self._stale = 0
        self._scan_offset = self._roll_offset = self.committed_offset
        self._next_roll_ms = None
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
