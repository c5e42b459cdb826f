"""SlaveSynchronize against a stand-in master remoting server, with the broker's real managers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ferrymq.broker.offset_manager import ConsumerOffsetManager
from ferrymq.broker.slave_sync import SlaveSynchronize
from ferrymq.broker.subscription_manager import SubscriptionGroupManager
from ferrymq.broker.topic_manager import TopicManager
from ferrymq.remoting import jsonx
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Dispatcher
from ferrymq.remoting.pool import ConnectionPool
from ferrymq.remoting.server import RemotingServer
from support.aio import wait_for


def clock() -> int:
    return 1_700_000_000_000


def managers(root: Path) -> SimpleNamespace:
    root.mkdir(parents=True, exist_ok=True)
    d = str(root)
    schedule_file = root / "delayOffset.json"

    class Schedule:
        offsets: dict[int, int] = {}

        def write_raw(self, data: bytes) -> None:
            schedule_file.write_bytes(data)
            self.offsets = {int(k): int(v) for k, v in jsonx.loads(data)["offsetTable"].items()}

    return SimpleNamespace(
        topics=TopicManager(d, cluster_name="C", broker_name="b", clock_ms=clock),
        offsets=ConsumerOffsetManager(d),
        groups=SubscriptionGroupManager(d, auto_create=True, clock_ms=clock),
        schedule=Schedule(),
        schedule_file=schedule_file,
    )


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[tuple[str, SimpleNamespace]]:
    m = managers(tmp_path / "master")
    from ferrymq.common.topic import TopicConfig

    m.topics.update(TopicConfig("OrderTopic", 8, 8))
    m.offsets.commit("g1", "OrderTopic", 3, 42)
    delay = {"offsetTable": {"1": 7, "3": 9}}
    d = Dispatcher()

    def answer(body: Any) -> Any:
        return lambda conn, cmd: cmd.response(ResponseCode.SUCCESS, body=jsonx.dumps(body()))

    d.register(RequestCode.GET_ALL_TOPIC_CONFIG, answer(m.topics.encode))
    d.register(RequestCode.GET_ALL_CONSUMER_OFFSET, answer(m.offsets.encode))
    d.register(RequestCode.GET_ALL_DELAY_OFFSET, answer(lambda: delay))
    d.register(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, answer(m.groups.encode))
    server = RemotingServer(d, "127.0.0.1", 0)
    await server.start()
    try:
        yield f"127.0.0.1:{server.port}", m
    finally:
        await server.stop()


async def test_sync_all_copies_master_metadata(master: tuple[str, SimpleNamespace], tmp_path: Path) -> None:
    addr, m = master
    s = managers(tmp_path / "slave")
    s.offsets.commit("g1", "OrderTopic", 3, 1)  # the master wins
    s.offsets.commit("g2", "Other", 0, 5)  # kept (putAll semantics)
    pool = ConnectionPool()
    ctrl = SimpleNamespace(pool=pool, broker_addr="127.0.0.1:1", config=None, **vars(s))
    sync = SlaveSynchronize(ctrl)
    try:
        assert await sync.sync_all() is False  # no master known
        sync.master_addr = addr
        assert await sync.sync_all() is True
        assert s.topics.get("OrderTopic") is not None
        assert s.topics.data_version.to_json() == m.topics.data_version.to_json()
        assert s.offsets.query("g1", "OrderTopic", 3) == 42
        assert s.offsets.query("g2", "Other", 0) == 5
        assert json.loads(s.schedule_file.read_bytes()) == {"offsetTable": {"1": 7, "3": 9}}
        assert s.groups.data_version.to_json() == m.groups.data_version.to_json()
        # persisted
        assert (tmp_path / "slave" / "topics.json").exists()
        assert (tmp_path / "slave" / "consumerOffset.json").exists()
        # a master address equal to our own is ignored
        sync.master_addr = "127.0.0.1:1"
        assert await sync.sync_all() is False
    finally:
        await sync.stop()
        await pool.close()


async def test_periodic_sync_and_unreachable_master(
    master: tuple[str, SimpleNamespace], tmp_path: Path
) -> None:
    addr, m = master
    s = managers(tmp_path / "slave")
    ctrl = SimpleNamespace(pool=ConnectionPool(), broker_addr="127.0.0.1:1", config=None, **vars(s))
    sync = SlaveSynchronize(ctrl, interval_ms=100)
    await sync.start()
    try:
        sync.master_addr = "127.0.0.1:1"  # own address: nothing happens
        sync.master_addr = addr
        await wait_for(lambda: sync.sync_count >= 2, 10, what="two sync rounds")
        from ferrymq.common.topic import TopicConfig

        m.topics.update(TopicConfig("Later", 4, 4))
        await wait_for(lambda: s.topics.get("Later") is not None, 10, what="new topic on slave")
        sync.master_addr = "127.0.0.1:9"  # nothing listens: steps fail, loop survives
        await wait_for(lambda: sync.last_error is not None, 10, what="failure noted")
    finally:
        await sync.stop()
        await ctrl.pool.close()


@pytest.mark.parametrize("yields", [0, 1, 2, 3])
async def test_stop_returns_when_a_master_change_races_it(yields: int) -> None:
    """A broker becoming master stops its slave sync right after the master address changed (which wakes the
    sync loop). On Python 3.11 the loop's asyncio.wait_for swallowed that cancel and stop() never returned:
    a controller-mode master then held its role lock forever, sent no heartbeat and lost its lease."""
    sync = SlaveSynchronize(SimpleNamespace(broker_addr="127.0.0.1:2", pool=None, config=None))
    sync.first_delay_ms = 60_000
    await sync.start()
    await asyncio.sleep(0)  # the loop now waits for a wake-up
    sync.master_addr = "127.0.0.1:1"  # sets the wake-up event
    for _ in range(yields):
        await asyncio.sleep(0)
    await asyncio.wait_for(sync.stop(), 5)
    assert sync._task is None
