"""Master side of classic HA on asyncio: accepts slaves, pushes commit log bytes, tracks acks.

* One ``_SlaveLink`` (an asyncio Protocol) per accepted connection drives a sans-IO
  ``MasterConnection``: reports are handled in ``data_received`` (an ack releases waiters in the
  callback that read it); ``notify_data_appended()`` pushes new bytes once per loop iteration (the
  sends of an iteration share one transfer), and from inside the put when the last iteration had a
  single put and the slave acked everything pushed (a lone SYNC_MASTER sender: no loop turn before
  the push); a pump task
  streams backlogs and sleeps until woken or until the connection's next timer (heartbeat /
  housekeeping) is due.
* ``push2slave_max_offset`` is the highest ack of any slave (never decreases), like RocketMQ.
* ``wait_for_slave_ack`` waiters live in a heap keyed by offset; every ack raising
  ``push2slave_max_offset`` resolves all waiters at or below it in one pass, so thousands of
  concurrent SYNC_MASTER sends are released together and no send waits behind another.
  Callback waiters (``on_slave_ack``, the SYNC_MASTER send path) share one deadline timer.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ferrymq.common.tls import SILENT_MEANS_PLAIN_MS, Listener, TlsServerSettings
from ferrymq.ha import auth
from ferrymq.ha.config import (
    DEFAULT_DIFF_LOG_INTERVAL_MS,
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_HOUSEKEEPING_INTERVAL_MS,
    DEFAULT_SLAVE_FALLBEHIND_MAX,
    DEFAULT_TRANSFER_BATCH_SIZE,
    HAConfig,
)
from ferrymq.ha.master_conn import AckReceived, CloseConnection, MasterConnection, SendBytes
from ferrymq.ha.store_view import StoreView

__all__ = ["HAService"]

log = logging.getLogger(__name__)

#: Transfers produced per pump step before checking the socket's write buffer.
PUMP_BATCHES_PER_STEP = 8
#: Pause pumping while the socket holds this many unsent bytes (wait for drain).
WRITE_BUFFER_HIGH_BYTES = 1024 * 1024
#: Upper bound on concurrently waiting ``wait_for_slave_ack`` calls (each holds a heap entry).
MAX_ACK_WAITERS = 1_000_000
#: The deadline sweep treats deadlines this close ahead as due (timer resolution, ms rounding).
SWEEP_EARLY_S = 0.001


#: HA connections a master accepts at once (a group has a few slaves; anything past this is not one of them)
MAX_SLAVE_CONNECTIONS = 16


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


class _AckCallback:
    """A heap waiter that calls ``fn(ok)`` instead of resolving a future (no task per SYNC_MASTER send).

    Quacks like the ``asyncio.Future[bool]`` entries of ``HAService._waiters``: ``done()``,
    ``set_result()``, ``cancel()``. Its deadline lives in ``HAService._deadlines`` (one shared
    sweep timer instead of a timer per send).
    """

    __slots__ = ("_done", "fn")

    def __init__(self, fn: Callable[[bool], None]) -> None:
        self.fn = fn
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, ok: bool) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.fn(ok)
        except Exception:  # pragma: no cover - the callback guards itself
            log.exception("HA ack callback failed")

    def cancel(self) -> bool:
        self._done = True
        return True


_Waiter = asyncio.Future[bool] | _AckCallback


class _SlaveLink(asyncio.Protocol):
    """One accepted slave connection: an asyncio Protocol driving a sans-IO ``MasterConnection``.

    Reports are handled right in ``data_received`` (no reader task, no stream buffer), so the ack
    that releases SYNC_MASTER waiters is processed in the loop callback that read it. New commit
    log bytes are pushed inline by ``wakeup`` while the pump task is parked; the pump streams
    backlogs (catch-up) with flow control and runs the heartbeat / housekeeping timer.
    """

    def __init__(self, service: HAService) -> None:
        self.service = service
        self.transport: asyncio.Transport | None = None
        self.addr = "?"
        self.connected_since_ms = int(time.time() * 1000)
        self.proto = MasterConnection(
            service._view,
            segment_size=service._view.segment_size,
            now_ms=service._clock_ms(),
            config=service._config,
        )
        self._dirty = True
        self._wake: asyncio.Future[None] | None = None
        #: the timer the parked pump waits for (ms, service clock)
        self._parked_due = 0
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self.closed = False
        self.tasks: list[asyncio.Task[None]] = []
        #: with haSecret: the proof received so far (None once proven, or without a secret)
        self._proof: bytearray | None = None
        self._nonce = b""
        self._auth_timer: asyncio.TimerHandle | None = None

    # ---- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.addr = _peer(transport)
        if not self.service.started:
            self.closed = True
            transport.close()
            return
        service = self.service
        if len(service._links) + len(service._unproven) >= service.max_slave_connections:
            log.warning("refusing HA connection from %s: %d slave connections open (the limit)",
                        self.addr, len(service._links) + len(service._unproven))
            self.closed = True
            transport.close()
            return
        # pause_writing() only when a catch-up backlog piles up, not at the 64 KiB default
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)  # type: ignore[attr-defined]
        if service.ha_secret:
            # ha/auth.py: nothing is sent and no report counts until the peer proves it knows the secret
            self._nonce, challenge = auth.new_challenge()
            self._proof = bytearray()
            service._unproven.add(self)
            transport.write(challenge)  # type: ignore[attr-defined]
            self._auth_timer = asyncio.get_running_loop().call_later(auth.AUTH_TIMEOUT_MS / 1000,
                                                                     self._auth_timeout)
            return
        self._begin()

    def _begin(self) -> None:
        self.proto.last_read_ms = self.service._clock_ms()
        self.service._add(self)
        self.tasks = [asyncio.get_running_loop().create_task(self._pump_loop(), name=f"ha-pump-{self.addr}")]

    def _auth_timeout(self) -> None:
        if self._proof is not None and not self.closed:
            log.warning("closing HA connection from %s: no authentication within %d ms", self.addr,
                        auth.AUTH_TIMEOUT_MS)
            self.close()

    def _check_proof(self, data: bytes) -> None:
        proof = self._proof
        assert proof is not None
        proof += data
        if len(proof) < auth.RESPONSE.size:
            return
        service = self.service
        service._unproven.discard(self)
        self._proof = None
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        if not auth.verify(bytes(proof[:auth.RESPONSE.size]), service.ha_secret, service.broker_name, self._nonce):
            log.warning("closing HA connection from %s: wrong HA authentication (haSecret or brokerName differ)",
                        self.addr)
            self.close()
            return
        log.info("HA connection from %s authenticated", self.addr)
        self._begin()
        rest = bytes(proof[auth.RESPONSE.size:])
        if rest:
            self._handle(self.proto.receive_data(rest, service._clock_ms()))

    def data_received(self, data: bytes) -> None:
        if self._proof is not None:
            self._check_proof(data)
            return
        self._handle(self.proto.receive_data(data, self.service._clock_ms()))

    def eof_received(self) -> bool:
        self._handle(self.proto.close("slave closed the connection"))
        self.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._handle(self.proto.close(f"read error: {exc!r}"))
        self.close()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        fut, self._drained = self._drained, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    # ---- data path -------------------------------------------------------------------------------
    def wakeup(self) -> None:
        self._dirty = True
        fut = self._wake
        if fut is not None and not fut.done():
            if self._push_inline():
                return  # everything new is on its way; the pump stays parked on its timer
            fut.set_result(None)

    def push_if_idle(self) -> None:
        """Push what is new now if the slave acked everything pushed so far (nothing in flight) and the pump
        is parked; otherwise leave it to the iteration's ``wakeup``. Called from inside a put."""
        proto = self.proto
        fut = self._wake
        if fut is None or fut.done() or not proto.ack_offset >= proto.next_transfer_offset >= 0:
            return
        try:
            self._push_inline()
        except (ConnectionError, OSError) as exc:  # as the pump does; the put that called us is not concerned
            self._handle(proto.close(f"write error: {exc!r}"))
            self.close()
        except Exception:
            log.exception("HA push to %s failed; the loop's wake-up tries again", self.addr)

    def _push_inline(self) -> bool:
        """Send what is new right here (the pump is parked): no task switch on the SYNC_MASTER path.
        False when the pump must run (more than one step of data, a full write buffer, closed)."""
        if self.closed or self._paused:
            return False
        due = self.proto.next_timer_ms()
        if due is None or due < self._parked_due:
            return False  # the pump's timer is stale (e.g. streaming just started): let it re-arm
        if 0 <= self.proto.next_transfer_offset >= self.service._view.max_phy_offset():
            self._dirty = False  # e.g. already pushed by ``push_if_idle``: nothing new since
            return True
        outs = self.proto.data_available(self.service._clock_ms(), PUMP_BATCHES_PER_STEP)
        self._handle(outs)
        if self.closed or len(outs) >= PUMP_BATCHES_PER_STEP:
            return False
        self._dirty = False
        return True

    def _handle(self, outputs: list[Any]) -> None:
        for out in outputs:
            if isinstance(out, SendBytes):
                if not self.closed and self.transport is not None:
                    self.transport.write(out.data)
            elif isinstance(out, AckReceived):
                if out.is_request:
                    log.info(
                        "HA slave %s requests from offset %d, master transfers from %d",
                        self.addr,
                        out.ack_phy_offset,
                        self.proto.next_transfer_offset,
                    )
                    self.wakeup()
                self.service._on_ack(out.ack_phy_offset)
            elif isinstance(out, CloseConnection):
                log.warning("HA closing slave %s: %s", self.addr, out.reason)
                self.close()

    async def _wait_drained(self) -> None:
        if self._paused and not self.closed:
            fut = self._drained
            if fut is None or fut.done():
                fut = self._drained = asyncio.get_running_loop().create_future()
            await fut

    async def _pump_loop(self) -> None:
        loop = asyncio.get_running_loop()
        clock = self.service._clock_ms
        try:
            while not self.closed:
                self._handle(self.proto.tick(clock()))
                if self._dirty and not self.closed:
                    self._dirty = False
                    outs = self.proto.data_available(clock(), PUMP_BATCHES_PER_STEP)
                    if outs:
                        self._handle(outs)
                        self._dirty = True  # maybe more behind this step
                        if self._paused:
                            await self._wait_drained()
                        else:
                            await asyncio.sleep(0)  # let acks and other links run
                        continue
                if self.closed:
                    break
                due = self.proto.next_timer_ms()
                if due is None:
                    break
                delay_s = max(0.0, (due - clock()) / 1000.0)
                fut: asyncio.Future[None] = loop.create_future()
                self._wake = fut
                self._parked_due = due
                timer = loop.call_later(delay_s, _resolve, fut)
                try:
                    await fut
                finally:
                    timer.cancel()
                    self._wake = None
        except (ConnectionError, OSError) as exc:
            self._handle(self.proto.close(f"write error: {exc!r}"))
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.proto.close("link closed")
        if self.transport is not None:
            try:
                self.transport.close()
            except Exception:  # pragma: no cover - transport already gone
                pass
        for fut in (self._drained, self._wake):
            if fut is not None and not fut.done():
                fut.set_result(None)
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self.service._unproven.discard(self)
        self.service._remove(self)


class HAService:
    """Master-side HA service. ``port`` is known after ``start()`` (pass 0 for an ephemeral port)."""

    def __init__(
        self,
        store: Any,
        *,
        listen_host: str = "0.0.0.0",
        listen_port: int = 10912,
        housekeeping_interval_ms: int = DEFAULT_HOUSEKEEPING_INTERVAL_MS,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        transfer_batch_size: int = DEFAULT_TRANSFER_BATCH_SIZE,
        slave_fallbehind_max: int = DEFAULT_SLAVE_FALLBEHIND_MAX,
        diff_log_interval_ms: int = DEFAULT_DIFF_LOG_INTERVAL_MS,
        segment_size: int | None = None,
        clock_ms: Callable[[], int] = _monotonic_ms,
        max_slave_connections: int = MAX_SLAVE_CONNECTIONS,
        ha_secret: str = "",
        broker_name: str = "",
        tls: TlsServerSettings | None = None,
    ) -> None:
        self._view = StoreView(store, segment_size)
        self.max_slave_connections = max_slave_connections
        #: haSecret: links must authenticate (ha/auth.py) before they get data or their reports count
        self.ha_secret = ha_secret
        self.broker_name = broker_name
        self._unproven: set[_SlaveLink] = set()
        self._config = HAConfig(
            heartbeat_interval_ms=heartbeat_interval_ms,
            housekeeping_interval_ms=housekeeping_interval_ms,
            transfer_batch_size=transfer_batch_size,
        )
        self.listen_host = listen_host
        self.port = listen_port
        self.slave_fallbehind_max = slave_fallbehind_max
        self.diff_log_interval_ms = diff_log_interval_ms
        self._clock_ms = clock_ms
        self._links: set[_SlaveLink] = set()
        self._server: Listener | None = None
        #: TLS of the HA port (tlsServerMode and tls.server.*, common/tls.py)
        self.tls = tls
        self._diff_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None
        self._push2slave_max_offset = 0
        self._waiters: list[tuple[int, int, _Waiter]] = []
        self._waiter_seq = itertools.count()
        self._stale_waiters = 0
        #: callback waiters by deadline (loop time): one sweep timer instead of a timer per send
        self._deadlines: list[tuple[float, int, _AckCallback]] = []
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        self._wake_scheduled = False
        #: puts of this loop iteration, and whether the last iteration with puts had one (a lone sender)
        self._iteration_puts = 0
        self._lone_puts = True
        self.started = False

    # ---- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        if self.started:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        # with haSecret the master speaks first (its challenge): in permissive mode a silent peer is plain
        self._server = Listener(lambda: _SlaveLink(self), self.listen_host, self.port, self.tls,
                                silent_means_plain_ms=SILENT_MEANS_PLAIN_MS if self.ha_secret else None)
        await self._server.start()
        self.port = self._server.port
        self._diff_task = asyncio.create_task(self._diff_log_loop(), name="ha-diff-log")
        self.started = True
        log.info("HA service listening on %s:%d", self.listen_host, self.port)

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        if self._server is not None:
            self._server.close()
        tasks: list[asyncio.Task[None]] = []
        for link in list(self._links):
            tasks.extend(link.tasks)
            link.close()
        if self._diff_task is not None:
            self._diff_task.cancel()
            tasks.append(self._diff_task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        for _offset, _seq, fut in self._waiters:
            if not fut.done():
                fut.set_result(False)
        self._waiters.clear()
        self._deadlines.clear()
        self._cancel_sweep()
        self._stale_waiters = 0

    def _add(self, link: _SlaveLink) -> None:
        self._links.add(link)
        log.info("HA slave connected from %s (%d slaves)", link.addr, len(self._links))

    def _remove(self, link: _SlaveLink) -> None:
        if link in self._links:
            self._links.discard(link)
            log.info("HA slave %s disconnected (%d slaves)", link.addr, len(self._links))

    # ---- data path -----------------------------------------------------------------------------
    def notify_data_appended(self) -> None:
        """New commit log bytes exist: every slave link pushes them at once. Thread-safe.

        On the loop thread the first call of a loop iteration schedules one ``_wake_links`` for the
        iteration; later calls of the iteration do nothing: ``_wake_links`` clears the flag before it
        pushes, so their bytes leave with it (one transfer for all the sends of an iteration, e.g. 16
        producers). When the last iteration with puts had a single one (a lone sender), the first call
        also pushes right here, from inside the put, to every link with nothing in flight (the slave
        acked every pushed byte): a lone SYNC_MASTER client's send reaches the slave before its handler
        even registers the ack wait."""
        if self._wake_scheduled:
            self._iteration_puts += 1
            return
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() == self._loop_thread_id:
            self._wake_scheduled = True
            self._iteration_puts = 1
            loop.call_soon(self._wake_links)
            if self._lone_puts:
                for link in tuple(self._links):  # a failing link leaves the set
                    link.push_if_idle()
        else:
            loop.call_soon_threadsafe(self._wake_links)

    def _wake_links(self) -> None:
        self._wake_scheduled = False
        if self._iteration_puts:
            self._lone_puts = self._iteration_puts == 1
            self._iteration_puts = 0
        for link in self._links:
            link.wakeup()

    # ---- acks and SYNC_MASTER waits ------------------------------------------------------------
    @property
    def push2slave_max_offset(self) -> int:
        return self._push2slave_max_offset

    @property
    def connection_count(self) -> int:
        return len(self._links)

    def is_slave_ok(self, end_phy_offset: int) -> bool:
        return bool(self._links) and end_phy_offset - self._push2slave_max_offset < self.slave_fallbehind_max

    def _on_ack(self, ack_phy_offset: int) -> None:
        if ack_phy_offset <= self._push2slave_max_offset:
            return
        self._push2slave_max_offset = ack_phy_offset
        waiters = self._waiters
        if not waiters or waiters[0][0] > ack_phy_offset:
            return
        heappop = heapq.heappop
        while waiters and waiters[0][0] <= ack_phy_offset:
            _offset, _seq, fut = heappop(waiters)
            if fut.done():
                self._stale_waiters = max(0, self._stale_waiters - 1)
            else:
                fut.set_result(True)
        # released callback waiters leave the deadline heap from the top (oldest first)
        deadlines = self._deadlines
        while deadlines and deadlines[0][2]._done:
            heappop(deadlines)

    async def wait_for_slave_ack(self, end_phy_offset: int, timeout_ms: int) -> bool:
        """True once some slave acked ``end_phy_offset`` (or beyond), False after ``timeout_ms``."""
        if self._push2slave_max_offset >= end_phy_offset:
            return True
        if timeout_ms <= 0 or not self.started:
            return False
        if len(self._waiters) >= MAX_ACK_WAITERS:
            self._compact_waiters()
            if len(self._waiters) >= MAX_ACK_WAITERS:
                log.warning("HA ack waiters at limit %d; failing a wait at once", MAX_ACK_WAITERS)
                return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        heapq.heappush(self._waiters, (end_phy_offset, next(self._waiter_seq), fut))
        timer = loop.call_later(timeout_ms / 1000.0, self._expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()
            if not fut.done():  # cancelled by our caller
                fut.cancel()
                self._note_stale()

    def on_slave_ack(self, end_phy_offset: int, timeout_ms: int, fn: Callable[[bool], None]) -> None:
        """Callback form of ``wait_for_slave_ack``: ``fn(True)`` once some slave acked
        ``end_phy_offset``, ``fn(False)`` after ``timeout_ms`` (or at stop). May call ``fn`` at once.
        Runs on the event loop thread; ``fn`` runs inline in the ack handling (keep it short)."""
        if self._push2slave_max_offset >= end_phy_offset:
            fn(True)
            return
        if timeout_ms <= 0 or not self.started:
            fn(False)
            return
        if len(self._waiters) >= MAX_ACK_WAITERS:
            self._compact_waiters()
            if len(self._waiters) >= MAX_ACK_WAITERS:
                log.warning("HA ack waiters at limit %d; failing a wait at once", MAX_ACK_WAITERS)
                fn(False)
                return
        waiter = _AckCallback(fn)
        seq = next(self._waiter_seq)
        heapq.heappush(self._waiters, (end_phy_offset, seq, waiter))
        loop = self._loop or asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000.0
        heapq.heappush(self._deadlines, (deadline, seq, waiter))
        if deadline < self._sweep_at:
            self._arm_sweep(loop, deadline)

    # ---- callback waiter deadlines: one timer for all --------------------------------------------
    def _arm_sweep(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._sweep_at = when
        self._sweep_handle = loop.call_at(when, self._sweep)

    def _cancel_sweep(self) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        self._sweep_at = math.inf

    def _sweep(self) -> None:
        """Answer every callback waiter whose deadline passed (FLUSH_SLAVE_TIMEOUT); re-arm for the next."""
        self._sweep_handle = None
        self._sweep_at = math.inf
        loop = self._loop or asyncio.get_running_loop()
        # timers may fire up to the loop's clock resolution early: treat that as due
        due = loop.time() + SWEEP_EARLY_S
        deadlines = self._deadlines
        while deadlines and (deadlines[0][0] <= due or deadlines[0][2]._done):
            _deadline, _seq, waiter = heapq.heappop(deadlines)
            if not waiter._done:
                waiter.set_result(False)
                self._note_stale()
        if deadlines:
            self._arm_sweep(loop, deadlines[0][0])

    def _expire(self, fut: _Waiter) -> None:
        if not fut.done():
            fut.set_result(False)
            self._note_stale()

    def _note_stale(self) -> None:
        self._stale_waiters += 1
        if self._stale_waiters > 1024 and self._stale_waiters * 2 > len(self._waiters):
            self._compact_waiters()

    def _compact_waiters(self) -> None:
        # in place: loops in _on_ack / _sweep hold these lists
        self._waiters[:] = [w for w in self._waiters if not w[2].done()]
        heapq.heapify(self._waiters)
        self._deadlines[:] = [d for d in self._deadlines if not d[2]._done]
        heapq.heapify(self._deadlines)
        self._stale_waiters = 0

    @property
    def pending_ack_waiters(self) -> int:
        return sum(1 for w in self._waiters if not w[2].done())

    # ---- status --------------------------------------------------------------------------------
    def slave_status(self) -> list[dict[str, Any]]:
        master_max = self._view.max_phy_offset()
        out: list[dict[str, Any]] = []
        for link in sorted(self._links, key=lambda lk: lk.addr):
            ack = link.proto.ack_offset
            out.append(
                {
                    "addr": link.addr,
                    "ackOffset": ack,
                    "lagBytes": master_max - max(ack, 0),
                    "connectedSinceMs": link.connected_since_ms,
                    "requestOffset": link.proto.request_offset,
                    "state": link.proto.state.value,
                }
            )
        return out

    async def _diff_log_loop(self) -> None:
        while True:
            await asyncio.sleep(self.diff_log_interval_ms / 1000.0)
            try:
                self.print_master_and_slave_diff()
            except Exception:  # pragma: no cover - logging only
                log.exception("HA diff log failed")

    def print_master_and_slave_diff(self) -> None:
        for status in self.slave_status():
            log.info(
                "HA slave %s ack offset %d, lag %d bytes",
                status["addr"],
                status["ackOffset"],
                status["lagBytes"],
            )
