"""Spark test fixtures: one session-scoped SparkSession (local[2]) for the whole run.

The environment must be set before the JVM starts (spark-notes §7): workers run ``sys.executable``
(which has pyarrow and the editable ferrymq install) and bind to loopback only.
"""

from __future__ import annotations

import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from collections.abc import Iterator  # noqa: E402

# No importorskip: CI installs the spark extra, so a missing pyspark must fail loudly.
import pyarrow  # noqa: E402,F401
import pyspark  # noqa: E402,F401
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("ferrymq-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


# ---- a real cluster: one name server + two master brokers (subprocesses) ------------------------

_ACCEPTANCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "acceptance")
if _ACCEPTANCE not in sys.path:
    sys.path.insert(0, _ACCEPTANCE)

#: Queues per broker of every test topic (two brokers → 2 × QUEUES_PER_BROKER queues).
QUEUES_PER_BROKER = 2
ROUTE_TIMEOUT_S = 45.0


class SparkCluster:
    """Handle on the running processes plus helpers to create and fill topics."""

    def __init__(self, group: object, ns_addr: str, brokers: list[object]) -> None:
        self.group = group
        self.ns_addr = ns_addr
        self.brokers = brokers

    def create_topic(self, topic: str, queues: int = QUEUES_PER_BROKER) -> None:
        from procs import create_topic, wait_route

        for broker in self.brokers:
            resp = create_topic(broker.addr, topic, queues=queues)  # type: ignore[attr-defined]
            assert resp.code == 0, resp.remark
        for broker in self.brokers:
            wait_route(self.ns_addr, topic, timeout_s=ROUTE_TIMEOUT_S, broker_name=broker.broker_name)  # type: ignore[attr-defined]

    def produce(self, topic: str, count: int, *, start: int = 0, body_size: int = 0) -> list[str]:
        """Send ``count`` messages round-robin over all queues; bodies ``m<i>`` (padded to body_size).

        Message i has key ``k<i>``, tags ``even``/``odd`` and property ``i``. Returns the bodies.
        """
        import asyncio

        from ferrymq.client.producer import Producer
        from ferrymq.client.values import SendStatus, new_message

        bodies = [f"m{i}".ljust(body_size, ".") for i in range(start, start + count)]

        async def go() -> None:
            producer = Producer(self.ns_addr, "spark-test-producer")
            await producer.start()
            try:
                sem = asyncio.Semaphore(256)

                async def one(i: int, body: str) -> None:
                    async with sem:
                        msg = new_message(topic, body, tags="even" if i % 2 == 0 else "odd", keys=f"k{i}",
                                          properties={"i": str(i)})  # fmt: skip
                        result = await producer.send(msg)
                        assert result.status is SendStatus.SEND_OK

                await asyncio.gather(*(one(start + n, b) for n, b in enumerate(bodies)))
            finally:
                await producer.close()

        asyncio.run(go())
        return bodies

    def get_bytes(self, topic: str) -> float:
        """Bytes the brokers returned by PULL for ``topic`` so far (their ferrymq_get_bytes counters)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for broker in self.brokers:
            url = f"http://127.0.0.1:{broker.props['metricsPort']}/metrics"  # type: ignore[attr-defined]
            with urllib.request.urlopen(url, timeout=10) as resp:
                text = resp.read().decode()
            for family in text_string_to_metric_families(text):
                if family.name == "ferrymq_get_bytes":
                    total += sum(s.value for s in family.samples if s.labels.get("topic") == topic)
        return total


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    from procs import ProcessGroup, free_port, start_broker, start_namesrv

    group = ProcessGroup(tmp_path_factory.mktemp("spark-cluster"))
    try:
        ns = start_namesrv(group)
        brokers = [
            start_broker(group, [ns.addr], name=f"broker-{n}", broker_name=f"broker-{n}", metricsPort=free_port())
            for n in ("a", "b")
        ]
        yield SparkCluster(group, ns.addr, brokers)
    except BaseException:
        print(group.dump())
        raise
    finally:
        group.stop_all()
