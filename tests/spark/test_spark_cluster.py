"""The connector on a Spark standalone cluster: a master and two workers started with ``spark-class``.

As docs/spark.md ("Running on a cluster") describes it: the application is submitted with ``spark-submit
--master spark://...`` and runs one executor (1 core) on each worker; the executors' Python workers import
ferrymq from the installed package. The module starts the cluster once (master, two workers, a name
server and two brokers) and submits one application (this file, run as a script) that does a batch read,
an AvailableNow stream into parquet and a batch write, and saves what it saw in a JSON file; the tests
check that file, the parquet output and the brokers.

Every process is started in its own session and its whole process group is killed at the end (a worker's
executors and their Python workers are in the worker's group), also when a test fails.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Messages in the source topic (spread over 2 brokers x 2 queues).
SOURCE_ROWS = 240
#: Rows the application writes to the sink topic.
WRITE_ROWS = 120
#: maxOffsetsPerTrigger of the AvailableNow stream (several micro-batches).
STREAM_BATCH_ROWS = 100
#: Executors the application waits for before its first job (one per worker).
EXECUTORS = 2
#: Seconds the application waits for its executors.
EXECUTOR_WAIT_S = 120.0


# ---- the application (runs under spark-submit) -------------------------------------------------------


def _wait_for_executors(spark: Any) -> None:
    import time

    deadline = time.monotonic() + EXECUTOR_WAIT_S
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()  # includes the driver's block manager
    while status.size() < EXECUTORS + 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{status.size() - 1} of {EXECUTORS} executors registered")
        time.sleep(0.1)
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()


def run_application(ns_addr: str, source_topic: str, sink_topic: str, out_dir: str) -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("ferrymq-cluster-test").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _wait_for_executors(spark)
    result: dict[str, Any] = {}

    df = spark.read.format("rocketmq").option("nameServer", ns_addr).option("subscribe", source_topic).load()
    result["batch"] = [
        [r["brokerName"], r["queueId"], r["queueOffset"], bytes(r["value"]).decode()]
        for r in df.select("brokerName", "queueId", "queueOffset", "value").collect()
    ]

    stream = (spark.readStream.format("rocketmq").option("nameServer", ns_addr).option("subscribe", source_topic)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(STREAM_BATCH_ROWS))
              .load().select("brokerName", "queueId", "queueOffset", "value"))  # fmt: skip
    query = (stream.writeStream.format("parquet").option("path", os.path.join(out_dir, "stream"))
             .option("checkpointLocation", os.path.join(out_dir, "checkpoint"))
             .trigger(availableNow=True).start())  # fmt: skip
    try:
        query.awaitTermination()
        result["stream_batches"] = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()

    rows = spark.range(WRITE_ROWS, numPartitions=EXECUTORS).selectExpr(
        "CAST(id AS STRING) AS key", "CONCAT('w', CAST(id AS STRING)) AS value"
    )
    rows.write.format("rocketmq").mode("append").option("nameServer", ns_addr).option("topic", sink_topic).save()
    written = spark.read.format("rocketmq").option("nameServer", ns_addr).option("subscribe", sink_topic).load()
    result["written"] = [[r["key"], bytes(r["value"]).decode()] for r in written.collect()]
    result["executors"] = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    Path(out_dir, "result.json").write_text(json.dumps(result))
    spark.stop()


if __name__ == "__main__":
    run_application(*sys.argv[1:5])
    sys.exit(0)


# ---- the tests ------------------------------------------------------------------------------------

import pytest  # noqa: E402

pytestmark = pytest.mark.spark

#: Seconds the master, each worker and the application get to start / finish.
MASTER_START_TIMEOUT_S = 60.0
WORKERS_START_TIMEOUT_S = 90.0
APPLICATION_TIMEOUT_S = 300.0
#: Memory of each worker / executor / daemon JVM (small: the machine is shared).
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"
DAEMON_MEMORY = "256m"
#: Quick-start JVM flags for every JVM of the cluster (tests, not throughput).
JVM_FLAGS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


def _spark_bin(name: str) -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", name)


def _master_state(ui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def _kill_process_group(proc: Any) -> None:
    """SIGKILL what is left of a process's group (executors, Python workers) after it stopped."""
    if proc.popen is None:
        return
    try:
        os.killpg(proc.popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class StandaloneCluster:
    def __init__(self, group: Any, master_url: str, ui_port: int, work_dirs: list[Path]) -> None:
        self.group = group
        self.master_url = master_url
        self.ui_port = ui_port
        self.work_dirs = work_dirs


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    from procs import ProcessGroup, free_port, port_answers, wait_for

    base = tmp_path_factory.mktemp("spark-standalone")
    group = ProcessGroup(base)
    env = {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(base / "local"),
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": JVM_FLAGS,
        "PYSPARK_PYTHON": sys.executable,
    }
    port, ui_port = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    try:
        master = group.spawn("spark-master", [
            _spark_bin("spark-class"), "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port),
        ], env=env)  # fmt: skip
        wait_for(lambda: port_answers(port) and _master_state(ui_port), timeout_s=MASTER_START_TIMEOUT_S,
                 what="the Spark master", alive=[master])  # fmt: skip
        workers, work_dirs = [], []
        for n in range(EXECUTORS):
            work_dir = base / f"worker-{n}"
            work_dirs.append(work_dir)
            workers.append(group.spawn(f"spark-worker-{n}", [
                _spark_bin("spark-class"), "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--webui-port", str(free_port()), "--cores", "1",
                "--memory", WORKER_MEMORY, "--work-dir", str(work_dir), master_url,
            ], env=env))  # fmt: skip

        def registered() -> bool:
            alive = [w for w in _master_state(ui_port)["workers"] if w["state"] == "ALIVE"]
            return len(alive) == EXECUTORS

        wait_for(registered, timeout_s=WORKERS_START_TIMEOUT_S, what="both Spark workers to register",
                 alive=[master, *workers])  # fmt: skip
        yield StandaloneCluster(group, master_url, ui_port, work_dirs)
    except BaseException:
        print(group.dump())
        raise
    finally:
        group.stop_all()
        for proc in group.procs:
            _kill_process_group(proc)


@pytest.fixture(scope="module")
def application(standalone: StandaloneCluster, cluster: Any, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[dict[str, Any], Path, str, list[str]]:  # fmt: skip
    """Submit this file as an application once; its result, output dir, sink topic and source bodies."""
    from procs import wait_for

    source, sink = "SparkClusterSource", "SparkClusterSink"
    cluster.create_topic(source)
    cluster.create_topic(sink)
    bodies = cluster.produce(source, SOURCE_ROWS)
    out = tmp_path_factory.mktemp("spark-standalone-app")
    conf = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": JVM_FLAGS,
        "spark.executor.extraJavaOptions": JVM_FLAGS,
        "spark.executor.cores": "1",
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.cores.max": str(EXECUTORS),
        "spark.pyspark.python": sys.executable,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    argv = [_spark_bin("spark-submit"), "--master", standalone.master_url]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    argv += [os.path.abspath(__file__), cluster.ns_addr, source, sink, str(out)]
    app = standalone.group.spawn("spark-application", argv, env={"SPARK_LOCAL_IP": "127.0.0.1",
                                                                  "PYSPARK_PYTHON": sys.executable})  # fmt: skip
    try:
        wait_for(lambda: app.exited, timeout_s=APPLICATION_TIMEOUT_S, what="the Spark application to finish")
        assert app.returncode == 0, app.tail()
    except BaseException:
        print(standalone.group.dump())
        raise
    finally:
        app.stop()
        _kill_process_group(app)
    return json.loads((out / "result.json").read_text()), out, sink, bodies


def _by_queue(rows: list[list[Any]]) -> dict[tuple[str, int], list[int]]:
    queues: dict[tuple[str, int], list[int]] = {}
    for broker, queue_id, queue_offset, _ in rows:
        queues.setdefault((broker, queue_id), []).append(queue_offset)
    return {q: sorted(offsets) for q, offsets in queues.items()}


def _assert_exact(rows: list[list[Any]], bodies: list[str]) -> None:
    """Every body once, and each queue's offsets 0.. without a gap; the queues sum to the count."""
    assert sorted(r[3] for r in rows) == sorted(bodies)
    queues = _by_queue(rows)
    assert {b for b, _ in queues} == {"broker-a", "broker-b"} and len(queues) == 4
    for queue, offsets in queues.items():
        assert offsets == list(range(len(offsets))), f"gap or duplicate in {queue}"


def test_executors_on_both_workers(standalone: StandaloneCluster, application: Any) -> None:
    result = application[0]
    assert result["executors"] == EXECUTORS
    for work_dir in standalone.work_dirs:  # each worker ran one executor, and that executor ran tasks
        logs = [p.read_text(errors="replace") for p in work_dir.glob("app-*/*/stderr")]
        assert any("Finished task" in text for text in logs), f"no task ran on the worker of {work_dir}"


def test_batch_read_exact(application: Any) -> None:
    result, _, _, bodies = application
    _assert_exact(result["batch"], bodies)


def test_stream_available_now_into_parquet_exact(application: Any) -> None:
    import pyarrow.parquet as pq

    result, out, _, bodies = application
    assert result["stream_batches"] == [STREAM_BATCH_ROWS, STREAM_BATCH_ROWS, SOURCE_ROWS - 2 * STREAM_BATCH_ROWS]
    table = pq.read_table(out / "stream")
    rows = [[r["brokerName"], r["queueId"], r["queueOffset"], r["value"].decode()] for r in table.to_pylist()]
    _assert_exact(rows, bodies)


def test_write_exact(application: Any, cluster: Any) -> None:
    from procs import max_offset, route

    result, _, sink, _ = application
    assert sorted(result["written"]) == sorted([str(i), f"w{i}"] for i in range(WRITE_ROWS))
    sink_route = route(cluster.ns_addr, sink)
    assert sink_route is not None
    queues = {q["brokerName"]: q["writeQueueNums"] for q in sink_route["queueDatas"]}
    stored = sum(max_offset(b.addr, sink, q) for b in cluster.brokers for q in range(queues[b.broker_name]))
    assert stored == WRITE_ROWS  # nothing written twice
