"""The exporter families built from a broker's tables without a network: an estate of 10,000 topics and
5,000 groups (every series present once, the build yields the event loop in slices), a slave publishing no
replicated state (no double count under ``sum by (group)``), the per-key minute rates, the put distribution,
the statusTable parsing of a GET_CONSUMER_RUNNING_INFO answer and the client's consume statistics."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ferrymq.broker import exporter_metrics
from ferrymq.broker.consumer_manager import ClientChannel, ConsumerGroupInfo
from ferrymq.broker.exporter_metrics import ExporterExposition, publishes_client, status_table_of
from ferrymq.broker.stats import KEYED_SAMPLE_INTERVAL_MS, MINUTE_GET_MSGS, BrokerStats, local_midnight_ms
from ferrymq.client.consumer.status import ConsumeStatusStats
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode as R
from ferrymq.store.errors import StoreDirError

T0_MS = local_midnight_ms(1_700_000_000_000) + 3_600_000
TOPICS = 10_000
GROUPS = 5_000
QUEUES = 4
#: messages in each queue; groups commit COMMITTED of them
MAX_OFFSET = 10
COMMITTED = 7


class Clock:
    def __init__(self) -> None:
        self.now_ms = T0_MS

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class TopicConfig:
    write_queue_nums: int = QUEUES
    read_queue_nums: int = QUEUES


class Store:
    max_phy_offset = 123_456
    config = SimpleNamespace(store_path_commit_log=".")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.timestamp_reads = 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return MAX_OFFSET

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return 0

    def get_message_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        self.timestamp_reads += 1
        return self.clock.now_ms - 5_000


@dataclass
class Consumers:
    groups: dict[str, ConsumerGroupInfo] = field(default_factory=dict)

    def get(self, group: str) -> ConsumerGroupInfo | None:
        return self.groups.get(group)


class Conn:
    """A consumer's connection answering GET_CONSUMER_RUNNING_INFO with a statusTable."""

    closed = False

    def __init__(self, peer_addr: str) -> None:
        self.peer_addr = peer_addr
        self.asked: list[RemotingCommand] = []

    async def invoke(self, cmd: RemotingCommand, timeout_ms: int) -> RemotingCommand:
        self.asked.append(cmd)
        return cmd.response(R.SUCCESS, body=STATUS_BODY)


STATUS_BODY = (b'{"jstack":"","mqTable":{{"brokerName":"b1","queueId":0,"topic":"T"}:{"commitOffset":3}},'
               b'"properties":{},"statusTable":{"T":{"consumeFailedMsgs":2,"consumeFailedTPS":0.5,"consumeOKTPS":3.0,'
               b'"consumeRT":1.5,"pullRT":4.0,"pullTPS":6.0}},"subscriptionSet":[]}')


def estate(*, slave: bool = False, topics: int = TOPICS, groups: int = GROUPS) -> Any:
    clock = Clock()
    ctx = SimpleNamespace(
        clock_ms=clock, config=SimpleNamespace(broker_cluster_name="c1", broker_name="b1", broker_id=1 if slave else 0,
                                               is_slave=slave),
        controller_role=None, ha_service=None, broker_addr="127.0.0.1:10911", stats=BrokerStats(clock),
        loop_lag=SimpleNamespace(last_lag_s=0.002), store=Store(clock),
        topics=SimpleNamespace(table={f"T{i}": TopicConfig() for i in range(topics)}),
        offsets=SimpleNamespace(table={f"T{g % topics}@G{g}": dict.fromkeys(range(QUEUES), COMMITTED)
                                       for g in range(groups)}),
        consumers=Consumers(), producers=SimpleNamespace(groups={"P0": {1: object(), 2: object()}}),
    )
    ctx.runtime_info = lambda: {"brokerVersionDesc": "V4_9_7", "bootTimestamp": str(T0_MS), "brokerVersion": "407",
                                "commitLogMaxOffset": "100", "commitLogFlushedOffset": "60", "putTps": "1.00 2.00 3.00"}
    return ctx


def parse(pieces: list[bytes]) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(b"".join(pieces).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


async def test_an_estate_of_10000_topics_and_5000_groups_is_built_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exporter_metrics, "EXPOSITION_SLICE_BUDGET_S", 0.0)  # yield at every check
    ctx = estate()
    ctx.consumers.groups["G1"] = ConsumerGroupInfo("G1", channels={1: ClientChannel(
        Conn("10.0.0.9:5555"), "cid-1", "JAVA", 413, T0_MS)})
    exp = ExporterExposition(ctx)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.ensure_future(ticker())
    try:
        m = parse(await exp.render())
    finally:
        other.cancel()
    assert len(m["rocketmq_producer_offset"]) == TOPICS
    assert {v for _, v in m["rocketmq_producer_offset"]} == {QUEUES * MAX_OFFSET}
    assert len(m["rocketmq_consumer_offset"]) == GROUPS
    assert {v for _, v in m["rocketmq_consumer_offset"]} == {QUEUES * COMMITTED}
    assert {v for _, v in m["rocketmq_group_diff"]} == {QUEUES * (MAX_OFFSET - COMMITTED)}
    assert {v for _, v in m["rocketmq_group_get_latency_by_storetime"]} == {5_000}
    assert len(m["ferrymq_consume_queue_lag"]) == GROUPS * QUEUES
    online = [lab for lab, _ in m["rocketmq_group_diff"] if lab["countOfOnlineConsumers"] == "1"]
    assert [lab["group"] for lab in online] == ["G1"]
    (count_labels, count), = [(lab, v) for lab, v in m["rocketmq_group_count"] if lab["group"] == "G1"]
    assert (count_labels["caddr"], count_labels["localaddr"], count) == ("10.0.0.9:5555", "cid-1", 1)
    assert len(m["rocketmq_group_count"]) == GROUPS  # the others with 0 online, as the exporter publishes them
    assert m["rocketmq_producer_count"] == [({"cluster": "c1", "broker": "b1", "group": "P0", "brokerId": "0",
                                              "role": "master"}, 2)]
    # the other task ran between the slices: the loop was never held for the whole build
    assert exp.last_yields >= exp.last_rows // exporter_metrics.EXPOSITION_CHECK_EVERY - 1
    assert ticks >= exp.last_yields // 2
    assert ctx.store.timestamp_reads == GROUPS * QUEUES

    # the scrape started a GET_CONSUMER_RUNNING_INFO poll: the next scrape publishes the consumer's statusTable
    await exp.poller._task  # type: ignore[misc]
    (asked,) = ctx.consumers.groups["G1"].channels[1].conn.asked
    assert asked.code == 307 and asked.ext_fields["consumerGroup"] == "G1" and asked.ext_fields["clientId"] == "cid-1"
    m = parse(await exp.render())
    client = {"clientAddr": "10.0.0.9:5555", "clientId": "cid-1", "group": "G1", "topic": "T", "cluster": "c1",
              "broker": "b1", "brokerId": "0", "role": "master"}
    for name, value in (("rocketmq_client_consume_fail_msg_count", 2), ("rocketmq_client_consume_fail_msg_tps", 0.5),
                        ("rocketmq_client_consume_ok_msg_tps", 3.0), ("rocketmq_client_consume_rt", 1.5),
                        ("rocketmq_client_consumer_pull_rt", 4.0), ("rocketmq_client_consumer_pull_tps", 6.0)):
        assert m[name] == [(client, value)], name
    assert len(ctx.consumers.groups["G1"].channels[1].conn.asked) == 1  # no new poll within the interval


async def test_store_time_lookups_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exporter_metrics, "MAX_STORE_TIME_LOOKUPS", 10)
    ctx = estate(topics=100, groups=100)
    await ExporterExposition(ctx).render()
    assert ctx.store.timestamp_reads == 10


async def test_a_queue_file_gone_during_a_scrape_leaves_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic deleted or the store stopping while a scrape reads store times: that queue's time is unknown,
    the scrape still answers (it failed with StoreDirError 'segment ... is closed')."""
    ctx = estate(topics=5, groups=5)

    def gone(topic: str, queue_id: int, queue_offset: int) -> int:
        raise StoreDirError("segment /x is closed")

    monkeypatch.setattr(ctx.store, "get_message_store_timestamp", gone)
    m = parse(await ExporterExposition(ctx).render())
    assert m["rocketmq_group_diff"] and m["rocketmq_group_get_latency_by_storetime"]


async def test_a_slave_publishes_its_runtime_but_no_replicated_state() -> None:
    ctx = estate(slave=True, topics=3, groups=3)
    m = parse(await ExporterExposition(ctx).render())
    for name in ("rocketmq_producer_offset", "rocketmq_consumer_offset", "rocketmq_group_diff",
                 "rocketmq_group_get_latency_by_storetime", "rocketmq_group_count", "rocketmq_producer_count"):
        assert name not in m, name
    (labels, value), = m["rocketmq_brokeruntime_put_tps60"]
    assert value == 2.0
    assert labels == {"cluster": "c1", "brokerIP": "127.0.0.1:10911", "brokerHost": "", "des": "V4_9_7",
                      "boottime": str(T0_MS), "broker_version": "407", "broker": "b1", "brokerId": "1",
                      "role": "slave"}
    assert m["rocketmq_brokeruntime_remain_howmanydata_toflush"][0][1] == 40
    assert m["rocketmq_brokeruntime_send_threadpoolqueue_headwait_timemills"][0][1] == 2


def test_minute_rates_follow_the_snapshots() -> None:
    clock = Clock()
    stats = BrokerStats(clock)
    for _second in range(90):  # 6 messages a second pulled by G from T
        stats.on_get("T", 6, 60, "G")
        clock.now_ms += 1000
        stats.sample()
    base_ms, snaps = stats.minute.base(clock.now_ms)
    assert clock.now_ms - base_ms <= 60_000 and clock.now_ms - base_ms > 60_000 - KEYED_SAMPLE_INTERVAL_MS
    count = stats.get_msgs_by_group[("T", "G")] - snaps[MINUTE_GET_MSGS][("T", "G")]
    assert count / ((clock.now_ms - base_ms) / 1000) == pytest.approx(6.0)
    assert stats.get_msgs_by_topic == {"T": 540}


def test_put_distribution_buckets_and_minute_reset() -> None:
    clock = Clock()
    stats = BrokerStats(clock)
    for seconds in (0.0004, 0.003, 0.012, 0.3, 2.5, 11.0):
        stats.on_put_time(seconds)
    assert stats.put_distribution.named() == {
        "<=0ms": 1, "0~10ms": 1, "10~50ms": 1, "50~100ms": 0, "100~200ms": 0, "200~500ms": 1, "500ms~1s": 0,
        "1~2s": 0, "2~3s": 1, "3~4s": 0, "4~5s": 0, "5~10s": 0, "10s~": 1}
    assert stats.put_distribution.max_ms == 11_000
    clock.now_ms += 60_000
    stats.sample()
    assert sum(stats.put_distribution.named().values()) == 0 and stats.put_distribution.periods == 1
    assert stats.put_distribution.max_ms == 11_000  # since start, as putMessageEntireTimeMax


def test_status_table_is_read_from_a_fastjson_shaped_answer() -> None:
    assert status_table_of(STATUS_BODY) == {"T": {"consumeFailedMsgs": 2, "consumeFailedTPS": 0.5, "consumeOKTPS": 3.0,
                                           "consumeRT": 1.5, "pullRT": 4.0, "pullTPS": 6.0}}
    assert status_table_of(b'{"mqTable":{}}') == {}
    assert status_table_of(b'{"statusTable": [1, 2]}') == {}
    assert status_table_of(b'{"statusTable": {broken') == {}


def test_one_master_publishes_a_consumer_that_pulls_from_several() -> None:
    two_brokers = (b'{"mqTable":{{"brokerName":"broker-b","queueId":0,"topic":"T"}:{},'
                   b'{"brokerName":"broker-a","queueId":1,"topic":"T"}:{}},"statusTable":{}}')
    assert publishes_client(two_brokers, "broker-a") and not publishes_client(two_brokers, "broker-b")
    assert publishes_client(b'{"mqTable":{},"statusTable":{}}', "broker-b")  # holds no queue: every broker


async def test_a_slave_does_not_ask_consumers() -> None:
    ctx = estate(slave=True, topics=1, groups=1)
    conn = Conn("10.0.0.9:5555")
    ctx.consumers.groups["G1"] = ConsumerGroupInfo("G1", channels={1: ClientChannel(conn, "c", "JAVA", 1, T0_MS)})
    exp = ExporterExposition(ctx)
    await exp.render()
    assert exp.poller._task is None and conn.asked == []


def test_client_consume_status_over_the_last_minute() -> None:
    now = [0]
    s = ConsumeStatusStats(lambda: now[0])
    for _ in range(60):
        s.on_pull("T", 4.0, 10)
        s.on_consume("T", 2.0, 8, ok=True)
        s.on_consume("T", 6.0, 2, ok=False)
        now[0] += 1000
    st = s.status_table()["T"]
    assert st["pullRT"] == pytest.approx(4.0) and st["consumeRT"] == pytest.approx(4.0)
    assert st["pullTPS"] == pytest.approx(10.0) and st["consumeOKTPS"] == pytest.approx(8.0)
    assert st["consumeFailedTPS"] == pytest.approx(2.0) and st["consumeFailedMsgs"] == 120
