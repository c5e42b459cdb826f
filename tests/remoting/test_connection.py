"""Connections over real loopback sockets: concurrency, failure of pending calls, unknown codes."""

from __future__ import annotations

import asyncio
import struct

import pytest

from ferrymq.errors import ConnectionClosedError, RemotingTimeoutError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher, connect
from ferrymq.remoting.pool import ConnectionPool
from ferrymq.remoting.server import RemotingServer


async def _server(dispatcher: Dispatcher) -> RemotingServer:
    server = RemotingServer(dispatcher, "127.0.0.1", 0)
    await server.start()
    return server


async def test_requests_on_one_connection_are_served_concurrently() -> None:
    release = asyncio.Event()
    d = Dispatcher()

    async def slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return cmd.response(0, {"who": "slow"})

    def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(0, {"who": "fast"})

    d.register(1, slow)
    d.register(2, fast)
    server = await _server(d)
    try:
        conn = await connect(server.addr)
        slow_call = asyncio.ensure_future(conn.invoke(RemotingCommand.request(1), 5000))
        fast_resp = await conn.invoke(RemotingCommand.request(2), 5000)
        assert fast_resp.ext_fields["who"] == "fast"
        assert not slow_call.done()
        release.set()
        assert (await slow_call).ext_fields["who"] == "slow"
        conn.close()
    finally:
        await server.stop()


async def test_unknown_code_and_handler_fault() -> None:
    d = Dispatcher()

    def boom(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("kaput")

    d.register(5, boom)
    server = await _server(d)
    try:
        conn = await connect(server.addr)
        r = await conn.invoke(RemotingCommand.request(999), 3000)
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert r.remark == " request type 999 not supported"
        r = await conn.invoke(RemotingCommand.request(5), 3000)
        assert r.code == ResponseCode.SYSTEM_ERROR and "kaput" in (r.remark or "")
        conn.close()
    finally:
        await server.stop()


async def test_closing_connection_fails_pending_calls_with_cause() -> None:
    d = Dispatcher()
    never = asyncio.Event()

    async def hang(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await never.wait()
        return cmd.response(0)

    d.register(1, hang)
    server = await _server(d)
    try:
        conn = await connect(server.addr)
        calls = [asyncio.ensure_future(conn.invoke(RemotingCommand.request(1), 10000)) for _ in range(5)]
        await asyncio.sleep(0)
        for c in list(server.connections):
            c.close()
        for call in calls:
            with pytest.raises(ConnectionClosedError):
                await call
    finally:
        await server.stop()


async def test_timeout_and_garbage_closes_only_that_connection() -> None:
    d = Dispatcher()
    never = asyncio.Event()

    async def hang(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await never.wait()
        return cmd.response(0)

    d.register(1, hang)
    d.register(2, lambda conn, cmd: cmd.response(0))
    server = await _server(d)
    try:
        good = await connect(server.addr)
        with pytest.raises(RemotingTimeoutError):
            await good.invoke(RemotingCommand.request(1), 50)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(struct.pack(">i", 2**31 - 1) + b"garbage")
        await writer.drain()
        assert await reader.read() == b""  # server closed the bad connection
        writer.close()
        assert (await good.invoke(RemotingCommand.request(2), 3000)).code == 0
        good.close()
    finally:
        await server.stop()


async def test_pool_reuses_and_reconnects() -> None:
    d = Dispatcher()
    d.register(2, lambda conn, cmd: cmd.response(0))
    server = await _server(d)
    pool = ConnectionPool()
    try:
        c1 = await pool.get(server.addr)
        assert await pool.get(server.addr) is c1
        c1.close()
        c2 = await pool.get(server.addr)
        assert c2 is not c1
        assert (await pool.invoke(server.addr, RemotingCommand.request(2))).code == 0
    finally:
        await pool.close()
        await server.stop()


async def test_server_can_call_client_on_same_connection() -> None:
    """Brokers send requests (e.g. NOTIFY_CONSUMER_IDS_CHANGED) back over the client's connection."""
    got = asyncio.get_running_loop().create_future()
    server_d = Dispatcher()

    async def hello(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        answer = await conn.invoke(RemotingCommand.request(307), 3000)
        return cmd.response(0, {"client_said": answer.ext_fields["x"]})

    server_d.register(1, hello)
    client_d = Dispatcher()

    def on_307(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        got.set_result(True)
        return cmd.response(0, {"x": "hi"})

    client_d.register(307, on_307)
    server = await _server(server_d)
    try:
        conn = await connect(server.addr, client_d)
        r = await conn.invoke(RemotingCommand.request(1), 3000)
        assert r.ext_fields["client_said"] == "hi" and got.done()
        conn.close()
    finally:
        await server.stop()
