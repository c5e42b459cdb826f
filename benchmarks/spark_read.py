"""Spark connector read throughput: rows/s of batch and streaming reads of a topic, beside the same
pipeline reading the same rows from parquet, in the same run and the same SparkSession.

    python benchmarks/spark_read.py                    # 1M x 100-byte messages, own namesrv + 2 brokers
    python benchmarks/spark_read.py -n 100000          # fewer messages
    python benchmarks/spark_read.py --pull-caps rocketmq   # brokers keep RocketMQ's per-pull caps (32 / 256 KiB)
    python benchmarks/spark_read.py --name-server 127.0.0.1:9876 --topic Existing --no-produce

The started brokers raise their per-pull caps for a Spark pipeline (``--pull-caps spark``, the default:
``SPARK_PULL_CAPS``, as docs/spark.md recommends); ``--pull-caps rocketmq`` keeps RocketMQ's defaults, where
every PULL answers at most 32 messages / 256 KiB.

Pipelines (each ends in a parquet write, so both sides do the same sink work):

| row                        | source                                               |
|----------------------------|------------------------------------------------------|
| rocketmq batch → parquet   | spark.read.format("rocketmq")                        |
| parquet batch → parquet    | spark.read.parquet(the rows the first pipeline wrote) |
| rocketmq stream → parquet  | readStream, trigger(availableNow=True)               |
| parquet stream → parquet   | readStream.parquet, trigger(availableNow=True)       |

Every pipeline runs ``--rounds`` times (default 2), alternating, and the best round is shown with all
rounds beside it: the first parquet write of a JVM pays seconds of JIT warm-up, whichever pipeline it is.
Messages are loaded with SEND_BATCH_MESSAGE (256 per batch, 16 batches in flight).

The floor of PySpark's Python Data Source API: ``--floor`` adds a pipeline whose source is a Python data source
that plans the same ranges but serves each one from batches the connector already decoded and cached in the
worker process on an untimed first read (no pull, no decode: only what PySpark does with the batches a Python
source yields). It bounds what any Python source can reach here; the rocketmq pipeline's distance to it is the
connector's own cost.

After the table it prints the stages of the batch read: the connector alone in this process (pull + decode,
decode alone), and both sources in Spark into a ``noop`` sink (so the rocketmq figure is pull, decode and the
Arrow hand-off to the JVM, without the parquet writer).

Not a test: it prints a table and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

#: Messages per SEND_BATCH_MESSAGE while filling the topic.
PRODUCE_BATCH = 256
PRODUCE_CONCURRENCY = 16
PRODUCE_SEND_TIMEOUT_MS = 30_000
QUEUES_PER_BROKER = 4
START_TIMEOUT_S = 60.0
#: broker.conf lines of ``--pull-caps spark``: a PULL may answer up to 4096 messages / 4 MiB, hot or cold
SPARK_PULL_CAPS = [
    "maxTransferCountOnMessageInMemory=4096", "maxTransferBytesOnMessageInMemory=4194304",
    "maxTransferCountOnMessageInDisk=4096", "maxTransferBytesOnMessageInDisk=4194304",
]  # fmt: skip


def free_port(broker: bool = False) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not broker:
            return port
        ok = True
        for p in (port - 2, port + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            return port


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open")


class LocalCluster:
    """namesrv + ``brokers`` masters as subprocesses in a temp dir; always stopped by ``close``."""

    def __init__(self, brokers: int, base: Path, broker_conf: list[str] | None = None) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.base = base
        ns_port = free_port()
        self.ns_addr = f"127.0.0.1:{ns_port}"
        self._spawn("namesrv", ["namesrv", "--listen", self.ns_addr], ns_port)
        self.brokers: list[str] = []
        for i in range(brokers):
            port = free_port(broker=True)
            name = f"broker-{chr(ord('a') + i)}"
            store = base / f"{name}-store"
            store.mkdir(parents=True)
            conf = base / f"{name}.conf"
            conf.write_text(
                "\n".join(
                    [
                        "brokerClusterName=DefaultCluster",
                        f"brokerName={name}",
                        "brokerId=0",
                        f"namesrvAddr={self.ns_addr}",
                        f"listenPort={port}",
                        "listenHost=127.0.0.1",
                        "brokerIP1=127.0.0.1",
                        f"storePathRootDir={store}",
                        "flushDiskType=ASYNC_FLUSH",
                        "brokerRole=ASYNC_MASTER",
                        "autoCreateTopicEnable=true",
                        *(broker_conf or []),
                    ]
                )
                + "\n"
            )
            self._spawn(name, ["broker", "-c", str(conf)], port)
            self.brokers.append(f"127.0.0.1:{port}")

    def _spawn(self, name: str, args: list[str], port: int) -> None:
        log = open(self.base / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "ferrymq.cli", *args], stdout=log, stderr=subprocess.STDOUT
        )
        self.procs.append(proc)
        wait_port(port, proc)

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def create_topic(ns_addr: str, broker_addrs: list[str], topic: str) -> None:
    from ferrymq.remoting.codec import RemotingCommand
    from ferrymq.remoting.codes import RequestCode
    from ferrymq.remoting.connection import connect

    for addr in broker_addrs:
        conn = await connect(addr)
        try:
            fields = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": QUEUES_PER_BROKER,
                      "writeQueueNums": QUEUES_PER_BROKER, "perm": 6, "topicFilterType": "SINGLE_TAG",
                      "topicSysFlag": 0, "order": False}  # fmt: skip
            resp = await conn.invoke(
                RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields), 5000
            )
            if resp.code != 0:
                raise RuntimeError(f"create topic on {addr}: {resp.code} {resp.remark}")
        finally:
            conn.close()
    from ferrymq.client.consumer.pull import PullConsumer

    consumer = PullConsumer(ns_addr, "bench-wait")
    await consumer.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                mqs = await consumer.fetch_subscribe_message_queues(topic)
                if len({mq.broker_name for mq in mqs}) == len(broker_addrs):
                    return
            except Exception:  # noqa: BLE001 - not routed yet
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} not routed")
            await asyncio.sleep(0.2)
    finally:
        await consumer.close()


async def produce(ns_addr: str, topic: str, count: int, size: int) -> float:
    from ferrymq.client.producer import Producer
    from ferrymq.client.values import SendStatus, new_message

    # a fresh broker may take seconds to answer the first batches (its first commit log segment is being
    # allocated), which is not what this benchmark measures
    producer = Producer(ns_addr, "bench-spark-producer", send_timeout_ms=PRODUCE_SEND_TIMEOUT_MS)
    await producer.start()
    sem = asyncio.Semaphore(PRODUCE_CONCURRENCY)
    body = b"x" * size
    started = time.perf_counter()

    async def one(first: int, n: int) -> None:
        async with sem:
            msgs = [new_message(topic, body, keys=f"k{first + i}") for i in range(n)]
            result = await producer.send_batch(msgs)
            if result.status is not SendStatus.SEND_OK:
                raise RuntimeError(f"send_batch: {result.status}")

    try:
        await asyncio.gather(*(one(i, min(PRODUCE_BATCH, count - i)) for i in range(0, count, PRODUCE_BATCH)))
    finally:
        await producer.close()
    return time.perf_counter() - started


def spark_session(master: str) -> Any:
    """The benchmarks' SparkSession: no UI, 2 shuffle partitions, errors only in the log."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def tear_down(spark: Any, cluster: LocalCluster | None, base: Path) -> None:
    """Stop the SparkSession and the started processes (either may be None), remove the temp dir."""
    if spark is not None:
        spark.stop()
    if cluster is not None:
        cluster.close()
    shutil.rmtree(base, ignore_errors=True)


def stage_breakdown(opts: dict[str, str]) -> tuple[int, float, float]:
    """The connector's own work without Spark, in this process: (rows, seconds pulling and decoding every
    planned range one after the other, seconds of the decoding alone on the same raw PULL bodies)."""
    from ferrymq.spark import fetch, runtime
    from ferrymq.spark.arrow import BatchBuilder
    from ferrymq.spark.options import parse_source_options
    from ferrymq.spark.reader import _metadata, plan_batch

    source = parse_source_options(opts, False)
    ranges = plan_batch(_metadata(source), source)
    exec_opts = source.executor_options()
    started = time.perf_counter()
    rows = sum(b.num_rows for r in ranges for b in fetch.read_range(r, exec_opts))
    total_s = time.perf_counter() - started

    async def raw_bodies() -> list[tuple[str, int, int, list[bytes]]]:
        consumer = await runtime._started_consumer(exec_opts)
        out = []
        for r in ranges:
            chunk = await fetch.pull_chunk(consumer, r.queue, r.start, r.end, exec_opts, max_bytes=1 << 62)
            out.append((r.broker_name, r.start, r.end, chunk.bodies))
        return out

    bodies = runtime.run(raw_bodies())
    started = time.perf_counter()
    builder = BatchBuilder()
    for broker, lo, hi, raws in bodies:
        for raw in raws:
            builder.append_raw(raw, broker, lo, hi)
            if len(builder) >= fetch.ARROW_BATCH_ROWS:
                builder.flush()
    builder.flush()
    return rows, total_s, time.perf_counter() - started


#: Worker-process module holding the floor source's cached batches between rounds (workers are reused).
FLOOR_CACHE_MODULE = "_ferrymq_bench_floor_cache"


def register_floor_source(spark: Any) -> None:
    """Register ``rocketmq-cached`` (see ``--floor``): the rocketmq batch reader's ranges, each served from the
    worker process's cache after its first read."""
    import types

    from ferrymq.spark import fetch
    from ferrymq.spark.options import parse_source_options
    from ferrymq.spark.reader import QueueRangePartition, RocketMQBatchReader, RocketMQStreamReader
    from ferrymq.spark.source import RocketMQDataSource

    def cached_read(partition: Any) -> Any:
        cache = sys.modules.setdefault(FLOOR_CACHE_MODULE, types.ModuleType(FLOOR_CACHE_MODULE)).__dict__
        assert isinstance(partition, QueueRangePartition)
        key = repr(partition.rng)
        if key not in cache:
            cache[key] = list(fetch.read_range(partition.rng, partition.opts))
        return iter(cache[key])

    class CachedReader(RocketMQBatchReader):
        def read(self, partition: Any) -> Any:  # the PySpark read() contract
            return cached_read(partition)

    class CachedStreamReader(RocketMQStreamReader):
        def read(self, partition: Any) -> Any:
            return cached_read(partition)

    class CachedSource(RocketMQDataSource):
        @classmethod
        def name(cls) -> str:
            return "rocketmq-cached"

        def reader(self, schema: Any) -> Any:
            return CachedReader(parse_source_options(self.options, streaming=False))

        def streamReader(self, schema: Any) -> Any:
            return CachedStreamReader(parse_source_options(self.options, streaming=True))

    spark.dataSource.register(CachedSource)


def timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--brokers", type=int, default=2)
    parser.add_argument("--name-server", help="use a running cluster instead of starting one")
    parser.add_argument("--topic", default=None)
    parser.add_argument("--no-produce", action="store_true", help="read what the topic already holds")
    parser.add_argument("--partitions", type=int, default=None, help="minPartitions")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds of every pipeline (best shown)")
    parser.add_argument("--pull-caps", choices=("spark", "rocketmq"), default="spark",
                        help="per-pull caps of the started brokers (default: raised for Spark, SPARK_PULL_CAPS)")
    parser.add_argument("--broker-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra broker.conf line of the started brokers (repeatable)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra option of the rocketmq source (repeatable), e.g. pullBatchSize=1024")
    parser.add_argument("--floor", action="store_true",
                        help="add the Python-source floor: the same ranges served from batches cached in the workers")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="ferrymq-spark-bench-"))
    cluster: LocalCluster | None = None
    spark = None
    try:
        if args.name_server:
            ns_addr = args.name_server
        else:
            caps = SPARK_PULL_CAPS if args.pull_caps == "spark" else []
            cluster = LocalCluster(args.brokers, base, caps + args.broker_conf)
            ns_addr = cluster.ns_addr
        topic = args.topic or f"SparkBench{int(time.time())}"
        if cluster is not None:
            asyncio.run(create_topic(ns_addr, cluster.brokers, topic))
        if not args.no_produce:
            secs = asyncio.run(produce(ns_addr, topic, args.messages, args.size))
            print(
                f"produced {args.messages:,} x {args.size} B in {secs:.1f} s ({args.messages / secs:,.0f} msg/s)"
            )

        spark = spark_session(args.master)
        opts = {"nameServer": ns_addr, "subscribe": topic}
        if args.partitions:
            opts["minPartitions"] = str(args.partitions)
        for item in args.option:
            key, _, value = item.partition("=")
            opts[key] = value

        # start the workers with a whole read: a limit() stops reading early and PySpark's daemon then prints the
        # workers' broken-pipe tracebacks
        spark.read.format("rocketmq").options(**opts).load().write.format("noop").mode("overwrite").save()
        results: list[tuple[str, int, list[float]]] = []

        def rocket_batch(out: Path) -> None:
            spark.read.format("rocketmq").options(**opts).load().write.mode("overwrite").parquet(str(out))

        def parquet_batch(out: Path) -> None:
            spark.read.parquet(str(base / "rb0")).write.mode("overwrite").parquet(str(out))

        def stream(df: object, out: Path) -> None:
            q = (
                df.writeStream.format("parquet")  # type: ignore[attr-defined]
                .option("path", str(out))
                .option("checkpointLocation", str(out) + "-ck")
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()

        def rocket_stream(out: Path) -> None:
            stream(
                spark.readStream.format("rocketmq").options(startingOffsets="earliest", **opts).load(), out
            )

        def parquet_stream(out: Path) -> None:
            schema = spark.read.parquet(str(base / "rb0")).schema
            stream(spark.readStream.schema(schema).parquet(str(base / "rb0")), out)

        def floor_stream(out: Path) -> None:
            stream(
                spark.readStream.format("rocketmq-cached").options(startingOffsets="earliest", **opts).load(), out
            )

        def floor_batch(out: Path) -> None:
            spark.read.format("rocketmq-cached").options(**opts).load().write.mode("overwrite").parquet(str(out))

        pipelines = [
            ("rocketmq batch  -> parquet", "rb", rocket_batch),
            ("parquet  batch  -> parquet", "pb", parquet_batch),
            ("rocketmq stream -> parquet", "rs", rocket_stream),
            ("parquet  stream -> parquet", "ps", parquet_stream),
        ]
        if args.floor:
            register_floor_source(spark)
            # the untimed first read fills the workers' caches (each worker caches the ranges it is given)
            for _ in range(2):
                spark.read.format("rocketmq-cached").options(**opts).load().write.format("noop").mode("overwrite").save()
            pipelines.append(("floor: cached  -> parquet", "fb", floor_batch))
            pipelines.append(("floor: cached stream -> pq", "fs", floor_stream))
        # Round 0 pays the JVM's JIT warm-up of the parquet writer (several seconds on 2 cores), so
        # rounds alternate between the pipelines and the table shows the best round of each.
        for rnd in range(args.rounds):
            for i, (name, tag, fn) in enumerate(pipelines):
                out = base / f"{tag}{rnd}"
                secs = timed(lambda fn=fn, out=out: fn(out))
                rows = spark.read.parquet(str(out)).count()
                if rnd == 0:
                    results.append((name, rows, []))
                elif rows != results[i][1]:
                    raise RuntimeError(f"{name}: {rows} rows in round {rnd}, {results[i][1]} in round 0")
                results[i][2].append(secs)
                if rnd and tag != "rb":
                    shutil.rmtree(out, ignore_errors=True)
                    shutil.rmtree(str(out) + "-ck", ignore_errors=True)

        print(f"\n{'pipeline':<28} {'rows':>11} {'best s':>8} {'rows/s':>10}   rounds (rows/s)")
        for name, n, times in results:
            rounds = ", ".join(f"{n / t:,.0f}" for t in times)
            print(f"{name:<28} {n:>11,} {min(times):>8.2f} {n / min(times):>10,.0f}   {rounds}")
        best = {name: n / min(times) for name, n, times in results}
        print(f"ratio batch  rocketmq/parquet: {best['rocketmq batch  -> parquet'] / best['parquet  batch  -> parquet']:.2f}x"
              f"   stream: {best['rocketmq stream -> parquet'] / best['parquet  stream -> parquet']:.2f}x")
        if args.floor:
            print(f"floor (cached batches, no pull, no decode)/parquet: "
                  f"{best['floor: cached  -> parquet'] / best['parquet  batch  -> parquet']:.2f}x; "
                  f"rocketmq/floor: {best['rocketmq batch  -> parquet'] / best['floor: cached  -> parquet']:.2f}x; "
                  f"stream floor/parquet stream: "
                  f"{best['floor: cached stream -> pq'] / best['parquet  stream -> parquet']:.2f}x; "
                  f"rocketmq stream/stream floor: "
                  f"{best['rocketmq stream -> parquet'] / best['floor: cached stream -> pq']:.2f}x")
        # the sources alone in Spark (no sink work): the rocketmq side includes the Arrow hand-off to the JVM
        noop: dict[str, list[float]] = {"rocketmq": [], "parquet": []}
        for _ in range(args.rounds):
            noop["rocketmq"].append(timed(lambda: spark.read.format("rocketmq").options(**opts).load()
                                          .write.format("noop").mode("overwrite").save()))  # fmt: skip
            noop["parquet"].append(timed(lambda: spark.read.parquet(str(base / "rb0"))
                                         .write.format("noop").mode("overwrite").save()))  # fmt: skip
            if args.floor:
                noop.setdefault("floor", []).append(timed(lambda: spark.read.format("rocketmq-cached").options(**opts)
                                                          .load().write.format("noop").mode("overwrite").save()))  # fmt: skip
        stages = [stage_breakdown(opts) for _ in range(args.rounds)]
        rows, pull_decode_s, decode_s = min(stages, key=lambda st: st[1])
        batch_s = rows / best["rocketmq batch  -> parquet"]
        print(f"\nstages of the batch read ({rows:,} rows; the connector without Spark, one range after the other):")
        print(f"  pull + decode   {pull_decode_s:6.2f} s   {rows / pull_decode_s:>10,.0f} rows/s")
        print(f"  decode alone    {decode_s:6.2f} s   {rows / decode_s:>10,.0f} rows/s")
        print(f"  pull (the rest) {pull_decode_s - decode_s:6.2f} s")
        print(f"  Spark pipeline  {batch_s:6.2f} s   (hand-off to the JVM, parquet write, scheduling: the rest)")
        rows_noop, pq_noop = min(noop["rocketmq"]), min(noop["parquet"])
        print(f"  Spark source to a noop sink {rows_noop:6.2f} s (pull, decode and hand-off to the JVM on {args.master};"
              f" parquet source to noop: {pq_noop:.2f} s, {pq_noop / rows_noop:.2f}x)")
        if args.floor:
            print(f"  floor source (cached batches) to a noop sink {min(noop['floor']):6.2f} s")
        return 0
    finally:
        tear_down(spark, cluster, base)


if __name__ == "__main__":
    sys.exit(main())
