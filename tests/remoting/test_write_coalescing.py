"""Frames produced together leave a connection in one write (one syscall): the answers to the requests of one
read, and frames sent outside a read once the connection has already written since its last read."""

from __future__ import annotations

import asyncio

from ferrymq.remoting.codec import FLAG_ONEWAY, FrameDecoder, RemotingCommand, encode
from ferrymq.remoting.connection import MAX_COLLECTED_BYTES, Connection, Dispatcher
from support.transports import StubTransport


class CountingTransport(StubTransport):
    """Counts write calls (``write`` or ``writelines``: each is one send on a real socket)."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.calls.append(bytes(data))

    def writelines(self, parts: list[bytes]) -> None:  # type: ignore[override]
        self.calls.append(b"".join(parts))

    def close(self) -> None:
        self.closed = True


def _frames(calls: list[bytes]) -> list[RemotingCommand]:
    dec = FrameDecoder()
    return [c for data in calls for c in dec.feed(data)]


def _conn(disp: Dispatcher | None = None) -> tuple[Connection, CountingTransport]:
    conn = Connection(disp)
    tr = CountingTransport()
    conn.connection_made(tr)  # type: ignore[arg-type]
    return conn, tr


async def test_answers_to_one_read_leave_in_one_write() -> None:
    disp = Dispatcher()
    disp.register(1, lambda conn, cmd: cmd.response(0, {"n": cmd.opaque}))
    conn, tr = _conn(disp)
    reqs = [RemotingCommand.request(1) for _ in range(5)]
    for i, r in enumerate(reqs):
        r.opaque = 100 + i
    reqs[2].flag |= FLAG_ONEWAY  # no answer, and no gap in the write
    conn.data_received(b"".join(encode(r) for r in reqs))
    assert len(tr.calls) == 1
    assert [c.opaque for c in _frames(tr.calls)] == [100, 101, 103, 104]
    # the next read's answers: one more write
    conn.data_received(encode(reqs[0]))
    assert len(tr.calls) == 2
    conn.close()


async def test_a_lone_answer_or_request_is_written_at_once() -> None:
    """Request/response (one frame per read): nothing is deferred, no callback scheduled."""
    conn, tr = _conn()
    for i in range(3):
        conn.request(RemotingCommand.request(7), 1000)
        assert len(tr.calls) == i + 1 and not conn._flush_scheduled
        answer = RemotingCommand(0, opaque=i + 1, flag=1)
        conn.data_received(encode(answer))
    conn.close()


async def test_frames_of_one_iteration_outside_a_read_leave_in_one_write_in_order() -> None:
    """Answers completing later (tasks) and a client's requests: the first goes out at once, the others of the
    same iteration are collected and written by one callback, in send order."""
    gate = asyncio.Event()

    async def later(cmd: RemotingCommand) -> RemotingCommand:
        await gate.wait()
        return cmd.response(0)

    disp = Dispatcher()
    disp.register(2, lambda conn, cmd: later(cmd))
    conn, tr = _conn(disp)
    reqs = [RemotingCommand.request(2) for _ in range(4)]
    for i, r in enumerate(reqs):
        r.opaque = 10 + i
    conn.data_received(b"".join(encode(r) for r in reqs))
    assert tr.calls == []  # nothing answered yet
    gate.set()
    for _ in range(5):
        await asyncio.sleep(0)
    # the four answers complete in one iteration: one at once, three collected into one write
    assert len(tr.calls) == 2, [len(c) for c in tr.calls]
    assert [c.opaque for c in _frames(tr.calls)] == [10, 11, 12, 13]
    # requests sent from coroutines in one iteration (a client with several sends in flight)
    before = len(tr.calls)
    futs = [conn.request(RemotingCommand.request(9), 1000) for _ in range(6)]
    assert len(tr.calls) == before  # already wrote since the last read: all six collected
    await asyncio.sleep(0)
    assert len(tr.calls) == before + 1
    assert [c.code for c in _frames(tr.calls[before:])] == [9] * 6
    for f in futs:
        f.cancel()
    conn.close()


async def test_a_read_writes_frames_collected_before_it_first() -> None:
    disp = Dispatcher()
    disp.register(1, lambda conn, cmd: cmd.response(0))
    conn, tr = _conn(disp)
    conn.send(RemotingCommand.request(5))
    conn.send(RemotingCommand.request(6))  # collected, a flush pending
    req = RemotingCommand.request(1)
    req.opaque = 77
    conn.data_received(encode(req))
    assert len(tr.calls) == 2  # the collected request and the answer in one write, in order
    assert [c.code for c in _frames(tr.calls[1:])] == [6, 0]
    await asyncio.sleep(0)  # the pending flush finds nothing left
    assert len(tr.calls) == 2
    conn.close()


async def test_close_writes_collected_frames_before_closing() -> None:
    conn, tr = _conn()
    conn.send(RemotingCommand.request(5))
    conn.send(RemotingCommand.request(6))
    conn.send(RemotingCommand.request(7))
    assert len(tr.calls) == 1
    conn.close()
    assert tr.closed
    assert [c.code for c in _frames(tr.calls)] == [5, 6, 7]
    await asyncio.sleep(0)
    assert len(tr.calls) == 2  # nothing written twice after close


async def test_big_answers_of_one_read_are_written_as_they_pass_the_collect_limit() -> None:
    big = b"x" * (MAX_COLLECTED_BYTES // 2 + 1)
    disp = Dispatcher()
    disp.register(1, lambda conn, cmd: cmd.response(0, body=big))
    conn, tr = _conn(disp)
    conn.data_received(b"".join(encode(RemotingCommand.request(1)) for _ in range(5)))
    assert 2 <= len(tr.calls) <= 3
    assert len(_frames(tr.calls)) == 5
    conn.close()
