"""What a streaming query costs before its first trigger in the connector's driver-side process.

PySpark runs a Python source's driver-side calls in a Python process it starts for each streaming query
(``pyspark.sql.streaming.python_streaming_source_runner``). This script replays what that process does for
an AvailableNow query of the connector, in a fresh interpreter per run, against its own name server and two
brokers, and times each step (median of ``--runs``):

| step        | what the runner does                                                               |
|-------------|------------------------------------------------------------------------------------|
| pyspark     | imports its own modules (not the connector's: shown for scale)                     |
| import      | unpickles the data source (imports ``ferrymq.spark.source`` and what it imports)   |
| reader      | ``streamReader(schema)``, the supported-features check, ``getDefaultReadLimit()``   |
| prepare     | ``prepareForTriggerAvailableNow()``: the first network calls (client start, routes) |
| initial     | ``initialOffset()``                                                                |
| latest      | ``latestOffset(start, limit)`` and ``reportLatestOffset()``                        |
| partitions  | ``partitions(start, end)`` of the first micro-batch                                |

One more run counts the remoting requests of those steps by destination and request code.

    python benchmarks/spark_stream_startup.py                  # 1 topic, 2 brokers x 4 queues, 7 runs
    python benchmarks/spark_stream_startup.py --topics 4 --queues 16
    python benchmarks/spark_stream_startup.py --spark          # also start() -> end of an AvailableNow query

``--spark`` also times whole AvailableNow queries of the same small topic into Spark's ``noop`` sink in one
local[2] SparkSession (the first query is a warm-up), beside a parquet stream of the same rows: the
difference is what a Python source's streaming runner adds per query.

Not a test: it prints a table and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STEPS = ("pyspark", "import", "reader", "prepare", "initial", "latest", "partitions")
#: Steps that are the connector's own (everything but PySpark's imports).
CONNECTOR_STEPS = STEPS[1:]
#: Messages per topic (small: the point is the cost before the first trigger, not reading).
MESSAGES_PER_TOPIC = 1000
#: Seconds one replay may take.
CHILD_TIMEOUT_S = 120.0


# ---- the replay (a fresh interpreter per run) -----------------------------------------------------------


def _count_requests(counts: collections.Counter[tuple[str, str]], ns_addrs: set[str]) -> None:
    """Wrap the client's transport so every request is counted by (destination, request code)."""
    from ferrymq.client.instance import ClientInstance
    from ferrymq.remoting.codes import RequestCode

    def name(code: int) -> str:
        try:
            return RequestCode(code).name
        except ValueError:
            return str(code)

    def where(addr: str) -> str:
        return "name server" if addr in ns_addrs else f"broker {addr}"

    invoke, oneway = ClientInstance.invoke, ClientInstance.invoke_oneway

    async def counted_invoke(self: Any, addr: str, cmd: Any, timeout_ms: int | None = None) -> Any:
        counts[(where(addr), name(cmd.code))] += 1
        return await invoke(self, addr, cmd, timeout_ms)

    async def counted_oneway(self: Any, addr: str, cmd: Any) -> None:
        counts[(where(addr), name(cmd.code))] += 1
        await oneway(self, addr, cmd)

    ClientInstance.invoke = counted_invoke  # type: ignore[method-assign]
    ClientInstance.invoke_oneway = counted_oneway  # type: ignore[method-assign]


def replay(pickled_source: Path, schema_json: str, ns_addr: str, count: bool) -> dict[str, Any]:
    import pickle

    times: dict[str, float] = {}
    t0 = time.perf_counter()
    import pyspark.sql.streaming.python_streaming_source_runner as runner
    from pyspark.sql.types import _parse_datatype_json_string

    t1 = time.perf_counter()
    times["pyspark"] = t1 - t0
    data_source = pickle.loads(pickled_source.read_bytes())
    t2 = time.perf_counter()
    times["import"] = t2 - t1
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    if count:  # outside the timed steps: importing the client here would move its cost out of them
        _count_requests(counts, set(ns_addr.split(";")))
    t2 = time.perf_counter()
    reader = runner._streamReader(data_source, _parse_datatype_json_string(schema_json))
    limit = reader.getDefaultReadLimit()
    t3 = time.perf_counter()
    times["reader"] = t3 - t2
    reader.prepareForTriggerAvailableNow()
    t4 = time.perf_counter()
    times["prepare"] = t4 - t3
    start = reader.initialOffset()
    t5 = time.perf_counter()
    times["initial"] = t5 - t4
    end = reader.latestOffset(start, limit)
    reader.reportLatestOffset()
    t6 = time.perf_counter()
    times["latest"] = t6 - t5
    partitions = reader.partitions(start, end)
    times["partitions"] = time.perf_counter() - t6
    return {"times": times, "partitions": len(partitions),
            "requests": [[where, code, n] for (where, code), n in sorted(counts.items())]}  # fmt: skip


def run_replay(pickled: Path, schema_json: str, ns_addr: str, count: bool) -> dict[str, Any]:
    argv = [sys.executable, os.path.abspath(__file__), "--replay", str(pickled), schema_json, ns_addr]
    out = subprocess.run(argv + (["--count"] if count else []), capture_output=True, text=True, check=False,
                         timeout=CHILD_TIMEOUT_S)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"replay failed:\n{out.stderr[-4000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# ---- whole queries in Spark -----------------------------------------------------------------------------


def spark_queries(ns_addr: str, topics: list[str], runs: int, base: Path) -> tuple[list[float], list[float]]:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    try:
        rows = spark.read.format("rocketmq").option("nameServer", ns_addr).option("subscribe", ",".join(topics))
        rows.load().write.parquet(str(base / "rows"))

        def query(n: int, parquet: bool) -> float:
            reader = spark.readStream
            if parquet:
                df = reader.schema(spark.read.parquet(str(base / "rows")).schema).parquet(str(base / "rows"))
            else:
                df = (reader.format("rocketmq").option("nameServer", ns_addr).option("subscribe", ",".join(topics))
                      .option("startingOffsets", "earliest").load())  # fmt: skip
            started = time.perf_counter()
            q = (df.writeStream.format("noop").option("checkpointLocation", str(base / f"ck-{parquet}-{n}"))
                 .trigger(availableNow=True).start())  # fmt: skip
            q.awaitTermination()
            return time.perf_counter() - started

        query(-1, False)  # warm-up of both
        query(-1, True)
        rocket, parquet = [], []
        for n in range(runs):
            rocket.append(query(n, False))
            parquet.append(query(n, True))
        return rocket, parquet
    finally:
        spark.stop()


# ---- main -----------------------------------------------------------------------------------------------


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--replay":
        pickled, schema_json, ns_addr = sys.argv[2:5]
        print(json.dumps(replay(Path(pickled), schema_json, ns_addr, "--count" in sys.argv[5:])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="replays (and Spark queries) whose median is shown")
    parser.add_argument("--topics", type=int, default=1, help="topics subscribed")
    parser.add_argument("--queues", type=int, default=4, help="queues per topic per broker")
    parser.add_argument("--spark", action="store_true", help="also time whole AvailableNow queries in Spark")
    args = parser.parse_args()

    import spark_read
    from pyspark import cloudpickle

    from ferrymq.spark.source import RocketMQDataSource, source_schema

    spark_read.QUEUES_PER_BROKER = args.queues
    base = Path(tempfile.mkdtemp(prefix="ferrymq-stream-startup-"))
    cluster = None
    try:
        cluster = spark_read.LocalCluster(2, base)
        topics = [f"StartupBench{i}" for i in range(args.topics)]
        for topic in topics:
            asyncio.run(spark_read.create_topic(cluster.ns_addr, cluster.brokers, topic))
            asyncio.run(spark_read.produce(cluster.ns_addr, topic, MESSAGES_PER_TOPIC, 100))
        options = {"nameServer": cluster.ns_addr, "subscribe": ",".join(topics), "startingOffsets": "earliest"}
        pickled = base / "source.pickle"
        pickled.write_bytes(cloudpickle.dumps(RocketMQDataSource(options)))
        schema_json = source_schema().json()
        results = [run_replay(pickled, schema_json, cluster.ns_addr, count=False) for _ in range(args.runs)]
        counted = run_replay(pickled, schema_json, cluster.ns_addr, count=True)

        queues = 2 * args.queues * args.topics
        print(f"stream startup in the source runner: {args.topics} topic(s), {queues} queues, "
              f"{counted['partitions']} partitions; median of {args.runs} fresh interpreters (ms)")  # fmt: skip
        print(f"{'step':<12}{'median':>9}{'min':>9}{'max':>9}")
        for step in STEPS:
            values = [r["times"][step] * 1000 for r in results]
            print(f"{step:<12}{statistics.median(values):>9.1f}{min(values):>9.1f}{max(values):>9.1f}")
        totals = [sum(r["times"][s] for s in CONNECTOR_STEPS) * 1000 for r in results]
        print(f"{'connector':<12}{statistics.median(totals):>9.1f}{min(totals):>9.1f}{max(totals):>9.1f}"
              "   (every step but pyspark)")  # fmt: skip
        total_requests = sum(n for _, _, n in counted["requests"])
        print(f"\nremoting requests of those steps: {total_requests}")
        for where, code, n in counted["requests"]:
            print(f"  {n:>5}  {code:<36} {where}")
        if args.spark:
            rocket, parquet = spark_queries(cluster.ns_addr, topics, args.runs, base)
            print(f"\nwhole AvailableNow queries into noop, start() to termination (s, median of {args.runs}): "
                  f"rocketmq {statistics.median(rocket):.3f} (min {min(rocket):.3f}), "
                  f"parquet {statistics.median(parquet):.3f} (min {min(parquet):.3f})")  # fmt: skip
    finally:
        if cluster is not None:
            cluster.close()
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
