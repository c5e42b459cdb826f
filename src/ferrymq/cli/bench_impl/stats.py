"""Small statistics helpers: percentiles over latency samples, medians over repeats."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile of an already sorted sequence; None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def latency_summary_us(samples_ns: Sequence[int]) -> dict[str, float | None]:
    """p50/p99/p999 in microseconds of a list of nanosecond latencies."""
    s = sorted(samples_ns)
    return {
        "p50_us": _ns_to_us(percentile(s, 50)),
        "p99_us": _ns_to_us(percentile(s, 99)),
        "p999_us": _ns_to_us(percentile(s, 99.9)),
        "samples": len(s),
    }


def _ns_to_us(v: float | None) -> float | None:
    return None if v is None else v / 1000.0


def median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def thin(samples: list[int], cap: int) -> list[int]:
    """Keep at most ``cap`` evenly spaced samples (so worker processes ship bounded lists)."""
    if len(samples) <= cap:
        return samples
    step = len(samples) / cap
    return [samples[int(i * step)] for i in range(cap)]
