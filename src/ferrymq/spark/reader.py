"""Batch and micro-batch readers (Python Data Source API, pyspark >= 4.2).

Driver side plans per-queue ranges from broker metadata; executors read each range with
``fetch.read_range``. The streaming offset is ``{"topic": {"brokerName:queueId": next_offset}}``.

Streaming planning, ``latestOffset(start, limit)``:

1. discover queues (subscribe / subscribePattern / assign); queues not in ``start`` start at their
   minimum offset (a queue that appears later is read from the beginning);
2. offsets below a queue's minimum (expired) or above its maximum (reset) are data loss:
   fail, or skip with a warning under failOnDataLoss=false;
3. the end is each queue's max offset, capped by the AvailableNow target if one is set;
4. ``ReadMaxRows`` (maxOffsetsPerTrigger) caps the total, split across queues by lag;
5. minOffsetsPerTrigger holds the batch back (returns ``start``) until enough rows exist or
   maxTriggerDelay passed since the last batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, Filter, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from ferrymq.common.route import MessageQueue
from ferrymq.errors import ConfigError
from ferrymq.spark.options import ExecutorOptions, SourceOptions
from ferrymq.spark.planning import (
    Metadata,
    OffsetMap,
    QueueRange,
    TriggerGate,
    check_spec_topics,
    clamp_to_available,
    discover_queues,
    offsets_from_json,
    offsets_to_json,
    ranges_between,
    report_data_loss,
    resolve_ending_offsets,
    resolve_starting,
    resolve_starting_offsets,
    split_by_lag,
    split_ranges,
    total_lag,
)
from ferrymq.spark.pushdown import PushedFilters, push

log = logging.getLogger("ferrymq.spark")


class QueueRangePartition(InputPartition):
    """One Spark task: queue offsets [start, end) plus what the executor needs to pull them."""

    def __init__(self, rng: QueueRange, opts: ExecutorOptions) -> None:
        super().__init__((rng, opts))
        self.rng = rng
        self.opts = opts

    def __repr__(self) -> str:
        r = self.rng
        return f"QueueRangePartition({r.topic}/{r.broker_name}:{r.queue_id} [{r.start}, {r.end}))"


def _metadata(opts: SourceOptions) -> Metadata:
    from ferrymq.spark.runtime import ClusterMetadata

    return ClusterMetadata(opts.executor_options())


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, QueueRangePartition):  # no range planned: PySpark hands one empty partition
        if getattr(partition, "value", None) is None:
            return iter(())
        raise TypeError(f"not a rocketmq partition: {partition!r}")
    from ferrymq.spark import fetch  # executors only: the driver-side runner never imports the pull path

    return fetch.read_range(partition.rng, partition.opts)


def to_partitions(ranges: Sequence[QueueRange], opts: SourceOptions) -> list[QueueRangePartition]:
    exec_opts = opts.executor_options()
    return [QueueRangePartition(r, exec_opts) for r in split_ranges(ranges, opts.min_partitions)]


# ---- batch ---------------------------------------------------------------------------------------


def plan_batch(meta: Metadata, opts: SourceOptions, pushed: PushedFilters | None = None) -> list[QueueRange]:
    """Ranges of a batch query: [starting, ending) per queue, narrowed by pushed filters."""
    check_spec_topics("startingOffsets", opts.starting, opts)
    check_spec_topics("endingOffsets", opts.ending, opts)
    queues = discover_queues(meta, opts)
    if opts.topics:
        have = {mq.topic for mq in queues}
        missing = [t for t in opts.topics if t not in have]
        if missing:
            raise ConfigError(
                "subscribe", f"topic(s) {', '.join(missing)} do not exist or have no readable queue"
            )
    if not queues:
        log.warning("rocketmq source: no queue matches the subscription; the result is empty")
        return []
    mins, maxs = meta.offset_bounds(queues)
    start = resolve_starting_offsets(meta, opts, queues, mins, maxs)
    end = resolve_ending_offsets(meta, opts, queues, mins, maxs)
    for mq in queues:
        if end[mq] > maxs[mq]:
            log.warning("endingOffsets %d for %s is beyond the queue's max offset %d; reading to %d",
                        end[mq], mq, maxs[mq], maxs[mq])  # fmt: skip
            end[mq] = maxs[mq]
        if start[mq] > end[mq]:
            raise ConfigError(
                "startingOffsets",
                f"start {start[mq]} of {mq.topic}/{mq.broker_name}:{mq.queue_id} is after its end {end[mq]}",
            )
    start = clamp_to_available(start, mins, maxs, opts.fail_on_data_loss)
    ranges = ranges_between(start, end)
    return ranges if pushed is None else narrow_ranges(meta, ranges, pushed)


def narrow_ranges(meta: Metadata, ranges: list[QueueRange], pushed: PushedFilters) -> list[QueueRange]:
    """Drop the ranges of pruned queues; cut each range to the pushed store-time bounds."""
    if pushed.empty:
        return []
    kept = [r for r in ranges if pushed.selects(r.topic, r.broker_name, r.queue_id)]
    if not kept or (pushed.store_from_ms is None and pushed.store_to_ms is None):
        return kept
    queues = [r.queue for r in kept]
    lo = meta.search_offsets(queues, pushed.store_from_ms) if pushed.store_from_ms is not None else {}
    hi = meta.search_offsets(queues, pushed.store_to_ms) if pushed.store_to_ms is not None else {}
    result: list[QueueRange] = []
    for r in kept:
        start = max(r.start, lo.get(r.queue, r.start))
        end = min(r.end, hi.get(r.queue, r.end))
        if end > start:
            result.append(QueueRange(r.topic, r.broker_name, r.queue_id, start, end))
    return result


class RocketMQBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.pushed: PushedFilters | None = None

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts if self.pushed is None else self.pushed.apply_tags(self.opts)
        return to_partitions(plan_batch(_metadata(opts), opts, self.pushed), opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _read(partition)


class RocketMQFilteringBatchReader(RocketMQBatchReader):
    """The batch reader with ``pushFilters`` (see ``spark.pushdown``). PySpark refuses a reader that defines
    ``pushFilters`` while ``spark.sql.python.filterPushdown.enabled`` is false, so the data source hands this
    one out only to PySpark's filter-pushdown step, which runs only when that setting is true."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # type: ignore[override]
        self.pushed, remaining = push(filters, self.opts)
        if self.pushed == PushedFilters():
            self.pushed = None
        return remaining


# ---- streaming -----------------------------------------------------------------------------------


class StreamPlanner:
    """Driver-side streaming state (lives in Spark's long-lived source runner process).

    Separate from the pyspark reader class so it can be unit-tested with a fake ``Metadata``.
    """

    def __init__(self, opts: SourceOptions, meta: Metadata, clock_ms: Any = None) -> None:
        self.opts = opts
        self.meta = meta
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.gate = (
            TriggerGate(opts.min_offsets_per_trigger, opts.max_trigger_delay_ms)
            if opts.min_offsets_per_trigger
            else None
        )
        self.available_now_target: OffsetMap | None = None
        self.latest_seen: OffsetMap = {}
        check_spec_topics("startingOffsets", opts.starting, opts)

    def initial_offsets(self) -> OffsetMap:
        queues = discover_queues(self.meta, self.opts)
        return resolve_starting(self.meta, self.opts, queues)

    def prepare_available_now(self) -> None:
        queues = discover_queues(self.meta, self.opts)
        self.available_now_target = self.meta.max_offsets(queues) if queues else {}

    def default_read_limit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def _effective_start(
        self, start: OffsetMap, queues: Sequence[MessageQueue]
    ) -> tuple[OffsetMap, OffsetMap]:
        """(start with new queues at their minimum and data loss resolved, latest offsets)."""
        mins, maxs = self.meta.offset_bounds(queues) if queues else ({}, {})
        full = dict(start)
        for mq in queues:
            if mq not in full:
                log.info("rocketmq source: new queue %s, reading from its earliest offset %d", mq, mins[mq])
                full[mq] = mins[mq]
        return clamp_to_available(full, mins, maxs, self.opts.fail_on_data_loss), maxs

    def latest_offsets(self, start: OffsetMap, limit: ReadLimit) -> OffsetMap:
        queues = discover_queues(self.meta, self.opts)
        eff_start, maxs = self._effective_start(start, queues)
        self.latest_seen = dict(maxs)
        latest: OffsetMap = {}
        for mq, s in eff_start.items():
            top = maxs.get(mq, s)
            if self.available_now_target is not None:
                top = min(top, self.available_now_target.get(mq, s))
            latest[mq] = max(s, top)
        if isinstance(limit, ReadMaxRows):
            end = split_by_lag(eff_start, latest, limit.max_rows)
        else:
            end = latest
        for mq, s in eff_start.items():  # queues gone from the route keep their offset
            end.setdefault(mq, s)
        available = total_lag(eff_start, end)
        if (
            self.gate is not None
            and self.available_now_target is None
            and not isinstance(limit, ReadAllAvailable)
        ):
            now = self.clock_ms()
            if not self.gate.should_fire(total_lag(eff_start, latest), now):
                return dict(start)
            if available:
                self.gate.fired(now)
        return end

    def plan(self, start: OffsetMap, end: OffsetMap) -> list[QueueRange]:
        """Ranges of one micro-batch. Queues missing from ``start`` begin at their current minimum."""
        queues = sorted(mq for mq in end)
        mins = self.meta.min_offsets(queues) if queues else {}
        full = dict(start)
        for mq in queues:
            full.setdefault(mq, mins[mq])
        ranges: list[QueueRange] = []
        for mq in queues:
            s, e = full[mq], end[mq]
            lo = mins.get(mq, s)
            if e < s:  # latestOffset reset this queue (failOnDataLoss=false): read it from its minimum
                report_data_loss(
                    self.opts.fail_on_data_loss,
                    f"Queue {mq.topic}/{mq.broker_name}:{mq.queue_id}: end offset {e} is before start offset {s} "
                    "(the queue was reset); reading from its minimum offset.",
                )
                s = min(lo, e)
            if s < lo:
                report_data_loss(
                    self.opts.fail_on_data_loss,
                    f"Queue {mq.topic}/{mq.broker_name}:{mq.queue_id}: offsets [{s}, {min(lo, e)}) are below "
                    f"the queue's minimum offset {lo} and no longer available.",
                )
                s = min(lo, e)
            if e > s:
                ranges.append(QueueRange(mq.topic, mq.broker_name, mq.queue_id, s, e))
        return ranges


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._planner: StreamPlanner | None = None

    @property
    def planner(self) -> StreamPlanner:
        if self._planner is None:
            self._planner = StreamPlanner(self.opts, _metadata(self.opts))
        return self._planner

    def __getstate__(self) -> dict[str, Any]:  # executors get a copy without driver state
        return {"opts": self.opts, "_planner": None}

    def initialOffset(self) -> dict:
        return offsets_to_json(self.planner.initial_offsets())

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.prepare_available_now()

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.planner.default_read_limit()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # type: ignore[override]
        return offsets_to_json(self.planner.latest_offsets(offsets_from_json(start), limit))

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self.planner.latest_seen) if self.planner.latest_seen else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = self.planner.plan(offsets_from_json(start), offsets_from_json(end))
        return to_partitions(ranges, self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: the checkpoint is the source of truth (no group offsets are committed)."""

    def stop(self) -> None:
        """Nothing to release: clients are process-wide and closed at exit."""
