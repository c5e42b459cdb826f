"""Filter pushdown folding without a broker: which filters are used, which stay with Spark, and the bounds."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)

from ferrymq.common.route import MessageQueue
from ferrymq.spark.options import parse_source_options
from ferrymq.spark.planning import QueueRange
from ferrymq.spark.pushdown import PushedFilters, push
from ferrymq.spark.reader import narrow_ranges

pytestmark = pytest.mark.spark

UTC = dt.UTC


def opts(**kw: str):
    return parse_source_options({"nameServer": "h:1", "subscribe": "T", **kw}, streaming=False)


def test_usable_filters_fold_and_the_rest_stay_with_spark() -> None:
    kept = [IsNotNull(("tags",)), StringStartsWith(("key",), "k"), EqualTo(("queueId",), "1")]
    ts = GreaterThan(("storeTimestamp",), dt.datetime(2026, 1, 1, tzinfo=UTC))
    filters = [In(("tags",), ("a", "b")), EqualTo(("tags",), "b"), In(("brokerName",), ("broker-a",)),
               EqualTo(("queueId",), 2), EqualTo(("topic",), "T"), ts, *kept]  # fmt: skip
    pushed, remaining = push(filters, opts())
    assert pushed.tags == {"b"} and pushed.brokers == {"broker-a"} and pushed.queue_ids == {2}
    assert pushed.topics == {"T"} and pushed.store_from_ms == 1767225600000 + 1
    assert remaining == [ts, *kept] and all(a is b for a, b in zip(remaining, [ts, *kept], strict=True))
    # beside a SQL92 selector the tag filter stays with Spark (the broker evaluates the selector only)
    sql = opts(expressionType="SQL92", subExpression="a > 1")
    tag_filter = EqualTo(("tags",), "x")
    assert push([tag_filter], sql) == (PushedFilters(), [tag_filter])


def test_tags_meet_the_sub_expression() -> None:
    pushed, _ = push([In(("tags",), ("a", "b", "c"))], opts())
    assert pushed.apply_tags(opts(subExpression="b || c || d")).sub_expression == "b || c"
    assert pushed.apply_tags(opts()).sub_expression == "a || b || c"
    none, _ = push([EqualTo(("tags",), "a"), EqualTo(("tags",), "b")], opts())
    assert none.empty and narrow_ranges(None, [QueueRange("T", "b", 0, 0, 9)], none) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cls", "micros", "bounds"),
    [
        (GreaterThan, 500, (1001, None)),  # > 1000.5 ms: whole ms from 1001
        (GreaterThan, 0, (1001, None)),
        (GreaterThanOrEqual, 500, (1001, None)),
        (GreaterThanOrEqual, 0, (1000, None)),
        (LessThan, 500, (None, 1001)),  # < 1000.5 ms: whole ms up to 1000 (end exclusive 1001)
        (LessThan, 0, (None, 1000)),
        (LessThanOrEqual, 500, (None, 1001)),
        (LessThanOrEqual, 0, (None, 1001)),
        (EqualTo, 0, (1000, 1001)),
        (EqualTo, 500, (1001, 1001)),  # no whole ms equals 1000.5 ms
    ],
)
def test_store_time_bounds_round_outwards(cls: type, micros: int, bounds: tuple[int | None, int | None]) -> None:
    value = dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=1, microseconds=micros)
    pushed, remaining = push([cls(("storeTimestamp",), value)], opts())
    assert (pushed.store_from_ms, pushed.store_to_ms) == bounds
    assert len(remaining) == 1  # Spark still applies the exact comparison


class TimedMeta:
    """offset i stored at (i + 1) * 100 ms"""

    def search_offsets(self, queues: list[MessageQueue], timestamp_ms: int) -> dict[MessageQueue, int]:
        return {mq: max(0, -(-timestamp_ms // 100) - 1) for mq in queues}


def test_ranges_pruned_and_narrowed() -> None:
    ranges = [QueueRange("T", "broker-a", 0, 0, 10), QueueRange("T", "broker-a", 1, 3, 10),
              QueueRange("T", "broker-b", 0, 0, 10)]  # fmt: skip
    pushed = PushedFilters(brokers=frozenset({"broker-a"}), store_from_ms=450, store_to_ms=800)
    assert narrow_ranges(TimedMeta(), ranges, pushed) == [QueueRange("T", "broker-a", 0, 4, 7),  # type: ignore[arg-type]
                                                          QueueRange("T", "broker-a", 1, 4, 7)]  # fmt: skip
    late = PushedFilters(store_from_ms=5000)
    assert narrow_ranges(TimedMeta(), ranges, late) == []  # type: ignore[arg-type]
