"""What one peer may cost a server (remoting/limits.py), over real loopback sockets: connection caps, the
frame deadline (slowloris), the budget of unfinished frames, and a client that never reads its answers."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator

import pytest

from ferrymq.remoting.codec import MAX_FRAME_BYTES, RemotingCommand, encode
from ferrymq.remoting.codes import ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher, connect
from ferrymq.remoting.limits import ServerLimits
from ferrymq.remoting.server import RemotingServer
from support.aio import wait_for

ECHO = 77
BIG_ANSWER = 300
ANSWER_BYTES = 256 * 1024


def dispatcher() -> Dispatcher:
    d = Dispatcher()
    d.register(ECHO, lambda conn, cmd: cmd.response(ResponseCode.SUCCESS, body=cmd.body))
    d.register(BIG_ANSWER, lambda conn, cmd: cmd.response(ResponseCode.SUCCESS, body=b"a" * ANSWER_BYTES))
    return d


@pytest.fixture
async def make_server() -> AsyncIterator[object]:
    servers: list[RemotingServer] = []

    async def make(**limits: int) -> RemotingServer:
        server = RemotingServer(dispatcher(), "127.0.0.1", 0, limits=ServerLimits(**limits))
        await server.start()
        servers.append(server)
        return server

    try:
        yield make
    finally:
        for server in servers:
            await server.stop()


async def round_trip(server: RemotingServer) -> None:
    conn = await connect(server.addr)
    try:
        resp = await conn.invoke(RemotingCommand.request(ECHO, {}, b"ping"), 3000)
        assert resp.code == ResponseCode.SUCCESS and resp.body == b"ping"
    finally:
        conn.close()


async def is_closed(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1 << 16), timeout_s) == b""
    except (OSError, TimeoutError):
        return True


async def test_connection_caps_per_address_and_total(make_server) -> None:
    server = await make_server(max_connections_per_address=5, max_connections=8)
    held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(5)]
    await wait_for(lambda: server.budget.connections == 5)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    assert await is_closed(reader), "the 6th connection from one address is refused"
    writer.close()
    for _r, w in held:
        w.close()
    await wait_for(lambda: server.budget.connections == 0 and not server.budget.per_address)
    await round_trip(server)


async def test_slowloris_connections_are_closed_at_the_frame_deadline(make_server) -> None:
    server = await make_server(frame_deadline_ms=1000)
    frame = encode(RemotingCommand.request(ECHO, {}, b"x" * 100))
    conns = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(30)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    closed: set[int] = set()
    # one byte per connection every 0.1 s: never idle, never a whole frame
    for i in range(len(frame) - 1):
        if loop.time() - start > 4:
            break
        for n, (_r, w) in enumerate(conns):
            if n not in closed and not w.is_closing():
                try:
                    w.write(frame[i:i + 1])
                except OSError:
                    closed.add(n)
        await asyncio.sleep(0.1)
    results = await asyncio.gather(*(is_closed(r, 3.0) for r, _w in conns))
    assert all(results), f"{results.count(False)} slow connections still open past the deadline"
    assert loop.time() - start < 8
    for _r, w in conns:
        w.close()
    await round_trip(server)


async def test_unfinished_frames_are_bounded_in_total(make_server) -> None:
    """20 connections each start a 15 MiB frame: the server holds at most its budget of unfinished bytes
    (the connections that push it over are closed), and still serves others."""
    limit = MAX_FRAME_BYTES + 1024 * 1024
    server = await make_server(max_partial_bytes_total=limit)
    length = 15 * 1024 * 1024
    chunk = struct.pack(">ii", length, 2) + b"{}" + b"z" * (1024 * 1024)
    peers = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(20)]
    peak = 0
    for _ in range(6):
        for _r, w in peers:
            if not w.is_closing():
                try:
                    w.write(chunk)
                except OSError:
                    pass
        await asyncio.sleep(0.05)
        peak = max(peak, server.budget.partial_bytes)
    await asyncio.sleep(0.3)
    peak = max(peak, server.budget.partial_bytes)
    assert peak <= limit + len(chunk) * 2, peak
    closed = await asyncio.gather(*(is_closed(r, 1.0) for r, _w in peers))
    assert sum(closed) >= 15
    for _r, w in peers:
        w.close()
    await round_trip(server)
    await wait_for(lambda: server.budget.partial_bytes == 0)


async def test_a_client_that_never_reads_is_paused_then_closed(make_server) -> None:
    """A client sends requests with big answers and never reads: the server stops reading from it at the
    high-water mark (its answers stop growing), and the answers already owed never pass the per-connection
    cap. Other clients are served meanwhile."""
    server = await make_server(write_high_water_bytes=1024 * 1024, max_write_buffer_bytes=8 * 1024 * 1024)
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.setblocking(False)
    request = encode(RemotingCommand.request(BIG_ANSWER, {}, b""))
    loop = asyncio.get_running_loop()
    sent = 0
    try:
        for _ in range(5000):
            try:
                sent += sock.send(request * 20)
            except BlockingIOError:
                await asyncio.sleep(0.01)
            if loop.time() > 0 and sent > 200 * len(request) * 20:
                break
        await asyncio.sleep(0.5)
        conns: list[Connection] = list(server.connections)
        assert conns, "the abuser is still connected (paused) or was closed"
        biggest = max(c.write_buffer_size() for c in conns)
        assert biggest <= 8 * 1024 * 1024 + ANSWER_BYTES * 2, biggest
        await round_trip(server)
    finally:
        sock.close()


async def test_a_steady_pipelined_stream_is_not_mistaken_for_a_slow_frame(make_server) -> None:
    """A client streaming frames back to back, every read ending inside the next frame, has an unfinished
    frame after each read for longer than the frame deadline in total: each frame is quick, so the
    connection stays open (the deadline runs per frame, not per stream of partial reads)."""
    server = await make_server(frame_deadline_ms=300)
    conn = await connect(server.addr)
    try:
        frame = encode(RemotingCommand.request(ECHO, {}, b"p" * 1000))
        transport = conn._transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.5
        half = len(frame) // 2
        # write so that every chunk the server reads ends in the middle of a frame
        transport.write(frame[:half])
        while loop.time() < end:
            transport.write(frame[half:] + frame[:half])
            await asyncio.sleep(0.02)
        transport.write(frame[half:])
        resp = await conn.invoke(RemotingCommand.request(ECHO, {}, b"still open"), 3000)
        assert resp.body == b"still open"
    finally:
        conn.close()
