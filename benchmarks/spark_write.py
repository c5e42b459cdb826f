"""Spark sink write throughput: ``df.write.format("rocketmq")`` of 1 KiB rows into one local broker, in MB/s
of message bodies, beside the same DataFrame written to parquet in the same SparkSession.

    python benchmarks/spark_write.py                  # 300k x 1 KiB rows, own name server + 1 broker
    python benchmarks/spark_write.py -n 100000 --size 100
    python benchmarks/spark_write.py --key            # rows carry a key: placed by key hash
    python benchmarks/spark_write.py --exactly-once   # and the exactly-once sink (exactlyOnce=true) beside it

The DataFrame is built once and cached (in the JVM) before the timed rounds, so the rounds time the sink alone:
Arrow hand-off to Python, message building, SEND_BATCH requests per queue, the broker's store. Every round
writes every row (``--rounds``, default 3, after one untimed warm-up round of each pipeline; the median is
printed with all rounds beside it).

Not a test: it prints a table and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_read import LocalCluster, create_topic, spark_session, tear_down  # noqa: E402 - the shared cluster helpers

MB = 1_000_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--rows", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes per row")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2, help="DataFrame partitions (writer tasks)")
    parser.add_argument("--key", action="store_true", help="give every row a key (key-hash placement)")
    parser.add_argument("--exactly-once", action="store_true", help="also time the exactly-once sink")
    parser.add_argument("--broker-conf", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="ferrymq-spark-write-"))
    cluster: LocalCluster | None = None
    spark = None
    try:
        cluster = LocalCluster(1, base, args.broker_conf)
        topic = f"SparkWrite{int(time.time())}"
        asyncio.run(create_topic(cluster.ns_addr, cluster.brokers, topic))

        from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

        spark = spark_session(args.master)
        columns = [F.expr(f"unhex(repeat('78', {args.size}))").alias("value")]
        if args.key:
            columns.append(F.concat(F.lit("order-"), (F.col("id") % 10_000).cast("string")).alias("key"))
        df = spark.range(args.rows, numPartitions=args.partitions).select(*columns).cache()
        df.count()  # materialise the cache outside the timed rounds
        opts = {"nameServer": cluster.ns_addr, "topic": topic}
        # one untimed round of each pipeline: the first full write of a JVM pays seconds of JIT warm-up
        df.write.format("rocketmq").options(**opts).mode("append").save()
        df.write.mode("overwrite").parquet(str(base / "warm-up"))

        body_mb = args.rows * args.size / MB
        eos_opts = {**opts, "exactlyOnce": "true"}
        if args.exactly_once:
            df.write.format("rocketmq").options(**eos_opts).mode("append").save()
        rocket_s: list[float] = []
        eos_s: list[float] = []
        parquet_s: list[float] = []
        for rnd in range(args.rounds):
            started = time.perf_counter()
            df.write.format("rocketmq").options(**opts).mode("append").save()
            rocket_s.append(time.perf_counter() - started)
            if args.exactly_once:
                started = time.perf_counter()
                df.write.format("rocketmq").options(**eos_opts).mode("append").save()
                eos_s.append(time.perf_counter() - started)
            out = base / f"pq{rnd}"
            started = time.perf_counter()
            df.write.mode("overwrite").parquet(str(out))
            parquet_s.append(time.perf_counter() - started)
            shutil.rmtree(out, ignore_errors=True)

        def line(name: str, secs: list[float]) -> str:
            med = statistics.median(secs)
            rounds = ", ".join(f"{body_mb / s:,.0f}" for s in secs)
            return f"{name:<28}{args.rows:>10,}{med:>9.2f}{body_mb / med:>10,.0f}{args.rows / med:>12,.0f}   {rounds}"

        print(f"\n{'pipeline':<28}{'rows':>10}{'med s':>9}{'MB/s':>10}{'rows/s':>12}   rounds (MB/s)")
        print(line("cached df -> rocketmq", rocket_s))
        if eos_s:
            print(line("cached df -> rocketmq (EOS)", eos_s))
            print(f"exactly-once / at-least-once throughput: {statistics.median(rocket_s) / statistics.median(eos_s):.2f}x")
        print(line("cached df -> parquet", parquet_s))
        print(f"rows of {args.size} B{' with a key' if args.key else ''}, {args.partitions} writer tasks, "
              f"{args.master}; MB = 10^6 bytes of message bodies")
    finally:
        tear_down(spark, cluster, base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
