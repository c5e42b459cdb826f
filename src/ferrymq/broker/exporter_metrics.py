"""rocketmq-exporter's metric families, served by the broker's own ``/metrics`` (no exporter process).

The Apache rocketmq-exporter (``RMQMetricsCollector``) asks every master over the wire (runtime info, topic and
consume stats, ``viewBrokerStatsData``, GET_CONSUMER_RUNNING_INFO of each live consumer) and publishes gauges
under fixed names and labels; its two Grafana dashboards query those. Here the broker publishes the same names,
label names and meanings from its own tables, so Prometheus can scrape it directly (docs/metrics.md lists every
family, what it means here and where it differs).

Labels: each family has the exporter's labels, plus whichever of ``cluster`` (brokerClusterName), ``broker``
(brokerName), ``brokerId`` and ``role`` (``master`` / ``slave``) it lacks. State a slave only replicates (offsets,
lags, client counts) is published by the master alone, so ``sum by (group)`` counts a group once; traffic a slave
serves (its pulls) and its runtime info are published by the slave too, told apart by ``brokerId`` / ``role``.

Estate size: the per-topic and per-group series (these families plus the ``ferrymq_`` per-topic counters and
per-queue lag) are built at scrape time from the tables in slices: after ``EXPOSITION_SLICE_BUDGET_S`` of work
the builder yields the event loop, so a scrape of 10,000 topics and 5,000 groups never holds it long. Concurrent
scrapes share one build. Reading the store time of the first unconsumed message
(``rocketmq_group_get_latency_by_storetime``) is capped at ``MAX_STORE_TIME_LOOKUPS`` queues per scrape.

Client series (``rocketmq_client_*``) come from GET_CONSUMER_RUNNING_INFO (307) answers of the connected
consumers, as the exporter gets them: ``RunningInfoPoller`` asks them in the background (a scrape starts a poll
when the last one is older than ``RUNNING_INFO_POLL_INTERVAL_MS``; at most ``RUNNING_INFO_CONCURRENCY`` at once,
each within ``RUNNING_INFO_TIMEOUT_MS``, at most ``RUNNING_INFO_MAX_CLIENTS`` per poll) and a scrape reads the
cached answers (dropped after ``RUNNING_INFO_TTL_MS``). A client whose answer has no ``statusTable`` (the C++
client 2.x, for one) gives no client series, as with the exporter. Only masters poll, and of the masters a
consumer pulls from, the one with the smallest broker name publishes its series (``publishes_client``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from prometheus_client.utils import floatToGoString

from ferrymq.broker.stats import (
    LATENCY_BUCKETS_S,
    MINUTE_GET_BYTES,
    MINUTE_GET_MSGS,
    MINUTE_PUT_BYTES,
    MINUTE_PUT_MSGS,
    MINUTE_SEND_BACK,
    BrokerStats,
    LatencyHistogram,
)
from ferrymq.errors import FerryError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from ferrymq.store.errors import StoreError

log = logging.getLogger(__name__)

#: the builder yields the event loop after this much work
EXPOSITION_SLICE_BUDGET_S = 0.005
#: rows between two clock reads of the builder
EXPOSITION_CHECK_EVERY = 64
#: sample lines joined and encoded at once when the text is assembled
EXPOSITION_CHUNK_LINES = 2_048
#: queues whose first unconsumed message's store time one scrape reads at most
MAX_STORE_TIME_LOOKUPS = 20_000
#: a scrape starts a GET_CONSUMER_RUNNING_INFO poll when the last one started longer ago than this
RUNNING_INFO_POLL_INTERVAL_MS = 10_000
#: how long one consumer may take to answer
RUNNING_INFO_TIMEOUT_MS = 3_000
#: consumers asked at once
RUNNING_INFO_CONCURRENCY = 8
#: consumers asked per poll at most (the rest wait for the next poll)
RUNNING_INFO_MAX_CLIENTS = 2_000
#: an answer older than this is no longer published
RUNNING_INFO_TTL_MS = 3 * RUNNING_INFO_POLL_INTERVAL_MS

#: broker names in a ConsumerRunningInfo answer (its mqTable / processQueues entries)
BROKER_NAME_FIELD = re.compile(rb'"brokerName"\s*:\s*"([^"\\]*)"')
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
#: ``msgModel`` label: the ordinal of Java's MessageModel (BROADCASTING 0, CLUSTERING 1)
CLUSTERING_ORDINAL = "1"
#: labels every family gets when the exporter's lack them
BROKER_IDENTITY = ("cluster", "broker", "brokerId", "role")

BROKER_RUNTIME_LABELS = ("cluster", "brokerIP", "brokerHost", "des", "boottime", "broker_version")
BROKER_NUMS_LABELS = ("cluster", "brokerIP", "broker")
TOPIC_LABELS = ("cluster", "broker", "topic")
DLQ_LABELS = ("cluster", "broker", "group")
GROUP_NUMS_LABELS = ("cluster", "broker", "topic", "group")
GROUP_DIFF_LABELS = ("group", "topic", "countOfOnlineConsumers", "msgModel")
GROUP_COUNT_LABELS = ("caddr", "localaddr", "group")
PRODUCER_COUNT_LABELS = ("cluster", "broker", "group")
CLIENT_LABELS = ("clientAddr", "clientId", "group", "topic")

#: runtime-info key -> family (rocketmq_brokeruntime_<suffix>), read as a number
RUNTIME_KEY_FAMILIES = (
    ("msgPutTotalTodayNow", "msg_put_total_today_now"),
    ("msgGetTotalTodayNow", "msg_gettotal_today_now"),
    ("dispatchBehindBytes", "dispatch_behind_bytes"),
    ("putMessageSizeTotal", "put_message_size_total"),
    ("putMessageAverageSize", "put_message_average_size"),
    ("queryThreadPoolQueueCapacity", "query_threadpool_queue_capacity"),
    ("remainTransientStoreBufferNumbs", "remain_transientstore_buffer_numbs"),
    ("earliestMessageTimeStamp", "earliest_message_timestamp"),
    ("startAcceptSendRequestTimeStamp", "start_accept_sendrequest_time"),
    ("sendThreadPoolQueueSize", "send_threadpool_queue_size"),
    ("putMessageTimesTotal", "putmessage_times_total"),
    ("getMessageEntireTimeMax", "getmessage_entire_time_max"),
    ("pageCacheLockTimeMills", "pagecache_lock_time_mills"),
    ("commitLogDiskRatio", "commitlog_disk_ratio"),
    ("consumeQueueDiskRatio", "consumequeue_disk_ratio"),
    ("dispatchMaxBuffer", "dispatch_maxbuffer"),
    ("pullThreadPoolQueueCapacity", "pull_threadpoolqueue_capacity"),
    ("sendThreadPoolQueueCapacity", "send_threadpoolqueue_capacity"),
    ("pullThreadPoolQueueSize", "pull_threadpoolqueue_size"),
    ("queryThreadPoolQueueSize", "query_threadpoolqueue_size"),
    ("msgGetTotalYesterdayMorning", "msg_gettotal_yesterdaymorning"),
    ("msgPutTotalYesterdayMorning", "msg_puttotal_yesterdaymorning"),
    ("msgGetTotalTodayMorning", "msg_gettotal_todaymorning"),
    ("msgPutTotalTodayMorning", "msg_puttotal_todaymorning"),
    ("commitLogMaxOffset", "commitlog_maxoffset"),
    ("commitLogMinOffset", "commitlog_minoffset"),
)
#: runtime-info rate key -> family prefix; each gives <prefix>10, <prefix>60, <prefix>600
RUNTIME_TPS_FAMILIES = (("putTps", "put_tps"), ("getFoundTps", "getfound_tps"), ("getTotalTps", "gettotal_tps"),
                        ("getTransferedTps", "gettransfered_tps"), ("getMissTps", "getmiss_tps"))
#: putMessageDistributeTime bucket -> family suffix
PMDT_FAMILIES = (("<=0ms", "0ms"), ("0~10ms", "0to10ms"), ("10~50ms", "10to50ms"), ("50~100ms", "50to100ms"),
                 ("100~200ms", "100to200ms"), ("200~500ms", "200to500ms"), ("500ms~1s", "500to1s"),
                 ("1~2s", "1to2s"), ("2~3s", "2to3s"), ("3~4s", "3to4s"), ("4~5s", "4to5s"), ("5~10s", "5to10s"),
                 ("10s~", "10stomore"))
#: ConsumeStatus field of a 307 answer's statusTable -> family
CLIENT_FAMILIES = (("consumeFailedMsgs", "rocketmq_client_consume_fail_msg_count"),
                   ("consumeFailedTPS", "rocketmq_client_consume_fail_msg_tps"),
                   ("consumeOKTPS", "rocketmq_client_consume_ok_msg_tps"),
                   ("consumeRT", "rocketmq_client_consume_rt"),
                   ("pullRT", "rocketmq_client_consumer_pull_rt"),
                   ("pullTPS", "rocketmq_client_consumer_pull_tps"))


K = TypeVar("K")
V = TypeVar("V")
_GONE: Any = object()


def _entries(table: dict[K, V]) -> Iterator[tuple[K, V]]:
    """(key, value) of a table that may change while the build yields: a copy of the keys only (one list, not a
    tuple per entry that the garbage collector would track and promote while the build runs), each value read
    when reached and skipped if it is gone by then."""
    for key in list(table):
        value = table.get(key, _GONE)
        if value is not _GONE:
            yield key, value


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Family:
    """One metric family's exposition lines (text format 0.0.4)."""

    __slots__ = ("name", "kind", "labels", "lines", "_head")

    def __init__(self, name: str, doc: str, labels: Iterable[str], kind: str = "gauge") -> None:
        self.name = name
        self.kind = kind
        self.labels = tuple(labels)
        self.lines: list[str] = []
        help_text = doc.replace("\\", "\\\\").replace("\n", "\\n")  # HELP escapes no quotes
        self._head = f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"

    def add(self, values: Iterable[Any], value: float) -> None:
        pairs = ",".join(f'{k}="{_escape(str(v))}"' for k, v in zip(self.labels, values, strict=True))
        self.lines.append(f"{self.name}{{{pairs}}} {floatToGoString(value)}\n")

    def chunks(self) -> Iterable[bytes]:
        """The family's text in pieces of at most ``EXPOSITION_CHUNK_LINES`` samples."""
        yield self._head.encode()
        lines = self.lines
        for at in range(0, len(lines), EXPOSITION_CHUNK_LINES):
            yield "".join(lines[at:at + EXPOSITION_CHUNK_LINES]).encode()


class Pacer:
    """Yields the event loop once ``EXPOSITION_SLICE_BUDGET_S`` of work has passed since the last yield."""

    def __init__(self, budget_s: float | None = None) -> None:
        self.budget_s = EXPOSITION_SLICE_BUDGET_S if budget_s is None else budget_s
        self.rows = 0
        self.yields = 0
        #: the longest run between two yields (s): wall time, and this thread's CPU time (the work itself, without
        #: the time the process waited for a CPU)
        self.longest_slice_s = 0.0
        self.longest_slice_cpu_s = 0.0
        self._since = time.perf_counter()
        self._since_cpu = time.thread_time()

    async def tick(self) -> None:
        self.rows += 1
        if self.rows % EXPOSITION_CHECK_EVERY == 0:
            await self.check()

    async def check(self) -> None:
        """Yield now if the budget is spent (for steps heavier than a row)."""
        ran_s = time.perf_counter() - self._since
        if ran_s >= self.budget_s:
            self.yields += 1
            self.longest_slice_s = max(self.longest_slice_s, ran_s)
            self.longest_slice_cpu_s = max(self.longest_slice_cpu_s, time.thread_time() - self._since_cpu)
            await asyncio.sleep(0)
            self._since = time.perf_counter()
            self._since_cpu = time.thread_time()


def _num(text: Any, default: float = 0.0) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return default


def _quantile_ms(h: LatencyHistogram | None, q: float) -> float:
    """Upper bound (ms) of the histogram bucket holding quantile ``q``; -1 without observations (the exporter's
    value for a missing putLatency99)."""
    if h is None or h.count == 0:
        return -1.0
    rank = q * h.count
    acc = 0
    for bound_s, n in zip((*LATENCY_BUCKETS_S, None), h.counts, strict=True):
        acc += n
        if acc >= rank:
            return bound_s * 1000.0 if bound_s is not None else LATENCY_BUCKETS_S[-1] * 1000.0
    return LATENCY_BUCKETS_S[-1] * 1000.0


def status_table_of(body: bytes) -> dict[str, dict[str, Any]]:
    """The ``statusTable`` object of a ConsumerRunningInfo answer ({topic: ConsumeStatus}); {} when absent.

    The whole body is not JSON (fastjson writes ``mqTable`` keyed by objects), but ``statusTable`` is keyed by
    topic names, so the value after its key is decoded on its own."""
    text = body.decode("utf-8", "replace")
    at = text.find('"statusTable"')
    if at < 0:
        return {}
    colon = text.find(":", at + len('"statusTable"'))
    if colon < 0:
        return {}
    start = colon + 1
    while start < len(text) and text[start] in " \t\r\n":
        start += 1
    try:
        value, _end = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(topic): status for topic, status in value.items() if isinstance(status, dict)}


def publishes_client(body: bytes, broker_name: str) -> bool:
    """Whether this broker publishes a consumer's client series: every master the consumer pulls from is
    connected to it and gets the same answer, so the one with the smallest name among the brokers of the
    queues the consumer holds (its mqTable) publishes them, and ``sum by (group)`` counts the consumer once.
    A consumer that holds no queue is published by every broker it is connected to."""
    owners = {m.decode("utf-8", "replace") for m in BROKER_NAME_FIELD.findall(body)}
    return not owners or min(owners) == broker_name


class RunningInfoPoller:
    """Asks the connected consumers GET_CONSUMER_RUNNING_INFO in the background and keeps their statusTable."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        #: (group, clientId) -> (answered at ms, client address, {topic: ConsumeStatus})
        self.answers: dict[tuple[str, str], tuple[int, str, dict[str, dict[str, Any]]]] = {}
        self.polls = 0
        self._last_start_ms: int | None = None
        self._task: asyncio.Task[None] | None = None

    def maybe_start(self, master: bool) -> None:
        """Start a poll unless one runs or the last started less than the interval ago (called by a scrape).
        A slave does not poll: its master publishes the client series."""
        if not master:
            self.answers.clear()
            return
        now = self.ctx.clock_ms()
        if self._task is not None and not self._task.done():
            return
        if self._last_start_ms is not None and now - self._last_start_ms < RUNNING_INFO_POLL_INTERVAL_MS:
            return
        self._last_start_ms = now
        self._task = asyncio.ensure_future(self.poll())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    async def poll(self) -> None:
        ctx = self.ctx
        pacer = Pacer()
        targets: list[tuple[str, Any]] = []
        for group, info in _entries(ctx.consumers.groups):
            for ch in list(info.channels.values()):
                if not getattr(ch.conn, "closed", False) and len(targets) < RUNNING_INFO_MAX_CLIENTS:
                    targets.append((group, ch))
            await pacer.tick()
        gate = asyncio.Semaphore(RUNNING_INFO_CONCURRENCY)

        async def ask(group: str, ch: Any) -> None:
            async with gate:
                req = RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO,
                                              {"consumerGroup": group, "clientId": ch.client_id,
                                               "jstackEnable": "false"})
                try:
                    answer = await ch.conn.invoke(req, RUNNING_INFO_TIMEOUT_MS)
                except (FerryError, OSError, TimeoutError) as exc:
                    log.debug("consumer %s of %s did not answer GET_CONSUMER_RUNNING_INFO: %s", ch.client_id,
                              group, exc)
                    return
                if answer.code != R.SUCCESS or not answer.body:
                    return
                if not publishes_client(answer.body, ctx.config.broker_name):
                    self.answers.pop((group, ch.client_id), None)
                    return
                table = status_table_of(answer.body)
                self.answers[(group, ch.client_id)] = (ctx.clock_ms(), ch.conn.peer_addr, table)

        try:
            await asyncio.gather(*(ask(group, ch) for group, ch in targets))
        finally:
            self.polls += 1
            horizon = ctx.clock_ms() - RUNNING_INFO_TTL_MS
            for key, (at_ms, _addr, _table) in _entries(self.answers):
                if at_ms < horizon:
                    del self.answers[key]
                await pacer.tick()


class ExporterExposition:
    """Builds the exposition text of the exporter families and of the broker's per-topic / per-group series."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.poller = RunningInfoPoller(ctx)
        self._building: asyncio.Future[list[bytes]] | None = None
        #: work of the last build: rows visited, event-loop yields, the longest run between two yields (s)
        self.last_rows = 0
        self.last_yields = 0
        self.last_longest_slice_s = 0.0
        self.last_longest_slice_cpu_s = 0.0

    async def render(self) -> list[bytes]:
        """The text in pieces (written one after the other); a scrape arriving while another builds shares that
        build."""
        self.poller.maybe_start(self._is_master())
        if self._building is None or self._building.done():
            self._building = asyncio.ensure_future(self._build())
        return await asyncio.shield(self._building)

    # ---- identity --------------------------------------------------------------------------------
    def _is_master(self) -> bool:
        role = getattr(self.ctx, "controller_role", None)
        if role is not None:
            return bool(role.is_master)
        return not self.ctx.config.is_slave

    def _identity(self) -> dict[str, str]:
        cfg = self.ctx.config
        return {"cluster": cfg.broker_cluster_name, "broker": cfg.broker_name, "brokerId": str(cfg.broker_id),
                "role": "master" if self._is_master() else "slave"}

    def _family(self, name: str, doc: str, labels: tuple[str, ...], ident: dict[str, str],
                kind: str = "gauge") -> tuple[Family, tuple[str, ...]]:
        extra = tuple(k for k in BROKER_IDENTITY if k not in labels)
        return Family(name, doc, (*labels, *extra), kind), tuple(ident[k] for k in extra)

    # ---- the build -------------------------------------------------------------------------------
    async def _build(self) -> list[bytes]:
        ctx = self.ctx
        st: BrokerStats = ctx.stats
        pacer = Pacer()
        ident = self._identity()
        master = ident["role"] == "master"
        now_ms = ctx.clock_ms()
        fams: list[Family] = []

        fams.extend(self._broker_runtime(st, ident))
        fams.extend(self._broker_nums(st, ident, master))
        fams.extend(await self._topics(st, ident, master, now_ms, pacer))
        fams.extend(await self._groups(st, ident, master, now_ms, pacer))
        fams.extend(await self._clients(ident, pacer))
        parts: list[bytes] = []
        for fam in fams:
            for chunk in fam.chunks():
                parts.append(chunk)
                await pacer.check()
        self.last_rows, self.last_yields = pacer.rows, pacer.yields
        self.last_longest_slice_s = max(pacer.longest_slice_s, time.perf_counter() - pacer._since)
        self.last_longest_slice_cpu_s = max(pacer.longest_slice_cpu_s, time.thread_time() - pacer._since_cpu)
        return parts

    def _broker_runtime(self, st: BrokerStats, ident: dict[str, str]) -> list[Family]:
        """rocketmq_brokeruntime_*: the runtime info (GET_BROKER_RUNTIME_INFO), read as the exporter reads it."""
        ctx = self.ctx
        info = ctx.runtime_info()
        values = (ident["cluster"], ctx.broker_addr, "", str(info.get("brokerVersionDesc", "")),
                  str(info.get("bootTimestamp", "0")), str(info.get("brokerVersion", "0")))
        out: list[Family] = []

        def gauge(suffix: str, doc: str, value: float) -> None:
            fam, extra = self._family(f"rocketmq_brokeruntime_{suffix}", doc, BROKER_RUNTIME_LABELS, ident)
            fam.add((*values, *extra), value)
            out.append(fam)

        for key, suffix in RUNTIME_KEY_FAMILIES:
            gauge(suffix, f"{key} of the broker runtime info", _num(info.get(key)))
        for key, prefix in RUNTIME_TPS_FAMILIES:
            rates = str(info.get(key, "")).split(" ")
            for i, window in enumerate(("10", "60", "600")):
                gauge(f"{prefix}{window}", f"{key} over {window} s (messages/s)",
                      _num(rates[i]) if i < len(rates) else 0.0)
        lag_ms = float(int(getattr(ctx.loop_lag, "last_lag_s", 0.0) * 1000))
        for kind in ("send", "pull", "query"):
            gauge(f"{kind}_threadpoolqueue_headwait_timemills", "How late the event loop ran its last timer (ms): "
                  "every request waits in that one queue", lag_ms)
        gauge("putmessage_entire_time_max", "Longest successful SEND handling time since start (ms)",
              st.put_distribution.max_ms)
        flushed = _num(info.get("commitLogFlushedOffset"), _num(info.get("commitLogMaxOffset")))
        gauge("remain_howmanydata_toflush", "Commit log bytes written but not flushed",
              max(_num(info.get("commitLogMaxOffset")) - flushed, 0.0))
        total, free = _disk(ctx)
        gauge("commitlogdir_capacity_total", "Bytes of the commit log's file system", total)
        gauge("commitlogdir_capacity_free", "Free bytes of the commit log's file system", free)
        send_ok = st.send_latency.get(0)
        gauge("put_latency_99", "99th percentile of successful SEND handling time since start (ms, bucket bound)",
              _quantile_ms(send_ok, 0.99))
        gauge("put_latency_999", "99.9th percentile of successful SEND handling time since start (ms, bucket "
              "bound)", _quantile_ms(send_ok, 0.999))
        dist = st.put_distribution.named()
        for bucket, suffix in PMDT_FAMILIES:
            gauge(f"pmdt_{suffix}", f"Successful SENDs handled in {bucket} during the current minute",
                  dist[bucket])
        return out

    def _broker_nums(self, st: BrokerStats, ident: dict[str, str], master: bool) -> list[Family]:
        ctx = self.ctx
        values = (ident["cluster"], ctx.broker_addr, ident["broker"])
        tps, extra = self._family("rocketmq_broker_tps", "Messages stored per second over the last minute",
                                  BROKER_NUMS_LABELS, ident)
        tps.add((*values, *extra), st.put_tps()[1])
        qps, extra = self._family("rocketmq_broker_qps", "Messages returned by PULL per second over the last minute",
                                  BROKER_NUMS_LABELS, ident)
        qps.add((*values, *extra), st.get_tps()[1])
        diff, extra = self._family("rocketmq_broker_commitlog_diff", "Commit log bytes a slave (brokerIP) has not "
                                   "replicated yet", BROKER_NUMS_LABELS, ident)
        if master:
            for addr, lag in self._slave_lags():
                diff.add((ident["cluster"], addr, ident["broker"], *extra), lag)
        return [tps, qps, diff]

    def _slave_lags(self) -> list[tuple[str, int]]:
        ctx = self.ctx
        out: list[tuple[str, int]] = []
        ha = getattr(ctx, "ha_service", None)
        if ha is not None:
            out.extend((str(s["addr"]), int(s["lagBytes"])) for s in ha.slave_status())
        role = getattr(ctx, "controller_role", None)
        if role is not None and role.is_master:
            max_phy = int(ctx.store.max_phy_offset)
            out.extend((f"replica-{s['replicaId']}", max(0, max_phy - int(s["ackPhyOffset"])))
                       for s in role.ha_master.slave_status())
        return out

    async def _topics(self, st: BrokerStats, ident: dict[str, str], master: bool, now_ms: int,
                      pacer: Pacer) -> list[Family]:
        ctx = self.ctx
        store = ctx.store
        cluster, broker = ident["cluster"], ident["broker"]
        base = ["cluster", "broker"]
        ids = [cluster, broker]
        out: list[Family] = []
        for name, doc, table in (
            ("ferrymq_put_messages", "Messages stored, per topic", st.put_msgs_by_topic),
            ("ferrymq_put_bytes", "Bytes stored (records), per topic", st.put_bytes_by_topic),
            ("ferrymq_get_messages", "Messages returned by PULL, per topic", st.get_msgs_by_topic),
            ("ferrymq_get_bytes", "Bytes returned by PULL (records), per topic", st.get_bytes_by_topic),
        ):
            fam = Family(f"{name}_total", doc, [*base, "topic"], "counter")
            for topic, n in _entries(table):
                fam.add([*ids, topic], n)
                await pacer.tick()
            out.append(fam)

        base_ms, snaps = st.minute.base(now_ms)
        elapsed_s = (now_ms - base_ms) / 1000.0
        put_tps, extra = self._family("rocketmq_producer_tps", "Messages stored per second for the topic over the "
                                      "last minute", TOPIC_LABELS, ident)
        put_size, _ = self._family("rocketmq_producer_message_size", "Bytes stored per second for the topic over the "
                                   "last minute", TOPIC_LABELS, ident)
        for fam, table, index in ((put_tps, st.put_msgs_by_topic, MINUTE_PUT_MSGS),
                                  (put_size, st.put_bytes_by_topic, MINUTE_PUT_BYTES)):
            before = snaps[index]
            for topic, total in _entries(table):
                if not topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
                    fam.add((cluster, broker, topic, *extra), _rate(total - before.get(topic, 0), elapsed_s))
                await pacer.tick()
        out += [put_tps, put_size]

        offset, _ = self._family("rocketmq_producer_offset", "Max queue offsets of the topic, summed over its "
                                 "queues", TOPIC_LABELS, ident)
        retry, _ = self._family("rocketmq_topic_retry_offset", "Max queue offsets of a retry topic, summed",
                                TOPIC_LABELS, ident)
        dlq, _ = self._family("rocketmq_topic_dlq_offset", "Max queue offsets of a group's dead letter topic, "
                              "summed", DLQ_LABELS, ident)
        if master:
            for topic, tc in _entries(ctx.topics.table):
                total = sum(store.get_max_offset_in_queue(topic, q) for q in range(tc.write_queue_nums))
                if topic.startswith(RETRY_PREFIX):
                    retry.add((cluster, broker, topic, *extra), total)
                elif topic.startswith(DLQ_PREFIX):
                    dlq.add((cluster, broker, topic[len(DLQ_PREFIX):], *extra), total)
                else:
                    offset.add((cluster, broker, topic, *extra), total)
                await pacer.tick()
        out += [offset, retry, dlq]
        return out

    async def _groups(self, st: BrokerStats, ident: dict[str, str], master: bool, now_ms: int,
                      pacer: Pacer) -> list[Family]:
        ctx = self.ctx
        store = ctx.store
        cluster, broker = ident["cluster"], ident["broker"]
        base = ["cluster", "broker"]
        ids = [cluster, broker]
        queue_lag = Family("ferrymq_consume_queue_lag", "Messages of a queue not yet consumed by a group (queue max "
                           "offset - committed offset)", [*base, "group", "topic", "queue_id"])
        accumulation = Family("rocketmq_message_accumulation", "Messages not yet consumed by a group, per topic",
                              [*base, "group", "topic"])
        consumer_offset, extra = self._family("rocketmq_consumer_offset", "Committed offsets of the group, summed "
                                              "over the topic's queues", GROUP_NUMS_LABELS, ident)
        diff, diff_extra = self._family("rocketmq_group_diff", "Messages of the topic the group has not consumed "
                                        "(clustering groups)", GROUP_DIFF_LABELS, ident)
        retry_diff, _ = self._family("rocketmq_group_retrydiff", "Messages of the group's retry topic not consumed",
                                     GROUP_DIFF_LABELS, ident)
        dlq_diff, _ = self._family("rocketmq_group_dlqdiff", "Not published (the exporter skips dead letter topics)",
                                   GROUP_DIFF_LABELS, ident)
        latency, _ = self._family("rocketmq_group_get_latency_by_storetime", "Age (ms) of the oldest message the "
                                  "group has not consumed, over the topic's queues", GROUP_NUMS_LABELS, ident)
        lookups = 0
        seen_groups: set[str] = set()
        if master:
            for key, queues in _entries(ctx.offsets.table):
                topic, _, group = key.partition("@")
                if topic.startswith(DLQ_PREFIX):
                    continue
                seen_groups.add(group)
                committed_total = 0
                lag_total = 0
                oldest_ms = 0
                tc = ctx.topics.table.get(topic)
                queue_ids: Iterable[int] = range(tc.read_queue_nums) if tc is not None else list(queues)
                for queue_id in queue_ids:
                    committed = max(queues.get(queue_id, 0), 0)
                    max_offset = max(store.get_max_offset_in_queue(topic, queue_id), 0)
                    q_lag = max_offset - committed
                    committed_total += committed
                    lag_total += q_lag
                    if queue_id in queues:
                        queue_lag.add([*ids, group, topic, str(queue_id)], max(q_lag, 0))
                    if q_lag > 0 and lookups < MAX_STORE_TIME_LOOKUPS:
                        lookups += 1
                        try:
                            at = max(committed, store.get_min_offset_in_queue(topic, queue_id))
                            stored_ms = store.get_message_store_timestamp(topic, queue_id, at)
                        except StoreError:  # a queue file gone meanwhile (topic deleted, store stopping)
                            stored_ms = -1
                        if stored_ms and stored_ms > 0:
                            oldest_ms = max(oldest_ms, now_ms - stored_ms)
                    await pacer.tick()
                accumulation.add([*ids, group, topic], max(lag_total, 0))
                consumer_offset.add((cluster, broker, topic, group, *extra), committed_total)
                info = ctx.consumers.get(group)
                if info is None or info.message_model == "CLUSTERING":
                    online = str(len(info.channels)) if info is not None else "0"
                    fam = retry_diff if topic.startswith(RETRY_PREFIX) else diff
                    fam.add((group, topic, online, CLUSTERING_ORDINAL, *diff_extra), lag_total)
                    latency.add((cluster, broker, topic, group, *extra), max(oldest_ms, 0))
        if lookups >= MAX_STORE_TIME_LOOKUPS:
            log.debug("rocketmq_group_get_latency_by_storetime: capped at %d queues", MAX_STORE_TIME_LOOKUPS)
        out = [queue_lag, accumulation, consumer_offset, diff, retry_diff, dlq_diff, latency]

        base_ms, snaps = st.minute.base(now_ms)
        elapsed_s = (now_ms - base_ms) / 1000.0
        get_tps, extra = self._family("rocketmq_consumer_tps", "Messages the group pulled per second from the "
                                      "topic over the last minute", GROUP_NUMS_LABELS, ident)
        get_size, _ = self._family("rocketmq_consumer_message_size", "Bytes the group pulled per second from the "
                                   "topic over the last minute", GROUP_NUMS_LABELS, ident)
        for fam, table, index in ((get_tps, st.get_msgs_by_group, MINUTE_GET_MSGS),
                                  (get_size, st.get_bytes_by_group, MINUTE_GET_BYTES)):
            before = snaps[index]
            for (topic, group), total in _entries(table):
                if not topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
                    fam.add((cluster, broker, topic, group, *extra), _rate(total - before.get((topic, group), 0),
                                                                           elapsed_s))
                await pacer.tick()
        send_back, _ = self._family("rocketmq_send_back_nums", "Messages of the topic the group sent back for a "
                                    "retry during the last minute", GROUP_NUMS_LABELS, ident)
        before = snaps[MINUTE_SEND_BACK]
        for (topic, group), total in _entries(st.send_back_by_group):
            send_back.add((cluster, broker, topic, group, *extra), total - before.get((topic, group), 0))
            await pacer.tick()
        consume_tps, _ = self._family("rocketmq_group_consume_tps", "Declared by the exporter, never filled",
                                      GROUP_NUMS_LABELS, ident)
        consume_total, _ = self._family("rocketmq_group_consume_total_offset", "Declared by the exporter, never "
                                        "filled", GROUP_NUMS_LABELS, ident)
        out += [get_tps, get_size, send_back, consume_tps, consume_total]

        count, count_extra = self._family("rocketmq_group_count", "Consumers of the group online here",
                                          GROUP_COUNT_LABELS, ident)
        producers, prod_extra = self._family("rocketmq_producer_count", "Producers of the group connected here",
                                             PRODUCER_COUNT_LABELS, ident)
        if master:
            for group, info in _entries(ctx.consumers.groups):
                chans = list(info.channels.values())
                count.add((",".join(getattr(c.conn, "peer_addr", "") for c in chans),
                           ",".join(c.client_id for c in chans), group, *count_extra), len(chans))
                seen_groups.discard(group)
                await pacer.tick()
            for group in sorted(seen_groups):
                count.add(("", "", group, *count_extra), 0)
                await pacer.tick()
            for group, chans in _entries(ctx.producers.groups):
                producers.add((cluster, broker, group, *prod_extra), len(chans))
                await pacer.tick()
        out += [count, producers]
        return out

    async def _clients(self, ident: dict[str, str], pacer: Pacer) -> list[Family]:
        fams = [self._family(name, f"{field} of the consumer's GET_CONSUMER_RUNNING_INFO statusTable",
                             CLIENT_LABELS, ident) for field, name in CLIENT_FAMILIES]
        horizon = self.ctx.clock_ms() - RUNNING_INFO_TTL_MS
        for (group, client_id), (at_ms, addr, table) in _entries(self.poller.answers):
            if at_ms < horizon:
                continue
            for topic, status in table.items():
                for (field, _name), (fam, extra) in zip(CLIENT_FAMILIES, fams, strict=True):
                    fam.add((addr, client_id, group, topic, *extra), _num(status.get(field)))
            await pacer.tick()
        return [fam for fam, _ in fams]


def _rate(count: int, elapsed_s: float) -> float:
    return count / elapsed_s if elapsed_s > 0 else 0.0


def _disk(ctx: Any) -> tuple[float, float]:
    try:
        usage = shutil.disk_usage(ctx.store.config.store_path_commit_log)
    except (OSError, AttributeError):
        return 0.0, 0.0
    return float(usage.total), float(usage.free)
