"""A push consumer's per-topic consume statistics: the ``statusTable`` of its GET_CONSUMER_RUNNING_INFO answer
(Java's ``ConsumerStatsManager`` / ``ConsumeStatus``), which rocketmq-exporter and the broker's own exporter
families read.

| field             | meaning (as the Java client computes it)                                    |
|-------------------|-----------------------------------------------------------------------------|
| pullRT            | mean time of a pull request that found messages, last minute (ms)           |
| pullTPS           | messages pulled per second, last minute                                     |
| consumeRT         | mean listener time per batch, last minute (ms)                              |
| consumeOKTPS      | messages consumed successfully per second, last minute                      |
| consumeFailedTPS  | messages whose listener failed per second, last minute                      |
| consumeFailedMsgs | messages whose listener failed during the last hour                         |

Each topic keeps running totals and snapshots of them taken at most every ``STATUS_SAMPLE_INTERVAL_MS`` (on a
record or a read), for an hour at most: a rate is (total now - total at the oldest snapshot of the window) /
elapsed. Recording costs a few additions.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

STATUS_SAMPLE_INTERVAL_MS = 10_000
MINUTE_MS = 60_000
HOUR_MS = 3_600_000

#: indexes of the totals
PULLS, PULL_RT_MS, PULLED_MSGS, CONSUMES, CONSUME_RT_MS, CONSUME_OK, CONSUME_FAILED = range(7)


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class _TopicStatus:
    __slots__ = ("totals", "snaps")

    def __init__(self, now_ms: int) -> None:
        self.totals = [0.0] * 7
        self.snaps: deque[tuple[int, tuple[float, ...]]] = deque([(now_ms, tuple(self.totals))])

    def sample(self, now_ms: int) -> None:
        if now_ms - self.snaps[-1][0] >= STATUS_SAMPLE_INTERVAL_MS:
            self.snaps.append((now_ms, tuple(self.totals)))
            while len(self.snaps) > 1 and self.snaps[1][0] <= now_ms - HOUR_MS:
                self.snaps.popleft()

    def since(self, now_ms: int, window_ms: int) -> tuple[float, list[float]]:
        """(elapsed s, totals now - totals at the oldest snapshot inside the window)."""
        base = self.snaps[-1]
        for snap in self.snaps:
            if snap[0] >= now_ms - window_ms:
                base = snap
                break
        return (now_ms - base[0]) / 1000.0, [now - then for now, then in zip(self.totals, base[1], strict=True)]


class ConsumeStatusStats:
    def __init__(self, clock_ms: Callable[[], int] = _monotonic_ms) -> None:
        self.clock_ms = clock_ms
        self.topics: dict[str, _TopicStatus] = {}

    def _topic(self, topic: str) -> _TopicStatus:
        now = self.clock_ms()
        t = self.topics.get(topic)
        if t is None:
            t = self.topics[topic] = _TopicStatus(now)
        else:
            t.sample(now)
        return t

    def on_pull(self, topic: str, rt_ms: float, msgs: int) -> None:
        t = self._topic(topic).totals
        t[PULLS] += 1
        t[PULL_RT_MS] += rt_ms
        t[PULLED_MSGS] += msgs

    def on_consume(self, topic: str, rt_ms: float, msgs: int, ok: bool) -> None:
        t = self._topic(topic).totals
        t[CONSUMES] += 1
        t[CONSUME_RT_MS] += rt_ms
        t[CONSUME_OK if ok else CONSUME_FAILED] += msgs

    def status_table(self) -> dict[str, dict[str, Any]]:
        now = self.clock_ms()
        out: dict[str, dict[str, Any]] = {}
        for topic, t in list(self.topics.items()):
            t.sample(now)
            elapsed_s, d = t.since(now, MINUTE_MS)
            _hour_s, h = t.since(now, HOUR_MS)

            def per_s(v: float, s: float = elapsed_s) -> float:
                return v / s if s > 0 else 0.0

            out[topic] = {
                "pullRT": d[PULL_RT_MS] / d[PULLS] if d[PULLS] else 0.0,
                "pullTPS": per_s(d[PULLED_MSGS]),
                "consumeRT": d[CONSUME_RT_MS] / d[CONSUMES] if d[CONSUMES] else 0.0,
                "consumeOKTPS": per_s(d[CONSUME_OK]),
                "consumeFailedTPS": per_s(d[CONSUME_FAILED]),
                "consumeFailedMsgs": int(h[CONSUME_FAILED]),
            }
        return out
