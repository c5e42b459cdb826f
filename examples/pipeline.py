"""Streaming ETL on ferrymq with PySpark: JSON events in, windowed aggregates to parquet, alerts back out.

Run against ``ferry quickstart`` (it prints the name server address in its ``quickstart ready`` line)::

    ferry quickstart &                                   # name server + master + slave on 127.0.0.1
    python examples/pipeline.py --name-server 127.0.0.1:PORT --generate 5000 --available-now

Events on topic ``SensorEvents`` look like ``{"sensor": "s3", "temp": 71.5, "ts": 1700000000123}``.
The pipeline

1. reads the topic (``startingOffsets=earliest``, ``maxOffsetsPerTrigger`` bounds each micro-batch),
2. parses the JSON body,
3. aggregates per sensor over 1-minute event-time windows (2-minute watermark) → parquet in ``--out``,
4. writes every reading above ``--threshold`` as an alert message to topic ``SensorAlerts``
   (key = sensor, tags = ``hot``, properties carry the source queue position).

``--generate N`` first sends N random events with the ferrymq producer (topics are auto-created by the
broker, as quickstart's brokers allow). ``--available-now`` processes what is there and stops;
without it the queries run until Ctrl-C. Each query has its own checkpoint under ``--out``, so a
re-run resumes where the last one stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need the interpreter that has pyarrow
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

EVENTS_TOPIC = "SensorEvents"
ALERTS_TOPIC = "SensorAlerts"


async def generate(name_server: str, count: int) -> None:
    from ferrymq.client.producer import Producer
    from ferrymq.client.values import SendStatus, new_message

    producer = Producer(name_server, "pipeline-example-generator")
    await producer.start()
    try:
        now_ms = int(time.time() * 1000)
        sem = asyncio.Semaphore(128)

        async def one(i: int) -> None:
            event = {
                "sensor": f"s{i % 8}",
                "temp": round(random.gauss(60, 12), 1),
                "ts": now_ms - (count - i) * 1000,
            }
            async with sem:
                result = await producer.send(
                    new_message(EVENTS_TOPIC, json.dumps(event), keys=event["sensor"])
                )
            if result.status is not SendStatus.SEND_OK:
                raise RuntimeError(f"send failed: {result.status}")

        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await producer.close()
    print(f"sent {count} events to {EVENTS_TOPIC}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name-server", required=True, help="host:port, e.g. from `ferry quickstart`")
    parser.add_argument("--out", default="pipeline-out", help="parquet output and checkpoints")
    parser.add_argument("--threshold", type=float, default=80.0, help="alert above this temperature")
    parser.add_argument("--generate", type=int, default=0, help="first send this many random events")
    parser.add_argument("--available-now", action="store_true", help="process what exists, then stop")
    args = parser.parse_args()

    if args.generate:
        asyncio.run(generate(args.name_server, args.generate))

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("ferrymq-pipeline-example")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    out = Path(args.out).resolve()

    events = (
        spark.readStream.format("rocketmq")  # found without register(): the pyspark_rocketmq module
        .option("nameServer", args.name_server)
        .option("subscribe", EVENTS_TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "20000")
        .load()
    )
    parsed = events.select(
        F.from_json(F.col("value").cast("string"), "sensor string, temp double, ts long").alias("e"),
        "brokerName",
        "queueId",
        "queueOffset",
    ).select(
        "e.sensor",
        "e.temp",
        (F.col("e.ts") / 1000).cast("timestamp").alias("event_time"),
        "brokerName",
        "queueId",
        "queueOffset",
    )

    per_minute = (
        parsed.withWatermark("event_time", "2 minutes")
        .groupBy(F.window("event_time", "1 minute"), "sensor")
        .agg(F.count("*").alias("readings"), F.avg("temp").alias("avg_temp"), F.max("temp").alias("max_temp"))
    )
    alerts = parsed.where(F.col("temp") > args.threshold).select(
        F.col("sensor").alias("key"),
        F.to_json(F.struct("sensor", "temp", "event_time")).alias("value"),
        F.lit("hot").alias("tags"),
        F.create_map(
            F.lit("sourceQueue"),
            F.concat_ws(":", "brokerName", F.col("queueId").cast("string")),
            F.lit("sourceOffset"),
            F.col("queueOffset").cast("string"),
        ).alias("properties"),
    )

    def trigger(writer):  # type: ignore[no-untyped-def]
        return (
            writer.trigger(availableNow=True)
            if args.available_now
            else writer.trigger(processingTime="5 seconds")
        )

    agg_query = trigger(
        per_minute.writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(out / "per_minute"))
        .option("checkpointLocation", str(out / "checkpoints" / "per_minute"))
    ).start()
    alert_query = trigger(
        alerts.writeStream.format("rocketmq")
        .option("nameServer", args.name_server)
        .option("topic", ALERTS_TOPIC)
        .option("checkpointLocation", str(out / "checkpoints" / "alerts"))
    ).start()

    try:
        for query in (agg_query, alert_query):
            query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        for query in (agg_query, alert_query):
            query.stop()

    windows = spark.read.parquet(str(out / "per_minute")) if (out / "per_minute").exists() else None
    try:
        alert_count = (
            (
                spark.read.format("rocketmq")
                .option("nameServer", args.name_server)
                .option("subscribe", ALERTS_TOPIC)
            )
            .load()
            .count()
        )
    except Exception:  # noqa: BLE001 - no alert was ever sent, so the topic does not exist
        alert_count = 0
    print(
        f"closed windows written: {windows.count() if windows is not None else 0}; alerts in {ALERTS_TOPIC}: {alert_count}"
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
