"""Connections over real loopback sockets: concurrency, failure of pending calls, unknown codes."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import pytest

from ferrymq.errors import ConnectionClosedError, RemotingTimeoutError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher, connect
from ferrymq.remoting.pool import ConnectionPool
from ferrymq.remoting.server import RemotingServer
from support.aio import wait_for
from support.transports import StubTransport


class Loopback:
    """Servers on 127.0.0.1 (port 0) and client connections to them, all closed at teardown."""

    def __init__(self) -> None:
        self.servers: list[RemotingServer] = []
        self.conns: list[Connection] = []

    async def serve(self, dispatcher: Dispatcher) -> RemotingServer:
        server = RemotingServer(dispatcher, "127.0.0.1", 0)
        self.servers.append(server)
        await server.start()
        return server

    async def connect(self, server: RemotingServer, dispatcher: Dispatcher | None = None) -> Connection:
        conn = await connect(server.addr, dispatcher)
        self.conns.append(conn)
        return conn

    async def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for server in self.servers:
            await server.stop()


@pytest.fixture
async def loopback() -> AsyncIterator[Loopback]:
    lb = Loopback()
    try:
        yield lb
    finally:
        await lb.close()


def hanging(dispatcher: Dispatcher, code: int) -> list[RemotingCommand]:
    """Register a handler for ``code`` that never answers; returns the requests it got."""
    arrived: list[RemotingCommand] = []
    never = asyncio.Event()

    async def hang(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        arrived.append(cmd)
        await never.wait()
        return cmd.response(0)

    dispatcher.register(code, hang)
    return arrived


async def test_requests_on_one_connection_are_served_concurrently(loopback: Loopback) -> None:
    release = asyncio.Event()
    d = Dispatcher()

    async def slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return cmd.response(0, {"who": "slow"})

    def fast(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(0, {"who": "fast"})

    d.register(1, slow)
    d.register(2, fast)
    conn = await loopback.connect(await loopback.serve(d))
    slow_call = asyncio.ensure_future(conn.invoke(RemotingCommand.request(1), 5000))
    fast_resp = await conn.invoke(RemotingCommand.request(2), 5000)
    assert fast_resp.ext_fields["who"] == "fast"
    assert not slow_call.done()
    release.set()
    assert (await slow_call).ext_fields["who"] == "slow"


async def test_unknown_code_and_handler_fault(loopback: Loopback) -> None:
    d = Dispatcher()

    def boom(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("kaput")

    d.register(5, boom)
    conn = await loopback.connect(await loopback.serve(d))
    r = await conn.invoke(RemotingCommand.request(999), 3000)
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert r.remark == " request type 999 not supported"
    r = await conn.invoke(RemotingCommand.request(5), 3000)
    assert r.code == ResponseCode.SYSTEM_ERROR and "kaput" in (r.remark or "")


async def test_closing_connection_fails_pending_calls_with_cause(loopback: Loopback) -> None:
    d = Dispatcher()
    arrived = hanging(d, 1)
    server = await loopback.serve(d)
    conn = await loopback.connect(server)
    calls = [asyncio.ensure_future(conn.invoke(RemotingCommand.request(1), 10000)) for _ in range(5)]
    await wait_for(lambda: len(arrived) == len(calls), what="every request to reach the handler")
    for c in list(server.connections):
        c.close()
    for call in calls:
        with pytest.raises(ConnectionClosedError):
            await call


async def test_timeout_and_garbage_closes_only_that_connection(loopback: Loopback) -> None:
    d = Dispatcher()
    hanging(d, 1)
    d.register(2, lambda conn, cmd: cmd.response(0))
    server = await loopback.serve(d)
    good = await loopback.connect(server)
    with pytest.raises(RemotingTimeoutError):
        await good.invoke(RemotingCommand.request(1), 50)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(struct.pack(">i", 2**31 - 1) + b"garbage")
        await writer.drain()
        assert await reader.read() == b""  # server closed the bad connection
    finally:
        writer.close()
    assert (await good.invoke(RemotingCommand.request(2), 3000)).code == 0


async def test_pool_reuses_and_reconnects(loopback: Loopback) -> None:
    d = Dispatcher()
    d.register(2, lambda conn, cmd: cmd.response(0))
    server = await loopback.serve(d)
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


async def test_server_can_call_client_on_same_connection(loopback: Loopback) -> None:
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
    conn = await loopback.connect(await loopback.serve(server_d), client_d)
    r = await conn.invoke(RemotingCommand.request(1), 3000)
    assert r.ext_fields["client_said"] == "hi" and got.done()


async def test_request_deadlines_share_one_timer(loopback: Loopback) -> None:
    """Requests with different timeouts on one connection each fail at their own deadline (a shorter one
    sent after a longer one re-arms the timer); answered and cancelled requests leave nothing pending."""
    d = Dispatcher()
    hanging(d, 1)
    d.register(2, lambda conn, cmd: cmd.response(0))
    conn = await loopback.connect(await loopback.serve(d))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    slow = asyncio.ensure_future(conn.invoke(RemotingCommand.request(1), 400))
    fast = conn.request(RemotingCommand.request(1), 60)
    answered = conn.request(RemotingCommand.request(2), 100)
    cancelled = asyncio.ensure_future(conn.invoke(RemotingCommand.request(1), 200))
    assert (await answered).code == 0
    with pytest.raises(RemotingTimeoutError, match="to code 1 within 60 ms"):
        await fast
    t_fast = loop.time() - t0
    assert not slow.done()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    with pytest.raises(RemotingTimeoutError, match="within 400 ms"):
        await slow
    t_slow = loop.time() - t0
    assert 0.05 <= t_fast < 0.35 and 0.39 <= t_slow < 1.5, (t_fast, t_slow)
    assert conn._pending == {}
    # an abandoned (cancelled) request future is dropped when its deadline passes
    abandoned = conn.request(RemotingCommand.request(1), 30)
    abandoned.cancel()
    await wait_for(lambda: not conn._pending, what="the abandoned request to be dropped")
    assert (await conn.invoke(RemotingCommand.request(2), 3000)).code == 0
    assert conn._pending == {}


async def test_request_on_closed_connection_leaves_nothing_pending(loopback: Loopback) -> None:
    d = Dispatcher()
    d.register(2, lambda conn, cmd: cmd.response(0))
    conn = await loopback.connect(await loopback.serve(d))
    conn.close()
    with pytest.raises(ConnectionClosedError):
        conn.request(RemotingCommand.request(2), 1000)
    assert conn._pending == {} and conn._timer is None


async def test_request_write_failures_leave_nothing_pending() -> None:
    """``request`` writes inline (no ``send()`` call): a connection without a transport raises what ``send``
    raises, a failing ``write`` propagates; neither leaves a pending entry. ``timeout_ms=None`` (what
    ``invoke_future`` uses) registers no deadline."""

    class Failing(StubTransport):
        def write(self, data: bytes) -> None:
            raise RuntimeError("write failed")

    fresh = Connection()
    fresh._loop = asyncio.get_running_loop()
    with pytest.raises(ConnectionClosedError, match="is closed"):
        fresh.request(RemotingCommand.request(2), 1000)
    assert fresh._pending == {}
    conn = Connection()
    conn.connection_made(Failing())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="write failed"):
        conn.request(RemotingCommand.request(2), 1000)
    with pytest.raises(RuntimeError, match="write failed"):
        conn.invoke_future(RemotingCommand.request(2))
    assert conn._pending == {}
    written: list[bytes] = []
    conn._transport = type("T", (), {"write": lambda self, data: written.append(data)})()  # type: ignore[assignment]
    fut = conn.invoke_future(RemotingCommand.request(2))
    (entry,) = conn._pending.values()
    assert entry[1] is None and entry[2] == 2 and len(written) == 1
    fut.cancel()
    conn._transport = None
    conn._teardown(ConnectionClosedError("done"))
    fresh._teardown(ConnectionClosedError("done"))
