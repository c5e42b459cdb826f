"""Executor side: read exactly queue offsets [start, end) of one queue into Arrow record batches.

The range is cut into chunks of ``pullBatchSize`` offsets. Up to ``pullPipelineDepth`` chunks are
pulled concurrently on the process's loop thread (a broker answers at most 32 messages / 256 KiB per
PULL by default, so one request at a time would be latency bound). A chunk stops once it holds
``CHUNK_MAX_BYTES`` and the rest of its offsets become the next chunk in line, and no chunk starts while
the task thread has more than ``BUFFER_MAX_BYTES`` of raw bodies to decode, so the raw bytes a task has
pulled and not yet handed to the Arrow builder stay below ``BUFFER_MAX_BYTES + pullPipelineDepth *
(CHUNK_MAX_BYTES + one PULL answer)`` whatever the message size (the builder holds at most
``ARROW_BATCH_BYTES`` more). Finished chunks cross to the task
thread in offset order, every chunk that is already done in one hand-over (one thread wake-up per
group, not per PULL); the task thread cuts the raw bodies into Arrow columns (``arrow.BatchBuilder``)
and yields a RecordBatch every ``ARROW_BATCH_ROWS`` rows or ``ARROW_BATCH_BYTES`` raw bytes.

One chunk [lo, hi) is pulled until ``nextBeginOffset >= hi``; only records with lo <= queueOffset < hi
are kept, so overlapping answers never produce duplicates and tag-filtered (skipped) offsets still
advance. Outcomes of one PULL:

| status          | action                                                                          |
|-----------------|---------------------------------------------------------------------------------|
| FOUND           | keep records in [lo, hi) whose TAGS match (the broker filters by hash only)      |
| NO_MATCHED_MSG  | nothing matched; continue at nextBeginOffset (retry later if it did not advance) |
| NO_NEW_MSG      | offset not readable yet (slave behind): retry until pullTimeoutMs passes         |
| network error   | retry (another member of the broker group when the address failed) until pullTimeoutMs |
| OFFSET_ILLEGAL  | below the queue minimum → data loss (fail, or skip to the minimum); beyond max   |
|                 | → data loss (the planned end no longer exists)                                   |
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from ferrymq.client.consumer.pull import PullConsumer
from ferrymq.client.selectors import MessageSelector
from ferrymq.client.values import PullStatus
from ferrymq.common.route import MessageQueue
from ferrymq.common.sql92 import EXPRESSION_TYPE_TAG
from ferrymq.errors import RemotingError
from ferrymq.spark import runtime
from ferrymq.spark.arrow import BatchBuilder
from ferrymq.spark.options import ExecutorOptions, parse_sub_expression, queue_key
from ferrymq.spark.planning import QueueRange, report_data_loss

log = logging.getLogger("ferrymq.spark")

#: Rows per yielded RecordBatch (Spark's own default arrow batch size is 10000; bigger batches
#: spread the fixed cost of the Arrow kernels in ``BatchBuilder.flush``).
ARROW_BATCH_ROWS = 32_768
#: Raw PULL bytes per RecordBatch at most (large bodies; keeps a batch far below Arrow's 2 GiB).
ARROW_BATCH_BYTES = 64 * 1024 * 1024
#: Pause before re-pulling an offset that was not readable yet.
RETRY_BACKOFF_S = 0.05
#: Raw PULL bytes handed to the task thread and not decoded yet above which no new chunk starts.
BUFFER_MAX_BYTES = 32 * 1024 * 1024
#: Raw bytes after which a chunk stops pulling (its remaining offsets are pulled as the next chunk).
CHUNK_MAX_BYTES = 1024 * 1024
#: With a filter (tags or SQL92) a chunk spans at least this many pulls' worth of offsets: the broker skips
#: unmatched messages and may answer with matches beyond the chunk's end, which the chunk drops, so few long
#: chunks pull far fewer surplus bytes than many short ones.
FILTERED_CHUNK_PULLS = 16
#: How often a paused pipeline checks whether the task thread caught up.
BACKPRESSURE_POLL_S = 0.002


class PullStalledError(TimeoutError):
    """The broker kept answering without reaching the planned end offset."""


@dataclass(slots=True)
class Chunk:
    """Raw PULL bodies covering offsets [lo, hi) of the planned [lo, end); hi < end when the chunk stopped
    at ``max_bytes``."""

    lo: int
    hi: int
    bodies: list[bytes]
    end: int
    nbytes: int


class Backlog:
    """Raw bytes handed to the task thread and not decoded yet; each counter has a single writer thread."""

    __slots__ = ("handed", "decoded")

    def __init__(self) -> None:
        self.handed = 0  # written by the loop thread
        self.decoded = 0  # written by the task thread

    @property
    def held(self) -> int:
        return self.handed - self.decoded


async def pull_chunk(
    consumer: PullConsumer, mq: MessageQueue, lo: int, hi: int, opts: ExecutorOptions,
    max_bytes: int | None = None,
) -> Chunk:  # fmt: skip
    """Pull until every offset in [lo, hi) was covered, or until the bodies hold ``max_bytes`` (default
    ``CHUNK_MAX_BYTES``); return the raw PULL bodies and the offset reached."""
    if max_bytes is None:
        max_bytes = CHUNK_MAX_BYTES
    bodies: list[bytes] = []
    held = 0
    offset = lo
    deadline = time.monotonic() + opts.pull_timeout_ms / 1000
    where = f"{mq.topic}/{queue_key(mq.broker_name, mq.queue_id)}"
    while offset < hi:
        try:
            result = await consumer.pull(
                mq, offset, min(hi - offset, opts.pull_batch_size),
                sub_expression=MessageSelector(opts.sub_expression, opts.expression_type),
                timeout_ms=opts.pull_timeout_ms, decode=False,
            )  # fmt: skip
        except RemotingError as exc:  # the broker died or restarts: the next try avoids the failed address
            if time.monotonic() > deadline:
                raise PullStalledError(f"{where}: no broker of the group answered at offset {offset} for "
                                       f"{opts.pull_timeout_ms} ms: {exc}") from exc
            log.info("%s: pull at %d failed (%s); retrying", where, offset, exc)
            await asyncio.sleep(RETRY_BACKOFF_S)
            continue
        status = result.status
        if status is PullStatus.FOUND:
            if result.raw_body:
                bodies.append(result.raw_body)
                held += len(result.raw_body)
            if result.next_begin_offset <= offset:
                raise PullStalledError(
                    f"{where}: FOUND at {offset} but nextBeginOffset {result.next_begin_offset}"
                )
            offset = result.next_begin_offset
            deadline = time.monotonic() + opts.pull_timeout_ms / 1000
            if held >= max_bytes and offset < hi:
                return Chunk(lo, offset, bodies, hi, held)
            continue
        if status is PullStatus.OFFSET_ILLEGAL:
            if offset < result.min_offset:
                report_data_loss(
                    opts.fail_on_data_loss,
                    f"{where}: offset {offset} is below the queue's minimum offset {result.min_offset}; "
                    f"{min(hi, result.min_offset) - offset} planned messages are gone.",
                )
                offset = result.min_offset
                continue
            if offset >= result.max_offset:
                report_data_loss(
                    opts.fail_on_data_loss,
                    f"{where}: planned offsets [{offset}, {hi}) are beyond the queue's maximum offset "
                    f"{result.max_offset} (the queue was reset or truncated).",
                )
                break
        elif status is PullStatus.NO_MATCHED_MSG and result.next_begin_offset > offset:
            offset = result.next_begin_offset
            deadline = time.monotonic() + opts.pull_timeout_ms / 1000
            continue
        # NO_NEW_MSG, or no progress: the data is planned, so it exists; the replica may be behind.
        if time.monotonic() > deadline:
            raise PullStalledError(
                f"{where}: no progress at offset {offset} (planned end {hi}) for {opts.pull_timeout_ms} ms; "
                f"last answer {status.name}, broker min {result.min_offset} max {result.max_offset}"
            )
        await asyncio.sleep(RETRY_BACKOFF_S)
    return Chunk(lo, hi, bodies, hi, held)


async def _pipeline(
    rng: QueueRange, opts: ExecutorOptions, out: queue.Queue[list[Chunk] | BaseException | None], backlog: Backlog
) -> None:
    """Pull the chunks of ``rng`` with bounded concurrency; put them on ``out`` in offset order,
    each put carrying every leading chunk that is already finished.

    Back-pressure without cross-thread wake-ups: no new chunk starts while the task thread has more than
    ``BUFFER_MAX_BYTES`` undecoded (``backlog``).
    """
    try:
        consumer = await runtime._started_consumer(opts)
        mq = rng.queue
        step = opts.pull_batch_size
        if opts.sub_expression.strip() not in ("", "*"):
            step = max(step * FILTERED_CHUNK_PULLS, -(-rng.size // opts.pull_pipeline_depth))
        pending: list[asyncio.Task[Chunk]] = []
        lo = rng.start
        try:
            while lo < rng.end or pending:
                while lo < rng.end and len(pending) < opts.pull_pipeline_depth:
                    if backlog.held > BUFFER_MAX_BYTES and pending:
                        break
                    hi = min(lo + step, rng.end)
                    pending.append(asyncio.ensure_future(pull_chunk(consumer, mq, lo, hi, opts)))
                    lo = hi
                while backlog.held > BUFFER_MAX_BYTES:
                    await asyncio.sleep(BACKPRESSURE_POLL_S)
                ready = [await pending.pop(0)]
                while ready[-1].hi == ready[-1].end and pending and pending[0].done():
                    ready.append(pending.pop(0).result())
                last = ready[-1]
                if last.hi < last.end:  # stopped at CHUNK_MAX_BYTES: its rest is next in line
                    pending.insert(0, asyncio.ensure_future(pull_chunk(consumer, mq, last.hi, last.end, opts)))
                backlog.handed += sum(chunk.nbytes for chunk in ready)
                out.put(ready)
        finally:
            for task in pending:
                task.cancel()
        out.put(None)
    except BaseException as exc:  # noqa: BLE001 - handed to the task thread, which re-raises
        out.put(exc)
        if isinstance(exc, asyncio.CancelledError):
            raise


def read_range(rng: QueueRange, opts: ExecutorOptions) -> Iterator[pa.RecordBatch]:
    """Yield RecordBatches with exactly the messages of ``rng`` (tag filter applied)."""
    if rng.end <= rng.start:
        return
    tags = parse_sub_expression(opts.sub_expression) if opts.expression_type == EXPRESSION_TYPE_TAG else None
    out: queue.Queue[list[Chunk] | BaseException | None] = queue.Queue()
    backlog = Backlog()
    future = runtime.submit(_pipeline(rng, opts, out, backlog))
    builder = BatchBuilder()
    try:
        while True:
            item = out.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            for chunk in item:
                for body in chunk.bodies:
                    builder.append_raw(body, rng.broker_name, chunk.lo, chunk.hi, tags)
                backlog.decoded += chunk.nbytes
                if len(builder) >= ARROW_BATCH_ROWS or builder.nbytes >= ARROW_BATCH_BYTES:
                    yield builder.flush()
        if len(builder):
            yield builder.flush()
    finally:
        if not future.done():
            future.cancel()
