"""A master SIGKILLed while a streaming query reads its broker group: with readFromSlave=whenMasterDown the
query finishes the ranges it planned from the slave, every acknowledged message exactly once.

Three rounds on one checkpoint: each round sends a backlog to the SYNC_MASTER (acknowledged = on the slave),
starts an AvailableNow query with small micro-batches, SIGKILLs the master once the query made progress, waits
for the query to end, checks the output holds every message sent so far exactly once, and restarts the master.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

ROUNDS = 3
MESSAGES_PER_ROUND = 1200
ROWS_PER_TRIGGER = 60
QUERY_TIMEOUT_S = 120.0
PROGRESS_TIMEOUT_S = 60.0


def test_stream_finishes_from_the_slave_when_the_master_dies(spark: Any, tmp_path: Path) -> None:
    from ha_support import ROUTE_TIMEOUT_S, ha_slave_count, send_backlog, start_failover_pair, wait_caught_up
    from procs import ProcessGroup, wait_for

    from ferrymq.client.values import SendStatus

    topic = "SparkFailover"
    procs = ProcessGroup(tmp_path / "procs")
    try:
        pair = start_failover_pair(procs, topic, queues=4)
        out, checkpoint = tmp_path / "out", tmp_path / "ck"
        sent: list[str] = []
        for rnd in range(ROUNDS):
            results = send_backlog(pair.ns_addr, topic, MESSAGES_PER_ROUND, prefix=f"r{rnd}")
            assert all(r.status is SendStatus.SEND_OK for r in results)
            sent += [f"r{rnd}-{i:06d}" for i in range(MESSAGES_PER_ROUND)]
            wait_caught_up(pair)
            query = (
                spark.readStream.format("rocketmq")
                .options(nameServer=pair.ns_addr, subscribe=topic, startingOffsets="earliest",
                         readFromSlave="whenMasterDown", maxOffsetsPerTrigger=str(ROWS_PER_TRIGGER),
                         pullTimeoutMs="5000")
                .load()
                .select("value")
                .writeStream.format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            try:
                wait_for(lambda q=query: len(q.recentProgress) >= 1 or not q.isActive,  # type: ignore[misc]
                         timeout_s=PROGRESS_TIMEOUT_S, what="a first micro-batch")  # fmt: skip
                assert query.isActive, "the query ended before the master could be killed mid-query"
                pair.master.kill()
                assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish from the slave"
                assert query.exception() is None, query.exception()
            finally:
                if query.isActive:
                    query.stop()
            got = [bytes(r.value).decode() for r in spark.read.parquet(str(out)).collect()]
            assert len(got) == len(sent) and sorted(got) == sorted(sent), f"round {rnd}"
            pair.master.start()
            wait_for(lambda: ha_slave_count(pair.master.addr) >= 1, timeout_s=ROUTE_TIMEOUT_S,
                     what="the slave back on the restarted master", alive=pair.alive)  # fmt: skip
    except BaseException:
        print(procs.dump())
        raise
    finally:
        procs.stop_all()
