"""The Kafka connector's options against real brokers: timestamp starts and ends (exact rows, precedence,
strategy), filter pushdown (same rows, fewer bytes pulled) and the sink's key-hash queue placement."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from ferrymq.client.selectors import select_by_hash
from ferrymq.common.route import MessageQueue

pytestmark = pytest.mark.spark

CLOCK_TIMEOUT_S = 5.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _past(ms: int) -> None:
    """Wait until the wall clock is past ``ms`` (a condition on the clock the broker stamps with)."""
    deadline = time.monotonic() + CLOCK_TIMEOUT_S
    while _now_ms() <= ms:
        assert time.monotonic() < deadline, "the wall clock did not advance"
        time.sleep(0.001)


def _bodies(df: Any) -> list[str]:
    return sorted(bytes(r.value).decode() for r in df.select("value").collect())


@pytest.fixture(scope="module")
def three_eras(cluster: Any) -> tuple[str, list[str], list[str], list[str], int, int]:
    """A topic filled in three eras A, B, C separated by the times ``t_b`` and ``t_c``: every A message was
    stored before t_b, every B message at or after t_b and before t_c, every C message at or after t_c."""
    topic = "SparkEras"
    cluster.create_topic(topic)
    era_a = cluster.produce(topic, 40, start=0)
    t_b = _now_ms() + 1
    _past(t_b)
    era_b = cluster.produce(topic, 40, start=100)
    t_c = _now_ms() + 1
    _past(t_c)
    era_c = cluster.produce(topic, 40, start=200)
    return topic, era_a, era_b, era_c, t_b, t_c


def _queues(topic: str) -> list[str]:
    return [f"broker-{b}:{q}" for b in ("a", "b") for q in (0, 1)]


def test_timestamp_options_give_exact_rows(spark: Any, cluster: Any, three_eras: Any) -> None:
    topic, era_a, era_b, era_c, t_b, t_c = three_eras
    base = {"nameServer": cluster.ns_addr, "subscribe": topic}

    def read(**kw: str) -> list[str]:
        return _bodies(spark.read.format("rocketmq").options(**base, **kw).load())

    assert read(startingTimestamp=str(t_b)) == sorted(era_b + era_c)
    assert read(startingTimestamp=str(t_b), endingTimestamp=str(t_c)) == sorted(era_b)
    assert read(endingTimestamp=str(t_b)) == sorted(era_a)
    by_queue = json.dumps({topic: {q: t_c for q in _queues(topic)}})
    assert read(startingOffsetsByTimestamp=by_queue) == sorted(era_c)
    ending_by_queue = json.dumps({topic: {q: t_c for q in _queues(topic)}})
    assert read(startingTimestamp=str(t_b), endingOffsetsByTimestamp=ending_by_queue) == sorted(era_b)
    # Kafka's precedence: startingTimestamp > startingOffsetsByTimestamp > startingOffsets
    assert read(startingOffsetsByTimestamp=by_queue, startingOffsets="earliest") == sorted(era_c)
    assert read(startingTimestamp=str(t_b), startingOffsetsByTimestamp=by_queue) == sorted(era_b + era_c)
    # no message at or after the time: error (the default), or start at the latest offset
    future = str(_now_ms() + 3_600_000)
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy=latest"):
        read(startingTimestamp=future)
    assert read(startingTimestamp=future, startingOffsetsByTimestampStrategy="latest") == []
    # an ending time with nothing at or after it ends at the latest offset
    assert read(startingTimestamp=str(t_c), endingTimestamp=future) == sorted(era_c)
    missing = json.dumps({topic: {"broker-a:0": t_b}})
    with pytest.raises(Exception, match="missing SparkEras/broker-a:1"):
        read(startingOffsetsByTimestamp=missing)


def test_stream_starts_at_a_timestamp(spark: Any, cluster: Any, three_eras: Any, tmp_path: Any) -> None:
    topic, _era_a, era_b, era_c, t_b, _t_c = three_eras
    query = (
        spark.readStream.format("rocketmq")
        .options(nameServer=cluster.ns_addr, subscribe=topic, startingTimestamp=str(t_b))
        .load()
        .select("value")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert _bodies(spark.read.parquet(str(tmp_path / "out"))) == sorted(era_b + era_c)
    progress = query.lastProgress or query.recentProgress[-1]
    latest = progress["sources"][0]["latestOffset"]
    assert latest is not None and sum(json.loads(latest)[topic].values()) == 120  # reportLatestOffset


@pytest.fixture()
def pushdown(spark: Any) -> Any:
    key = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "true")
    try:
        yield spark
    finally:
        spark.conf.set(key, before)


def test_pushdown_same_rows_fewer_bytes(spark: Any, cluster: Any, pushdown: Any) -> None:
    topic = "SparkPushdown"
    cluster.create_topic(topic)
    cluster.produce(topic, 400, body_size=200)
    t_mid = _now_ms() + 1
    _past(t_mid)
    cluster.produce(topic, 100, start=1000, body_size=200)
    opts = {"nameServer": cluster.ns_addr, "subscribe": topic}
    queries = [
        "tags = 'even'",
        "tags IN ('odd') AND queueId = 1 AND brokerName = 'broker-b'",
        f"storeTimestamp >= timestamp_millis({t_mid})",
        f"storeTimestamp < timestamp_millis({t_mid}) AND queueId = 0",
    ]
    for where in queries:
        results = {}
        pulled = {}
        for enabled in ("false", "true"):
            spark.conf.set("spark.sql.python.filterPushdown.enabled", enabled)
            before = cluster.get_bytes(topic)
            rows = spark.read.format("rocketmq").options(**opts).load().where(where)
            results[enabled] = sorted((r.brokerName, r.queueId, r.queueOffset, r.tags) for r in rows.collect())
            pulled[enabled] = cluster.get_bytes(topic) - before
        assert results["true"] == results["false"], where
        assert pulled["true"] < pulled["false"] * 0.75, (where, pulled)
    # a filter the source cannot use stays with Spark; rows still exact
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    df = spark.read.format("rocketmq").options(**opts).load()
    everything = df.select("key", "tags").collect()
    expected = sum(1 for r in everything if r.key.startswith("k1") or r.tags == "odd")
    assert df.where("key LIKE 'k1%' OR tags = 'odd'").count() == expected > 0


def test_sink_places_rows_by_key_hash_and_round_robin(spark: Any, cluster: Any) -> None:
    topic = "SparkKeyed"
    cluster.create_topic(topic)
    rows = [(f"order-{i % 12}", f"v{i}") for i in range(120)]
    df = spark.createDataFrame(rows, "key string, value string").coalesce(1)  # one task: one order per write
    for _ in range(2):  # same key -> same queue across two writes
        df.write.format("rocketmq").options(nameServer=cluster.ns_addr, topic=topic).mode("append").save()
    unkeyed_rows = [(f"nokey{i}", "t1" if i % 2 else None) for i in range(40)]
    spark.createDataFrame(unkeyed_rows, "value string, tags string").write.format("rocketmq").options(
        nameServer=cluster.ns_addr, topic=topic).mode("append").save()  # fmt: skip
    back = spark.read.format("rocketmq").options(nameServer=cluster.ns_addr, subscribe=topic).load().collect()
    assert len(back) == 280
    placed: dict[str, set[tuple[str, int]]] = {}
    for r in back:
        if r.key:
            placed.setdefault(r.key, set()).add((r.brokerName, r.queueId))
    queues = sorted(MessageQueue(topic, f"broker-{b}", q) for b in ("a", "b") for q in (0, 1))
    for key, where in placed.items():
        expected = select_by_hash(queues, None, key)
        assert where == {(expected.broker_name, expected.queue_id)}, key
    assert sorted((bytes(r.value).decode(), r.tags) for r in back if not r.key) == sorted(unkeyed_rows)
    assert sorted((r.key, r.tags, bytes(r.value).decode()) for r in back if r.key) == sorted(
        (k, None, v) for k, v in rows * 2)  # fmt: skip
    assert len({r.msgId for r in back}) == 280  # a UNIQ_KEY each
    assert {frozenset(r.properties) - {"CLUSTER"} for r in back if r.key} == {frozenset({"KEYS", "UNIQ_KEY"})}
    unkeyed = {(r.brokerName, r.queueId) for r in back if not r.key}
    assert len(unkeyed) == 4  # round robin reaches every queue
    # rows of one key keep their order within the queue (one request at a time per queue)
    for key in placed:
        mine = sorted((r.queueOffset, int(bytes(r.value).decode()[1:])) for r in back if r.key == key)
        first, second = [v for _o, v in mine[: len(mine) // 2]], [v for _o, v in mine[len(mine) // 2:]]
        assert first == sorted(first) and second == sorted(second), key
