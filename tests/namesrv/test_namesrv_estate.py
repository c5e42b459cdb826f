"""The name server at estate size (issue 24): a large changed topic table is applied in steps that yield to
the event loop, an unchanged one is not read at all, a large broker group leaves the routes at once and its
QueueData in steps, the per-cluster topic index agrees with the tables, and the expiry scan removes silent
brokers in bounded batches."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import orjson
import pytest

from ferrymq.common.register_body_codec import encode_compressed_register_body
from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.namesrv.app import NameServer
from ferrymq.namesrv.processors import REGISTER_INLINE_MAX_TOPICS, REGISTER_STEP_TOPICS
from ferrymq.namesrv.route_table import REMOVE_INLINE_MAX_TOPICS, REMOVE_STEP_TOPICS, RouteTable
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection
from support.aio import wait_for
from support.clock import ManualClock

N_TOPICS = REGISTER_INLINE_MAX_TOPICS + 3 * REGISTER_STEP_TOPICS
ADDR = "10.0.0.1:10911"
T0_MS = 1_700_000_000_000


def table_of(n: int) -> list[TopicConfig]:
    return [TopicConfig(f"T{i:05d}", 4, 4, 6) for i in range(n)]


def body_of(topics: list[TopicConfig], version: DataVersion, compressed: bool) -> bytes:
    if compressed:
        return encode_compressed_register_body(topics, [], version)
    return orjson.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
        "dataVersion": version.to_json(), "topicConfigTable": {t.topic_name: t.to_json() for t in topics}}})


def register_cmd(body: bytes, compressed: bool) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, {
        "brokerName": "big", "brokerAddr": ADDR, "clusterName": "C", "haServerAddr": "", "brokerId": 0,
        "compressed": compressed}, body)


@pytest.fixture
async def server() -> AsyncIterator[NameServer]:
    ns = NameServer(clock_ms=ManualClock(T0_MS))  # not started: the processors are called directly
    yield ns


def routed(ns: NameServer, topics: list[TopicConfig]) -> int:
    return sum(ns.routes.get_topic_route(t.topic_name) is not None for t in topics)


@pytest.mark.parametrize("compressed", [False, True], ids=["json", "compressed"])
async def test_large_changed_table_is_applied_in_steps(server: NameServer, compressed: bool) -> None:
    conn = Connection()
    topics = table_of(N_TOPICS)
    version = DataVersion(1, 5)
    pending = server.processors.register_broker(conn, register_cmd(body_of(topics, version, compressed),
                                                                   compressed))
    assert asyncio.iscoroutine(pending)
    task = asyncio.ensure_future(pending)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    partial = routed(server, topics)
    assert 0 < partial < N_TOPICS  # the loop ran between steps
    live = server.routes.live_info(ADDR)
    assert live is not None and live.data_version is None  # not recorded before the whole table is in
    assert (await task).code == ResponseCode.SUCCESS
    assert routed(server, topics) == N_TOPICS
    assert server.routes.live_info(ADDR).data_version == version  # type: ignore[union-attr]


async def test_a_large_plain_body_is_parsed_in_steps_and_an_unchanged_one_not_at_all(
        server: NameServer, monkeypatch: pytest.MonkeyPatch) -> None:
    topics = table_of(4 * N_TOPICS)
    body = body_of(topics, DataVersion(1, 5), False)
    parsed: list[int] = []
    real_loads = orjson.loads

    def loads(data: object) -> object:
        parsed.append(len(data))  # type: ignore[arg-type]
        return real_loads(data)  # type: ignore[arg-type]

    monkeypatch.setattr(orjson, "loads", loads)
    conn = Connection()
    answer = server.processors.register_broker(conn, register_cmd(body, False))
    assert asyncio.iscoroutine(answer)
    assert (await answer).code == ResponseCode.SUCCESS
    assert routed(server, topics) == len(topics)
    assert max(parsed) < len(body) / 10  # each parse a step of the table, never the whole body
    parsed.clear()
    again = server.processors.register_broker(conn, register_cmd(body, False))  # the same DataVersion
    assert not asyncio.iscoroutine(again) and again.code == ResponseCode.SUCCESS
    assert sum(parsed) < 1024  # only the text before the table


async def test_same_version_arriving_during_steps_is_not_skipped(server: NameServer) -> None:
    conn = Connection()
    topics = table_of(N_TOPICS)
    body = body_of(topics, DataVersion(1, 5), False)
    first = asyncio.ensure_future(server.processors.register_broker(conn, register_cmd(body, False)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    second = server.processors.register_broker(conn, register_cmd(body, False))
    assert asyncio.iscoroutine(second)  # queued behind the registration being applied
    answers = await asyncio.gather(first, second)
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 2
    assert routed(server, topics) == N_TOPICS


async def test_broker_removed_during_steps_gets_no_routes_back(server: NameServer) -> None:
    conn = Connection()
    topics = table_of(N_TOPICS)
    task = asyncio.ensure_future(server.processors.register_broker(
        conn, register_cmd(body_of(topics, DataVersion(1, 5), True), True)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert server.routes.on_channel_closed(conn) == [ADDR]
    assert (await task).code == ResponseCode.SUCCESS
    assert routed(server, topics) == 0
    assert server.routes.topics_by_cluster("C") == []


@pytest.mark.parametrize("compressed", [False, True], ids=["json", "compressed"])
async def test_unchanged_version_does_not_read_the_table(server: NameServer, compressed: bool) -> None:
    conn = Connection()
    topics = table_of(10)
    version = DataVersion(3, 9)
    assert server.processors.register_broker(conn, register_cmd(body_of(topics, version, compressed),
                                                                compressed)).code == ResponseCode.SUCCESS
    # same version, entries that would not decode: answered from the version alone
    if compressed:
        body = encode_compressed_register_body([TopicConfig("bad entry", 1, 1, 6)] * 3, [], version)
    else:
        body = orjson.dumps({"topicConfigSerializeWrapper": {"dataVersion": version.to_json(),
                                                             "topicConfigTable": {"x": {"perm": "not-int"}}}})
    assert server.processors.register_broker(conn, register_cmd(body, compressed)).code == ResponseCode.SUCCESS
    assert routed(server, topics) == 10


def test_cluster_topic_index_matches_the_tables() -> None:
    rnd = random.Random(24)
    clock = ManualClock(T0_MS)
    table = RouteTable(clock_ms=clock)
    clusters = ["c1", "c2", "c3"]
    names = [f"b{i}" for i in range(8)]
    versions: dict[str, int] = {}

    def brute(cluster: str) -> list[str]:
        out: set[str] = set()
        for name in table.clusters().get(cluster, []):
            out |= {t for t in table.all_topics() if table.queue_data(t, name) is not None}
        return sorted(out)

    for step in range(600):
        op = rnd.random()
        name = rnd.choice(names)
        addr = f"10.0.0.{names.index(name)}:10911"
        if op < 0.55:
            versions[addr] = versions.get(addr, 0) + 1
            topics = [TopicConfig(f"T{rnd.randrange(30)}", 4, 4, 6) for _ in range(rnd.randrange(6))]
            table.register_broker(rnd.choice(clusters), addr, name, 0, data_version=DataVersion(versions[addr], 0),
                                  topic_configs=topics, channel=addr)
        elif op < 0.7:
            table.delete_topic(f"T{rnd.randrange(30)}", rnd.choice([None, *clusters]))
        elif op < 0.8:
            table.unregister_broker("any", addr, name, 0)
        elif op < 0.9:
            table.on_channel_closed(addr)
        else:
            clock.advance(rnd.randrange(0, 130_000))
            table.scan_not_active_brokers(max_count=rnd.randrange(1, 4))
        for cluster in clusters:
            assert table.topics_by_cluster(cluster) == brute(cluster), (step, cluster)


def test_expiry_scan_in_batches_oldest_first() -> None:
    clock = ManualClock(T0_MS)
    table = RouteTable(clock_ms=clock)
    for i in range(10):
        table.register_broker("c", f"10.0.0.{i}:1", f"b{i}", 0, data_version=DataVersion(1, 0), topic_configs=[])
        clock.advance(1)
    clock.advance(1_000)
    # b3 refreshes by heartbeat, b4 by QUERY_DATA_VERSION: both become the newest
    table.register_broker("c", "10.0.0.3:1", "b3", 0, data_version=DataVersion(1, 0), topic_configs=[])
    assert table.query_data_version("10.0.0.4:1", DataVersion(1, 0)) == (False, DataVersion(1, 0))
    clock.advance(table.broker_expired_ms - 1_000 + 10)
    first = [g.addr for g in table.scan_not_active_brokers(max_count=3)]
    assert first == ["10.0.0.0:1", "10.0.0.1:1", "10.0.0.2:1"]
    rest = [g.addr for g in table.scan_not_active_brokers()]
    assert rest == [f"10.0.0.{i}:1" for i in (5, 6, 7, 8, 9)]
    assert table.live_addrs() == ["10.0.0.3:1", "10.0.0.4:1"]


def big_group_table() -> tuple[RouteTable, list[int]]:
    calls: list[int] = []
    table = RouteTable(clock_ms=ManualClock(T0_MS), on_retire=lambda: calls.append(1))
    table.register_broker("C", ADDR, "big", 0, data_version=DataVersion(1, 0),
                          topic_configs=table_of(REMOVE_INLINE_MAX_TOPICS + 500), channel="big-conn")
    table.register_broker("C", "10.0.0.9:1", "small", 0, data_version=DataVersion(1, 0),
                          topic_configs=table_of(3), channel="small-conn")
    return table, calls


def test_large_group_removed_in_steps_hidden_at_once() -> None:
    table, calls = big_group_table()
    assert table.on_channel_closed("big-conn") == [ADDR]
    assert calls == [1]
    assert table.get_topic_route("T00010") is None  # only "big" served it: gone from routes at once
    shared = table.get_topic_route("T00001")
    assert shared is not None and [q.broker_name for q in shared.queue_datas] == ["small"]
    steps = 0
    while table.drain_retired(REMOVE_STEP_TOPICS):
        steps += 1
    assert steps == (REMOVE_INLINE_MAX_TOPICS + 500 - 1) // REMOVE_STEP_TOPICS
    assert table.all_topics() == ["T00000", "T00001", "T00002"]
    assert table.topics_by_cluster("C") == ["T00000", "T00001", "T00002"]


def test_group_registering_again_while_retiring_keeps_its_new_routes() -> None:
    table, _ = big_group_table()
    table.on_channel_closed("big-conn")
    table.drain_retired(REMOVE_STEP_TOPICS)  # part of the old QueueData is gone
    table.register_broker("C", ADDR, "big", 0, data_version=DataVersion(2, 0), topic_configs=table_of(5),
                          channel="big-conn-2")
    assert not table.drain_retired(REMOVE_STEP_TOPICS)  # nothing left to drain: finished on re-registration
    assert table.all_topics() == [f"T{i:05d}" for i in range(5)]
    route = table.get_topic_route("T00004")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["big"]
    assert table.topics_by_cluster("C") == [f"T{i:05d}" for i in range(5)]


async def test_name_server_drains_a_closed_big_broker(server: NameServer) -> None:
    conn = Connection()
    topics = table_of(REMOVE_INLINE_MAX_TOPICS + 500)
    server.routes.register_broker("C", ADDR, "big", 0, data_version=DataVersion(1, 0), topic_configs=topics,
                                  channel=conn)
    server._on_closed(conn)
    assert routed(server, topics) == 0
    await wait_for(lambda: not server.routes.all_topics(), what="the retired broker's QueueData drained")


def _walked_references(rt: RouteTable) -> tuple[int, int]:
    """(tracked objects, references a full collection visits in them) reachable from the route table's tables
    through tracked objects (types, modules and functions left out): what a full pass walks for them."""
    import gc
    import types

    seen: set[int] = set()
    stack: list[object] = [getattr(rt, name) for name in rt.__slots__ if name.startswith("_")]
    visits = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or not gc.is_tracked(obj) or isinstance(obj, type | types.ModuleType | types.FunctionType):
            continue
        seen.add(id(obj))
        referents = gc.get_referents(obj)
        visits += len(referents)
        stack.extend(referents)
    return len(seen), visits


def test_a_full_collection_walks_the_route_table_per_broker_and_per_topic_not_per_pair() -> None:
    """1,200 brokers x topics: after a full pass the QueueData tuples, the per-topic dicts and the name indexes
    (dicts of names, no sets) are untracked, so what a pass visits grows with brokers + topics, not their product
    (issue 24: 1,000 brokers x 10,000 topics)."""
    import gc

    brokers, topics = 60, 200
    rt = RouteTable(clock_ms=ManualClock(T0_MS))
    configs = [TopicConfig(f"T{t}", 8, 8) for t in range(topics)]
    for b in range(brokers):
        rt.register_broker("c", f"10.0.0.{b}:10911", f"b{b}", 0, topic_configs=configs,
                           data_version=DataVersion(1, b), channel=f"conn{b}")
    gc.collect()
    objects, visits = _walked_references(rt)
    assert objects <= 8 * brokers + 20
    assert visits <= 10 * (brokers + topics), (objects, visits)  # brokers x topics = 12,000; was 13,522 with sets
    assert len(rt.get_topic_route("T7").queue_datas) == brokers
