"""The classic master's SYNC_MASTER push path, counted in loop iterations with a fake transport: a lone
send's bytes leave inside the put (``notify_data_appended``) when nothing is in flight, and the sends of
one iteration behind an unacked transfer still leave together in one transfer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ha_fakes import FakeCommitLog

from ferrymq.ha.codec import HEADER_SIZE, TransferDecoder, encode_report
from ferrymq.ha.service import HAService, _SlaveLink

SEG = 1 << 20


class FakeTransport:
    """Records what the link writes; the link never reads from it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def transfers(data: list[bytes]) -> list[tuple[int, bytes]]:
    dec = TransferDecoder(SEG)
    out: list[tuple[int, bytes]] = []
    for chunk in data:
        region = dec.get_buffer()
        region[: len(chunk)] = chunk
        out.extend((off, bytes(body)) for off, body in dec.take_frames(len(chunk)))
    return out


class Master:
    def __init__(self, service: HAService, log: FakeCommitLog, link: _SlaveLink, transport: FakeTransport) -> None:
        self.service = service
        self.log = log
        self.link = link
        self.transport = transport

    def put(self, data: bytes) -> None:
        """What ``MessageWriter`` does after a put: the bytes exist, then the HA service hears of them."""
        self.log.write(data)
        self.service.notify_data_appended()


async def _parked(link: _SlaveLink) -> None:
    for _ in range(100):
        if link._wake is not None:
            return
        await asyncio.sleep(0)
    raise AssertionError("the pump never parked")


@pytest.fixture
async def master() -> AsyncIterator[Master]:
    log = FakeCommitLog(SEG)
    service = HAService(log, listen_host="127.0.0.1", listen_port=0, segment_size=SEG)
    # what start() sets, without a listening socket: the link below is accepted by hand
    service._loop = asyncio.get_running_loop()
    service._loop_thread_id = threading.get_ident()
    service.started = True
    link = _SlaveLink(service)
    transport = FakeTransport()
    link.connection_made(transport)  # type: ignore[arg-type]
    link.data_received(encode_report(0))  # the slave's first report: empty, stream from 0
    await _parked(link)
    try:
        yield Master(service, log, link, transport)
    finally:
        link.close()
        await asyncio.gather(*link.tasks, return_exceptions=True)


async def test_a_lone_send_is_pushed_inside_its_put(master: Master) -> None:
    for i in range(3):
        body = bytes([65 + i]) * 100
        start = master.log.max_phy_offset()
        before = len(master.transport.writes)
        master.put(body)
        # written before the put returned: no loop iteration between the put and the transfer
        assert transfers(master.transport.writes[before:]) == [(start, body)]
        answered: list[bool] = []
        master.service.on_slave_ack(start + len(body), 1000, answered.append)
        master.link.data_received(encode_report(start + len(body)))  # the slave's ack
        assert answered == [True]
        await asyncio.sleep(0)  # the iteration's wake-up finds nothing new: no second transfer
        assert len(master.transport.writes) == before + 1


async def test_sends_behind_an_unacked_transfer_leave_together_next_iteration(master: Master) -> None:
    master.put(b"a" * 10)
    assert transfers(master.transport.writes) == [(0, b"a" * 10)]
    await asyncio.sleep(0)
    # the slave has not acked offset 10 yet: the next iteration's sends wait for its wake-up, and share it
    master.put(b"b" * 20)
    master.put(b"c" * 30)
    assert len(master.transport.writes) == 1
    await asyncio.sleep(0)
    assert transfers(master.transport.writes) == [(0, b"a" * 10), (10, b"b" * 20 + b"c" * 30)]
    assert master.transport.writes[1][:HEADER_SIZE]  # one write, header and body


async def test_sends_of_one_iteration_after_the_inline_push_share_one_transfer(master: Master) -> None:
    master.put(b"x" * 5)  # idle link: pushed inline
    master.put(b"y" * 6)  # same iteration: left to the iteration's wake-up
    master.put(b"z" * 7)
    assert transfers(master.transport.writes) == [(0, b"x" * 5)]
    await asyncio.sleep(0)
    assert transfers(master.transport.writes) == [(0, b"x" * 5), (5, b"y" * 6 + b"z" * 7)]


@pytest.mark.parametrize("error", [OSError("broken pipe"), RuntimeError("transport in a bad state")])
async def test_a_failing_push_inside_the_put_never_reaches_the_send(master: Master, error: Exception,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    def fail(data: bytes) -> None:
        raise error

    master.transport.write = fail  # type: ignore[method-assign]
    master.put(b"q" * 10)  # returns: the put's caller (the send handler) never sees the push fail
    if isinstance(error, OSError):
        assert master.link.closed and master.service.connection_count == 0  # closed, as the pump does
    else:
        assert not master.link.closed and "HA push" in caplog.text


async def test_after_an_iteration_of_several_puts_the_next_waits_for_the_iterations_push(master: Master) -> None:
    """Several producers (an iteration with more than one put): the next iteration's sends, even with nothing
    in flight, share its one push instead of the first leaving alone; a single-put iteration brings the
    inline push back."""
    master.put(b"x" * 5)
    master.put(b"y" * 6)
    await asyncio.sleep(0)
    master.link.data_received(encode_report(11))  # everything acked: nothing in flight
    master.put(b"z" * 7)
    assert len(master.transport.writes) == 2  # not pushed inside the put
    master.put(b"w" * 8)
    await asyncio.sleep(0)
    assert transfers(master.transport.writes[2:]) == [(11, b"z" * 7 + b"w" * 8)]
    master.link.data_received(encode_report(26))
    master.put(b"v" * 9)  # two puts last time: still at the iteration's end
    assert len(master.transport.writes) == 3
    await asyncio.sleep(0)
    assert transfers(master.transport.writes[3:]) == [(26, b"v" * 9)]
    master.link.data_received(encode_report(35))
    master.put(b"u" * 10)  # the last iteration had one put: inline again
    assert transfers(master.transport.writes[4:]) == [(35, b"u" * 10)]
