"""The driver's metadata look-ups (``runtime.ClusterMetadata``) against real brokers: how many requests a
look-up sends, to whom, and that the answers equal the per-queue requests they replace."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.spark

#: The requests counted (not heartbeats, which a client sends on its own schedule).
COUNTED = frozenset({"GET_ROUTEINFO_BY_TOPIC", "GET_TOPIC_STATS_INFO", "GET_MIN_OFFSET", "GET_MAX_OFFSET"})


@pytest.fixture
def requests_sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    """Metadata requests the process's clients send (by code name), counted from here on."""
    from ferrymq.client.instance import ClientInstance
    from ferrymq.remoting.codes import RequestCode

    counts: collections.Counter[str] = collections.Counter()
    invoke = ClientInstance.invoke

    async def counted(self: Any, addr: str, cmd: Any, timeout_ms: int | None = None) -> Any:
        name = RequestCode(cmd.code).name
        if name in COUNTED:
            counts[name] += 1
        return await invoke(self, addr, cmd, timeout_ms)

    monkeypatch.setattr(ClientInstance, "invoke", counted)
    yield counts


def _offset_requests(counts: collections.Counter[str]) -> dict[str, int]:
    """The offset requests among ``counts`` (a client's periodic route refresh may add a route fetch)."""
    return {code: n for code, n in counts.items() if code != "GET_ROUTEINFO_BY_TOPIC"}


def _metadata(cluster: Any) -> Any:
    from ferrymq.spark.options import parse_source_options
    from ferrymq.spark.runtime import ClusterMetadata

    # a group of its own: a fresh cached client, so earlier tests' routes do not hide route fetches
    opts = parse_source_options({"nameServer": cluster.ns_addr, "subscribe": "T", "group": f"meta-{id(cluster)}"},
                                streaming=True)  # fmt: skip
    return ClusterMetadata(opts.executor_options())


def _per_queue(cluster: Any, topic: str, queues: list[Any]) -> tuple[dict[Any, int], dict[Any, int]]:
    from procs import request

    from ferrymq.remoting.codes import RequestCode

    addrs = {b.broker_name: b.addr for b in cluster.brokers}
    mins, maxs = {}, {}
    for mq in queues:
        for code, table in ((RequestCode.GET_MIN_OFFSET, mins), (RequestCode.GET_MAX_OFFSET, maxs)):
            resp = request(addrs[mq.broker_name], code, {"topic": topic, "queueId": mq.queue_id})
            table[mq] = resp.get_int("offset")
    return mins, maxs


def test_offset_bounds_one_request_per_topic_and_broker(cluster: Any, requests_sent: Any) -> None:
    topics = ["SparkMetaA", "SparkMetaB"]
    for topic in topics:
        cluster.create_topic(topic)
        cluster.produce(topic, 30)
    meta = _metadata(cluster)
    requests_sent.clear()
    found = meta.queues_of(topics)
    queues = sorted(mq for t in topics for mq in found[t])
    assert len(queues) == 8 and requests_sent["GET_ROUTEINFO_BY_TOPIC"] == 2
    requests_sent.clear()
    mins, maxs = meta.offset_bounds(queues)
    assert _offset_requests(requests_sent) == {"GET_TOPIC_STATS_INFO": 4}  # 2 topics x 2 brokers, none per queue
    for topic in topics:
        expected = _per_queue(cluster, topic, found[topic])
        assert ({mq: mins[mq] for mq in found[topic]}, {mq: maxs[mq] for mq in found[topic]}) == expected
    assert sum(maxs.values()) == 60


def test_offset_bounds_fall_back_queue_by_queue(cluster: Any, requests_sent: Any) -> None:
    """Read queues beyond the write queues are not in the topic stats; they are asked one by one."""
    from procs import request, wait_route

    from ferrymq.remoting.codes import RequestCode

    topic = "SparkMetaWide"
    broker = cluster.brokers[0]
    resp = request(broker.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": 3, "writeQueueNums": 2, "perm": 6,
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"})  # fmt: skip
    assert resp.code == 0, resp.remark
    wait_route(cluster.ns_addr, topic, timeout_s=45.0, broker_name=broker.broker_name)
    cluster.produce(topic, 10)
    meta = _metadata(cluster)
    queues = meta.queues(topic)
    assert [mq.queue_id for mq in queues] == [0, 1, 2]
    requests_sent.clear()
    mins, maxs = meta.offset_bounds(queues)
    assert _offset_requests(requests_sent) == {"GET_TOPIC_STATS_INFO": 1, "GET_MIN_OFFSET": 1, "GET_MAX_OFFSET": 1}
    assert (mins, maxs) == _per_queue(cluster, topic, queues)
    assert maxs[queues[2]] == 0 and sum(maxs.values()) == 10


def test_offset_bounds_when_the_broker_refuses_topic_stats(
    cluster: Any, requests_sent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that does not serve GET_TOPIC_STATS_INFO (or refuses it) is asked queue by queue."""
    from ferrymq.client.instance import ClientInstance
    from ferrymq.remoting.codes import RequestCode, ResponseCode

    topic = "SparkMetaRefused"
    cluster.create_topic(topic)
    cluster.produce(topic, 12)
    counting = ClientInstance.invoke

    async def refusing(self: Any, addr: str, cmd: Any, timeout_ms: int | None = None) -> Any:
        if cmd.code == RequestCode.GET_TOPIC_STATS_INFO:
            requests_sent["GET_TOPIC_STATS_INFO"] += 1
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark="not supported")
        return await counting(self, addr, cmd, timeout_ms)

    monkeypatch.setattr(ClientInstance, "invoke", refusing)
    meta = _metadata(cluster)
    queues = meta.queues(topic)
    requests_sent.clear()
    mins, maxs = meta.offset_bounds(queues)
    assert _offset_requests(requests_sent) == {"GET_TOPIC_STATS_INFO": 2, "GET_MIN_OFFSET": 4, "GET_MAX_OFFSET": 4}
    assert (mins, maxs) == _per_queue(cluster, topic, queues)
    assert sum(maxs.values()) == 12


#: Modules the driver-side streaming runner has no use for: the pull and decode path (executors), the sink,
#: the SQL92 compiler (only a SQL92 subExpression needs it), pandas, and the clients it does not start.
NOT_AT_PLAN_TIME = ("ferrymq.spark.fetch", "ferrymq.spark.arrow", "ferrymq.spark.writer", "ferrymq.client.admin",
                    "ferrymq.client.producer", "ferrymq.client.consumer.push", "ferrymq.common.sql92.compiler",
                    "lark", "pandas")  # fmt: skip


def test_the_streaming_runner_imports_only_what_planning_needs() -> None:
    """What PySpark's source runner imports for the connector: the data source, the stream reader and the
    driver's metadata client, and not the modules above (each run of a query pays for its imports)."""
    import json
    import subprocess
    import sys

    code = ("import json, sys\n"
            "from ferrymq.spark.source import RocketMQDataSource, source_schema\n"
            "reader = RocketMQDataSource({'nameServer': '127.0.0.1:1', 'subscribe': 'T'})"
            ".streamReader(source_schema())\n"
            "reader.getDefaultReadLimit()\n"
            "import ferrymq.spark.runtime\n"
            "print(json.dumps(sorted(sys.modules)))\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded = set(json.loads(out.stdout))
    assert "ferrymq.spark.reader" in loaded and "ferrymq.client.consumer.pull" in loaded
    assert sorted(m for m in NOT_AT_PLAN_TIME if m in loaded) == []
