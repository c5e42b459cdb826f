"""HA service + client with two real MessageStores over real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ha_store_support import (
    SEGMENT,
    commit_log_bytes,
    open_store,
    put_n,
    read_queue_bodies,
)

from ferrymq.ha.client import HAClient
from ferrymq.ha.codec import encode_report
from ferrymq.ha.service import HAService
from ferrymq.store.config import BrokerRole
from ferrymq.store.message_store import MessageStore
from support.aio import wait_for

QUEUES = 4


class Pair:
    """A master store + HAService and a slave store + HAClient, stopped at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.master = open_store(tmp / "master", BrokerRole.SYNC_MASTER)
        self.service = HAService(
            self.master,
            listen_host="127.0.0.1",
            listen_port=0,
            heartbeat_interval_ms=200,
            housekeeping_interval_ms=2000,
        )
        self.slave: MessageStore | None = None
        self.client: HAClient | None = None
        self.appended_calls = 0

    async def start_master(self) -> None:
        await self.service.start()

    async def start_slave(self, **kw: object) -> HAClient:
        self.slave = open_store(self.tmp / "slave", BrokerRole.SLAVE)
        slave = self.slave

        def on_appended() -> None:
            self.appended_calls += 1
            slave.reput()

        params: dict[str, object] = dict(
            heartbeat_interval_ms=200,
            housekeeping_interval_ms=2000,
            reconnect_interval_ms=100,
            session_retry_delay_ms=50,
        )
        params.update(kw)
        self.client = HAClient(
            slave, master_ha_addr=f"127.0.0.1:{self.service.port}", on_appended=on_appended, **params
        )  # type: ignore[arg-type]
        await self.client.start()
        return self.client

    async def stop_slave(self) -> None:
        if self.client is not None:
            await self.client.stop()
            self.client = None
        if self.slave is not None and self.slave.running:
            self.slave.shutdown()

    def put(self, start: int, n: int) -> list[int]:
        ends = put_n(self.master, start, n, QUEUES)
        self.service.notify_data_appended()
        return ends

    async def caught_up(self, timeout_s: float = 20.0) -> None:
        assert self.slave is not None
        slave = self.slave
        await wait_for(
            lambda: (
                slave.max_phy_offset == self.master.max_phy_offset
                and self.service.push2slave_max_offset == self.master.max_phy_offset
            ),
            timeout_s,
            what="slave catch-up",
        )
        await wait_for(lambda: slave.reput_phy_offset == slave.max_phy_offset, timeout_s, what="slave reput")

    async def close(self) -> None:
        await self.stop_slave()
        await self.service.stop()
        if self.master.running:
            self.master.shutdown()


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    p = Pair(tmp_path)
    await p.start_master()
    try:
        yield p
    finally:
        await p.close()


def per_queue_counts(n_total: int) -> dict[int, int]:
    return {q: len(range(q, n_total, QUEUES)) for q in range(QUEUES)}


async def test_slave_catches_up_byte_identical_with_cqs(pair: Pair) -> None:
    pair.put(0, 200)  # before the slave exists (all in segment 0)
    await pair.start_slave()
    await pair.caught_up()
    total = 200
    # live traffic crossing several 1 MiB segments
    for _ in range(12):
        pair.put(total, 500)
        total += 500
        await asyncio.sleep(0)
    await pair.caught_up()
    assert pair.master.max_phy_offset > 2 * SEGMENT
    slave = pair.slave
    assert slave is not None
    assert slave.min_phy_offset == pair.master.min_phy_offset == 0
    end = pair.master.max_phy_offset
    assert commit_log_bytes(slave, 0, end) == commit_log_bytes(pair.master, 0, end)
    for q, count in per_queue_counts(total).items():
        assert slave.get_max_offset_in_queue("HaTopic", q) == count
        assert read_queue_bodies(slave, q, 0, count) == read_queue_bodies(pair.master, q, 0, count)
    assert pair.appended_calls > 0
    status = pair.service.slave_status()
    assert len(status) == 1
    assert status[0]["ackOffset"] == end and status[0]["lagBytes"] == 0
    assert status[0]["connectedSinceMs"] <= time.time() * 1000


async def test_fresh_slave_gets_only_the_masters_last_segment(pair: Pair) -> None:
    total = 0
    while pair.master.max_phy_offset < 2 * SEGMENT + 1000:
        pair.put(total, 500)
        total += 500
    seg_start = pair.master.max_phy_offset - pair.master.max_phy_offset % SEGMENT
    await pair.start_slave()
    await pair.caught_up()
    slave = pair.slave
    assert slave is not None
    assert slave.min_phy_offset == seg_start
    end = pair.master.max_phy_offset
    assert commit_log_bytes(slave, seg_start, end) == commit_log_bytes(pair.master, seg_start, end)
    # the messages of the last segment are readable by queue offset on the slave
    for q in range(QUEUES):
        hi = slave.get_max_offset_in_queue("HaTopic", q)
        lo = slave.get_min_offset_in_queue("HaTopic", q)
        assert hi == pair.master.get_max_offset_in_queue("HaTopic", q)
        assert hi > lo >= 0
        assert read_queue_bodies(slave, q, lo, hi) == read_queue_bodies(pair.master, q, lo, hi)


async def test_slave_restart_resumes_without_gap_or_duplicate(pair: Pair) -> None:
    await pair.start_slave()
    pair.put(0, 1000)
    await pair.caught_up()
    await pair.stop_slave()
    await wait_for(lambda: pair.service.connection_count == 0, 5, what="master notices the slave left")
    pair.put(1000, 3000)  # crosses into the next segment while the slave is down
    await pair.start_slave()
    await pair.caught_up()
    pair.put(4000, 500)
    await pair.caught_up()
    slave = pair.slave
    assert slave is not None
    end = pair.master.max_phy_offset
    assert commit_log_bytes(slave, 0, end) == commit_log_bytes(pair.master, 0, end)
    for q, count in per_queue_counts(4500).items():
        assert slave.get_min_offset_in_queue("HaTopic", q) == 0
        assert slave.get_max_offset_in_queue("HaTopic", q) == count
        assert read_queue_bodies(slave, q, 0, count) == read_queue_bodies(pair.master, q, 0, count)


async def test_many_concurrent_waiters_released_by_acks(pair: Pair) -> None:
    await pair.start_slave()
    await pair.caught_up()
    ends = put_n(pair.master, 0, 3000, QUEUES)  # not yet notified: nothing flows
    waiters = [asyncio.create_task(pair.service.wait_for_slave_ack(e, 10_000)) for e in ends]
    await asyncio.sleep(0)
    assert pair.service.pending_ack_waiters == len(ends)
    t0 = time.monotonic()
    pair.service.notify_data_appended()
    results = await asyncio.gather(*waiters)
    assert all(results)
    assert time.monotonic() - t0 < 5
    assert pair.service.pending_ack_waiters == 0
    assert pair.service.is_slave_ok(ends[-1])


async def test_no_slave_means_not_ok_and_waits_fail(pair: Pair) -> None:
    ends = pair.put(0, 10)
    assert pair.service.connection_count == 0
    assert not pair.service.is_slave_ok(ends[-1])
    assert await pair.service.wait_for_slave_ack(ends[-1], 100) is False


async def test_stopped_slave_waiters_time_out(pair: Pair) -> None:
    await pair.start_slave()
    ends = pair.put(0, 10)
    await pair.caught_up()
    assert pair.service.is_slave_ok(ends[-1])
    assert await pair.service.wait_for_slave_ack(ends[-1], 100) is True
    await pair.stop_slave()
    more = pair.put(10, 10)
    waits = [asyncio.create_task(pair.service.wait_for_slave_ack(e, 300)) for e in more]
    assert await asyncio.gather(*waits) == [False] * len(more)
    await wait_for(lambda: pair.service.connection_count == 0, 5, what="master drops the slave")
    assert not pair.service.is_slave_ok(more[-1])


async def test_callback_waiters_released_by_acks_and_answered_inline_when_known(pair: Pair) -> None:
    await pair.start_slave()
    await pair.caught_up()
    ends = put_n(pair.master, 0, 500, QUEUES)  # not yet notified: nothing flows
    got: list[tuple[int, bool]] = []
    for e in ends:
        pair.service.on_slave_ack(e, 10_000, lambda ok, e=e: got.append((e, ok)))
    assert got == [] and pair.service.pending_ack_waiters == len(ends)
    pair.service.notify_data_appended()
    await wait_for(lambda: len(got) == len(ends), 5, what="acks")
    assert got == [(e, True) for e in ends]  # in offset order, all released
    assert pair.service.pending_ack_waiters == 0
    assert pair.service._deadlines == []  # released waiters leave the deadline heap too
    # already acked -> answered inline; no time to wait -> refused inline
    inline: list[bool] = []
    pair.service.on_slave_ack(ends[-1], 10_000, inline.append)
    pair.service.on_slave_ack(ends[-1] + 1, 0, inline.append)
    assert inline == [True, False]


async def test_callback_waiters_time_out_by_their_own_deadline(pair: Pair) -> None:
    await pair.start_slave()
    await pair.caught_up()
    await pair.stop_slave()
    ends = put_n(pair.master, 0, 6, QUEUES)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    fired: dict[int, float] = {}
    # later deadlines registered first: the single sweep timer must follow the earliest deadline
    for i, e in enumerate(ends):
        timeout_ms = 600 if i < 3 else 200

        def on_ack(ok: bool, i: int = i) -> None:
            assert ok is False
            fired[i] = loop.time() - t0

        pair.service.on_slave_ack(e, timeout_ms, on_ack)
    await wait_for(lambda: len(fired) == len(ends), 5, what="timeouts")
    short = [fired[i] for i in range(3, 6)]
    long = [fired[i] for i in range(3)]
    assert all(t >= 0.19 for t in short), short  # never before their own deadline
    assert all(t >= 0.59 for t in long), long
    assert min(long) - max(short) >= 0.2, (short, long)  # the 200 ms ones did not wait for the 600 ms timer
    assert pair.service._deadlines == [] and pair.service._sweep_handle is None
    # a waiter pending at stop() is answered False
    stopped: list[bool] = []
    pair.service.on_slave_ack(ends[-1], 10_000, stopped.append)
    await pair.service.stop()
    assert stopped == [False]


async def test_fallbehind_limit(tmp_path: Path) -> None:
    master = open_store(tmp_path / "m", BrokerRole.SYNC_MASTER)
    service = HAService(master, listen_host="127.0.0.1", listen_port=0, slave_fallbehind_max=1000)
    await service.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
        await wait_for(lambda: service.connection_count == 1, 5, what="accept")
        assert service.is_slave_ok(999)
        assert not service.is_slave_ok(1000)
        writer.close()
    finally:
        await service.stop()
        master.shutdown()


async def test_master_drops_a_silent_connection(tmp_path: Path) -> None:
    master = open_store(tmp_path / "m", BrokerRole.ASYNC_MASTER)
    service = HAService(
        master,
        listen_host="127.0.0.1",
        listen_port=0,
        heartbeat_interval_ms=100,
        housekeeping_interval_ms=300,
    )
    await service.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
        await wait_for(lambda: service.connection_count == 1, 5, what="accept")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by housekeeping
        assert service.connection_count == 0
        writer.close()
    finally:
        await service.stop()
        master.shutdown()


async def test_idle_link_heartbeats_and_stays_up(pair: Pair) -> None:
    client = await pair.start_slave()
    pair.put(0, 5)
    await pair.caught_up()
    proto = client._proto
    assert proto is not None
    # 200 ms heartbeats, 2 s housekeeping: wait for 12 heartbeats (> housekeeping span)
    await wait_for(lambda: proto.heartbeats_received >= 12, 15, what="heartbeats")
    assert client.connected and client.sessions == 1
    assert pair.service.connection_count == 1


async def test_master_refuses_a_slave_ahead_of_it(pair: Pair) -> None:
    pair.put(0, 10)
    reader, writer = await asyncio.open_connection("127.0.0.1", pair.service.port)
    writer.write(encode_report(pair.master.max_phy_offset + 1))
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await wait_for(lambda: pair.service.connection_count == 0, 5, what="drop")


async def test_update_master_address_switches_and_none_disconnects(pair: Pair) -> None:
    client = await pair.start_slave()
    await wait_for(lambda: pair.service.connection_count == 1, 5, what="connect")
    client.update_master_address(None)
    await wait_for(lambda: pair.service.connection_count == 0 and not client.connected, 5, what="disconnect")
    client.update_master_address(f"127.0.0.1:{pair.service.port}")
    pair.put(0, 50)
    await pair.caught_up()
    assert client.sessions == 2


HA_CLIENT_LOGGER = "ferrymq.ha.client"
FEW_FAILED_CONNECTS = 3


def _failed_connects(caplog: pytest.LogCaptureFixture) -> int:
    """Connect attempts the HAClient logged as failed."""
    return sum(r.name == HA_CLIENT_LOGGER and r.getMessage().startswith("HA connect to master")
               and "failed" in r.getMessage() for r in caplog.records)


async def test_slave_waits_for_a_master_that_starts_later(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=HA_CLIENT_LOGGER)
    master = open_store(tmp_path / "m", BrokerRole.ASYNC_MASTER)
    slave = open_store(tmp_path / "s", BrokerRole.SLAVE)
    probe = HAService(master, listen_host="127.0.0.1", listen_port=0)
    await probe.start()
    port = probe.port
    await probe.stop()  # the port is free again: nobody listens yet
    client = HAClient(
        slave, master_ha_addr=f"127.0.0.1:{port}", reconnect_interval_ms=50, on_appended=slave.reput
    )
    await client.start()
    service = HAService(master, listen_host="127.0.0.1", listen_port=port)
    try:
        await wait_for(lambda: _failed_connects(caplog) >= FEW_FAILED_CONNECTS, 10, what="a few failed attempts")
        assert not client.connected
        put_n(master, 0, 100)
        await service.start()
        service.notify_data_appended()
        await wait_for(lambda: slave.max_phy_offset == master.max_phy_offset, 10, what="catch-up")
    finally:
        await client.stop()
        await service.stop()
        slave.shutdown()
        master.shutdown()


async def test_master_caps_its_ha_connections(tmp_path: Path) -> None:
    """Connections past the cap are closed at once; the ones inside it are kept (a hostile peer cannot open
    thousands of links, each with its own pump task)."""
    master = open_store(tmp_path / "m", BrokerRole.SYNC_MASTER)
    service = HAService(master, listen_host="127.0.0.1", listen_port=0, max_slave_connections=4)
    await service.start()
    peers = []
    try:
        for _ in range(10):
            peers.append(await asyncio.open_connection("127.0.0.1", service.port))
        await wait_for(lambda: service.connection_count == 4, 5, what="four links accepted")
        closed = 0
        for reader, _writer in peers[4:]:
            try:
                closed += await asyncio.wait_for(reader.read(1), 5) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == 6 and service.connection_count == 4
    finally:
        for _r, w in peers:
            w.close()
        await service.stop()
        master.shutdown()
