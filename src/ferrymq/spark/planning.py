"""Offset planning: which queues, which [start, end) per queue, how ranges become Spark tasks.

Pure functions over ``MessageQueue -> offset`` maps plus a small ``Metadata`` protocol (the driver's
view of the cluster), so everything here is unit-testable without a broker or a JVM.

Streaming offset / checkpoint JSON (what Spark stores in ``checkpoint/offsets/N``)::

    {"TopicA": {"broker-a:0": 120, "broker-a:1": 98, "broker-b:0": 77}}

Each value is the *next* queue offset to read; a micro-batch covers [start, end) per queue.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ferrymq.common.route import MessageQueue
from ferrymq.errors import ConfigError, FerryError
from ferrymq.spark.options import EARLIEST, LATEST, OffsetSpec, SourceOptions, parse_queue_key, queue_key

log = logging.getLogger("ferrymq.spark")

OffsetMap = dict[MessageQueue, int]


class DataLossError(FerryError):
    """Planned offsets are no longer available (expired, deleted or reset); see failOnDataLoss."""


DATA_LOSS_HINT = (
    " Some data may have been lost because it is no longer available in the broker (expired or deleted). "
    "If you want the query to continue anyway, set the source option failOnDataLoss=false."
)


def report_data_loss(fail_on_data_loss: bool, message: str) -> None:
    """Raise (failOnDataLoss=true) or log a warning (false)."""
    if fail_on_data_loss:
        raise DataLossError(message + DATA_LOSS_HINT)
    log.warning("%s Skipping (failOnDataLoss=false).", message)


class Metadata(Protocol):
    """The driver's view of the cluster (bulk calls, so an implementation can run them concurrently: each
    call is one round of requests; the planner asks for what it needs in as few calls as it can)."""

    def topics(self) -> list[str]: ...

    def queues(self, topic: str) -> list[MessageQueue]: ...

    def queues_of(self, topics: Sequence[str]) -> dict[str, list[MessageQueue]]: ...

    def offset_bounds(self, queues: Sequence[MessageQueue]) -> tuple[OffsetMap, OffsetMap]:
        """(min offsets, max offsets) of ``queues`` in one round."""
        ...

    def min_offsets(self, queues: Sequence[MessageQueue]) -> OffsetMap: ...

    def max_offsets(self, queues: Sequence[MessageQueue]) -> OffsetMap: ...

    def search_offsets(self, queues: Sequence[MessageQueue], timestamp_ms: int) -> OffsetMap: ...


# ---- offset JSON ---------------------------------------------------------------------------------


def offsets_to_json(offsets: Mapping[MessageQueue, int]) -> dict[str, dict[str, int]]:
    result: dict[str, dict[str, int]] = {}
    for mq in sorted(offsets):
        result.setdefault(mq.topic, {})[queue_key(mq.broker_name, mq.queue_id)] = int(offsets[mq])
    return result


def offsets_from_json(obj: Mapping[str, object] | None) -> OffsetMap:
    result: OffsetMap = {}
    for topic, queues in (obj or {}).items():
        if not isinstance(queues, Mapping):
            raise ValueError(f"bad offset JSON for topic {topic!r}: {queues!r}")
        for key, offset in queues.items():
            broker, qid = parse_queue_key("offset", str(key))
            result[MessageQueue(str(topic), broker, qid)] = int(offset)  # type: ignore[call-overload]
    return result


# ---- queue discovery -----------------------------------------------------------------------------


def discover_queues(meta: Metadata, opts: SourceOptions) -> list[MessageQueue]:
    """The queues the options select, sorted. Unknown subscribed topics simply have no queues yet."""
    if opts.assignment is not None:
        selected: list[MessageQueue] = []
        for topic, queues in meta.queues_of(list(opts.assignment.queues)).items():
            selected.extend(
                mq for mq in queues if opts.assignment.selects(topic, mq.broker_name, mq.queue_id)
            )
        return sorted(set(selected))
    if opts.pattern is not None:
        regex = re.compile(opts.pattern)
        topics = [t for t in meta.topics() if regex.fullmatch(t) and not _is_system_topic(t)]
    else:
        topics = list(opts.topics)
    found: set[MessageQueue] = set()
    for queues in meta.queues_of(topics).values():
        found.update(queues)
    return sorted(found)


def _is_system_topic(topic: str) -> bool:
    return topic.startswith(("%RETRY%", "%DLQ%", "RMQ_SYS_", "rmq_sys_")) or topic in (
        "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC",
    )  # fmt: skip


def check_spec_topics(option: str, spec: OffsetSpec, opts: SourceOptions) -> None:
    """A specific offsets spec may only name subscribed topics (pattern subscriptions: not checked)."""
    if spec.kind != "specific" or opts.pattern is not None:
        return
    subscribed = set(opts.assignment.queues) if opts.assignment is not None else set(opts.topics)
    for topic in spec.offsets:
        if topic not in subscribed:
            raise ConfigError(option, f"names topic {topic!r}, which is not subscribed")


# ---- resolving starting / ending offsets ---------------------------------------------------------


def resolve_spec(
    spec: OffsetSpec,
    queues: Sequence[MessageQueue],
    mins: Mapping[MessageQueue, int],
    maxs: Mapping[MessageQueue, int],
    default: int,
) -> OffsetMap:
    """Turn a spec into concrete offsets: -2 → queue min, -1 → queue max; unnamed queues get ``default``."""
    result: OffsetMap = {}
    for mq in queues:
        wanted = spec.for_queue(mq.topic, mq.broker_name, mq.queue_id, default)
        if wanted == EARLIEST:
            result[mq] = mins[mq]
        elif wanted == LATEST:
            result[mq] = maxs[mq]
        else:
            result[mq] = wanted
    return result


def _timestamps_per_queue(
    option: str, single_ms: int | None, by_queue: Mapping[str, Mapping[str, int]] | None,
    queues: Sequence[MessageQueue],
) -> dict[MessageQueue, int]:
    """The time each queue is resolved at: one for all, or the JSON's, which must name every queue (as Kafka)."""
    if single_ms is not None:
        return {mq: single_ms for mq in queues}
    assert by_queue is not None
    result: dict[MessageQueue, int] = {}
    missing: list[str] = []
    for mq in queues:
        ts = by_queue.get(mq.topic, {}).get(queue_key(mq.broker_name, mq.queue_id))
        if ts is None:
            missing.append(f"{mq.topic}/{queue_key(mq.broker_name, mq.queue_id)}")
        else:
            result[mq] = ts
    if missing:
        raise ConfigError(option, f"must name every queue of the subscription; missing {', '.join(missing)} "
                                  "(or use one time for all queues)")
    return result


def search_by_timestamps(meta: Metadata, per_queue: Mapping[MessageQueue, int]) -> OffsetMap:
    """SEARCH_OFFSET_BY_TIMESTAMP for each queue at its own time (one bulk call per distinct time)."""
    by_time: dict[int, list[MessageQueue]] = {}
    for mq, ts in per_queue.items():
        by_time.setdefault(ts, []).append(mq)
    found: OffsetMap = {}
    for ts, group in sorted(by_time.items()):
        found.update(meta.search_offsets(group, ts))
    return found


def resolve_starting_offsets(
    meta: Metadata, opts: SourceOptions, queues: Sequence[MessageQueue],
    mins: Mapping[MessageQueue, int], maxs: Mapping[MessageQueue, int],
) -> OffsetMap:
    """Starting offsets by Kafka's precedence: startingTimestamp, startingOffsetsByTimestamp, startingOffsets.

    A time resolves to the first offset stored at or after it. When a queue holds no such message, the
    strategy decides: ``error`` fails the query naming the queue, ``latest`` starts at the queue's max offset.
    """
    if opts.starting_timestamp_ms is None and opts.starting_by_timestamp is None:
        return resolve_spec(opts.starting, queues, mins, maxs, EARLIEST)
    option = "startingTimestamp" if opts.starting_timestamp_ms is not None else "startingOffsetsByTimestamp"
    if opts.starting.kind != ("latest" if opts.streaming else "earliest") or (
        option == "startingTimestamp" and opts.starting_by_timestamp is not None
    ):
        log.info("rocketmq source: %s takes precedence over the other starting options", option)
    per_queue = _timestamps_per_queue(option, opts.starting_timestamp_ms, opts.starting_by_timestamp, queues)
    found = search_by_timestamps(meta, per_queue)
    result: OffsetMap = {}
    for mq in queues:
        offset = found[mq]
        if offset >= maxs[mq]:  # no message stored at or after the time
            if opts.starting_timestamp_strategy == "error":
                raise ConfigError(
                    option,
                    f"no message of {mq.topic}/{queue_key(mq.broker_name, mq.queue_id)} was stored at or after "
                    f"{per_queue[mq]} ms (set startingOffsetsByTimestampStrategy=latest to start at the latest "
                    "offset instead)",
                )
            offset = maxs[mq]
        result[mq] = min(max(offset, mins[mq]), maxs[mq])
    return result


def resolve_ending_offsets(
    meta: Metadata, opts: SourceOptions, queues: Sequence[MessageQueue],
    mins: Mapping[MessageQueue, int], maxs: Mapping[MessageQueue, int],
) -> OffsetMap:
    """Ending offsets (exclusive) by precedence: endingTimestamp, endingOffsetsByTimestamp, endingOffsets.

    A time ends each queue before the first message stored at or after it, or at the latest offset when
    there is none (as Kafka).
    """
    if opts.ending_timestamp_ms is None and opts.ending_by_timestamp is None:
        return resolve_spec(opts.ending, queues, mins, maxs, LATEST)
    option = "endingTimestamp" if opts.ending_timestamp_ms is not None else "endingOffsetsByTimestamp"
    per_queue = _timestamps_per_queue(option, opts.ending_timestamp_ms, opts.ending_by_timestamp, queues)
    found = search_by_timestamps(meta, per_queue)
    return {mq: min(max(found[mq], mins[mq]), maxs[mq]) for mq in queues}


def resolve_starting(meta: Metadata, opts: SourceOptions, queues: Sequence[MessageQueue]) -> OffsetMap:
    """Starting offsets of a new query (batch, or the first micro-batch of a stream)."""
    if not queues:
        return {}
    return resolve_starting_offsets(meta, opts, queues, *meta.offset_bounds(queues))


def clamp_to_available(
    start: Mapping[MessageQueue, int],
    mins: Mapping[MessageQueue, int],
    maxs: Mapping[MessageQueue, int],
    fail_on_data_loss: bool,
) -> OffsetMap:
    """Start offsets moved into [min, max]; a start below min (expired) or above max (queue reset) is data loss."""
    result: OffsetMap = {}
    for mq, offset in start.items():
        lo, hi = mins.get(mq), maxs.get(mq)
        if lo is None or hi is None:  # queue gone from the route: keep the offset, nothing to read
            result[mq] = offset
            continue
        if offset < lo:
            report_data_loss(
                fail_on_data_loss,
                f"Queue {mq.topic}/{queue_key(mq.broker_name, mq.queue_id)}: offset {offset} is below the "
                f"queue's minimum offset {lo}; {lo - offset} messages are gone.",
            )
            offset = lo
        elif offset > hi:
            report_data_loss(
                fail_on_data_loss,
                f"Queue {mq.topic}/{queue_key(mq.broker_name, mq.queue_id)}: offset {offset} is beyond the "
                f"queue's maximum offset {hi} (the queue was reset or recreated).",
            )
            offset = lo
        result[mq] = offset
    return result


# ---- admission control ---------------------------------------------------------------------------


def total_lag(start: Mapping[MessageQueue, int], latest: Mapping[MessageQueue, int]) -> int:
    return sum(max(0, latest[mq] - start.get(mq, latest[mq])) for mq in latest)


def split_by_lag(
    start: Mapping[MessageQueue, int], latest: Mapping[MessageQueue, int], limit: int
) -> OffsetMap:
    """End offsets reading at most ``limit`` messages in total, shared in proportion to each queue's lag.

    Largest-remainder rounding: the shares sum to exactly min(limit, total lag), and no queue gets more
    than its lag. Queues without a start offset are not read.
    """
    lags = {mq: max(0, latest[mq] - start[mq]) for mq in latest if mq in start}
    total = sum(lags.values())
    end: OffsetMap = {mq: start[mq] for mq in lags}
    if total <= limit:
        return {mq: start[mq] + lag for mq, lag in lags.items()}
    shares: dict[MessageQueue, int] = {}
    remainders: list[tuple[float, MessageQueue]] = []
    for mq, lag in lags.items():
        exact = limit * lag / total
        shares[mq] = min(lag, math.floor(exact))
        remainders.append((exact - shares[mq], mq))
    left = limit - sum(shares.values())
    for _frac, mq in sorted(remainders, key=lambda item: (-item[0], item[1])):
        if left <= 0:
            break
        if shares[mq] < lags[mq]:
            shares[mq] += 1
            left -= 1
    for mq, share in shares.items():
        end[mq] = start[mq] + share
    return end


@dataclass(slots=True)
class TriggerGate:
    """minOffsetsPerTrigger + maxTriggerDelay: hold a batch back until enough rows or enough time passed."""

    min_rows: int
    max_delay_ms: int
    last_fire_ms: int | None = None

    def should_fire(self, available_rows: int, now_ms: int) -> bool:
        if self.last_fire_ms is None:
            self.last_fire_ms = now_ms  # the delay counts from the query's first planning
        if available_rows <= 0:
            return False
        if available_rows >= self.min_rows:
            return True
        return now_ms - self.last_fire_ms >= self.max_delay_ms

    def fired(self, now_ms: int) -> None:
        self.last_fire_ms = now_ms


# ---- ranges and partitions -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class QueueRange:
    """Queue offsets [start, end) one Spark task reads."""

    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


def ranges_between(start: Mapping[MessageQueue, int], end: Mapping[MessageQueue, int]) -> list[QueueRange]:
    """Non-empty ranges [start, end) for queues present in both maps."""
    return [
        QueueRange(mq.topic, mq.broker_name, mq.queue_id, start[mq], end[mq])
        for mq in sorted(end)
        if mq in start and end[mq] > start[mq]
    ]


def split_ranges(ranges: Sequence[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Split ranges so that there are at least ``min_partitions`` of them (in proportion to size)."""
    if not min_partitions or len(ranges) >= min_partitions:
        return list(ranges)
    total = sum(r.size for r in ranges)
    if total == 0:
        return list(ranges)
    result: list[QueueRange] = []
    for r in ranges:
        parts = max(1, min(r.size, math.ceil(r.size * min_partitions / total)))
        step, extra = divmod(r.size, parts)
        pos = r.start
        for i in range(parts):
            length = step + (1 if i < extra else 0)
            result.append(QueueRange(r.topic, r.broker_name, r.queue_id, pos, pos + length))
            pos += length
    return result
