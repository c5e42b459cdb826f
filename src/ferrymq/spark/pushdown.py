"""Filter pushdown for batch reads (``DataSourceReader.pushFilters``, PySpark >= 4.1).

Spark hands the conjuncts of a query's WHERE clause; each one the source can use is folded into
``PushedFilters`` and changes what is pulled:

| filter (column, Spark filter)                         | effect                                              | Spark re-checks |
|-------------------------------------------------------|-----------------------------------------------------|-----------------|
| tags: EqualTo, EqualNullSafe, In                      | the PULL's tag expression (the broker skips others)  | no (exact)      |
| topic, brokerName, queueId: EqualTo, EqualNullSafe, In | queues pruned before planning                       | no (exact)      |
| storeTimestamp: >, >=, <, <=, =                       | offset range narrowed with SEARCH_OFFSET_BY_TIMESTAMP | yes            |

Everything else (other columns, OR, NOT, string matches, a tag filter beside a SQL92 ``subExpression``) is
handed back to Spark untouched. Timestamp narrowing relies on store times ascending within a queue (the broker
stamps records in append order); Spark still evaluates those filters, so rows are exact either way.

Spark's timestamp values are ``datetime`` objects (naive ones are local time, as PySpark makes them); the store
keeps milliseconds, so bounds are rounded outwards to whole milliseconds.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from ferrymq.common.sql92 import EXPRESSION_TYPE_TAG
from ferrymq.spark.options import SourceOptions, parse_sub_expression

_EQUALITY = (EqualTo, EqualNullSafe)
_QUEUE_COLUMNS = {"topic": str, "brokerName": str, "queueId": int}


@dataclass(frozen=True, slots=True)
class PushedFilters:
    """What the pushed filters allow (None = no constraint). Picklable: it travels with the reader."""

    tags: frozenset[str] | None = None
    topics: frozenset[str] | None = None
    brokers: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    store_from_ms: int | None = None  # inclusive
    store_to_ms: int | None = None  # exclusive

    @property
    def empty(self) -> bool:
        """True when no row can pass (e.g. ``tags = 'a' AND tags = 'b'``)."""
        sets: tuple[frozenset[Any] | None, ...] = (self.tags, self.topics, self.brokers, self.queue_ids)
        if any(s is not None and not s for s in sets):
            return True
        return self.store_from_ms is not None and self.store_to_ms is not None and self.store_from_ms >= self.store_to_ms

    def selects(self, topic: str, broker_name: str, queue_id: int) -> bool:
        return ((self.topics is None or topic in self.topics) and (self.brokers is None or broker_name in self.brokers)
                and (self.queue_ids is None or queue_id in self.queue_ids))  # fmt: skip

    def apply_tags(self, opts: SourceOptions) -> SourceOptions:
        """Options whose tag expression also requires the pushed tags."""
        if self.tags is None:
            return opts
        wanted = self.tags
        current = parse_sub_expression(opts.sub_expression)
        if current is not None:
            wanted = wanted & current
        if not wanted:
            return opts  # ``empty`` already says no row passes; the planner reads nothing
        return replace(opts, sub_expression=" || ".join(sorted(wanted)))


def _column(f: Filter) -> str | None:
    attribute: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
    return attribute[0] if len(attribute) == 1 else None


def _values(f: Filter, kind: type) -> frozenset[Any] | None:
    """The values an equality / IN filter allows, or None when they are not all of ``kind``."""
    raw = (f.value,) if isinstance(f, _EQUALITY) else tuple(f.value) if isinstance(f, In) else None  # type: ignore[attr-defined]
    if raw is None or not all(isinstance(v, kind) and not isinstance(v, bool) for v in raw):
        return None
    return frozenset(raw)


def _epoch_us(value: Any) -> int | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.astimezone()  # naive: local time, as PySpark's TimestampType makes it
        delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return None


def _intersect(a: frozenset[Any] | None, b: frozenset[Any]) -> frozenset[Any]:
    return b if a is None else a & b


def push(filters: Iterable[Filter], opts: SourceOptions) -> tuple[PushedFilters, list[Filter]]:
    """Fold the usable filters into ``PushedFilters``; return it with the filters Spark must still apply."""
    pushed = PushedFilters()
    remaining: list[Filter] = []
    for f in filters:
        column = _column(f)
        if column == "tags" and opts.expression_type == EXPRESSION_TYPE_TAG:
            tags = _values(f, str)
            if tags is not None:
                pushed = replace(pushed, tags=_intersect(pushed.tags, tags))
                continue
        elif column in _QUEUE_COLUMNS:
            values = _values(f, _QUEUE_COLUMNS[column])
            if values is not None:
                if column == "topic":
                    pushed = replace(pushed, topics=_intersect(pushed.topics, values))
                elif column == "brokerName":
                    pushed = replace(pushed, brokers=_intersect(pushed.brokers, values))
                else:
                    pushed = replace(pushed, queue_ids=_intersect(pushed.queue_ids, values))
                continue
        elif column == "storeTimestamp":
            pushed = _narrow_time(pushed, f)
        remaining.append(f)
    return pushed, remaining


def _narrow_time(pushed: PushedFilters, f: Filter) -> PushedFilters:
    """Store-time bounds in whole ms: rows whose ms time satisfies the filter lie in [from, to)."""
    us = _epoch_us(getattr(f, "value", None))
    if us is None:
        return pushed
    floor_ms, ceil_ms = us // 1000, math.ceil(us / 1000) if us % 1000 else us // 1000
    lo: int | None = None
    hi: int | None = None
    if isinstance(f, GreaterThan):
        lo = floor_ms + 1
    elif isinstance(f, GreaterThanOrEqual):
        lo = ceil_ms
    elif isinstance(f, LessThan):
        hi = ceil_ms
    elif isinstance(f, LessThanOrEqual):
        hi = floor_ms + 1
    elif isinstance(f, _EQUALITY):
        lo, hi = ceil_ms, floor_ms + 1
    if lo is not None:
        pushed = replace(pushed, store_from_ms=lo if pushed.store_from_ms is None else max(lo, pushed.store_from_ms))
    if hi is not None:
        pushed = replace(pushed, store_to_ms=hi if pushed.store_to_ms is None else min(hi, pushed.store_to_ms))
    return pushed

