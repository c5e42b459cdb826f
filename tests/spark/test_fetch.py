"""The executor's pull pipeline (spark/fetch.py) against real brokers: chunks that stop at CHUNK_MAX_BYTES
continue where they stopped, rows stay exact and in order, and no chunk starts while more than
BUFFER_MAX_BYTES wait for the task thread."""

from __future__ import annotations

from typing import Any

import pytest

from ferrymq.spark import fetch
from ferrymq.spark.options import parse_source_options
from ferrymq.spark.reader import _metadata, plan_batch

pytestmark = pytest.mark.spark

TOPIC = "SparkFetchBytes"
MESSAGES = 400
BODY_SIZE = 3000


@pytest.fixture(scope="module")
def filled(cluster: Any) -> dict[int, str]:
    cluster.create_topic(TOPIC)
    bodies = cluster.produce(TOPIC, MESSAGES, body_size=BODY_SIZE)
    return {int(b[1:].rstrip(".")): b for b in bodies}


def test_chunks_stop_at_their_byte_cap_and_rows_stay_exact(
    cluster: Any, filled: dict[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetch, "CHUNK_MAX_BYTES", 4 * BODY_SIZE)  # a chunk of 64 offsets stops after ~4
    monkeypatch.setattr(fetch, "BUFFER_MAX_BYTES", 8 * BODY_SIZE)
    backlogs: list[fetch.Backlog] = []
    starts: list[tuple[int, int, int]] = []  # (lo, hi, bytes waiting for the task thread then)

    class SpyBacklog(fetch.Backlog):
        def __init__(self) -> None:
            super().__init__()
            backlogs.append(self)

    real_pull_chunk = fetch.pull_chunk

    async def spy_pull_chunk(consumer: Any, mq: Any, lo: int, hi: int, opts: Any, *args: Any) -> fetch.Chunk:
        starts.append((lo, hi, backlogs[-1].held))
        return await real_pull_chunk(consumer, mq, lo, hi, opts, *args)

    monkeypatch.setattr(fetch, "Backlog", SpyBacklog)
    monkeypatch.setattr(fetch, "pull_chunk", spy_pull_chunk)
    source = parse_source_options(
        {"nameServer": cluster.ns_addr, "subscribe": TOPIC, "pullBatchSize": "64", "pullPipelineDepth": "3"}, False
    )
    ranges = plan_batch(_metadata(source), source)
    assert sum(r.size for r in ranges) == MESSAGES
    seen: list[int] = []
    for rng in ranges:
        offsets: list[int] = []
        for batch in fetch.read_range(rng, source.executor_options()):
            offsets += batch.column("queueOffset").to_pylist()
            seen += [int(v[1:].rstrip(b".")) for v in batch.column("value").to_pylist()]
            assert all(len(v) == BODY_SIZE for v in batch.column("value").to_pylist())
        assert offsets == list(range(rng.start, rng.end)), rng
    assert sorted(seen) == sorted(filled)
    # continuations start inside a planned chunk of 64 offsets
    assert any(lo % 64 != 0 for lo, _hi, _held in starts)
    # back-pressure: a chunk starts only while at most BUFFER_MAX_BYTES (+ the chunk just handed over) wait
    assert max(held for _lo, _hi, held in starts) <= 8 * BODY_SIZE + 3 * (4 * BODY_SIZE + 64 * (BODY_SIZE + 200))
