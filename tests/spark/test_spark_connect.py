"""The connector through Spark Connect: a real Connect server and a remote client in another process.

As docs/spark.md ("Spark Connect") describes it: the server is started with ``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`` from the installed pyspark package, with ferrymq
installed in the server's Python (its Python workers run the same interpreter); the formats are found by
Spark's ``pyspark_*`` discovery on the server, with no ``register()`` call. The client is this file run as
a script with ``SparkSession.builder.remote("sc://127.0.0.1:PORT")``, and it cannot import ferrymq at all
(an import hook refuses it): the client needs only ``pyspark[connect]``. One client run does every
scenario (a batch read, an AvailableNow stream into parquet, a write, the exactly-once sink in a stream and
in a batch write) and saves what each saw in a JSON file; each test checks one scenario. The brokers are
the session's name server and two brokers (conftest.py).

The module starts one Connect server and kills its whole process group (the JVM, its Python workers and
streaming runners) at the end, also when a test fails.
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


def run_client(url: str, cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every scenario in one session; what each saw, or its error (one failing does not hide the others)."""
    import time
    import traceback

    from pyspark.sql import SparkSession

    started = time.monotonic()
    spark = SparkSession.builder.remote(url).getOrCreate()
    result: dict[str, dict[str, Any]] = {"session": {"seconds": round(time.monotonic() - started, 1)}}
    ns = cfg["ns"]

    def read(topic: str, fmt: str = "rocketmq") -> Any:
        return spark.read.format(fmt).option("nameServer", ns).option("subscribe", topic).load()

    def stream(topic: str) -> Any:
        return (spark.readStream.format("rocketmq").option("nameServer", ns).option("subscribe", topic)
                .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(cfg["per_trigger"]))
                .load())  # fmt: skip

    def batch() -> dict[str, Any]:
        df = read(cfg["source"])
        return {"columns": df.columns, "rows": _rows(df)}

    def parquet_stream() -> dict[str, Any]:
        query = (stream(cfg["source"]).writeStream.format("parquet").option("path", cfg["parquet"])
                 .option("checkpointLocation", cfg["parquet_checkpoint"]).trigger(availableNow=True).start())  # fmt: skip
        batches = _available_now(query)
        return {"batches": batches, "rows": _rows(spark.read.parquet(cfg["parquet"]))}

    def write() -> dict[str, Any]:
        data = [(f"w{i}", f"key{i}", "tagW", {"i": str(i)}) for i in range(cfg["write_rows"])]
        df = spark.createDataFrame(data, "value string, key string, tags string, properties map<string,string>")
        df.write.format("rocketmq").mode("append").option("nameServer", ns).option("topic", cfg["write"]).save()
        return {"rows": _rows(read(cfg["write"], "ferrymq"))}  # the other format name

    def exactly_once_stream() -> dict[str, Any]:
        query = (stream(cfg["source"]).selectExpr("upper(CAST(value AS STRING)) AS value", "key")
                 .writeStream.format("rocketmq").option("nameServer", ns).option("topic", cfg["eos_stream"])
                 .option("exactlyOnce", "true").option("checkpointLocation", cfg["eos_checkpoint"])
                 .trigger(availableNow=True).start())  # fmt: skip
        batches = _available_now(query)
        return {"batches": batches, "rows": _rows(read(cfg["eos_stream"]))}

    def exactly_once_batch() -> dict[str, Any]:
        df = spark.range(cfg["write_rows"], numPartitions=2).selectExpr("CONCAT('b', CAST(id AS STRING)) AS value")
        (df.write.format("rocketmq").mode("append").option("nameServer", ns).option("topic", cfg["eos_batch"])
           .option("exactlyOnce", "true").save())  # fmt: skip
        return {"rows": _rows(read(cfg["eos_batch"]))}

    for scenario in (batch, parquet_stream, write, exactly_once_stream, exactly_once_batch):
        started = time.monotonic()
        try:
            result[scenario.__name__] = scenario()
        except Exception:
            result[scenario.__name__] = {"error": traceback.format_exc()}
        result[scenario.__name__]["seconds"] = round(time.monotonic() - started, 1)
    spark.stop()
    return result


if __name__ == "__main__":
    sys.meta_path.insert(0, _RefuseServerSideModules())
    _url, _cfg, _out = sys.argv[1:4]
    Path(_out).write_text(json.dumps(run_client(_url, json.loads(_cfg))))
    sys.exit(0)


# ---- the tests ------------------------------------------------------------------------------------

import pytest  # noqa: E402

#: Seconds the Connect server gets to answer on its port, and the client to run every scenario; the first
#: test's setup does both (on a loaded 2-core machine the whole module took up to 210 s), hence its timeout.
SERVER_START_TIMEOUT_S = 120.0
CLIENT_TIMEOUT_S = 420.0
TEST_TIMEOUT_S = 600

pytestmark = [pytest.mark.spark, pytest.mark.timeout(TEST_TIMEOUT_S)]
#: Memory and quick-start flags of the server's JVM (tests, not throughput; the machine is shared).
DRIVER_MEMORY = "1g"
JVM_FLAGS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: Characters of the server's log (and of the client's stderr) shown when a scenario fails.
SERVER_LOG_TAIL_CHARS = 8000
#: Queues per broker of each topic (two brokers), messages in the source topic, maxOffsetsPerTrigger of the
#: streams (two micro-batches).
QUEUES_PER_BROKER = 2
SOURCE_ROWS = 200
PER_TRIGGER = 120
#: Rows of each batch write.
WRITE_ROWS = 60


def _spark_submit() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")


def _kill_process_group(proc: Any) -> None:
    """SIGKILL the server's whole group (the JVM, its Python workers and streaming runners)."""
    if proc.popen is not None:
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class ConnectServer:
    def __init__(self, url: str, proc: Any) -> None:
        self.url = url
        self.proc = proc

    def log_tail(self) -> str:
        return str(self.proc.tail(SERVER_LOG_TAIL_CHARS))


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A Spark Connect server (local[2]) on a free loopback port."""
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
        yield ConnectServer(f"sc://127.0.0.1:{port}", server)
    except BaseException:
        print(group.dump())
        raise
    finally:
        if server is not None:
            _kill_process_group(server)  # nothing of the server's state is kept: no graceful stop needed
        group.stop_all()


class Seen:
    """What the client saw per scenario, and what the topics hold."""

    def __init__(self, server: ConnectServer, result: dict[str, dict[str, Any]], bodies: list[str],
                 queue_ends: dict[tuple[str, int], int]) -> None:  # fmt: skip
        self.server = server
        self.result = result
        #: the source topic's bodies and every queue's max offset (GET_MAX_OFFSET on its broker)
        self.bodies = bodies
        self.queue_ends = queue_ends

    def __getitem__(self, scenario: str) -> dict[str, Any]:
        got = self.result[scenario]
        if "error" in got:
            pytest.fail(f"{scenario} failed in the Connect client:\n{got['error']}\n"
                        f"----- the server's log -----\n{self.server.log_tail()}")  # fmt: skip
        return got


@pytest.fixture(scope="module")
def seen(connect_server: ConnectServer, cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Seen:
    """One client process runs every scenario against the server (one client start for the module)."""
    from procs import max_offset

    base = tmp_path_factory.mktemp("spark-connect-client")
    run = next(_runs)
    topics = {name: f"Connect{name.title().replace('_', '')}{run}"
              for name in ("source", "write", "eos_stream", "eos_batch")}  # fmt: skip
    for topic in topics.values():
        cluster.create_topic(topic, queues=QUEUES_PER_BROKER)
    bodies = cluster.produce(topics["source"], SOURCE_ROWS)
    queue_ends = {(b.broker_name, q): max_offset(b.addr, topics["source"], q)
                  for b in cluster.brokers for q in range(QUEUES_PER_BROKER)}  # fmt: skip
    cfg = {
        "ns": cluster.ns_addr, **topics, "per_trigger": PER_TRIGGER, "write_rows": WRITE_ROWS,
        "parquet": str(base / "parquet"), "parquet_checkpoint": str(base / "parquet-checkpoint"),
        "eos_checkpoint": str(base / "eos-checkpoint"),
    }  # fmt: skip
    out = base / "seen.json"
    # the client gets none of the server's Spark settings: it is a plain remote client
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), connect_server.url, json.dumps(cfg), str(out)],
        env=env, cwd=base, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.fail(f"the Connect client exited {proc.returncode}:\n{proc.stderr[-SERVER_LOG_TAIL_CHARS:]}\n"
                    f"----- the server's log -----\n{connect_server.log_tail()}")  # fmt: skip
    return Seen(connect_server, json.loads(out.read_text()), bodies, queue_ends)


_runs = iter(range(1_000_000))


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


def assert_whole_queues(rows: list[list[Any]], seen: Seen) -> None:
    """Every queue of the source topic read from offset 0 to its max offset, nothing else."""
    assert {queue: offsets[-1] + 1 for queue, offsets in per_queue(rows).items()} == seen.queue_ends


def test_batch_read_through_connect(seen: Seen) -> None:
    got = seen["batch"]
    assert got["columns"] == ["key", "value", "topic", "brokerName", "queueId", "queueOffset", "tags", "msgId",
                              "bornTimestamp", "storeTimestamp", "properties"]  # fmt: skip
    assert_exact(got["rows"], seen.bodies)
    assert_whole_queues(got["rows"], seen)
    assert {b for b, _ in seen.queue_ends} == {"broker-a", "broker-b"} and len(seen.queue_ends) == 4
    row = next(r for r in got["rows"] if r[3] == "m7")
    assert row[4:] == ["k7", "odd", "7"]


def test_available_now_stream_into_parquet_through_connect(seen: Seen) -> None:
    got = seen["parquet_stream"]
    assert got["batches"] == [120, 80]  # maxOffsetsPerTrigger honoured
    assert_exact(got["rows"], seen.bodies)
    assert_whole_queues(got["rows"], seen)


def test_write_through_connect(seen: Seen) -> None:
    got = seen["write"]
    assert sorted((r[3], r[4], r[5], r[6]) for r in got["rows"]) == sorted(
        (f"w{i}", f"key{i}", "tagW", str(i)) for i in range(WRITE_ROWS)
    )
    per_queue(got["rows"])


def test_exactly_once_stream_through_connect(seen: Seen) -> None:
    got = seen["exactly_once_stream"]
    assert got["batches"] == [120, 80]
    assert_exact(got["rows"], [b.upper() for b in seen.bodies])


def test_exactly_once_batch_write_through_connect(seen: Seen) -> None:
    got = seen["exactly_once_batch"]
    assert sorted(r[3] for r in got["rows"]) == sorted(f"b{i}" for i in range(WRITE_ROWS))
    per_queue(got["rows"])
