"""Local mode's way to its own broker: the proxy's remoting connection to the broker it runs in is an
in-memory pair of ``Connection``s instead of a TCP socket to itself.

Both ends are the ordinary ``Connection`` protocol (frames encoded and decoded as on a socket, the broker's
dispatcher serving one end exactly as it serves a TCP client: heartbeats, long polls, check-backs), joined by
``LoopbackTransport``s: bytes written on one end reach the other end's ``data_received`` on the next loop
iteration (never inside the writer's call), all the bytes of one iteration in one call. What goes away is
the socket: per request and per answer one ``send``, one ``recv`` and one wake-up of the event loop's poll
(benchmarks/RESULTS.md, "gRPC endpoint (issue 27)").

| end         | protocol                                           | ``peername`` / ``sockname``                  |
|-------------|----------------------------------------------------|----------------------------------------------|
| proxy side  | ``Connection`` of the proxy's ``ConnectionPool``   | the broker's address / (broker's host, ``LOOPBACK_PORT``) |
| broker side | ``Connection`` serving the broker's ``Dispatcher`` | (broker's host, ``LOOPBACK_PORT``) / the broker's address |

The broker sees its own host as the peer's address, as it would see a TCP connection the process opened to
itself (ACL white lists of addresses apply as they did then).

The broker-side connection carries no ``ServerBudget`` (the proxy is the broker's own process, not a remote
peer to bound) and is not one of the remoting server's accepted connections (no idle close); its close is
reported to the broker as a TCP connection's is (``LocalBroker.on_connection_closed``). Closing either end
closes both; the pool opens a new pair on the next request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ferrymq.errors import ConnectError
from ferrymq.remoting.connection import Connection, Dispatcher, split_addr
from ferrymq.remoting.pool import ConnectionPool

#: the port the broker sees the in-process proxy connect from (no socket: no port; shown where brokers list
#: client addresses)
LOOPBACK_PORT = 0


class LoopbackTransport(asyncio.Transport):
    """One end of an in-memory transport pair (the asyncio.Transport surface ``Connection`` uses)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, peername: tuple[str, int], sockname: tuple[str, int]) -> None:
        super().__init__({"peername": peername, "sockname": sockname})
        self._loop = loop
        self.protocol: Connection | None = None
        self.peer: LoopbackTransport | None = None
        #: bytes written this loop iteration, handed to the peer together
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._closing = False

    # ---- writing -----------------------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        if not self._pending:
            self._loop.call_soon(self._deliver)
        chunk = bytes(data)
        self._pending.append(chunk)
        self._pending_bytes += len(chunk)

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.write(part)

    def _deliver(self) -> None:
        pending, self._pending = self._pending, []
        self._pending_bytes = 0
        peer = self.peer
        if not pending or peer is None or peer._closing or peer.protocol is None:
            return
        peer.protocol.data_received(pending[0] if len(pending) == 1 else b"".join(pending))

    def get_write_buffer_size(self) -> int:
        return self._pending_bytes

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None  # nothing is buffered beyond one loop iteration

    # ---- reading: the peer's writes are never held back (no buffer to fill) --------------------------------
    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None

    # ---- the rest of the transport surface -------------------------------------------------------------------
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Close both ends: what was written before reaches the peer first, then both protocols are told."""
        if self._closing:
            return
        self._closing = True
        self._loop.call_soon(self._finish)

    def abort(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._pending = []
        self._pending_bytes = 0
        self._loop.call_soon(self._finish)

    def _finish(self) -> None:
        self._deliver()
        peer = self.peer
        if peer is not None and not peer._closing:
            peer._closing = True
            peer._pending = []
            peer._pending_bytes = 0
            if peer.protocol is not None:
                peer.protocol.connection_lost(None)
        if self.protocol is not None:
            self.protocol.connection_lost(None)


def connect_pair(client: Connection, server: Connection, broker_addr: str) -> None:
    """Join ``client`` (the proxy's end) and ``server`` (the broker's end) by a transport pair."""
    loop = asyncio.get_running_loop()
    host, port = split_addr(broker_addr)
    client_end = LoopbackTransport(loop, peername=(host, port), sockname=(host, LOOPBACK_PORT))
    server_end = LoopbackTransport(loop, peername=(host, LOOPBACK_PORT), sockname=(host, port))
    client_end.peer, server_end.peer = server_end, client_end
    client_end.protocol, server_end.protocol = client, server
    server.connection_made(server_end)
    client.connection_made(client_end)


@dataclass(frozen=True, slots=True)
class LocalBroker:
    """The broker this process runs, as local mode's endpoint reaches it."""

    #: the address its routes name (``brokerIP1:listenPort``)
    addr: str
    #: serves the broker's end of the pair, as it serves its TCP connections
    dispatcher: Dispatcher
    #: told when the broker's end closes, as the remoting server tells it of a closed TCP connection (the
    #: broker drops the connection's producer and consumer registrations)
    on_connection_closed: Callable[[Connection], None] | None = None


class LoopbackPool(ConnectionPool):
    """A ``ConnectionPool`` whose connection to ``broker.addr`` is a loopback pair to the broker this process
    runs; every other address is a TCP connection as usual."""

    def __init__(self, broker: LocalBroker, dispatcher: Dispatcher, *, connect_timeout_ms: int,
                 on_close: Callable[[str, Connection], None] | None = None, ssl_context: Any = None) -> None:
        super().__init__(dispatcher, connect_timeout_ms=connect_timeout_ms, on_close=on_close,
                         ssl_context=ssl_context)
        self.broker = broker
        self.broker_addr = broker.addr
        self._loopback: Connection | None = None

    @classmethod
    def replacing(cls, pool: ConnectionPool, broker: LocalBroker) -> LoopbackPool:
        """A loopback pool with the settings of ``pool`` (dispatcher, close callback, timeouts, TLS), to use
        instead of it before it opened any connection."""
        return cls(broker, pool.dispatcher, connect_timeout_ms=pool.connect_timeout_ms, on_close=pool._on_close,
                   ssl_context=pool.ssl_context)

    def open_connection(self, addr: str) -> Connection | None:
        if addr == self.broker_addr:
            conn = self._loopback
            return conn if conn is not None and not conn.closed else None
        return super().open_connection(addr)

    async def get(self, addr: str) -> Connection:
        if addr != self.broker_addr:
            return await super().get(addr)
        conn = self.open_connection(addr)
        if conn is not None:
            return conn
        if self.closed:
            raise ConnectError("connection pool is closed")
        client = Connection(self.dispatcher, on_close=lambda c: self._closed(addr, c))
        server = Connection(self.broker.dispatcher, on_close=self.broker.on_connection_closed)
        connect_pair(client, server, addr)
        self._loopback = client
        return client

    def _closed(self, addr: str, conn: Connection) -> None:
        if addr == self.broker_addr:
            if self._loopback is conn:
                self._loopback = None
            if self._on_close is not None:
                self._on_close(addr, conn)
            return
        super()._closed(addr, conn)

    def connections(self) -> dict[str, Connection]:
        out = super().connections()
        if self._loopback is not None and not self._loopback.closed:
            out[self.broker_addr] = self._loopback
        return out

    async def close(self) -> None:
        await super().close()
        if self._loopback is not None:
            self._loopback.close()
            self._loopback = None
