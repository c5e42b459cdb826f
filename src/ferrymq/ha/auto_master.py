"""Master side of controller-mode HA (wire: ``auto_codec``): handshake and truncation point, epoch-stamped
transfers, per-replica acks, SYNC waits and the SyncStateSet's caught-up / lagging signals.

* Each accepted connection: hello (nonce) -> handshake (checked: version, brokerName, HMAC when
  ``ha_secret`` is set; acks of an unauthenticated peer never count) -> answer with the common point
  (``find_common_point``) and the master's epoch entries -> the slave's first report says where to start ->
  a pump streams ``read_from`` chunks (never across a segment or an epoch boundary), a reader takes acks.
  A newer connection of the same replica id replaces the older one.
* ``wait_for_ack(end, timeout_ms)``: with ``all_ack_in_sync_state_set`` every SyncStateSet member other than
  the master must have acked ``end``; otherwise ``in_sync_replicas - 1`` of them (at least
  ``min_in_sync_replicas - 1``). A SyncStateSet smaller than ``min_in_sync_replicas`` answers False at once.
  Waiters are a heap on ``end`` released by the ack level (the needed-th highest ack).
* ``confirm_offset`` = min(the master's max phy offset, every other SyncStateSet member's ack).
  ``on_confirm_changed()`` runs whenever the least ack of the other members moved (a member's ack, a change of
  the set): the broker dispatches up to it (controller mode serves consumers only confirmed records). A move of
  the max phy offset alone is the put's own business (the broker's put schedules its dispatch).
* A slave whose ack reached the master's max phy offset is caught up at that moment. A SyncStateSet member
  not caught up for ``ha_max_time_slave_not_catchup_ms`` -> ``on_slave_lagging(id)``; a connected slave outside
  the set that catches up -> ``on_slave_caught_up(id)``. Each fires once until the set changes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

from ferrymq.common import aio
from ferrymq.common.aio import wait_event
from ferrymq.common.tls import SILENT_MEANS_PLAIN_MS, Listener, TlsServerSettings
from ferrymq.errors import ProtocolError
from ferrymq.ha import auto_codec as codec
from ferrymq.ha.epoch import EpochFile, find_common_point

__all__ = ["AutoSwitchHAMaster"]

log = logging.getLogger(__name__)

DEFAULT_TRANSFER_BATCH_SIZE = 256 * 1024
DEFAULT_HEARTBEAT_INTERVAL_MS = 1000
DEFAULT_HA_MAX_TIME_SLAVE_NOT_CATCHUP_MS = 15_000
#: a peer must finish its handshake (and its first report) within this
HANDSHAKE_TIMEOUT_MS = 5000
#: a slave silent for this long is dropped
DEFAULT_HOUSEKEEPING_INTERVAL_MS = 20_000
MAX_SLAVE_CONNECTIONS = 16
WRITE_BUFFER_HIGH_BYTES = 4 * 1024 * 1024
#: the SyncStateSet check (lagging / caught up) runs this often at most
CHECK_INTERVAL_MS = 500
#: the least ack of the other SyncStateSet members when there is none: the confirm offset is the log's end
CONFIRM_UNBOUNDED = 1 << 62


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


class _AckCallback:
    """A callback waiter (``on_slave_ack``): answered once, True by the ack level or False at its deadline."""

    __slots__ = ("fn", "done")

    def __init__(self, fn: Callable[[bool], None]) -> None:
        self.fn = fn
        self.done = False

    def resolve(self, ok: bool) -> None:
        if not self.done:
            self.done = True
            self.fn(ok)


def _resolve(waiter: asyncio.Future[bool] | _AckCallback, ok: bool) -> None:
    if isinstance(waiter, _AckCallback):
        waiter.resolve(ok)
    elif not waiter.done():
        waiter.set_result(ok)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class _Slave:
    def __init__(self, replica_id: int, writer: asyncio.StreamWriter, next_phy_offset: int) -> None:
        self.replica_id = replica_id
        self.writer = writer
        self.ack_phy_offset = next_phy_offset
        self.next_phy_offset = next_phy_offset
        self.last_read_ms = _now_ms()
        self.wake = asyncio.Event()
        #: set while the transport takes writes (cleared by pause_writing: the pump waits)
        self.writable = asyncio.Event()
        self.writable.set()
        self.partial = b""  # an unfinished report
        self.tasks: list[asyncio.Task[None]] = []


class _AckProtocol(asyncio.Protocol):
    """The transport's protocol once a replica's handshake is done: its reports are acks."""

    def __init__(self, master: AutoSwitchHAMaster, slave: _Slave) -> None:
        self.master = master
        self.slave = slave

    def data_received(self, data: bytes) -> None:
        slave = self.slave
        buffered = slave.partial + data if slave.partial else data
        whole = len(buffered) - len(buffered) % codec.REPORT_SIZE
        slave.partial = buffered[whole:]
        if whole:
            try:
                self.master._on_ack(slave, codec.last_report(buffered[:whole]))
            except ProtocolError as exc:
                log.warning("HA replica %d: %s", slave.replica_id, exc)
                self.master._drop(slave, "protocol error")

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.slave.writable.set()  # a pump waiting to write finds the transport closing
        self.master._drop(self.slave, "connection closed")

    def pause_writing(self) -> None:
        self.slave.writable.clear()

    def resume_writing(self) -> None:
        self.slave.writable.set()


class AutoSwitchHAMaster:
    def __init__(self, store: Any, epoch_file: EpochFile, host: str, port: int, *, broker_name: str,
                 replica_id: int, ha_secret: str | None = None, all_ack_in_sync_state_set: bool = True,
                 in_sync_replicas: int = 1, min_in_sync_replicas: int = 1,
                 ha_max_time_slave_not_catchup_ms: int = DEFAULT_HA_MAX_TIME_SLAVE_NOT_CATCHUP_MS,
                 transfer_batch_size: int = DEFAULT_TRANSFER_BATCH_SIZE,
                 heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
                 housekeeping_interval_ms: int = DEFAULT_HOUSEKEEPING_INTERVAL_MS,
                 on_slave_caught_up: Callable[[int], None] | None = None,
                 on_slave_lagging: Callable[[int], None] | None = None,
                 on_confirm_changed: Callable[[], None] | None = None,
                 tls: TlsServerSettings | None = None) -> None:
        #: TLS of the HA port (tlsServerMode and tls.server.*, common/tls.py)
        self.tls = tls
        self.store = store
        self.epoch_file = epoch_file
        self.host = host
        self.port = port
        self.broker_name = broker_name
        self.replica_id = replica_id
        self.secret = ha_secret.encode() if ha_secret else None
        self.all_ack_in_sync_state_set = all_ack_in_sync_state_set
        self.in_sync_replicas = in_sync_replicas
        self.min_in_sync_replicas = min_in_sync_replicas
        self.ha_max_time_slave_not_catchup_ms = ha_max_time_slave_not_catchup_ms
        self.transfer_batch_size = transfer_batch_size
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.housekeeping_interval_ms = housekeeping_interval_ms
        self.on_slave_caught_up = on_slave_caught_up
        self.on_slave_lagging = on_slave_lagging
        self.on_confirm_changed = on_confirm_changed
        self.sync_state_set: set[int] = {replica_id}
        self.sync_state_set_epoch = 0
        self._slaves: dict[int, _Slave] = {}
        self._acks: dict[int, int] = {}  # replica id -> ack phy offset (kept across reconnects)
        self._caught_up_ms: dict[int, int] = {}
        self._signalled: set[int] = set()
        self._waiters: list[tuple[int, int, asyncio.Future[bool] | _AckCallback]] = []
        #: deadlines of callback waiters, swept by one timer
        self._deadlines: list[tuple[float, int, _AckCallback]] = []
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        self._seq = itertools.count()
        self._ack_level = 0
        #: the least ack of the other SyncStateSet members (CONFIRM_UNBOUNDED: no other member), kept by
        #: ``_recompute`` so ``confirm_offset``, read by every dispatch, is one ``min``
        self._others_acked = CONFIRM_UNBOUNDED
        self._server: Listener | None = None
        self._check_task: asyncio.Task[None] | None = None
        self._conn_tasks: set[asyncio.Task[None]] = set()
        self.rejected_handshakes = 0
        #: False while this broker is not the master (controller mode): connections are closed at once
        self.active = True
        self._push_scheduled = False
        #: puts of this loop iteration, and whether the last iteration with puts had one (a lone sender)
        self._iteration_puts = 0
        self._lone_puts = True

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        def streams() -> asyncio.StreamReaderProtocol:
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self._accept)

        # with haSecret the master speaks first (its challenge): in permissive mode a silent peer is plain
        self._server = Listener(streams, self.host, self.port, self.tls,
                                silent_means_plain_ms=SILENT_MEANS_PLAIN_MS if self.secret else None)
        await self._server.start()
        self.port = self._server.port
        self._check_task = asyncio.create_task(self._check_loop())
        self._recompute()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._check_task is not None:
            self._check_task.cancel()
        for slave in list(self._slaves.values()):
            self._drop(slave, "master stopping")
        for task in list(self._conn_tasks):
            task.cancel()
        await asyncio.gather(*self._conn_tasks, *(t for s in self._slaves.values() for t in s.tasks),
                             return_exceptions=True)
        if self._check_task is not None:
            await asyncio.gather(self._check_task, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self._fail_waiters()

    async def deactivate(self) -> None:
        """No longer the master: drop every replica, forget their acks (a later term starts afresh) and
        answer every waiting send False."""
        self.active = False
        for slave in list(self._slaves.values()):
            self._drop(slave, "no longer the master")
        self._acks.clear()
        self._others_acked = self._least_other_ack()
        self._caught_up_ms.clear()
        self._signalled.clear()
        self._fail_waiters()

    def _fail_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        self._deadlines = []
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        self._sweep_at = math.inf
        for _end, _seq, waiter in waiters:
            _resolve(waiter, False)

    # --- the broker's replica interface (as the classic HAService's) -----------------------------

    def is_slave_ok(self, end_phy_offset: int) -> bool:
        """Can a SYNC send wait for replicas at all? (False: SLAVE_NOT_AVAILABLE at once)"""
        return self.active and self._needed() >= 0

    async def wait_for_slave_ack(self, end_phy_offset: int, timeout_ms: int) -> bool:
        return await self.wait_for_ack(end_phy_offset, timeout_ms)

    # --- SyncStateSet and acks -------------------------------------------------------------------

    def set_sync_state_set(self, ids: set[int], epoch: int) -> None:
        self.sync_state_set = set(ids) | {self.replica_id}
        self.sync_state_set_epoch = epoch
        self._signalled.clear()
        now = _now_ms()
        for rid in self.sync_state_set:
            self._caught_up_ms.setdefault(rid, now)
        self._recompute()

    def _needed(self) -> int:
        """How many SyncStateSet members other than the master must ack; -1: the set is too small."""
        size = len(self.sync_state_set)
        if size < self.min_in_sync_replicas:
            return -1
        if self.all_ack_in_sync_state_set:
            return size - 1
        return max(min(self.in_sync_replicas, size), self.min_in_sync_replicas) - 1

    def _recompute(self) -> None:
        others = sorted((self._acks.get(rid, 0) for rid in self.sync_state_set if rid != self.replica_id),
                        reverse=True)
        needed = self._needed()
        if needed < 0:
            level = -1
        elif needed == 0:
            level = 1 << 62
        else:
            level = others[needed - 1] if len(others) >= needed else -1
        self._ack_level = level
        others_acked = others[-1] if others else CONFIRM_UNBOUNDED  # (= _least_other_ack(): sorted high to low)
        if others_acked != self._others_acked:  # else the confirm offset moves only with puts (their own reput)
            self._others_acked = others_acked
            if self.on_confirm_changed is not None:
                self.on_confirm_changed()
        waiters = self._waiters
        if not waiters or waiters[0][0] > level:
            return
        while waiters and waiters[0][0] <= level:
            _end, _seq, waiter = heapq.heappop(waiters)
            _resolve(waiter, True)
        # answered callback waiters leave the deadline heap from its top (the oldest first) now, not at their
        # deadline: kept for the whole wait (seconds of sends) they would pile up into the collector's full passes
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].done:
            heapq.heappop(deadlines)

    def _least_other_ack(self) -> int:
        acks = self._acks
        me = self.replica_id
        return min((acks.get(rid, 0) for rid in self.sync_state_set if rid != me), default=CONFIRM_UNBOUNDED)

    @property
    def confirm_offset(self) -> int:
        return min(int(self.store.max_phy_offset), self._others_acked)

    async def wait_for_ack(self, end_phy_offset: int, timeout_ms: int) -> bool:
        if not self.active or self._needed() < 0:
            return False
        if end_phy_offset <= self._ack_level:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        heapq.heappush(self._waiters, (end_phy_offset, next(self._seq), fut))
        timer = loop.call_later(timeout_ms / 1000, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    def on_slave_ack(self, end_phy_offset: int, timeout_ms: int, fn: Callable[[bool], None]) -> None:
        """Callback form of ``wait_for_ack`` (the SYNC send path answers from the ack handler, without a
        future or a task): ``fn(True)`` once the needed replicas acked ``end_phy_offset``, ``fn(False)`` after
        ``timeout_ms``, at a role change or at stop. May call ``fn`` at once."""
        if not self.active or self._needed() < 0 or timeout_ms <= 0:
            fn(False)
            return
        if end_phy_offset <= self._ack_level:
            fn(True)
            return
        waiter = _AckCallback(fn)
        seq = next(self._seq)
        heapq.heappush(self._waiters, (end_phy_offset, seq, waiter))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        heapq.heappush(self._deadlines, (deadline, seq, waiter))
        if deadline < self._sweep_at:
            if self._sweep_handle is not None:
                self._sweep_handle.cancel()
            self._sweep_at = deadline
            self._sweep_handle = loop.call_at(deadline, self._sweep)

    def _sweep(self) -> None:
        """Answer False to every callback waiter whose deadline passed; re-arm for the next one."""
        self._sweep_handle = None
        self._sweep_at = math.inf
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadlines = self._deadlines
        while deadlines and (deadlines[0][0] <= now or deadlines[0][2].done):
            _t, _seq, waiter = heapq.heappop(deadlines)
            waiter.resolve(False)  # (no-op when already answered)
        if deadlines:
            self._sweep_at = deadlines[0][0]
            self._sweep_handle = loop.call_at(self._sweep_at, self._sweep)
        if len(self._waiters) > 2 * (len(deadlines) + 16):  # drop answered entries left in the ack heap
            self._waiters = [w for w in self._waiters if not (isinstance(w[2], _AckCallback) and w[2].done)]
            heapq.heapify(self._waiters)

    def notify_data_appended(self) -> None:
        """New bytes in the commit log: push them to every slave at the end of this loop iteration, so the
        sends of one iteration leave in one transfer (and come back as one ack). When the last iteration with
        puts had a single one (a lone sender), the first call also pushes right here, from inside the put, to
        every slave with nothing in flight (it acked every pushed byte: a lone SYNC send reaches it before its
        handler registers the wait). The pump streams what a full write buffer left behind."""
        if self._push_scheduled:
            self._iteration_puts += 1
            return
        if not self._slaves:
            return
        self._push_scheduled = True
        self._iteration_puts = 1
        asyncio.get_running_loop().call_soon(self._push_all)
        if self._lone_puts:
            for slave in list(self._slaves.values()):
                if slave.ack_phy_offset >= slave.next_phy_offset:
                    self._push_one(slave)

    def _push_all(self) -> None:
        self._push_scheduled = False
        if self._iteration_puts:
            self._lone_puts = self._iteration_puts == 1
            self._iteration_puts = 0
        for slave in list(self._slaves.values()):
            self._push_one(slave)

    def _push_one(self, slave: _Slave) -> None:
        try:
            if not self._push_available(slave):
                slave.wake.set()
        except (OSError, ConnectionError) as exc:
            self._drop(slave, f"write failed: {exc}")
        except Exception:  # called from inside a put: the send that stored the bytes is not concerned
            log.exception("HA push to replica %d failed", slave.replica_id)

    def slave_status(self) -> list[dict[str, Any]]:
        now = _now_ms()
        out = []
        for rid in sorted(set(self._acks) | (self.sync_state_set - {self.replica_id})):
            caught = self._caught_up_ms.get(rid)
            out.append({"replicaId": rid, "ackPhyOffset": self._acks.get(rid, 0), "connected": rid in self._slaves,
                        "inSyncStateSet": rid in self.sync_state_set,
                        "caughtUpAgoMs": now - caught if caught is not None else -1})
        return out

    def link_table(self) -> list[dict[str, Any]]:
        """The connected replicas in the classic master's ``haSlaves`` shape (addr, ackOffset, lagBytes), so
        ``ferry ha status`` and ``cluster list`` read both modes alike; replicaId and inSyncStateSet added."""
        master_max = self.store.max_phy_offset
        out = []
        for rid, slave in sorted(self._slaves.items()):
            peer = slave.writer.get_extra_info("peername")
            ack = slave.ack_phy_offset
            out.append({"addr": f"{peer[0]}:{peer[1]}" if peer else f"replica {rid}", "replicaId": rid,
                        "ackOffset": ack, "lagBytes": master_max - max(ack, 0), "state": "TRANSFER",
                        "inSyncStateSet": rid in self.sync_state_set})
        return out

    def _on_ack(self, slave: _Slave, ack: int) -> None:
        slave.last_read_ms = _now_ms()
        if ack < slave.ack_phy_offset or ack > slave.next_phy_offset:
            raise ProtocolError(f"replica {slave.replica_id} acked {ack} (last ack {slave.ack_phy_offset}, sent up "
                                f"to {slave.next_phy_offset})")
        slave.ack_phy_offset = ack
        rid = slave.replica_id
        self._acks[rid] = ack
        if ack >= self.store.max_phy_offset:
            self._caught_up_ms[rid] = slave.last_read_ms
            if rid not in self.sync_state_set and rid not in self._signalled:
                self._signalled.add(rid)
                if self.on_slave_caught_up is not None:
                    self.on_slave_caught_up(rid)
        if rid in self.sync_state_set:
            self._recompute()

    async def _check_loop(self) -> None:
        interval = min(CHECK_INTERVAL_MS, max(10, self.ha_max_time_slave_not_catchup_ms // 3)) / 1000
        while True:
            await asyncio.sleep(interval)
            now = _now_ms()
            max_phy = self.store.max_phy_offset
            for rid in sorted(self.sync_state_set - {self.replica_id}):
                if self._acks.get(rid, 0) >= max_phy:
                    self._caught_up_ms[rid] = now
                    continue
                since = self._caught_up_ms.setdefault(rid, now)
                if now - since > self.ha_max_time_slave_not_catchup_ms and rid not in self._signalled:
                    self._signalled.add(rid)
                    log.warning("replica %d has not caught up for %d ms", rid, now - since)
                    if self.on_slave_lagging is not None:
                        self.on_slave_lagging(rid)
            for slave in list(self._slaves.values()):
                rid = slave.replica_id
                if (rid not in self.sync_state_set and rid not in self._signalled
                        and self._acks.get(rid, 0) >= max_phy):  # caught up without a transfer (idle log)
                    self._caught_up_ms[rid] = now
                    self._signalled.add(rid)
                    if self.on_slave_caught_up is not None:
                        self.on_slave_caught_up(rid)
                if now - slave.last_read_ms > self.housekeeping_interval_ms:
                    self._drop(slave, "silent slave")

    # --- connections -----------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if not self.active or len(self._conn_tasks) + len(self._slaves) >= MAX_SLAVE_CONNECTIONS:
            writer.close()
            return
        assert task is not None
        self._conn_tasks.add(task)
        try:
            slave = await aio.wait_for(self._handshake(reader, writer), HANDSHAKE_TIMEOUT_MS / 1000)
        except (TimeoutError, ProtocolError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            log.warning("HA handshake from %s failed: %s", writer.get_extra_info("peername"), exc)
            writer.close()
            return
        finally:
            self._conn_tasks.discard(task)
        if slave is None:
            return
        old = self._slaves.get(slave.replica_id)
        if old is not None:
            self._drop(old, "replaced by a new connection")
        self._slaves[slave.replica_id] = slave
        self._acks[slave.replica_id] = slave.ack_phy_offset
        proto = _AckProtocol(self, slave)
        leftover = bytes(getattr(reader, "_buffer", b""))  # reports that came with the handshake's last read
        transport: Any = writer.transport
        transport.set_protocol(proto)
        if not transport.is_reading():  # the stream reader paused it on a full buffer: nobody else resumes it
            transport.resume_reading()
        slave.tasks = [asyncio.create_task(self._pump(slave))]
        if leftover:
            proto.data_received(leftover)
        if reader.at_eof():
            proto.connection_lost(None)
        if slave.replica_id in self.sync_state_set:
            self._recompute()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Slave | None:
        nonce = os.urandom(codec.NONCE_SIZE)
        writer.write(codec.encode_hello(nonce))
        fixed = await reader.readexactly(codec.HANDSHAKE_FIXED)
        rest = await reader.readexactly(codec.handshake_rest_size(fixed))
        version, hs = codec.decode_handshake(fixed + rest)
        status = codec.HandshakeStatus.OK
        if version != codec.VERSION:
            status = codec.HandshakeStatus.BAD_VERSION
        elif hs.broker_name != self.broker_name:
            status = codec.HandshakeStatus.WRONG_BROKER_NAME
        elif self.secret is not None and (not hs.mac or not codec.verify_mac(self.secret, nonce, hs)):
            status = codec.HandshakeStatus.AUTH_FAILED
        elif hs.replica_id <= 0 or hs.replica_id == self.replica_id:
            status = codec.HandshakeStatus.BAD_REPLICA_ID
        entries = self.epoch_file.entries()
        master_max = int(self.store.max_phy_offset)
        if status is not codec.HandshakeStatus.OK:
            self.rejected_handshakes += 1
            log.warning("HA handshake of replica %d refused: %s", hs.replica_id, status.name)
            writer.write(codec.encode_answer(status, self.epoch_file.last_epoch(), -1, master_max, entries))
            await writer.drain()
            writer.close()
            return None
        cut = find_common_point(hs.entries, entries, hs.max_phy_offset, master_max)
        writer.write(codec.encode_answer(status, self.epoch_file.last_epoch(), cut, master_max, entries))
        await writer.drain()
        first = codec.last_report(await reader.readexactly(codec.REPORT_SIZE))
        if first > cut or first > master_max:
            raise ProtocolError(f"replica {hs.replica_id} starts at {first}, beyond the common point {cut}")
        master_min = int(self.store.min_phy_offset)
        if first < master_min:
            if first != 0:
                raise ProtocolError(f"replica {hs.replica_id} needs {first}, below the master's min {master_min}")
            first = master_min  # an empty replica starts with the oldest bytes the master still has
        log.info("HA replica %d connected: common point %d, starts at %d (master max %d)", hs.replica_id, cut,
                 first, master_max)
        return _Slave(hs.replica_id, writer, first)

    def _drop(self, slave: _Slave, reason: str) -> None:
        if self._slaves.get(slave.replica_id) is slave:
            del self._slaves[slave.replica_id]
        log.info("HA replica %d disconnected: %s", slave.replica_id, reason)
        slave.writer.close()
        current = asyncio.current_task()
        for task in slave.tasks:
            if task is not current:
                task.cancel()

    def _next_chunk(self, phy_offset: int) -> tuple[int, int, bytes]:
        """(data epoch, its start, bytes from ``phy_offset`` up to the batch size, the segment end and the
        next epoch's start)."""
        entries = self.epoch_file.entries_view
        data_epoch, start, limit = 0, 0, -1
        for i, (e, s) in enumerate(entries):
            if s > phy_offset:
                break
            data_epoch, start = e, s
            limit = entries[i + 1][1] if i + 1 < len(entries) else -1
        want = self.transfer_batch_size if limit < 0 else min(self.transfer_batch_size, limit - phy_offset)
        if want <= 0 or data_epoch == 0:
            return data_epoch, start, b""
        return data_epoch, start, bytes(self.store.read_from(phy_offset, want))

    def _push_available(self, slave: _Slave) -> bool:
        """Write every available chunk to ``slave`` (no await); False when its write buffer is full first."""
        writer = slave.writer
        transport = writer.transport
        if transport.is_closing():
            return True
        master_epoch = self.epoch_file.last_epoch()
        max_phy = int(self.store.max_phy_offset)
        while True:
            if slave.next_phy_offset >= max_phy:
                return True  # everything written is on its way
            if transport.get_write_buffer_size() > WRITE_BUFFER_HIGH_BYTES:
                return False
            data_epoch, start, body = self._next_chunk(slave.next_phy_offset)
            if not body:
                return True
            writer.write(codec.encode_transfer_header(master_epoch, data_epoch, start, slave.next_phy_offset,
                                                      self.confirm_offset, len(body)) + body)
            slave.next_phy_offset += len(body)

    async def _pump(self, slave: _Slave) -> None:
        writer = slave.writer
        heartbeat_s = self.heartbeat_interval_ms / 1000
        try:
            while True:
                slave.wake.clear()
                if writer.transport.is_closing():
                    break
                if not self._push_available(slave):
                    await slave.writable.wait()
                    continue
                if not await wait_event(slave.wake, heartbeat_s):
                    writer.write(codec.encode_transfer_header(self.epoch_file.last_epoch(), 0, 0,
                                                              slave.next_phy_offset, self.confirm_offset, 0))
                    if not slave.writable.is_set():
                        await slave.writable.wait()
        except (OSError, ConnectionError) as exc:
            self._drop(slave, f"write failed: {exc}")
