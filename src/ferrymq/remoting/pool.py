"""Client-side connection pool: one connection per address, opened on demand, reconnect on next use."""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable

from ferrymq.errors import ConnectError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.connection import (
    CONNECT_TIMEOUT_MS,
    DEFAULT_TIMEOUT_MS,
    Connection,
    Dispatcher,
    connect,
)


class ConnectionPool:
    def __init__(
        self,
        dispatcher: Dispatcher | None = None,
        *,
        connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
        on_close: Callable[[str, Connection], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.dispatcher = dispatcher or Dispatcher()
        self.connect_timeout_ms = connect_timeout_ms
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._on_close = on_close
        #: TLS for every connection of the pool (None: the process default, common/tls.py)
        self.ssl_context = ssl_context
        self.closed = False

    def open_connection(self, addr: str) -> Connection | None:
        """The pooled connection to ``addr`` if it is open (no await, no connect)."""
        conn = self._conns.get(addr)
        return conn if conn is not None and not conn.closed else None

    async def get(self, addr: str) -> Connection:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self.closed:
            raise ConnectError("connection pool is closed")
        pending = self._connecting.get(addr)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[addr] = fut
        try:
            conn = await connect(addr, self.dispatcher, timeout_ms=self.connect_timeout_ms,
                                 on_close=functools.partial(self._closed, addr), ssl_context=self.ssl_context)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            self._connecting.pop(addr, None)
        self._conns[addr] = conn
        fut.set_result(conn)
        return conn

    def _closed(self, addr: str, conn: Connection) -> None:
        if self._conns.get(addr) is conn:
            del self._conns[addr]
        if self._on_close is not None:
            self._on_close(addr, conn)

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> RemotingCommand:
        conn = await self.get(addr)
        return await conn.invoke(cmd, timeout_ms)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        conn = await self.get(addr)
        conn.invoke_oneway(cmd)

    def connections(self) -> dict[str, Connection]:
        return dict(self._conns)

    async def close(self) -> None:
        self.closed = True
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
