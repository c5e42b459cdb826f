"""Broker statistics: plain counters bumped on the event loop, read by GET_BROKER_RUNTIME_INFO and by the
Prometheus collector (``broker/metrics.py``) at read time.

Hot-path cost: ``on_put`` / ``on_get`` are two (four with a group) dict updates and two int additions; nothing
is locked (all writers run on the event loop thread, readers copy). Rates come from samples of the running totals taken by
``sample`` (once a second, a broker timer); ``tps(window_ms)`` is (total now - total at the oldest sample
inside the window) / elapsed.

Runtime info keys filled here (RocketMQ 4.x ``BrokerController``/``BrokerStats`` meaning):

| key                    | value                                                              |
|------------------------|--------------------------------------------------------------------|
| putTps                 | "tps10s tps1m tps10m" of stored messages, space separated          |
| getTransferedTps       | same for messages returned by PULL (found)                         |
| getFoundTps / getTotalTps | same: found messages / all pull requests                        |
| msgPutTotalTodayNow    | messages stored since local midnight                               |
| msgGetTotalTodayNow    | messages returned by PULL since local midnight                     |
| msgPutTotalYesterdayMorning / msgPutTotalTodayMorning (and Get) | totals at those midnights |

For the rocketmq-exporter families (``broker/exporter_metrics.py``) the stats also keep: per (topic, group) counts
of pulled messages and bytes and of messages sent back (CONSUMER_SEND_MSG_BACK), a per-minute distribution of
successful SEND handling times in RocketMQ's ``putMessageDistributeTime`` buckets, and ``MinuteRates``: snapshots
of the per-key totals taken every ``KEYED_SAMPLE_INTERVAL_MS`` (a dict copy per table, not per message), from
which a key's rate over the last minute is read at scrape time (RocketMQ's ``StatsItem`` "statsMinute").
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: rate windows of putTps / getTps (RocketMQ prints 10 s, 1 min, 10 min)
TPS_WINDOWS_MS = (10_000, 60_000, 600_000)
#: samples older than the longest window plus this slack are dropped
SAMPLE_SLACK_MS = 5_000
#: how often the broker calls ``sample``
SAMPLE_INTERVAL_MS = 1_000
#: latency histogram bucket upper bounds, seconds (the last bucket is +Inf)
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MS_PER_DAY = 86_400_000
#: send outcomes counted by ``on_replica_failure`` (PutMessageStatus names)
REPLICA_FAILURE_STATUSES = frozenset({"FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"})
#: how often ``MinuteRates`` snapshots the per-key totals (RocketMQ's StatsItem samples every 10 s)
KEYED_SAMPLE_INTERVAL_MS = 10_000
#: the window of a per-key rate (RocketMQ's "statsMinute")
KEYED_RATE_WINDOW_MS = 60_000
#: RocketMQ's putMessageDistributeTime buckets: (name, exclusive upper bound in ms); the last has none
PUT_DISTRIBUTION_BUCKETS_MS = (("<=0ms", 1), ("0~10ms", 10), ("10~50ms", 50), ("50~100ms", 100),
                               ("100~200ms", 200), ("200~500ms", 500), ("500ms~1s", 1_000), ("1~2s", 2_000),
                               ("2~3s", 3_000), ("3~4s", 4_000), ("4~5s", 5_000), ("5~10s", 10_000))
PUT_DISTRIBUTION_OVERFLOW = "10s~"
#: the distribution starts over this often (RocketMQ's StoreStatsService prints and resets it every minute)
PUT_DISTRIBUTION_PERIOD_MS = 60_000


def local_midnight_ms(now_ms: int) -> int:
    t = time.localtime(now_ms / 1000)
    return int(time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1)) * 1000)


class LatencyHistogram:
    """Counts per bucket (non-cumulative) plus sum and count; cumulated when read."""

    __slots__ = ("counts", "sum_s", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum_s = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum_s += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        acc = 0
        for bound, n in zip((*(str(b) for b in LATENCY_BUCKETS_S), "+Inf"), self.counts, strict=True):
            acc += n
            out.append((bound, acc))
        return out


class MinuteRates:
    """Per-key rates over the last ``KEYED_RATE_WINDOW_MS`` from snapshots of per-key running totals.

    ``sample`` copies the tables (at most every ``KEYED_SAMPLE_INTERVAL_MS``); ``base(now_ms)`` is the oldest
    snapshot inside the window, so a key's rate is (total now - total in that snapshot) / elapsed and its count
    over the window is the difference alone. A key absent from the snapshot counted 0 then."""

    def __init__(self, tables: tuple[dict[Any, int], ...], now_ms: int) -> None:
        self.tables = tables
        self._snaps: deque[tuple[int, tuple[dict[Any, int], ...]]] = deque()
        self._snaps.append((now_ms, tuple({} for _ in tables)))

    def sample(self, now_ms: int) -> None:
        s = self._snaps
        if now_ms - s[-1][0] < KEYED_SAMPLE_INTERVAL_MS:
            return
        s.append((now_ms, tuple(dict(t) for t in self.tables)))
        while len(s) > 1 and s[1][0] <= now_ms - KEYED_RATE_WINDOW_MS:
            s.popleft()

    def rate(self, index: int, key: Any, now_ms: int) -> float:
        """Per second over the window, of table ``index`` (``MINUTE_*``) and one key."""
        at_ms, snaps = self.base(now_ms)
        elapsed_ms = now_ms - at_ms
        if elapsed_ms <= 0:
            return 0.0
        return (self.tables[index].get(key, 0) - snaps[index].get(key, 0)) * 1000.0 / elapsed_ms

    def base(self, now_ms: int) -> tuple[int, tuple[dict[Any, int], ...]]:
        """(time, snapshots) of the oldest sample no older than the window (the newest if all are older)."""
        for snap in self._snaps:
            if snap[0] >= now_ms - KEYED_RATE_WINDOW_MS:
                return snap
        return self._snaps[-1]


class PutDistribution:
    """Successful SEND handling times counted in RocketMQ's putMessageDistributeTime buckets (whole ms, as the
    Java broker measures), started over every ``PUT_DISTRIBUTION_PERIOD_MS``; ``max_ms`` is the longest since
    the broker started (RocketMQ's putMessageEntireTimeMax)."""

    __slots__ = ("counts", "period_start_ms", "max_ms", "periods")

    def __init__(self, now_ms: int) -> None:
        self.counts = [0] * (len(PUT_DISTRIBUTION_BUCKETS_MS) + 1)
        self.period_start_ms = now_ms
        self.max_ms = 0
        #: periods started over so far
        self.periods = 0

    def observe_ms(self, ms: int) -> None:
        i = 0
        for _name, bound in PUT_DISTRIBUTION_BUCKETS_MS:
            if ms < bound:
                break
            i += 1
        self.counts[i] += 1
        if ms > self.max_ms:
            self.max_ms = ms

    def roll(self, now_ms: int) -> None:
        if now_ms - self.period_start_ms >= PUT_DISTRIBUTION_PERIOD_MS:
            self.counts = [0] * len(self.counts)
            self.period_start_ms = now_ms
            self.periods += 1

    def named(self) -> dict[str, int]:
        names = [name for name, _ in PUT_DISTRIBUTION_BUCKETS_MS] + [PUT_DISTRIBUTION_OVERFLOW]
        return dict(zip(names, self.counts, strict=True))


#: indexes of the ``BrokerStats.minute`` tables
MINUTE_PUT_MSGS, MINUTE_PUT_BYTES, MINUTE_GET_MSGS, MINUTE_GET_BYTES, MINUTE_SEND_BACK = range(5)


class BrokerStats:
    def __init__(self, clock_ms: Callable[[], int]) -> None:
        self.clock_ms = clock_ms
        self.put_msgs_total = 0
        self.put_bytes_total = 0
        self.get_msgs_total = 0
        self.get_bytes_total = 0
        self.pull_requests_total = 0
        #: answered PULLs that found no message (RocketMQ's getMissTps counts these)
        self.pull_misses_total = 0
        self.put_msgs_by_topic: dict[str, int] = {}
        self.put_bytes_by_topic: dict[str, int] = {}
        self.get_msgs_by_topic: dict[str, int] = {}
        self.get_bytes_by_topic: dict[str, int] = {}
        #: (topic, group) -> messages / bytes returned by PULL; messages sent back by the group's consumers
        self.get_msgs_by_group: dict[tuple[str, str], int] = {}
        self.get_bytes_by_group: dict[tuple[str, str], int] = {}
        self.send_back_by_group: dict[tuple[str, str], int] = {}
        #: request latency by response code (filled only when metrics are on: the dispatcher wrappers)
        self.send_latency: dict[int, LatencyHistogram] = {}
        self.pull_latency = LatencyHistogram()
        #: SYNC_MASTER replica waits
        self.sync_wait = LatencyHistogram()
        #: PutMessageStatus name -> sends answered with it (FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE)
        self.replica_failures: dict[str, int] = dict.fromkeys(sorted(REPLICA_FAILURE_STATUSES), 0)
        #: (time_ms, put total, get total, pull requests)
        self._samples: deque[tuple[int, int, int, int, int]] = deque()
        now = clock_ms()
        #: per-key minute rates of the tables, in this order (``MINUTE_*`` indexes)
        self.minute = MinuteRates((self.put_msgs_by_topic, self.put_bytes_by_topic, self.get_msgs_by_group,
                                   self.get_bytes_by_group, self.send_back_by_group), now)
        self.put_distribution = PutDistribution(now)
        self._day_start_ms = local_midnight_ms(now)
        self._put_at_today_morning = 0
        self._get_at_today_morning = 0
        self._put_at_yesterday_morning = 0
        self._get_at_yesterday_morning = 0
        self.sample(now)

    # ---- hot path --------------------------------------------------------------------------------
    def on_put(self, topic: str, msgs: int, nbytes: int) -> None:
        self.put_msgs_total += msgs
        self.put_bytes_total += nbytes
        d = self.put_msgs_by_topic
        d[topic] = d.get(topic, 0) + msgs
        b = self.put_bytes_by_topic
        b[topic] = b.get(topic, 0) + nbytes

    def on_get(self, topic: str, msgs: int, nbytes: int, group: str | None = None) -> None:
        self.get_msgs_total += msgs
        self.get_bytes_total += nbytes
        d = self.get_msgs_by_topic
        d[topic] = d.get(topic, 0) + msgs
        b = self.get_bytes_by_topic
        b[topic] = b.get(topic, 0) + nbytes
        if group is not None:
            key = (topic, group)
            g = self.get_msgs_by_group
            g[key] = g.get(key, 0) + msgs
            gb = self.get_bytes_by_group
            gb[key] = gb.get(key, 0) + nbytes

    def on_send_back(self, topic: str, group: str) -> None:
        """A consumer of ``group`` sent a message of ``topic`` (its original topic) back for a retry."""
        key = (topic, group)
        d = self.send_back_by_group
        d[key] = d.get(key, 0) + 1

    def on_put_time(self, seconds: float) -> None:
        """A successful SEND took ``seconds`` to handle (timed by the metrics endpoint's dispatcher wrapper)."""
        self.put_distribution.observe_ms(int(seconds * 1000))

    def on_replica_failure(self, status: str) -> None:
        self.replica_failures[status] = self.replica_failures.get(status, 0) + 1

    # ---- sampling / rates ------------------------------------------------------------------------
    def sample(self, now_ms: int | None = None) -> None:
        now = self.clock_ms() if now_ms is None else now_ms
        self._roll_day(now)
        self.minute.sample(now)
        self.put_distribution.roll(now)
        s = self._samples
        s.append((now, self.put_msgs_total, self.get_msgs_total, self.pull_requests_total, self.pull_misses_total))
        horizon = now - TPS_WINDOWS_MS[-1] - SAMPLE_SLACK_MS
        while len(s) > 1 and s[1][0] <= horizon:
            s.popleft()

    def _roll_day(self, now_ms: int) -> None:
        if now_ms - self._day_start_ms < MS_PER_DAY:
            return
        self._day_start_ms = local_midnight_ms(now_ms)
        self._put_at_yesterday_morning = self._put_at_today_morning
        self._get_at_yesterday_morning = self._get_at_today_morning
        self._put_at_today_morning = self.put_msgs_total
        self._get_at_today_morning = self.get_msgs_total

    def _rate(self, index: int, window_ms: int, now_ms: int) -> float:
        s = self._samples
        start = now_ms - window_ms
        base = s[0]
        for sample in s:  # oldest sample still inside the window (at most ~600 entries)
            if sample[0] >= start:
                base = sample
                break
        elapsed_ms = now_ms - base[0]
        if elapsed_ms <= 0:
            return 0.0
        current = (now_ms, self.put_msgs_total, self.get_msgs_total, self.pull_requests_total,
                   self.pull_misses_total)[index]
        return (current - base[index]) * 1000.0 / elapsed_ms

    def tps(self, index: int, now_ms: int | None = None) -> tuple[float, ...]:
        now = self.clock_ms() if now_ms is None else now_ms
        return tuple(self._rate(index, w, now) for w in TPS_WINDOWS_MS)

    def put_tps(self, now_ms: int | None = None) -> tuple[float, ...]:
        return self.tps(1, now_ms)

    def get_tps(self, now_ms: int | None = None) -> tuple[float, ...]:
        return self.tps(2, now_ms)

    def runtime_info(self, now_ms: int | None = None) -> dict[str, str]:
        now = self.clock_ms() if now_ms is None else now_ms
        self._roll_day(now)

        def fmt(rates: tuple[float, ...]) -> str:
            return " ".join(f"{r:.2f}" for r in rates)

        get_tps = fmt(self.tps(2, now))
        return {
            "putTps": fmt(self.tps(1, now)),
            "getTransferedTps": get_tps,
            "getFoundTps": get_tps,
            "getTotalTps": fmt(self.tps(3, now)),
            "getMissTps": fmt(self.tps(4, now)),
            "msgPutTotalTodayNow": str(self.put_msgs_total - self._put_at_today_morning),
            "msgGetTotalTodayNow": str(self.get_msgs_total - self._get_at_today_morning),
            "msgPutTotalTodayMorning": str(self._put_at_today_morning),
            "msgGetTotalTodayMorning": str(self._get_at_today_morning),
            "msgPutTotalYesterdayMorning": str(self._put_at_yesterday_morning),
            "msgGetTotalYesterdayMorning": str(self._get_at_yesterday_morning),
        }
