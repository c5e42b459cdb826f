"""Latency fault tolerance for producers: avoid broker groups that failed or answered slowly.

After each send the producer reports (broker_name, latency_ms, isolation). The latency is mapped to
a "not available" duration by the table below (Java's defaults); ``isolation`` (a failure) counts as
the ``FAILURE_LATENCY_MS`` latency. A broker is available again when that duration has passed.

| latency ≥ ms | 0 | 50 | 100 | 550 | 1000 | 2000 | 3000 | 15000 |
|--------------|---|----|-----|-----|------|------|------|-------|
| avoid for ms | 0 | 0  | 0   | 30000 | 60000 | 120000 | 180000 | 600000 |
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

LATENCY_STEPS_MS = (15_000, 3_000, 2_000, 1_000, 550, 100, 50)
NOT_AVAILABLE_MS = (600_000, 180_000, 120_000, 60_000, 30_000, 0, 0)
#: Latency charged for a failed send (isolates the broker for the longest step).
FAILURE_LATENCY_MS = 30_000


_SMALLEST_STEP_MS = min(LATENCY_STEPS_MS)


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


def not_available_duration_ms(latency_ms: float) -> int:
    if latency_ms < _SMALLEST_STEP_MS:  # the usual case (a fast answer): no steps to walk
        return 0
    for step, duration in zip(LATENCY_STEPS_MS, NOT_AVAILABLE_MS, strict=True):
        if latency_ms >= step:
            return duration
    return 0


@dataclass(slots=True)
class FaultItem:
    broker_name: str
    latency_ms: float
    available_at_ms: float


class LatencyFaultTolerance:
    """Which broker groups a producer should avoid right now. ``clock`` returns milliseconds."""

    def __init__(self, clock: Callable[[], float] | None = None, *, enabled: bool = True,
                 failure_latency_ms: int = FAILURE_LATENCY_MS) -> None:
        self._clock = clock or _monotonic_ms
        self._items: dict[str, FaultItem] = {}
        self.enabled = enabled
        self.failure_latency_ms = failure_latency_ms

    def update(self, broker_name: str, latency_ms: float, isolation: bool = False) -> None:
        if not self.enabled:
            return
        latency = self.failure_latency_ms if isolation else latency_ms
        available_at = self._clock() + not_available_duration_ms(latency)
        item = self._items.get(broker_name)
        if item is None:
            self._items[broker_name] = FaultItem(broker_name, latency, available_at)
        else:  # updated in place: one send updates its broker's item every time
            item.latency_ms = latency
            item.available_at_ms = available_at

    def is_available(self, broker_name: str) -> bool:
        item = self._items.get(broker_name)
        return item is None or self._clock() >= item.available_at_ms

    def remove(self, broker_name: str) -> None:
        self._items.pop(broker_name, None)

    def pick_one_at_least(self) -> str | None:
        """The least bad broker among the avoided ones (earliest available, then lowest latency)."""
        if not self._items:
            return None
        best = min(self._items.values(), key=lambda i: (i.available_at_ms, i.latency_ms))
        return best.broker_name
