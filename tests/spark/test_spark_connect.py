"""The connector through Spark Connect: a real Connect server and a remote client in another process.

As docs/spark.md ("Spark Connect") describes it: the server is started with ``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`` from the installed pyspark package, with ferrymq
installed in the server's Python (its Python workers run the same interpreter); the formats are found by
Spark's ``pyspark_*`` discovery on the server, with no ``register()`` call. The client is this file run as
a script with ``SparkSession.builder.remote("sc://127.0.0.1:PORT")``, and it cannot import ferrymq at all
(an import hook refuses it): the client needs only ``pyspark[connect]``. Each test runs one client
(a batch read, an AvailableNow stream into parquet, a write, the exactly-once sink), which saves what it
saw in a JSON file that the test checks; the brokers are the session's name server and two brokers.

The module starts one Connect server and stops it, with its whole process group (its Python workers and
streaming runners), also when a test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Top-level modules the client must not need (it refuses to import them).
SERVER_SIDE_MODULES = ("ferrymq", "pyspark_rocketmq", "pyspark_ferrymq")
#: Seconds an AvailableNow query through Connect gets to finish.
STREAM_TIMEOUT_S = 120


# ---- the client (runs as a script, in a process without ferrymq) -------------------------------------


class _RefuseServerSideModules:
    """A meta path finder that fails every import of ferrymq, to prove the client does not need it."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in SERVER_SIDE_MODULES:
            raise ImportError(f"{name} must not be needed by a Spark Connect client")
        return None


def _rows(df: Any) -> list[list[Any]]:
    """[brokerName, queueId, queueOffset, value, key, tags, property i] of every row."""
    return [
        [r["brokerName"], r["queueId"], r["queueOffset"], bytes(r["value"]).decode(), r["key"], r["tags"],
         (r["properties"] or {}).get("i")]
        for r in df.select("brokerName", "queueId", "queueOffset", "value", "key", "tags", "properties").collect()
    ]  # fmt: skip


def _available_now(query: Any) -> list[int]:
    """Wait for an AvailableNow query; the input rows of its micro-batches."""
    try:
        if not query.awaitTermination(STREAM_TIMEOUT_S):
            raise TimeoutError("the availableNow query did not finish")
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        # attributes, not p["numInputRows"]: a progress rebuilt from JSON by the Connect client answers
        # None to the dict form for this derived field
        return [p.numInputRows for p in query.recentProgress if p.numInputRows]
    finally:
        query.stop()


def run_client(url: str, scenario: str, cfg: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    ns = cfg["ns"]

    def read(topic: str) -> Any:
        return spark.read.format("rocketmq").option("nameServer", ns).option("subscribe", topic).load()

    def stream(topic: str) -> Any:
        return (spark.readStream.format("rocketmq").option("nameServer", ns).option("subscribe", topic)
                .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(cfg["per_trigger"]))
                .load())  # fmt: skip

    result: dict[str, Any] = {}
    if scenario == "batch":
        df = read(cfg["topic"])
        result["columns"] = df.columns
        result["rows"] = _rows(df)
        ranged = (spark.read.format("ferrymq").option("nameServer", ns).option("subscribe", cfg["topic"])
                  .option("startingOffsets", json.dumps(cfg["starting"]))
                  .option("endingOffsets", json.dumps(cfg["ending"])).load())  # fmt: skip
        result["ranged"] = _rows(ranged)
    elif scenario == "stream":
        query = (stream(cfg["topic"]).writeStream.format("parquet").option("path", cfg["out"])
                 .option("checkpointLocation", cfg["checkpoint"]).trigger(availableNow=True).start())  # fmt: skip
        result["batches"] = _available_now(query)
        result["rows"] = _rows(spark.read.parquet(cfg["out"]))
    elif scenario == "write":
        data = [(f"w{i}", f"key{i}", "tagW", {"i": str(i)}) for i in range(cfg["rows"])]
        df = spark.createDataFrame(data, "value string, key string, tags string, properties map<string,string>")
        df.write.format("rocketmq").mode("append").option("nameServer", ns).option("topic", cfg["topic"]).save()
        result["rows"] = _rows(read(cfg["topic"]))
    elif scenario == "exactly-once-stream":
        query = (stream(cfg["source"]).selectExpr("upper(CAST(value AS STRING)) AS value", "key")
                 .writeStream.format("rocketmq").option("nameServer", ns).option("topic", cfg["sink"])
                 .option("exactlyOnce", "true").option("checkpointLocation", cfg["checkpoint"])
                 .trigger(availableNow=True).start())  # fmt: skip
        result["batches"] = _available_now(query)
        result["rows"] = _rows(read(cfg["sink"]))
    elif scenario == "exactly-once-batch":
        df = spark.range(cfg["rows"], numPartitions=2).selectExpr("CONCAT('b', CAST(id AS STRING)) AS value")
        (df.write.format("rocketmq").mode("append").option("nameServer", ns).option("topic", cfg["topic"])
           .option("exactlyOnce", "true").save())  # fmt: skip
        result["rows"] = _rows(read(cfg["topic"]))
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    spark.stop()
    return result


if __name__ == "__main__":
    sys.meta_path.insert(0, _RefuseServerSideModules())
    _url, _scenario, _cfg, _out = sys.argv[1:5]
    Path(_out).write_text(json.dumps(run_client(_url, _scenario, json.loads(_cfg))))
    sys.exit(0)


# ---- the tests ------------------------------------------------------------------------------------

import pytest  # noqa: E402

pytestmark = pytest.mark.spark

#: Seconds the Connect server gets to answer on its port, and one client run to finish.
SERVER_START_TIMEOUT_S = 120.0
CLIENT_TIMEOUT_S = 240.0
#: Memory and quick-start flags of the server's JVM (tests, not throughput; the machine is shared).
DRIVER_MEMORY = "1g"
JVM_FLAGS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
#: Messages in the source topics (2 brokers x 2 queues) and maxOffsetsPerTrigger of the streams.
SOURCE_ROWS = 200
PER_TRIGGER = 80
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _spark_submit() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")


def _kill_process_group(proc: Any) -> None:
    """SIGKILL what is left of the server's group (its Python workers) after the server stopped."""
    if proc.popen is not None:
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class ConnectServer:
    def __init__(self, url: str, base: Path, group: Any) -> None:
        self.url = url
        self.base = base
        self.group = group

    def run(self, scenario: str, **cfg: Any) -> dict[str, Any]:
        """Run the client script for ``scenario``; what it saw."""
        out = self.base / f"client-{scenario}-{os.getpid()}-{len(list(self.base.glob('client-*')))}.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), self.url, scenario, json.dumps(cfg), str(out)],
            env=env, cwd=self.base, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=CLIENT_TIMEOUT_S,
        )  # fmt: skip
        if proc.returncode != 0:
            print(self.group.dump())
            raise AssertionError(f"client {scenario} exited {proc.returncode}:\n{proc.stderr[-8000:]}")
        return dict(json.loads(out.read_text()))


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    from procs import ProcessGroup, free_port, port_answers, wait_for

    base = tmp_path_factory.mktemp("spark-connect")
    group = ProcessGroup(base)
    port = free_port()
    env = {
        # the server's Python workers and its data source look-up run this interpreter, which has ferrymq
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(base / "local"),
    }
    server = None
    try:
        server = group.spawn("spark-connect-server", [
            _spark_submit(), "--class", CONNECT_SERVER_CLASS, "--master", "local[2]",
            "--name", "ferrymq-connect-test", "--driver-memory", DRIVER_MEMORY, "--driver-java-options", JVM_FLAGS,
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.sql.shuffle.partitions=2",
            "--conf", "spark.sql.session.timeZone=UTC",
        ], env=env)  # fmt: skip
        wait_for(lambda: port_answers(port), timeout_s=SERVER_START_TIMEOUT_S,
                 what="the Spark Connect server to answer", alive=[server])  # fmt: skip
        yield ConnectServer(f"sc://127.0.0.1:{port}", base, group)
    except BaseException:
        print(group.dump())
        raise
    finally:
        group.stop_all()
        if server is not None:
            _kill_process_group(server)


_topic_ids = iter(range(1_000_000))


def new_topic(cluster: Any, prefix: str) -> str:
    topic = f"Connect{prefix}{next(_topic_ids)}"
    cluster.create_topic(topic)
    return topic


def per_queue(rows: list[list[Any]]) -> dict[tuple[str, int], list[int]]:
    """(broker, queue) -> sorted offsets, asserting no duplicate (queue, offset)."""
    keys = [(b, q, o) for b, q, o, *_ in rows]
    assert len(keys) == len(set(keys)), "duplicate rows"
    queues: dict[tuple[str, int], list[int]] = {}
    for b, q, o in keys:
        queues.setdefault((b, q), []).append(o)
    return {queue: sorted(offsets) for queue, offsets in queues.items()}


def assert_exact(rows: list[list[Any]], bodies: list[str]) -> None:
    """Exactly ``bodies``, once each, every queue contiguous from offset 0."""
    assert sorted(r[3] for r in rows) == sorted(bodies)
    for queue, offsets in per_queue(rows).items():
        assert offsets == list(range(len(offsets))), f"gap in {queue}"


def test_batch_read_through_connect(connect: ConnectServer, cluster: Any) -> None:
    topic = new_topic(cluster, "Batch")
    bodies = cluster.produce(topic, SOURCE_ROWS)
    starting = {topic: {"broker-a:0": 10, "broker-b:1": 30}}
    ending = {topic: {"broker-a:0": 20, "broker-a:1": 3, "broker-b:0": 0, "broker-b:1": -1}}
    seen = connect.run("batch", ns=cluster.ns_addr, topic=topic, starting=starting, ending=ending)
    assert seen["columns"] == ["key", "value", "topic", "brokerName", "queueId", "queueOffset", "tags", "msgId",
                               "bornTimestamp", "storeTimestamp", "properties"]  # fmt: skip
    assert_exact(seen["rows"], bodies)
    queues = per_queue(seen["rows"])
    assert len(queues) == 4 and sum(len(o) for o in queues.values()) == SOURCE_ROWS
    row = next(r for r in seen["rows"] if r[3] == "m7")
    assert row[4:] == ["k7", "odd", "7"]
    ranged = per_queue(seen["ranged"])
    last_b1 = queues[("broker-b", 1)][-1]
    assert ranged == {("broker-a", 0): list(range(10, 20)), ("broker-a", 1): [0, 1, 2],
                      ("broker-b", 1): list(range(30, last_b1 + 1))}  # fmt: skip


def test_available_now_stream_into_parquet_through_connect(
    connect: ConnectServer, cluster: Any, tmp_path: Path
) -> None:
    topic = new_topic(cluster, "Stream")
    first = cluster.produce(topic, SOURCE_ROWS)
    cfg = {"ns": cluster.ns_addr, "topic": topic, "per_trigger": PER_TRIGGER,
           "out": str(tmp_path / "out"), "checkpoint": str(tmp_path / "checkpoint")}  # fmt: skip
    seen = connect.run("stream", **cfg)
    assert seen["batches"] == [80, 80, 40]  # maxOffsetsPerTrigger honoured
    assert_exact(seen["rows"], first)

    second = cluster.produce(topic, 50, start=SOURCE_ROWS)
    again = connect.run("stream", **cfg)  # a new client, the same checkpoint: only the new messages
    assert again["batches"] == [50]
    assert_exact(again["rows"], first + second)


def test_write_through_connect(connect: ConnectServer, cluster: Any) -> None:
    topic = new_topic(cluster, "Write")
    seen = connect.run("write", ns=cluster.ns_addr, topic=topic, rows=60)
    assert sorted((r[3], r[4], r[5], r[6]) for r in seen["rows"]) == sorted(
        (f"w{i}", f"key{i}", "tagW", str(i)) for i in range(60)
    )
    per_queue(seen["rows"])


def test_exactly_once_sink_through_connect(connect: ConnectServer, cluster: Any, tmp_path: Path) -> None:
    source, sink = new_topic(cluster, "EosSource"), new_topic(cluster, "EosSink")
    first = cluster.produce(source, SOURCE_ROWS)
    cfg = {"ns": cluster.ns_addr, "source": source, "sink": sink, "per_trigger": PER_TRIGGER,
           "checkpoint": str(tmp_path / "checkpoint")}  # fmt: skip
    seen = connect.run("exactly-once-stream", **cfg)
    assert seen["batches"] == [80, 80, 40]
    assert_exact(seen["rows"], [b.upper() for b in first])

    second = cluster.produce(source, 50, start=SOURCE_ROWS)
    again = connect.run("exactly-once-stream", **cfg)  # restart from the checkpoint: nothing written twice
    assert again["batches"] == [50]
    assert_exact(again["rows"], [b.upper() for b in first + second])

    batch_topic = new_topic(cluster, "EosBatch")
    written = connect.run("exactly-once-batch", ns=cluster.ns_addr, topic=batch_topic, rows=120)
    assert sorted(r[3] for r in written["rows"]) == sorted(f"b{i}" for i in range(120))
    per_queue(written["rows"])
