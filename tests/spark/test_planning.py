"""Offset planning without a broker: a fake Metadata stands in for the cluster."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from ferrymq.common.route import MessageQueue
from ferrymq.errors import ConfigError
from ferrymq.spark.options import parse_source_options
from ferrymq.spark.planning import (
    DataLossError,
    OffsetMap,
    QueueRange,
    TriggerGate,
    offsets_from_json,
    offsets_to_json,
    split_by_lag,
    split_ranges,
)
from ferrymq.spark.reader import StreamPlanner, plan_batch

pytestmark = pytest.mark.spark

A0, A1, B0 = (
    MessageQueue("T", "broker-a", 0),
    MessageQueue("T", "broker-a", 1),
    MessageQueue("T", "broker-b", 0),
)


class FakeMeta:
    def __init__(self, bounds: dict[MessageQueue, tuple[int, int]], topics: Sequence[str] = ("T",)) -> None:
        self.bounds = dict(bounds)
        self.topic_names = list(topics)
        self.searched: list[int] = []
        #: look-ups made (each is one round of requests in ClusterMetadata)
        self.calls: list[str] = []

    def topics(self) -> list[str]:
        self.calls.append("topics")
        return self.topic_names

    def queues(self, topic: str) -> list[MessageQueue]:
        self.calls.append("queues")
        return sorted(mq for mq in self.bounds if mq.topic == topic)

    def queues_of(self, topics: Sequence[str]) -> dict[str, list[MessageQueue]]:
        self.calls.append("queues_of")
        return {t: sorted(mq for mq in self.bounds if mq.topic == t) for t in topics}

    def offset_bounds(self, queues: Sequence[MessageQueue]) -> tuple[OffsetMap, OffsetMap]:
        self.calls.append("offset_bounds")
        return {mq: self.bounds[mq][0] for mq in queues}, {mq: self.bounds[mq][1] for mq in queues}

    def min_offsets(self, queues: Sequence[MessageQueue]) -> OffsetMap:
        self.calls.append("min_offsets")
        return {mq: self.bounds[mq][0] for mq in queues}

    def max_offsets(self, queues: Sequence[MessageQueue]) -> OffsetMap:
        self.calls.append("max_offsets")
        return {mq: self.bounds[mq][1] for mq in queues}

    def search_offsets(self, queues: Sequence[MessageQueue], timestamp_ms: int) -> OffsetMap:
        self.searched.append(timestamp_ms)
        return {mq: self.bounds[mq][0] + 3 for mq in queues}


def opts(streaming: bool = False, **kw: str):
    return parse_source_options({"nameServer": "h:1", "subscribe": "T", **kw}, streaming=streaming)


# ---- pure helpers ---------------------------------------------------------------------------------


def test_offsets_json_round_trip() -> None:
    offsets = {A0: 5, A1: 7, B0: 0, MessageQueue("U", "broker-a", 2): 9}
    obj = offsets_to_json(offsets)
    assert obj == {"T": {"broker-a:0": 5, "broker-a:1": 7, "broker-b:0": 0}, "U": {"broker-a:2": 9}}
    assert offsets_from_json(obj) == offsets


def test_split_by_lag_is_proportional_and_exact() -> None:
    start = {A0: 0, A1: 100, B0: 10}
    latest = {A0: 600, A1: 400, B0: 10}  # lags 600, 300, 0
    end = split_by_lag(start, latest, 90)
    assert end == {A0: 60, A1: 130, B0: 10}
    assert sum(end[q] - start[q] for q in start) == 90
    # rounding: shares sum to the limit exactly and never exceed a lag
    end = split_by_lag({A0: 0, A1: 0, B0: 0}, {A0: 1, A1: 1, B0: 1}, 2)
    assert sum(end.values()) == 2 and all(v <= 1 for v in end.values())
    # limit above the total lag: everything
    assert split_by_lag(start, latest, 10_000) == latest


def test_split_ranges_for_min_partitions() -> None:
    ranges = [QueueRange("T", "broker-a", 0, 0, 90), QueueRange("T", "broker-a", 1, 5, 15)]
    parts = split_ranges(ranges, 10)
    assert len(parts) >= 10
    for r in ranges:  # contiguous, covering exactly
        mine = sorted(p for p in parts if p.queue_id == r.queue_id)
        assert mine[0].start == r.start and mine[-1].end == r.end
        assert all(a.end == b.start for a, b in zip(mine, mine[1:], strict=False))
    assert split_ranges(ranges, None) == ranges
    assert split_ranges([QueueRange("T", "b", 0, 0, 2)], 10) == [
        QueueRange("T", "b", 0, 0, 1),
        QueueRange("T", "b", 0, 1, 2),
    ]


def test_trigger_gate() -> None:
    gate = TriggerGate(min_rows=100, max_delay_ms=1000)
    assert not gate.should_fire(10, now_ms=0)
    assert not gate.should_fire(10, now_ms=999)
    assert gate.should_fire(10, now_ms=1000)  # delay passed
    gate.fired(1000)
    assert not gate.should_fire(50, now_ms=1500)
    assert gate.should_fire(100, now_ms=1500)  # enough rows
    assert not gate.should_fire(0, now_ms=10_000)  # nothing to read


# ---- batch planning -------------------------------------------------------------------------------


def test_batch_plan_default_is_earliest_to_latest() -> None:
    meta = FakeMeta({A0: (0, 10), A1: (5, 5), B0: (2, 8)})
    assert plan_batch(meta, opts()) == [
        QueueRange("T", "broker-a", 0, 0, 10),
        QueueRange("T", "broker-b", 0, 2, 8),
    ]


def test_batch_plan_specific_offsets_and_timestamp() -> None:
    meta = FakeMeta({A0: (0, 10), A1: (0, 10), B0: (0, 10)})
    o = opts(
        startingOffsets='{"T": {"broker-a:0": 3, "broker-b:0": 10}}', endingOffsets='{"T": {"broker-a:0": 7}}'
    )
    assert plan_batch(meta, o) == [
        QueueRange("T", "broker-a", 0, 3, 7),
        QueueRange("T", "broker-a", 1, 0, 10),
    ]
    ts = plan_batch(meta, opts(startingTimestamp="1234"))
    assert meta.searched == [1234] and {r.start for r in ts} == {3}


def test_batch_plan_errors() -> None:
    meta = FakeMeta({A0: (0, 10)})
    with pytest.raises(ConfigError, match="^subscribe.*Missing"):
        plan_batch(meta, opts(subscribe="T,Missing"))
    with pytest.raises(ConfigError, match="^startingOffsets.*'U'"):
        plan_batch(meta, opts(startingOffsets='{"U": {"broker-a:0": 1}}'))
    with pytest.raises(ConfigError, match="^startingOffsets.*after its end"):
        plan_batch(
            meta, opts(startingOffsets='{"T": {"broker-a:0": 8}}', endingOffsets='{"T": {"broker-a:0": 4}}')
        )


def test_batch_plan_data_loss_both_ways() -> None:
    meta = FakeMeta({A0: (50, 100)})
    o = opts(startingOffsets='{"T": {"broker-a:0": 10}}')
    with pytest.raises(DataLossError, match="below the queue's minimum offset 50.*failOnDataLoss=false"):
        plan_batch(meta, o)
    lenient = opts(startingOffsets='{"T": {"broker-a:0": 10}}', failOnDataLoss="false")
    assert plan_batch(meta, lenient) == [QueueRange("T", "broker-a", 0, 50, 100)]


def test_batch_plan_pattern_and_assign() -> None:
    u0 = MessageQueue("Users", "broker-a", 0)
    meta = FakeMeta({A0: (0, 1), u0: (0, 2), MessageQueue("%RETRY%g", "broker-a", 0): (0, 3)},
                    topics=["T", "Users", "%RETRY%g"])  # fmt: skip
    pat = parse_source_options({"nameServer": "h:1", "subscribePattern": "U.*|%RETRY%.*"}, streaming=False)
    assert [r.topic for r in plan_batch(meta, pat)] == ["Users"]
    meta = FakeMeta({A0: (0, 1), A1: (0, 2), B0: (0, 3)})
    asg = parse_source_options({"nameServer": "h:1", "assign": '{"T": [1, "broker-b:0"]}'}, streaming=False)
    assert [(r.broker_name, r.queue_id) for r in plan_batch(meta, asg)] == [("broker-a", 1), ("broker-b", 0)]


# ---- streaming planning ---------------------------------------------------------------------------


def test_stream_initial_offsets() -> None:
    meta = FakeMeta({A0: (2, 10), B0: (0, 4)})
    assert StreamPlanner(opts(True), meta).initial_offsets() == {A0: 10, B0: 4}
    assert StreamPlanner(opts(True, startingOffsets="earliest"), meta).initial_offsets() == {A0: 2, B0: 0}
    assert StreamPlanner(opts(True, startingTimestamp="5"), meta).initial_offsets() == {A0: 5, B0: 3}


def test_stream_max_rows_and_new_queue_from_earliest() -> None:
    meta = FakeMeta({A0: (0, 100), B0: (0, 100)})
    planner = StreamPlanner(opts(True, maxOffsetsPerTrigger="50"), meta)
    limit = planner.default_read_limit()
    assert limit == ReadMaxRows(50)
    end = planner.latest_offsets({A0: 0, B0: 0}, limit)
    assert end == {A0: 25, B0: 25}
    meta.bounds[A1] = (7, 27)  # a queue appears later: read from its earliest offset
    end2 = planner.latest_offsets(end, ReadAllAvailable())
    assert end2 == {A0: 100, A1: 27, B0: 100}
    assert planner.plan(end, end2) == [
        QueueRange("T", "broker-a", 0, 25, 100), QueueRange("T", "broker-a", 1, 7, 27),
        QueueRange("T", "broker-b", 0, 25, 100),
    ]  # fmt: skip


def test_stream_start_asks_one_round_per_look_up() -> None:
    """A query's start (the runner's prepare, initialOffset, latestOffset, partitions) fetches the routes of
    all topics in one call and the min and max offsets of all queues together, never queue by queue."""
    users = MessageQueue("Users", "broker-a", 0)
    meta = FakeMeta({A0: (0, 30), B0: (2, 9), users: (0, 5)}, topics=("T", "Users"))
    planner = StreamPlanner(opts(True, subscribe="T,Users", startingOffsets="earliest"), meta)
    planner.prepare_available_now()
    assert meta.calls == ["queues_of", "max_offsets"]
    meta.calls.clear()
    start = planner.initial_offsets()
    assert meta.calls == ["queues_of", "offset_bounds"]
    meta.calls.clear()
    end = planner.latest_offsets(start, ReadAllAvailable())
    assert meta.calls == ["queues_of", "offset_bounds"]
    meta.calls.clear()
    assert len(planner.plan(start, end)) == 3
    assert meta.calls == ["min_offsets"]
    meta.calls.clear()
    assert len(plan_batch(meta, opts(subscribe="T,Users"))) == 3
    assert meta.calls == ["queues_of", "offset_bounds"]


def test_stream_available_now_target_is_fixed() -> None:
    meta = FakeMeta({A0: (0, 30)})
    planner = StreamPlanner(opts(True, maxOffsetsPerTrigger="20"), meta)
    planner.prepare_available_now()
    meta.bounds[A0] = (0, 1000)  # data arriving after the trigger started is not read
    e1 = planner.latest_offsets({A0: 0}, ReadMaxRows(20))
    e2 = planner.latest_offsets(e1, ReadMaxRows(20))
    e3 = planner.latest_offsets(e2, ReadMaxRows(20))
    assert (e1[A0], e2[A0], e3[A0]) == (20, 30, 30)


def test_stream_min_trigger_waits_for_rows_or_delay() -> None:
    now = [0]
    meta = FakeMeta({A0: (0, 5)})
    planner = StreamPlanner(
        opts(True, minOffsetsPerTrigger="10", maxTriggerDelay="1s"), meta, clock_ms=lambda: now[0]
    )
    limit = planner.default_read_limit()
    assert limit == ReadMinRows(10)
    assert planner.latest_offsets({A0: 0}, limit) == {A0: 0}  # 5 < 10: hold back
    now[0] = 500
    assert planner.latest_offsets({A0: 0}, limit) == {A0: 0}
    now[0] = 1000
    assert planner.latest_offsets({A0: 0}, limit) == {A0: 5}  # delay passed
    meta.bounds[A0] = (0, 20)
    now[0] = 1001
    assert planner.latest_offsets({A0: 5}, limit) == {A0: 20}  # 15 >= 10
    assert planner.latest_offsets({A0: 5}, ReadAllAvailable()) == {A0: 20}  # trigger once: no gate


def test_stream_data_loss_both_ways() -> None:
    meta = FakeMeta({A0: (40, 100)})
    strict = StreamPlanner(opts(True), meta)
    with pytest.raises(DataLossError, match="below the queue's minimum offset 40"):
        strict.latest_offsets({A0: 10}, ReadAllAvailable())
    with pytest.raises(DataLossError):
        strict.plan({A0: 10}, {A0: 100})
    lenient = StreamPlanner(opts(True, failOnDataLoss="false"), meta)
    assert lenient.latest_offsets({A0: 10}, ReadAllAvailable()) == {A0: 100}
    assert lenient.plan({A0: 10}, {A0: 100}) == [QueueRange("T", "broker-a", 0, 40, 100)]
    assert lenient.plan({A0: 10}, {A0: 30}) == []  # the whole range expired


# ---- Kafka's timestamp options --------------------------------------------------------------------


class TimedMeta(FakeMeta):
    """Offset i of every queue was stored at ``(i + 1) * 100`` ms; search finds the first at/after a time."""

    def search_offsets(self, queues: Sequence[MessageQueue], timestamp_ms: int) -> OffsetMap:
        self.searched.append(timestamp_ms)
        result: OffsetMap = {}
        for mq in queues:
            lo, hi = self.bounds[mq]
            first = max(lo, -(-timestamp_ms // 100) - 1)
            result[mq] = min(first, hi)
        return result


def test_starting_offsets_by_timestamp_per_queue_and_precedence() -> None:
    meta = TimedMeta({A0: (0, 10), A1: (0, 10), B0: (0, 10)})
    by_ts = '{"T": {"broker-a:0": 300, "broker-a:1": 550, "broker-b:0": 100}}'
    ranges = plan_batch(meta, opts(startingOffsetsByTimestamp=by_ts))
    assert [(r.broker_name, r.queue_id, r.start) for r in ranges] == [("broker-a", 0, 2), ("broker-a", 1, 5),
                                                                         ("broker-b", 0, 0)]  # fmt: skip
    # Kafka's precedence: startingOffsetsByTimestamp over startingOffsets, startingTimestamp over both
    both = opts(startingOffsetsByTimestamp=by_ts, startingOffsets='{"T": {"broker-a:0": 9}}')
    assert [r.start for r in plan_batch(meta, both)] == [2, 5, 0]
    top = opts(startingTimestamp="800", startingOffsetsByTimestamp=by_ts, startingOffsets="earliest")
    assert [r.start for r in plan_batch(meta, top)] == [7, 7, 7]
    assert StreamPlanner(opts(True, startingOffsetsByTimestamp=by_ts), meta).initial_offsets() == {A0: 2, A1: 5,
                                                                                                  B0: 0}  # fmt: skip


def test_starting_timestamp_strategy_error_and_latest() -> None:
    meta = TimedMeta({A0: (0, 10), B0: (0, 4)})
    # 600 ms: broker-a:0 has offset 5, broker-b:0 (4 messages, stored up to 400 ms) has none
    with pytest.raises(ConfigError, match=r"^startingTimestamp.*T/broker-b:0.*at or after 600 ms.*=latest"):
        plan_batch(meta, opts(startingTimestamp="600"))
    with pytest.raises(ConfigError, match=r"^startingOffsetsByTimestamp.*T/broker-b:0"):
        plan_batch(meta, opts(startingOffsetsByTimestamp='{"T": {"broker-a:0": 100, "broker-b:0": 900}}'))
    latest = opts(startingTimestamp="600", startingOffsetsByTimestampStrategy="latest")
    assert plan_batch(meta, latest) == [QueueRange("T", "broker-a", 0, 5, 10)]  # broker-b:0 starts at its end
    assert StreamPlanner(opts(True, startingTimestamp="600", startingOffsetsByTimestampStrategy="LATEST"),
                         meta).initial_offsets() == {A0: 5, B0: 4}  # fmt: skip


def test_by_timestamp_must_name_every_queue() -> None:
    meta = TimedMeta({A0: (0, 10), B0: (0, 10)})
    with pytest.raises(ConfigError, match=r"^startingOffsetsByTimestamp.*missing T/broker-b:0"):
        plan_batch(meta, opts(startingOffsetsByTimestamp='{"T": {"broker-a:0": 100}}'))
    with pytest.raises(ConfigError, match=r"^endingOffsetsByTimestamp.*missing T/broker-a:0"):
        plan_batch(meta, opts(endingOffsetsByTimestamp='{"T": {"broker-b:0": 100}}'))


def test_ending_timestamps_precedence_and_no_match_is_latest() -> None:
    meta = TimedMeta({A0: (0, 10), B0: (2, 6)})
    # endingTimestamp 450: offsets stored before it are 0..3 -> end 4 (broker-b:0 from its min 2)
    assert [(r.start, r.end) for r in plan_batch(meta, opts(endingTimestamp="450"))] == [(0, 4), (2, 4)]
    by_ts = '{"T": {"broker-a:0": 250, "broker-b:0": 99999}}'
    assert [(r.start, r.end) for r in plan_batch(meta, opts(endingOffsetsByTimestamp=by_ts))] == [(0, 2), (2, 6)]
    # endingTimestamp wins over endingOffsetsByTimestamp and endingOffsets
    top = opts(endingTimestamp="450", endingOffsetsByTimestamp=by_ts, endingOffsets='{"T": {"broker-a:0": 1}}')
    assert [(r.start, r.end) for r in plan_batch(meta, top)] == [(0, 4), (2, 4)]
    both = opts(startingTimestamp="300", endingTimestamp="700")
    assert [(r.start, r.end) for r in plan_batch(meta, both)] == [(2, 6), (2, 6)]


def test_timestamp_options_checked_at_load() -> None:
    for bad, name in (
        ({"startingOffsetsByTimestamp": "[1]"}, "startingOffsetsByTimestamp"),
        ({"startingOffsetsByTimestamp": '{"T": {"broker-a:0": -5}}'}, "startingOffsetsByTimestamp"),
        ({"startingOffsetsByTimestamp": '{"T": {"a0": 5}}'}, "startingOffsetsByTimestamp"),
        ({"endingOffsetsByTimestamp": '{"T": {"broker-a:0": "soon"}}'}, "endingOffsetsByTimestamp"),
        ({"startingOffsetsByTimestampStrategy": "earliest"}, "startingOffsetsByTimestampStrategy"),
        ({"endingTimestamp": "-1"}, "endingTimestamp"),
        ({"fetchOffset.numRetries": "-1"}, "fetchOffset.numRetries"),
        ({"fetchOffset.retryIntervalMs": "x"}, "fetchOffset.retryIntervalMs"),
    ):
        with pytest.raises(ConfigError, match=f"^{name}"):
            opts(**bad)
    for name in ("endingTimestamp", "endingOffsetsByTimestamp"):
        with pytest.raises(ConfigError, match=f"^{name}.*batch queries only"):
            opts(True, **{name: '{"T": {"broker-a:0": 1}}' if "By" in name else "1"})
    o = opts(**{"fetchOffset.numRetries": "5", "fetchOffset.retryIntervalMs": "250"})
    assert (o.executor_options().fetch_offset_num_retries, o.executor_options().fetch_offset_retry_interval_ms) == (
        5, 250)  # fmt: skip


def test_metadata_lookups_are_retried_then_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    from ferrymq.errors import FerryError
    from ferrymq.spark import runtime

    calls: list[int] = []

    def flaky_run(coro: object, timeout_s: float | None = None) -> object:
        coro.close()  # type: ignore[attr-defined]
        calls.append(1)
        if len(calls) < 3:
            raise FerryError("connection refused")
        return ["T"]

    monkeypatch.setattr(runtime, "run", flaky_run)
    meta = runtime.ClusterMetadata(opts(**{"fetchOffset.retryIntervalMs": "1"}).executor_options())
    assert meta.topics() == ["T"] and len(calls) == 3
    calls.clear()
    strict = runtime.ClusterMetadata(opts(**{"fetchOffset.numRetries": "1"}).executor_options())
    with pytest.raises(FerryError, match="connection refused"):
        strict.topics()
    assert len(calls) == 2
