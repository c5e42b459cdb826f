"""The broker's put pipeline: store.put_message, then a coalesced reput + long-poll wake-up, then the
waits a SYNC_FLUSH / SYNC_MASTER send needs (protocol §6.5).

Everything here runs on the event loop thread except the flush thread behind ``FlushService``.
Reput is scheduled with ``loop.call_soon`` at most once per loop iteration, so a burst of sends on
many connections is dispatched in one go; a slave's replicated bytes are dispatched within 1 ms
(``schedule_reput_within``), after the HA client has reported them to the master.

A put is preceded by the store's ``prepare_put`` (its consume queue unit can be written: the file exists,
is mapped and has its blocks reserved), so a send is acknowledged only when its dispatch can be made; a
refusal (no descriptor left, a full disk) is answered with its status. A dispatch that still stops short
of the log's end (e.g. a batch beyond the reserved chunk on a full disk) is retried every
``DISPATCH_RETRY_INTERVAL_MS`` until it succeeds, without waiting for another send.

With ``hold_keys`` (controller mode without readUnCommitted: the store dispatches only what the SyncStateSet
confirmed) a put's queue is remembered with the phy offset its record ends at, and long polling is told about
it by the reput that dispatches it (after the replicas' acks), not by the first reput after the put
(beyond ``HELD_KEYS_MAX`` waiting puts: one wake-up of every parked pull instead). A put whose record the bound
cannot reach yet schedules no reput (it would dispatch nothing): the move of the confirm offset does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ferrymq.broker.config import BrokerConfig, BrokerRole, FlushDiskType
from ferrymq.broker.flush import FlushService
from ferrymq.common.message import SYSFLAG_TRANSACTION_MASK, MessageExtBrokerInner
from ferrymq.store.results import PutMessageResult

log = logging.getLogger(__name__)

#: records dispatched per loop iteration before yielding to other work
REPUT_BATCH_RECORDS = 10_000
#: ... and seconds: a dispatch whose records each touch a new page of another queue's file (an estate's first
#: messages) pays a page fault per record, which may wait for that page's writeback by the flush thread
REPUT_STEP_BUDGET_S = 0.02
#: a dispatch that stopped short of the commit log's end is tried again this often until it catches up
DISPATCH_RETRY_INTERVAL_MS = 200
#: puts whose queues wait for their dispatch (``hold_keys``) before they collapse into one wake-up of every
#: parked pull at the dispatch of the last of them (memory stays bounded while a replica does not ack)
HELD_KEYS_MAX = 65_536

QueueKey = tuple[str, int]


#: properties (as sent) of a message stored in another queue than the one its send names: a delay level, a
#: transaction half, and maybe a timer (TIMER_DELAY_SEC/_MS, TIMER_DELIVER_MS, __STARTDELIVERTIME; common/timer.py:
#: the Python path decides). They take a single send off the native path (and out of queue_files.py's gate)
STORED_ELSEWHERE_MARKS = ("DELAY\x01", "TRAN_MSG\x01", "TIMER_", "__STARTDELIVERTIME\x01")
_GOES_ELSEWHERE_DELAY, _GOES_ELSEWHERE_TRAN, _MAYBE_TIMER, _MAYBE_START_DELIVER = (
    mark.encode() for mark in STORED_ELSEWHERE_MARKS)

class MessageWriter:
    def __init__(self, store: Any, config: BrokerConfig, flush: FlushService,
                 on_dispatched: Callable[[set[QueueKey] | None], None]) -> None:
        self._store = store
        self._config = config
        self._flush = flush
        self._on_dispatched = on_dispatched
        self._pending_keys: set[QueueKey] = set()
        #: dispatch bounded by a confirm offset: (phy offset the put's records end at, queue), in put order
        self.hold_keys = False
        self._held_keys: deque[tuple[int, QueueKey]] = deque()
        #: the dispatch reaching this phy offset wakes every parked pull (-1: none due; HELD_KEYS_MAX overflowed)
        self._wake_all_at = -1
        self._wake_all = False
        self._reput_scheduled = False
        self._retry_handle: asyncio.TimerHandle | None = None
        #: where the last put through this writer ended: a reput that dispatched records and got there is not
        #: behind, so ``_reput`` asks the store's ``dispatch_behind_bytes`` only otherwise (0: no put yet)
        self._put_end_phy_offset = 0
        #: the store's ``Dispatcher`` when it has one (its ``cut_short`` and ``reput_phy_offset`` read directly)
        self._dispatcher: Any = getattr(store, "dispatcher", None)
        #: the store's check before a put (``MessageStore.prepare_put``), if it has one
        self._prepare: Callable[[str, int, int], Any] | None = getattr(store, "prepare_put", None)
        #: ``BrokerStats`` (set by the broker): stored messages/bytes per topic, SYNC_MASTER wait times
        self.stats: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: set by the controller on a master: ferrymq.ha.service.HAService
        self.ha_service: Any = None
        self.sync_flush = config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self.sync_master = config.broker_role is BrokerRole.SYNC_MASTER
        #: the store's native single put, when it has one (None: ``put`` only)
        self._put_one_raw: Callable[..., tuple[Any, bool] | None] | None = None
        #: whether ``put_one_raw`` may handle a send (the send processor skips its preparation otherwise)
        self.native_put_one = False
        self.refresh_native()

    def refresh_native(self) -> None:
        """Take the store's native single put if its commit log has the C extension (again after a test
        swapped ``commit_log.native``); a pure-Python store's sends go straight to ``put``. With a
        ``MessageStore`` that is its commit log's ``put_one_raw`` itself (it declines a stopped or slave store
        as ``MessageStore.put_one_raw`` does: one call less per send)."""
        put_raw = getattr(self._store, "put_one_raw", None)
        commit_log: Any = getattr(self._store, "commit_log", None)
        if getattr(commit_log, "native", None) is None:
            put_raw = None
        elif put_raw is not None and hasattr(commit_log, "accepting_puts"):
            put_raw = commit_log.put_one_raw
        self._put_one_raw = put_raw
        self.native_put_one = put_raw is not None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    # ---- puts -------------------------------------------------------------------------------
    def put(self, inner: MessageExtBrokerInner) -> Any:
        prepare = self._prepare
        if prepare is not None:
            refused = prepare(inner.topic, inner.queue_id, inner.sys_flag)
            if refused is not None:
                return PutMessageResult(refused)
        result = self._store.put_message(inner)
        if result.append_result is not None:
            self._appended((inner.topic, inner.queue_id), result.append_result)
        return result

    def put_batch(self, inners: list[MessageExtBrokerInner]) -> Any:
        prepare = self._prepare
        if prepare is not None and inners:
            refused = prepare(inners[0].topic, inners[0].queue_id, inners[0].sys_flag)
            if refused is not None:
                return PutMessageResult(refused)
        result = self._store.put_messages(inners)
        if result.append_result is not None and inners:
            self._appended((inners[0].topic, inners[0].queue_id), result.append_result)
        return result

    def put_batch_raw(self, topic: str, queue_id: int, batch_body: bytes, merge_props: bytes, cluster: bytes,
                      sys_flag: int, born_timestamp: int, born_host: bytes, store_host: bytes,
                      reconsume_times: int) -> Any:
        """The native SEND_BATCH put (``MessageStore.put_batch_raw``); None = use ``put_batch``."""
        put_raw = getattr(self._store, "put_batch_raw", None)
        if put_raw is None:
            # (an entry that asks for a delivery time is declined by the extension, which reads the entries'
            # properties: the Python path refuses it. A scan of the whole body here took ~40 % of the loop
            # thread under 256 KiB batches.)
            return None
        prepare = self._prepare
        if prepare is not None and prepare(topic, queue_id, sys_flag) is not None:
            return None  # put_batch answers the refusal
        result = put_raw(topic, queue_id, batch_body, merge_props, cluster, sys_flag, born_timestamp, born_host,
                         store_host, reconsume_times)
        if result is not None and result.append_result is not None:
            self._appended((topic, queue_id), result.append_result)
        return result

    def put_one_raw(self, topic: str, queue_id: int, body: bytes, props: bytes, cluster: bytes, flag: int,
                    sys_flag: int, born_timestamp: int, born_host: bytes, store_host: bytes,
                    reconsume_times: int) -> tuple[Any, bool] | None:
        """The native single SEND put (``MessageStore.put_one_raw``): (result, WAIT flag); None = use ``put``."""
        put_raw = self._put_one_raw
        if put_raw is None:
            return None
        find = props.find  # (``bytes.__contains__`` first tries its argument as an int: 2x the time of find)
        if (find(_GOES_ELSEWHERE_DELAY) >= 0 or find(_GOES_ELSEWHERE_TRAN) >= 0 or sys_flag & SYSFLAG_TRANSACTION_MASK
                or find(_MAYBE_TIMER) >= 0 or find(_MAYBE_START_DELIVER) >= 0):
            # the native put declines DELAY and TRAN_MSG, and a timer message is not a plain one: they are stored in
            # another queue (the delay level's, the half topic's, the timer topic's): ``put`` prepares that one;
            # preparing (topic, queue_id) here would create its file for nothing
            return None
        prepare = self._prepare
        if prepare is not None and prepare(topic, queue_id, sys_flag) is not None:
            return None  # put answers the refusal
        res = put_raw(topic, queue_id, body, props, cluster, flag, sys_flag, born_timestamp, born_host, store_host,
                      reconsume_times)
        if res is None:
            return None
        ar = res[0].append_result
        if ar is None:
            return res
        if self.hold_keys:
            self._appended((topic, queue_id), ar)
            return res
        # _appended written out for the usual case (once per plain send: one frame less)
        self._put_end_phy_offset = ar.wrote_offset + ar.wrote_bytes
        self._pending_keys.add((topic, queue_id))
        stats = self.stats
        if stats is not None:
            stats.on_put(topic, ar.msg_num, ar.wrote_bytes)
        ha = self.ha_service
        if ha is not None:
            ha.notify_data_appended()
        if not self._reput_scheduled:
            self.schedule_reput()
        return res

    def _appended(self, key: QueueKey, ar: Any) -> None:
        self._put_end_phy_offset = end = ar.wrote_offset + ar.wrote_bytes
        if self.hold_keys:
            held = self._held_keys
            if len(held) >= HELD_KEYS_MAX:
                held.clear()
                self._wake_all_at = end
            else:
                held.append((end, key))
        else:
            self._pending_keys.add(key)
        stats = self.stats
        if stats is not None:
            stats.on_put(key[0], ar.msg_num, ar.wrote_bytes)
        ha = self.ha_service
        if ha is not None:
            ha.notify_data_appended()
        if not self._reput_scheduled:  # the usual case after the first put of a loop iteration: nothing to do
            if self.hold_keys and not self._store.reput_can_advance():
                return  # beyond the confirm offset: the replicas' ack that confirms it schedules the dispatch
            self.schedule_reput()

    # ---- reput ------------------------------------------------------------------------------
    def schedule_reput(self, wake_all: bool = False) -> None:
        """Dispatch new records soon (once per loop iteration). ``wake_all``: replicated data (slave)."""
        self._wake_all = self._wake_all or wake_all
        if self._reput_scheduled:
            return
        loop = self._loop or asyncio.get_running_loop()
        self._reput_scheduled = True
        loop.call_soon(self._reput)

    def schedule_reput_within(self, delay_s: float, wake_all: bool = True) -> None:
        """Dispatch new records within ``delay_s`` (a slave's replicated bytes: transfers arriving meanwhile
        are dispatched together, like RocketMQ's reput loop that sleeps 1 ms between rounds)."""
        self._wake_all = self._wake_all or wake_all
        if self._reput_scheduled:
            return
        loop = self._loop or asyncio.get_running_loop()
        self._reput_scheduled = True
        loop.call_later(delay_s, self._reput)

    def schedule_reput_threadsafe(self, wake_all: bool = True) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self.schedule_reput(wake_all)
        else:
            loop.call_soon_threadsafe(self.schedule_reput, wake_all)

    def _reput(self) -> None:
        self._reput_scheduled = False
        if self.sync_flush and self._flush is not None:
            # the iteration's SYNC_FLUSH sends are flushed and answered first: the dispatch below is not durability
            self._flush.commit_now()
        try:
            n = self._store.reput(REPUT_BATCH_RECORDS, REPUT_STEP_BUDGET_S)
        except Exception:
            log.exception("reput failed")
            n = 0
        d = self._dispatcher
        if n >= REPUT_BATCH_RECORDS or (d.cut_short if d is not None else getattr(self._store, "reput_cut_short", False)):
            self.schedule_reput()
        elif ((d is None or n == 0 or d.reput_phy_offset < self._put_end_phy_offset or not self._put_end_phy_offset)
              and getattr(self._store, "dispatch_behind_bytes", 0) > 0):
            # stopped short (a file could not be had): again by itself, no send needed. A reput that dispatched
            # records up to the end of the last put is not behind (the usual case: no walk to the log's end);
            # a stalled one dispatched nothing, so it is asked as before
            self._schedule_retry()
        held = self._held_keys
        if held or self._wake_all_at >= 0:  # the queues whose puts this reput (or an earlier one) dispatched
            dispatched_to = self._store.reput_phy_offset
            pending = self._pending_keys
            while held and held[0][0] <= dispatched_to:
                pending.add(held.popleft()[1])
            if 0 <= self._wake_all_at <= dispatched_to:
                self._wake_all_at = -1
                self._wake_all = True
        keys, self._pending_keys = self._pending_keys, set()
        wake_all, self._wake_all = self._wake_all, False
        if wake_all:
            self._on_dispatched(None)
        elif keys:
            self._on_dispatched(keys)

    def _schedule_retry(self) -> None:
        if self._retry_handle is not None:
            return
        loop = self._loop or asyncio.get_running_loop()
        self._retry_handle = loop.call_later(DISPATCH_RETRY_INTERVAL_MS / 1000, self._retry)

    def _retry(self) -> None:
        self._retry_handle = None
        self.schedule_reput(wake_all=True)  # the keys of the stalled records are not known here

    def reput_now(self) -> None:
        """Dispatch everything appended so far (start-up, tests)."""
        while self._store.reput(REPUT_BATCH_RECORDS) >= REPUT_BATCH_RECORDS:
            pass

    # ---- waits ------------------------------------------------------------------------------
    def needs_wait(self, wait_store_msg_ok: bool) -> bool:
        return wait_store_msg_ok and (self.sync_flush or (self.sync_master and self.ha_service is not None))

    def on_flushed(self, result: Any, fn: Callable[[bool], None]) -> None:
        """SYNC_FLUSH without SYNC_MASTER, callback form of ``wait_stored``: ``fn(True)`` once the put's bytes
        are flushed, ``fn(False)`` at syncFlushTimeout (FLUSH_DISK_TIMEOUT). May call ``fn`` at once; otherwise
        ``fn`` runs on the loop in the flush round's one callback (no future, no task)."""
        ar = result.append_result
        self._flush.on_flushed(ar.wrote_offset + ar.wrote_bytes, self._config.sync_flush_timeout_ms, fn)

    async def wait_stored(self, result: Any) -> str:
        """Flush/replica waits for a stored put; the final PutMessageStatus name."""
        ar = result.append_result
        end = ar.wrote_offset + ar.wrote_bytes
        flush_status = "PUT_OK"
        if self.sync_flush:
            # bounded by the flush service's one deadline timer (syncFlushTimeout), not a timer per send
            if not await self._flush.request_flush(end, self._config.sync_flush_timeout_ms):
                flush_status = "FLUSH_DISK_TIMEOUT"
        replica_status = "PUT_OK"
        ha = self.ha_service
        if self.sync_master and ha is not None:
            if not ha.is_slave_ok(end):
                replica_status = "SLAVE_NOT_AVAILABLE"
            else:
                started_s = time.perf_counter()
                acked = await ha.wait_for_slave_ack(end, self._config.replica_wait_ms)
                if self.stats is not None:
                    self.stats.sync_wait.observe(time.perf_counter() - started_s)
                if not acked:
                    replica_status = "FLUSH_SLAVE_TIMEOUT"
        return replica_status if replica_status != "PUT_OK" else flush_status
