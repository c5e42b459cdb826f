"""The connector end to end: Spark local[2] against a name server and two brokers (subprocesses).

No ``register()`` call anywhere: ``.format("rocketmq")`` / ``.format("ferrymq")`` rely on Spark's
``pyspark_*`` module discovery, as users get it after ``pip install 'ferrymq[spark]'``.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

_topic_ids = itertools.count()
STREAM_TIMEOUT_S = 120


def new_topic(cluster: Any, prefix: str) -> str:
    topic = f"Spark{prefix}{next(_topic_ids)}"
    cluster.create_topic(topic)
    return topic


def reader(spark: Any, cluster: Any, **options: str) -> Any:
    r = spark.read.format("rocketmq").option("nameServer", cluster.ns_addr)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def keys_of(rows: list[Any]) -> list[tuple[str, int, int]]:
    return [(r["brokerName"], r["queueId"], r["queueOffset"]) for r in rows]


def assert_exact(rows: list[Any], expected_bodies: list[str]) -> None:
    """No duplicate (queue, offset), and exactly the expected bodies."""
    ks = keys_of(rows)
    assert len(ks) == len(set(ks)), "duplicate rows"
    assert sorted(bytes(r["value"]).decode() for r in rows) == sorted(expected_bodies)


def contiguous_per_queue(rows: list[Any]) -> dict[tuple[str, int], tuple[int, int]]:
    """(broker, queue) -> (first, last) offsets, asserting no gap inside."""
    by_queue: dict[tuple[str, int], list[int]] = {}
    for b, q, o in keys_of(rows):
        by_queue.setdefault((b, q), []).append(o)
    result = {}
    for queue, offsets in by_queue.items():
        offsets.sort()
        assert offsets == list(range(offsets[0], offsets[-1] + 1)), f"gap in {queue}"
        result[queue] = (offsets[0], offsets[-1])
    return result


@pytest.fixture(scope="module")
def filled(cluster: Any) -> tuple[str, list[str]]:
    topic = new_topic(cluster, "Batch")
    return topic, cluster.produce(topic, 400)


def test_batch_read_everything_across_queues_and_brokers(
    spark: Any, cluster: Any, filled: tuple[str, list[str]]
) -> None:
    topic, bodies = filled
    df = reader(spark, cluster, subscribe=topic)
    assert df.columns == ["key", "value", "topic", "brokerName", "queueId", "queueOffset", "tags", "msgId",
                          "bornTimestamp", "storeTimestamp", "properties"]  # fmt: skip
    rows = df.collect()
    assert_exact(rows, bodies)
    queues = contiguous_per_queue(rows)
    assert {b for b, _ in queues} == {"broker-a", "broker-b"} and len(queues) == 4
    assert all(first == 0 for first, _ in queues.values())
    row = next(r for r in rows if bytes(r["value"]) == b"m7")
    assert (row["key"], row["tags"], row["topic"], row["properties"]["i"]) == ("k7", "odd", topic, "7")
    assert row["msgId"] and row["bornTimestamp"] <= row["storeTimestamp"]


def test_batch_read_exact_ranges_and_min_partitions(
    spark: Any, cluster: Any, filled: tuple[str, list[str]]
) -> None:
    topic, _ = filled
    starting = {topic: {"broker-a:0": 10, "broker-b:1": 95}}
    ending = {topic: {"broker-a:0": 25, "broker-a:1": 3, "broker-b:0": 0, "broker-b:1": -1}}
    df = reader(spark, cluster, subscribe=topic, startingOffsets=json.dumps(starting),
                endingOffsets=json.dumps(ending), minPartitions="6")  # fmt: skip
    assert df.rdd.getNumPartitions() >= 6
    ranges = contiguous_per_queue(df.collect())
    assert ranges == {("broker-a", 0): (10, 24), ("broker-a", 1): (0, 2), ("broker-b", 1): (95, 99)}


def test_batch_assign_and_tag_filter(spark: Any, cluster: Any, filled: tuple[str, list[str]]) -> None:
    topic, bodies = filled
    assigned = reader(spark, cluster, assign=json.dumps({topic: ["broker-b:1", 0]})).collect()
    assert {(b, q) for b, q, _ in keys_of(assigned)} == {("broker-a", 0), ("broker-b", 0), ("broker-b", 1)}
    even = spark.read.format("ferrymq").option("nameServer", cluster.ns_addr).option("subscribe", topic) \
        .option("subExpression", "even").option("pullBatchSize", "7").load().collect()  # fmt: skip
    assert_exact(even, [b for b in bodies if int(b[1:]) % 2 == 0])


def test_stream_available_now_with_limits_and_restart(spark: Any, cluster: Any, tmp_path: Path) -> None:
    topic = new_topic(cluster, "Stream")
    first = cluster.produce(topic, 300)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run_once() -> list[int]:
        df = (spark.readStream.format("rocketmq").option("nameServer", cluster.ns_addr)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "120").load())  # fmt: skip
        query = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
                 .trigger(availableNow=True).start())  # fmt: skip
        try:
            assert query.awaitTermination(STREAM_TIMEOUT_S), "availableNow query did not finish"
            assert query.exception() is None
            return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        finally:
            query.stop()

    assert run_once() == [120, 120, 60]  # maxOffsetsPerTrigger honoured under AvailableNow
    assert_exact(spark.read.parquet(str(out)).collect(), first)
    committed = json.loads((ckpt / "offsets" / "2").read_text().splitlines()[-1])
    assert sum(committed[topic].values()) == 300 and len(committed[topic]) == 4

    second = cluster.produce(topic, 150, start=300)
    assert sum(run_once()) == 150  # restart from the checkpoint: only the new messages
    rows = spark.read.parquet(str(out)).collect()
    assert_exact(rows, first + second)  # no duplicates, no gaps
    contiguous_per_queue(rows)


def test_stream_new_queue_starts_at_earliest_and_bad_start_fails(
    spark: Any, cluster: Any, tmp_path: Path
) -> None:
    topic = new_topic(cluster, "Loss")
    bodies = cluster.produce(topic, 40)
    beyond = json.dumps({topic: {"broker-a:0": 10_000}})  # a start past the queue's end: data loss

    def run(fail_on_data_loss: str, name: str) -> Any:
        df = (spark.readStream.format("rocketmq").option("nameServer", cluster.ns_addr).option("subscribe", topic)
              .option("startingOffsets", beyond).option("failOnDataLoss", fail_on_data_loss).load())  # fmt: skip
        return (df.writeStream.format("memory").queryName(name)
                .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())  # fmt: skip

    from pyspark.errors import StreamingQueryException

    strict = run("true", "loss_strict")
    try:
        with pytest.raises(
            StreamingQueryException, match="beyond the queue's maximum offset.*failOnDataLoss=false"
        ):
            strict.awaitTermination(STREAM_TIMEOUT_S)
    finally:
        strict.stop()
    lenient = run("false", "loss_lenient")
    try:
        assert lenient.awaitTermination(STREAM_TIMEOUT_S) and lenient.exception() is None
    finally:
        lenient.stop()
    # broker-a:0 is reset to its earliest; queues not named in startingOffsets start at earliest too
    assert_exact(spark.sql("select * from loss_lenient").collect(), bodies)


def test_write_then_read_back_batch_and_stream(spark: Any, cluster: Any, tmp_path: Path) -> None:
    src, dst = new_topic(cluster, "WriteSrc"), new_topic(cluster, "WriteDst")
    data = [(f"w{i}", f"key{i}", "tagW" if i % 3 else "tagX", {"n": str(i)}, i % 2) for i in range(60)]
    df = spark.createDataFrame(
        data, "value string, key string, tags string, properties map<string,string>, queueId int"
    )
    with pytest.raises(Exception, match="queueId 0 of topic .* is ambiguous.*add a brokerName column"):
        df.write.format("rocketmq").mode("append").option("nameServer", cluster.ns_addr).option(
            "topic", src
        ).save()
    from pyspark.sql import functions as F

    (df.withColumn("brokerName", F.lit("broker-b"))
       .write.format("rocketmq").mode("append").option("nameServer", cluster.ns_addr).option("topic", src).save())  # fmt: skip
    back = reader(spark, cluster, subscribe=src).collect()
    assert sorted(
        (bytes(r["value"]).decode(), r["key"], r["tags"], r["properties"]["n"]) for r in back
    ) == sorted((v, k, t, p["n"]) for v, k, t, p, _ in data)
    assert {(r["brokerName"], r["queueId"]) for r in back} == {("broker-b", 0), ("broker-b", 1)}

    # streaming copy src -> dst keeping each message's queue (brokerName + queueId columns)
    stream = spark.readStream.format("rocketmq").option("nameServer", cluster.ns_addr).option("subscribe", src) \
        .option("startingOffsets", "earliest").load().select("value", "key", "tags", "properties", "queueId", "brokerName")  # fmt: skip
    query = (stream.writeStream.format("rocketmq").option("nameServer", cluster.ns_addr).option("topic", dst)
             .option("checkpointLocation", str(tmp_path / "copy")).trigger(availableNow=True).start())  # fmt: skip
    try:
        assert query.awaitTermination(STREAM_TIMEOUT_S) and query.exception() is None
    finally:
        query.stop()
    copied = reader(spark, cluster, subscribe=dst).collect()
    assert sorted((r["brokerName"], r["queueId"], bytes(r["value"])) for r in copied) == sorted(
        (r["brokerName"], r["queueId"], bytes(r["value"])) for r in back
    )


def test_bad_options_and_modes_fail_at_once(spark: Any, cluster: Any) -> None:
    from pyspark.errors import AnalysisException

    cases = {
        "nameServer": {"subscribe": "T"},
        "subscribe": {"nameServer": cluster.ns_addr},
        "startingOffsets": {"nameServer": cluster.ns_addr, "subscribe": "T", "startingOffsets": "{oops"},
        "readFromSlave": {"nameServer": cluster.ns_addr, "subscribe": "T", "readFromSlave": "sometimes"},
        "bootstrap": {"nameServer": cluster.ns_addr, "subscribe": "T", "bootstrap": "x"},
    }
    for named, options in cases.items():
        with pytest.raises(AnalysisException, match=f"ConfigError: {named}"):
            spark.read.format("rocketmq").options(**options).load()  # load() itself fails
    with pytest.raises(Exception, match="ConfigError: maxOffsetsPerTrigger: is for streaming"):
        reader(spark, cluster, subscribe="T", maxOffsetsPerTrigger="5").collect()
    with pytest.raises(Exception, match="ConfigError: subscribe: topic.*NoSuchTopic"):
        reader(spark, cluster, subscribe="NoSuchTopic").collect()
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(AnalysisException, match="ConfigError: value: column is required"):
        df.write.format("rocketmq").mode("append").option("nameServer", cluster.ns_addr).option(
            "topic", "T"
        ).save()
    ok = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(AnalysisException, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        ok.write.format("rocketmq").option("nameServer", cluster.ns_addr).option(
            "topic", "T"
        ).save()  # no append
    with pytest.raises(AnalysisException, match="ConfigError: mode"):
        ok.write.format("rocketmq").mode("overwrite").option("nameServer", cluster.ns_addr).option(
            "topic", "T"
        ).save()
