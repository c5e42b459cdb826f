"""Whole-table work at estate size runs in bounded steps between yields to the event loop (issue 24): the
slave-sync answers (GET_ALL_SUBSCRIPTIONGROUP_CONFIG, GET_ALL_CONSUMER_OFFSET, GET_BROKER_CONSUME_STATS), a
slave's take-over of the master's tables, the offsets snapshot a reset waits for; GET_ALL_TOPIC_CONFIG is
joined from kept fragments; request-reply finds the requester without scanning every group.

"In steps" is checked structurally: a ticker coroutine that only yields (``asyncio.sleep(0)``) counts how often
it ran while the operation was awaited. Code that does the whole table in one block lets it run at most once.
The bodies are checked against the tables' one-block encoding, so the steps change nothing on the wire."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from ferrymq.broker.config_file import JOURNAL_SUFFIX, SNAPSHOT_STEP_ENTRIES
from ferrymq.broker.consumer_manager import ConsumerData, ConsumerManager
from ferrymq.broker.offset_manager import ConsumerOffsetManager
from ferrymq.broker.producer_manager import ProducerManager
from ferrymq.broker.subscription_manager import SubscriptionGroupConfig, SubscriptionGroupManager
from ferrymq.broker.topic_manager import TopicManager
from ferrymq.common.topic import TopicConfig
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

T = TypeVar("T")

#: the estate of issue 24
ESTATE_TOPICS = 10_000
ESTATE_GROUPS = 5_000
ESTATE_OFFSETS = 100_000
QUEUES_PER_TOPIC = 8


async def ticks_while(work: Awaitable[T]) -> tuple[T, int]:
    """(the result of ``work``, how often a yielding ticker ran while it was awaited)."""
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            await asyncio.sleep(0)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)  # the ticker is running
    ticks = 0
    try:
        result = await work
    finally:
        done = True
        await task
    return result, ticks


def _min_steps(entries: int) -> int:
    """Yields an operation over ``entries`` entries makes at the least (with room to spare)."""
    return entries // SNAPSHOT_STEP_ENTRIES // 2


def _topics(path: str) -> TopicManager:
    return TopicManager(path, cluster_name="C", broker_name="B", clock_ms=lambda: 7)


def _estate_groups(path: str) -> SubscriptionGroupManager:
    groups = SubscriptionGroupManager(path, auto_create=True, clock_ms=lambda: 7)
    for i in range(ESTATE_GROUPS):
        groups.table[f"G{i}"] = SubscriptionGroupConfig(f"G{i}", retry_max_times=i % 17)
    groups._changed("G0")
    return groups


def _estate_offsets(path: str) -> ConsumerOffsetManager:
    offsets = ConsumerOffsetManager(path)
    for i in range(ESTATE_OFFSETS):
        pair = i // QUEUES_PER_TOPIC
        offsets.commit(f"G{pair % ESTATE_GROUPS}", f"T{pair % ESTATE_TOPICS}", i % QUEUES_PER_TOPIC, i)
    return offsets


def _master_topic_table(counter: int) -> dict[str, Any]:
    return {"dataVersion": {"counter": counter, "timestamp": 99},
            "topicConfigTable": {f"T{i}": TopicConfig(f"T{i}", QUEUES_PER_TOPIC, QUEUES_PER_TOPIC).to_json()
                                 for i in range(ESTATE_TOPICS)}}


async def test_slave_takes_the_master_topic_table_in_steps_and_persists_it(tmp_path) -> None:
    """10,000 topics from the master: built in steps, swapped in at once, then the snapshot holds the master's
    table and the slave's own journal lines from before are gone (a reload gives exactly the master's table)."""
    slave = _topics(str(tmp_path))
    slave.load()
    slave.update(TopicConfig("LocalOnly", 1, 1))  # journaled before the sync; not on the master
    master = _master_topic_table(counter=3)
    _, ticks = await ticks_while(slave.replace_all(master))
    assert ticks >= _min_steps(ESTATE_TOPICS)
    assert slave.get("T9999") is not None and slave.get("LocalOnly") is None
    assert slave.data_version.to_json() == master["dataVersion"]
    assert json.loads(slave.wrapper_json()) == master | {
        "topicConfigTable": {k: {**v, "topicName": k} for k, v in master["topicConfigTable"].items()}}
    assert not (tmp_path / ("topics.json" + JOURNAL_SUFFIX)).exists()
    again = _topics(str(tmp_path))
    again.load()
    assert set(master["topicConfigTable"]) <= set(again.table) and "LocalOnly" not in again.table
    assert again.data_version.to_json() == master["dataVersion"]


async def test_slave_takes_the_master_group_table_in_steps(tmp_path) -> None:
    master = _estate_groups(str(tmp_path / "master"))
    obj = master.encode()
    slave = SubscriptionGroupManager(str(tmp_path / "slave"), auto_create=False, clock_ms=lambda: 7)
    _, ticks = await ticks_while(slave.replace_all(obj))
    assert ticks >= _min_steps(ESTATE_GROUPS)
    assert slave.encode() == obj
    again = SubscriptionGroupManager(str(tmp_path / "slave"), auto_create=False, clock_ms=lambda: 7)
    again.load()
    assert again.encode() == obj


async def test_slave_merges_the_master_offsets_in_steps(tmp_path) -> None:
    master = _estate_offsets(str(tmp_path / "master"))
    slave = ConsumerOffsetManager(str(tmp_path / "slave"))
    slave.local_commits = {}
    push, ticks = await ticks_while(slave.merge_from_master(jsonx.loads(jsonx.dumps(master.encode()))))
    assert push == {}
    assert ticks >= _min_steps(len(master.table))
    assert slave.table == master.table
    assert slave.groups_of_topic("T7") == master.groups_of_topic("T7")


async def test_group_and_offset_answers_are_encoded_in_steps(tmp_path) -> None:
    groups = _estate_groups(str(tmp_path))
    body, ticks = await ticks_while(groups.table_json())
    assert ticks >= _min_steps(ESTATE_GROUPS)
    assert jsonx.loads(body) == jsonx.loads(jsonx.dumps(groups.encode()))
    offsets = _estate_offsets(str(tmp_path))
    body, ticks = await ticks_while(offsets.table_json())
    assert ticks >= _min_steps(len(offsets.table))
    assert jsonx.loads(body) == jsonx.loads(jsonx.dumps(offsets.encode()))


async def test_broker_answers_whole_table_requests_without_one_block(broker) -> None:
    """Through the broker's handlers: 21 is the one-block encoding's content (joined from fragments, no step
    needed), 201 / 43 / 317 yield to the loop while they encode an estate-size table."""
    for i in range(ESTATE_TOPICS):
        broker.topics.update(TopicConfig(f"T{i}", QUEUES_PER_TOPIC, QUEUES_PER_TOPIC))
    for i in range(ESTATE_GROUPS):
        broker.groups.update(SubscriptionGroupConfig(f"G{i}"))
    for i in range(ESTATE_OFFSETS):
        pair = i // QUEUES_PER_TOPIC
        broker.offsets.commit(f"G{pair % ESTATE_GROUPS}", f"T{pair % ESTATE_TOPICS}", i % QUEUES_PER_TOPIC, i)

    def call(code: int) -> Any:
        handler = broker.dispatcher.get(code)
        return handler(None, RemotingCommand.request(code, {}))

    topics = call(RequestCode.GET_ALL_TOPIC_CONFIG)
    assert isinstance(topics, RemotingCommand)
    assert jsonx.loads(topics.body) == jsonx.loads(jsonx.dumps(broker.topics.encode()))
    for code, entries in ((RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, ESTATE_GROUPS),
                          (RequestCode.GET_ALL_CONSUMER_OFFSET, len(broker.offsets.table)),
                          (RequestCode.GET_BROKER_CONSUME_STATS, ESTATE_OFFSETS)):
        pending = call(code)
        assert isinstance(pending, Awaitable), f"code {code} answered in one block"
        response, ticks = await ticks_while(pending)
        assert response.code == 0, response.remark
        assert ticks >= _min_steps(entries), f"code {code}: {ticks} yields"


async def test_offset_reset_waits_for_a_stepped_snapshot(broker) -> None:
    """INVOKE_BROKER_TO_RESET_OFFSET's answer comes after consumerOffset.json holds the reset, written by a
    snapshot in steps (it was one synchronous encode and fsync of the whole table on the loop)."""
    broker.topics.update(TopicConfig("Reset", 2, 2))
    for i in range(ESTATE_OFFSETS // 10):
        broker.offsets.commit(f"G{i}", f"T{i}", 0, i)
    handler = broker.dispatcher.get(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET)
    pending = handler(None, RemotingCommand.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {
        "topic": "Reset", "group": "g", "timestamp": -1, "isForce": "true"}))
    assert isinstance(pending, Awaitable)
    response, ticks = await ticks_while(pending)
    assert response.code == 0, response.remark
    assert ticks >= _min_steps(ESTATE_OFFSETS // 10)
    on_disk = jsonx.loads(Path(broker.config.config_dir, "consumerOffset.json").read_bytes())
    assert on_disk["offsetTable"]["Reset@g"] == {"0": 0, "1": 0}


class _Conn:
    def __init__(self) -> None:
        self.closed = False


class _NoScan(dict):  # type: ignore[type-arg]
    """A group table that fails any walk over it (values/items/iteration): look-ups by key only."""

    def values(self) -> Any:
        raise AssertionError("walked every group")

    def items(self) -> Any:
        raise AssertionError("walked every group")

    def __iter__(self) -> Any:
        raise AssertionError("walked every group")


def _consumer(group: str) -> ConsumerData:
    return ConsumerData(group, "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", [])


def test_reply_finds_the_requester_without_walking_every_group() -> None:
    consumers = ConsumerManager(clock_ms=lambda: 1)
    producers = ProducerManager(clock_ms=lambda: 1)
    conns = [_Conn() for _ in range(ESTATE_GROUPS)]
    for i, conn in enumerate(conns):
        consumers.register(conn, f"client-{i}", "JAVA", 1, _consumer(f"G{i}"))
        producers.register(conn, f"P{i}", f"client-{i}", "JAVA", 1)
    consumers.groups = _NoScan(consumers.groups)
    producers.groups = _NoScan(producers.groups)
    assert consumers.find_channel("client-4321").conn is conns[4321]
    assert producers.find_channel("client-17").conn is conns[17]
    assert consumers.find_channel("absent") is None and producers.find_channel("absent") is None


def test_requester_index_follows_channel_changes() -> None:
    now = [1]
    consumers = ConsumerManager(clock_ms=lambda: now[0], channel_expired_ms=100)
    producers = ProducerManager(clock_ms=lambda: now[0], channel_expired_ms=100)
    a, b = _Conn(), _Conn()
    consumers.register(a, "cid-a", "JAVA", 1, _consumer("G1"))
    consumers.register(a, "cid-a2", "JAVA", 1, _consumer("G1"))  # the same connection's client id changed
    assert consumers.find_channel("cid-a") is None and consumers.find_channel("cid-a2").conn is a
    consumers.register(b, "cid-b", "JAVA", 1, _consumer("G2"))
    consumers.unregister(b, "G2")
    assert consumers.find_channel("cid-b") is None
    consumers.register(b, "cid-b", "JAVA", 1, _consumer("G2"))
    consumers.channel_closed(b)
    assert consumers.find_channel("cid-b") is None
    producers.register(a, "P", "cid-p", "JAVA", 1)
    a.closed = True
    assert producers.find_channel("cid-p") is None and consumers.find_channel("cid-a2") is None
    a.closed = False
    now[0] = 1_000
    assert consumers.scan_expired() == 1 and producers.scan_expired() == 1
    assert consumers.find_channel("cid-a2") is None and producers.find_channel("cid-p") is None
    assert consumers._by_client == {} and producers._by_client == {}
