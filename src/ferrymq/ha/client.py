"""Slave side of classic HA on asyncio (RocketMQ HAClient behaviour).

Connects to the master's HA address, reports its commit log max offset, appends every pushed
byte range with ``store.append_at`` at exactly the pushed offset, reports the new max at once and
calls ``on_appended()`` so the broker reputs (builds consume queues). All protocol decisions are
made by the sans-IO ``SlaveConnection``; this module only moves bytes and time.

The connection is an ``asyncio.BufferedProtocol`` (``_MasterLink``): the socket reads straight into
the session's receive buffer, pushed bytes are appended from there (one copy, socket -> buffer,
before the store's ``pwrite``) and the new offset is written back inside ``buffer_updated`` — the
SYNC_MASTER round trip has no reader task, stream buffer or loop turn on the slave, and
``on_appended`` (the reput) runs after the report is on its way. While catching up, a read that
ends inside the next transfer defers its report (``SlaveConnection``: at most every 1 MiB / 10 ms);
a read that ends on a transfer boundary always reports at once. An awaitable returned by
``on_appended`` runs as a task (reading does not wait for it).

Connection policy: with no connection it tries every ``reconnect_interval_ms`` (5 s); after a
session ends (master gone, offset mismatch, housekeeping) it waits ``session_retry_delay_ms``
before the next attempt, so a persistent mismatch cannot spin. ``update_master_address`` with a
different address (or None) closes the current session; None stops connecting.

First report: sent at once on connect (``report_on_connect=True``), unlike RocketMQ which waits
``haSendHeartbeatInterval``; see docs/decisions/0002-ha-first-report.md.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from ferrymq.common import aio, tls
from ferrymq.common.aio import wait_event
from ferrymq.ha import auth
from ferrymq.ha.config import (
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_HOUSEKEEPING_INTERVAL_MS,
    DEFAULT_RECONNECT_INTERVAL_MS,
    HAConfig,
)
from ferrymq.ha.slave_conn import Appended, CloseConnection, SendBytes, SlaveConnection, SlaveState
from ferrymq.ha.store_view import StoreView

__all__ = ["HAClient", "parse_addr"]

log = logging.getLogger(__name__)

#: Pause after a session ends before reconnecting (bounds reconnect loops on persistent errors).
DEFAULT_SESSION_RETRY_DELAY_MS = 1000
DEFAULT_CONNECT_TIMEOUT_MS = 3000


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def parse_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad HA address {addr!r}, expected host:port")
    return host.strip("[]"), int(port)


class HAClient:
    def __init__(
        self,
        store: Any,
        *,
        master_ha_addr: str | None = None,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        housekeeping_interval_ms: int = DEFAULT_HOUSEKEEPING_INTERVAL_MS,
        on_appended: Callable[[], Any] | None = None,
        reconnect_interval_ms: int = DEFAULT_RECONNECT_INTERVAL_MS,
        session_retry_delay_ms: int = DEFAULT_SESSION_RETRY_DELAY_MS,
        connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
        report_on_connect: bool = True,
        clock_ms: Callable[[], int] = _monotonic_ms,
        ha_secret: str = "",
        broker_name: str = "",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._view = StoreView(store, segment_size=0)  # the slave never needs the segment size
        #: haSecret: prove group membership to the master before replicating (ha/auth.py)
        self.ha_secret = ha_secret
        self.broker_name = broker_name
        #: TLS to the master's HA port (tlsEnable and tls.client.*, common/tls.py)
        self.ssl_context = ssl_context
        self._config = HAConfig(
            heartbeat_interval_ms=heartbeat_interval_ms,
            housekeeping_interval_ms=housekeeping_interval_ms,
        )
        if master_ha_addr is not None:
            parse_addr(master_ha_addr)
        self._master_addr = master_ha_addr
        self._on_appended = on_appended
        self.reconnect_interval_ms = reconnect_interval_ms
        self.session_retry_delay_ms = session_retry_delay_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.report_on_connect = report_on_connect
        self._clock_ms = clock_ms
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._transport: asyncio.BaseTransport | None = None
        self._appended_tasks: set[asyncio.Future[Any]] = set()
        self._proto: SlaveConnection | None = None
        self._stopping = False
        self.sessions = 0
        self.connected_addr: str | None = None
        self.last_close_reason: str | None = None

    # ---- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is not None:
            return
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="ha-client")

    async def stop(self) -> None:
        self._stopping = True
        self._changed.set()
        self._close_writer()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._appended_tasks:
            await asyncio.gather(*self._appended_tasks, return_exceptions=True)

    @property
    def master_address(self) -> str | None:
        return self._master_addr

    @property
    def connected(self) -> bool:
        return self._proto is not None and self.connected_addr is not None

    @property
    def last_reported_offset(self) -> int:
        return self._proto.last_reported_offset if self._proto is not None else -1

    def update_master_address(self, addr: str | None) -> None:
        if addr == self._master_addr:
            return
        if addr is not None:
            parse_addr(addr)
        log.info("HA master address %s -> %s", self._master_addr, addr)
        self._master_addr = addr
        self._changed.set()
        self._close_writer()

    def status(self) -> dict[str, Any]:
        return {
            "masterAddr": self._master_addr,
            "connected": self.connected,
            "lastReportedOffset": self.last_reported_offset,
            "maxPhyOffset": self._view.max_phy_offset(),
            "sessions": self.sessions,
            "lastCloseReason": self.last_close_reason,
        }

    # ---- loop ----------------------------------------------------------------------------------
    async def _sleep_or_change(self, delay_ms: int) -> None:
        """Sleep ``delay_ms`` or until the master address changes (or stop)."""
        await wait_event(self._changed, delay_ms / 1000.0)

    async def _run(self) -> None:
        while not self._stopping:
            self._changed.clear()
            addr = self._master_addr
            if addr is None:
                await self._sleep_or_change(self.reconnect_interval_ms)
                continue
            host, port = parse_addr(addr)
            try:
                transport, link = await aio.wait_for(self._connect(host, port), self.connect_timeout_ms / 1000.0)
            except (OSError, TimeoutError, auth.HAAuthError) as exc:
                if isinstance(exc, auth.HAAuthError):
                    log.error("HA authentication with master %s failed: %s", addr, exc)
                else:
                    log.debug("HA connect to master %s failed: %r", addr, exc)
                await self._sleep_or_change(self.reconnect_interval_ms)
                continue
            if self._stopping or addr != self._master_addr:
                transport.close()
                continue
            try:
                await self._session(addr, transport, link)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("HA session with master %s failed", addr)
            if not self._stopping:
                await self._sleep_or_change(self.session_retry_delay_ms)

    async def _connect(self, host: str, port: int) -> tuple[asyncio.BaseTransport, _MasterLink]:
        """Connect to the master; with ``ha_secret``, answer its challenge (ha/auth.py) on the raw socket
        first, then hand the socket to the protocol."""
        loop = asyncio.get_running_loop()
        ctx = self.ssl_context
        if ctx is not None:
            return await self._connect_tls(host, port, ctx)
        if not self.ha_secret:
            return await loop.create_connection(lambda: _MasterLink(self), host, port)
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, stype, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, stype, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, sockaddr)
            challenge = b""
            while len(challenge) < auth.CHALLENGE.size:
                chunk = await loop.sock_recv(sock, auth.CHALLENGE.size - len(challenge))
                if not chunk:
                    raise auth.HAAuthError("the master closed the connection before its challenge")
                challenge += chunk
            await loop.sock_sendall(sock, auth.response_to(challenge, self.ha_secret, self.broker_name))
            return await loop.create_connection(lambda: _MasterLink(self), sock=sock)
        except BaseException:
            sock.close()
            raise

    async def _connect_tls(self, host: str, port: int,
                           ctx: ssl.SSLContext) -> tuple[asyncio.BaseTransport, _MasterLink]:
        """TLS to the master; with ``ha_secret`` the challenge is answered over TLS by a first protocol, and the
        transport is then handed to the link (the master sends nothing more until the first report)."""
        loop = asyncio.get_running_loop()
        hostname = tls.server_hostname(ctx, host)
        if not self.ha_secret:
            return await loop.create_connection(lambda: _MasterLink(self), host, port, ssl=ctx,
                                                server_hostname=hostname)
        transport, first = await loop.create_connection(lambda: _ChallengeReader(auth.CHALLENGE.size), host, port,
                                                        ssl=ctx, server_hostname=hostname)
        try:
            challenge = await first.done
            transport.write(auth.response_to(challenge, self.ha_secret, self.broker_name))
            link = _MasterLink(self)
            transport.set_protocol(link)
            return transport, link
        except BaseException:
            transport.abort()
            raise

    async def _session(self, addr: str, transport: asyncio.BaseTransport, link: _MasterLink) -> None:
        self.sessions += 1
        proto = SlaveConnection(
            self._view, now_ms=self._clock_ms(), config=self._config, report_on_connect=self.report_on_connect
        )
        self._proto = proto
        self._transport = transport
        self.connected_addr = addr
        log.info("HA connected to master %s, local max offset %d", addr, self._view.max_phy_offset())
        ticker = asyncio.create_task(self._tick_loop(proto), name="ha-client-tick")
        try:
            # bytes that arrived before the session was set up are fed now, in order
            link.attach(proto)
            await link.lost
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
            link.detach()
            self.last_close_reason = proto.close_reason
            refused = (proto.close_reason or "").startswith("the master refused")
            log.log(logging.ERROR if refused else logging.INFO, "HA session with master %s ended: %s", addr,
                    proto.close_reason)
            proto.close("session ended")
            self._close_writer()
            self._proto = None
            self.connected_addr = None

    async def _tick_loop(self, proto: SlaveConnection) -> None:
        while True:
            due = proto.next_timer_ms()
            if due is None:
                return
            await asyncio.sleep(max(0.0, (due - self._clock_ms()) / 1000.0))
            self._perform(proto.tick(self._clock_ms()))

    def _perform(self, outputs: list[Any]) -> None:
        for out in outputs:
            if isinstance(out, SendBytes):
                transport = self._transport
                if transport is not None and not transport.is_closing():
                    transport.write(out.data)  # type: ignore[attr-defined]
            elif isinstance(out, Appended):
                if self._on_appended is not None:
                    try:
                        result = self._on_appended()
                        if result is not None and inspect.isawaitable(result):
                            task = asyncio.ensure_future(result)
                            self._appended_tasks.add(task)
                            task.add_done_callback(self._appended_done)
                    except Exception:
                        log.exception("HA on_appended callback failed")
            elif isinstance(out, CloseConnection):
                log.warning("HA closing connection to master: %s", out.reason)
                self._close_writer()

    def _appended_done(self, task: asyncio.Future[Any]) -> None:
        self._appended_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("HA on_appended callback failed", exc_info=task.exception())

    def _close_writer(self) -> None:
        transport = self._transport
        if transport is not None:
            self._transport = None
            try:
                transport.close()
            except Exception:  # pragma: no cover
                pass


class _ChallengeReader(asyncio.Protocol):
    """Collects the master's haSecret challenge on a TLS connection (``done`` resolves to its bytes)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.data = b""
        self.done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data
        if len(self.data) > self.size and not self.done.done():
            self.done.set_exception(auth.HAAuthError("the master sent more than its challenge"))
        elif len(self.data) == self.size and not self.done.done():
            self.done.set_result(self.data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(auth.HAAuthError("the master closed the connection before its challenge"))


class _MasterLink(asyncio.BufferedProtocol):
    """The slave's TCP connection to the master: the socket reads straight into the session's
    ``SlaveConnection`` receive buffer (``get_buffer`` / ``buffer_updated``, so a transfer body is
    copied once, socket -> buffer, before the store writes it out) and its outputs are performed
    inline (report first, then ``on_appended``)."""

    def __init__(self, client: HAClient) -> None:
        self._client = client
        self._proto: SlaveConnection | None = None
        self._early: list[bytes] = []
        self._early_buf: bytearray | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def attach(self, proto: SlaveConnection) -> None:
        self._proto = proto
        client = self._client
        client._perform(proto.connection_made(client._clock_ms()))
        early, self._early = self._early, []
        for data in early:
            client._perform(proto.receive_data(data, client._clock_ms()))

    def detach(self) -> None:
        self._proto = None

    def get_buffer(self, sizehint: int) -> memoryview:
        proto = self._proto
        if proto is None:
            # bytes before the session is set up (rare: the master waits for the first report)
            self._early_buf = self._early_buf or bytearray(64 * 1024)
            return memoryview(self._early_buf)
        self._early_buf = None
        return proto.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        early_buf = self._early_buf
        if early_buf is not None:
            if not self.lost.done():
                self._early.append(bytes(early_buf[:nbytes]))
            return
        proto = self._proto
        if proto is None:  # detached between get_buffer and buffer_updated: drop
            return
        client = self._client
        client._perform(proto.buffer_updated(nbytes, client._clock_ms()))

    def eof_received(self) -> bool:
        self._closed("master closed the connection")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed(f"read error: {exc!r}" if exc is not None else "master closed the connection")

    def _closed(self, reason: str) -> None:
        proto = self._proto
        if proto is not None and proto.state is not SlaveState.CLOSED:
            self._client._perform(proto.close(reason))
        if not self.lost.done():
            self.lost.set_result(None)
