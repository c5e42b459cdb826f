"""A remoting server: accepts connections and serves them with one dispatcher."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ferrymq.common.tls import Listener, TlsServerSettings
from ferrymq.remoting.codec import MAX_FRAME_BYTES
from ferrymq.remoting.connection import Connection, Dispatcher
from ferrymq.remoting.limits import ServerBudget, ServerLimits

log = logging.getLogger(__name__)

#: Connections idle in both directions for this long are closed (serverChannelMaxIdleTimeSeconds).
SERVER_CHANNEL_MAX_IDLE_S = 120
IDLE_SCAN_INTERVAL_S = 10
#: period of the scan for late frames and for answers buffered past the server's total (limits.py)
LIMITS_SCAN_INTERVAL_S = 1.0


class RemotingServer:
    def __init__(
        self,
        dispatcher: Dispatcher,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        on_connection_closed: Callable[[Connection], None] | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        idle_timeout_s: float = SERVER_CHANNEL_MAX_IDLE_S,
        limits: ServerLimits | None = None,
        tls: TlsServerSettings | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.host = host
        self.port = port
        self._on_closed = on_connection_closed
        self._max_frame_bytes = max_frame_bytes
        self._idle_timeout_s = idle_timeout_s
        self.budget = ServerBudget(limits or ServerLimits())
        #: the TLS mode (common/tls.py); its certificates are loaded here, so a bad file fails construction
        self.tls = tls or TlsServerSettings()
        self._server = Listener(self._factory, host, port, self.tls)
        self._idle_task: asyncio.Task[None] | None = None
        self.connections: set[Connection] = set()

    def _factory(self) -> Connection:
        conn = Connection(self.dispatcher, on_close=self._closed, max_frame_bytes=self._max_frame_bytes,
                          budget=self.budget)
        self.connections.add(conn)
        return conn

    def _closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if self._on_closed is not None:
            self._on_closed(conn)

    async def start(self) -> None:
        self._server.port = self.port
        await self._server.start()
        self.port = self._server.port
        self._idle_task = asyncio.ensure_future(self._idle_loop())

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    async def _idle_loop(self) -> None:
        ticks_per_idle_scan = max(1, round(IDLE_SCAN_INTERVAL_S / LIMITS_SCAN_INTERVAL_S))
        tick = 0
        while True:
            await asyncio.sleep(LIMITS_SCAN_INTERVAL_S)
            tick += 1
            now = time.monotonic()
            self.enforce_limits(now)
            if tick % ticks_per_idle_scan:
                continue
            for conn in list(self.connections):
                if now - conn.last_activity > self._idle_timeout_s:
                    log.info("closing idle connection %s", conn.peer_addr)
                    conn.close()

    def enforce_limits(self, now: float) -> None:
        """Close connections whose unfinished frame is overdue (a peer that went quiet mid-frame), and the
        largest answer backlogs while all peers that do not read hold more than the server's total."""
        limits = self.budget.limits
        backlogs: list[tuple[int, Connection]] = []
        total = 0
        for conn in list(self.connections):
            if conn.frame_overdue(now):
                log.warning("closing %s: a frame took longer than %d ms to arrive (frameDeadlineMs)",
                            conn.peer_addr, limits.frame_deadline_ms)
                conn.close()
                continue
            size = conn.write_buffer_size()
            if size > limits.write_high_water_bytes:
                backlogs.append((size, conn))
                total += size
        if total <= limits.max_write_buffer_bytes_total:
            return
        for size, conn in sorted(backlogs, key=lambda item: item[0], reverse=True):
            log.warning("closing %s: %d bytes of answers not taken; all such peers hold %d bytes (limit %d)",
                        conn.peer_addr, size, total, limits.max_write_buffer_bytes_total)
            conn.abort()
            total -= size
            if total <= limits.max_write_buffer_bytes_total:
                return

    async def stop(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
        self._server.close()
        for conn in list(self.connections):
            conn.close()
        await self._server.wait_closed()
