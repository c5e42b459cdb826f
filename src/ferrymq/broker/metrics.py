"""The broker's Prometheus metrics (``metricsPort``), served by ``ferrymq.remoting.metrics_http`` on
``metricsListenHost`` (127.0.0.1 by default), behind ``metricsAuthToken`` / ``metricsBasicAuth`` when set.

Nothing is counted per message by prometheus_client: ``BrokerStats`` holds plain ints bumped on the event
loop and ``BrokerCollector`` turns the per-broker ones into metric families at scrape time. The per-topic and
per-group series (and rocketmq-exporter's families) are built by ``exporter_metrics.ExporterExposition`` in
slices that yield the event loop, appended to the registry's text. See docs/metrics.md for the names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ferrymq.broker.exporter_metrics import ExporterExposition
from ferrymq.broker.stats import BrokerStats, LatencyHistogram
from ferrymq.common.gc_policy import GC_FROZEN_DOC, GC_PAUSE_DOC
from ferrymq.common.http_auth import HttpAuth, is_loopback
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.metrics_http import MetricsServer

log = logging.getLogger(__name__)

#: the ``code`` label of a request the handler hands to a callback (answered later, e.g. on a slave's ack)
ANSWERED_LATER_CODE = -1
SEND_CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
LOOP_LAG_DOC = "How late the event loop ran a 10 ms timer (the time it was held by other work)"


def loop_lag_family(probe: Any, labels: list[str], values: list[str]) -> HistogramMetricFamily:
    """``ferrymq_event_loop_lag_seconds`` from a ``common.aio.LoopLagProbe``."""
    fam = HistogramMetricFamily("ferrymq_event_loop_lag_seconds", LOOP_LAG_DOC, labels=labels)
    fam.add_metric(values, probe.cumulative(), probe.sum_s)
    return fam


def histogram_family(name: str, doc: str, labels: list[str],
                     rows: Iterable[tuple[list[str], LatencyHistogram]]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for values, h in rows:
        fam.add_metric(values, h.cumulative(), h.sum_s)
    return fam


class BrokerCollector(Collector):
    """Reads ``ctx`` (a ``BrokerController``) at scrape time."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        ctx = self.ctx
        st: BrokerStats = ctx.stats
        cluster, broker = ctx.config.broker_cluster_name, ctx.config.broker_name
        base = ["cluster", "broker"]
        ids = [cluster, broker]

        yield histogram_family("ferrymq_send_latency_seconds", "SEND request handling time by response code",
                               [*base, "code"], [([*ids, str(code)], h) for code, h in
                                                 sorted(st.send_latency.items())])
        yield histogram_family("ferrymq_pull_latency_seconds",
                               "PULL request handling time (a parked pull is timed until it is answered)",
                               base, [(ids, st.pull_latency)])
        yield self._gauge("ferrymq_long_poll_waiters", "Pull requests parked by long polling", base, ids,
                          ctx.long_polling.parked_count)
        yield loop_lag_family(ctx.loop_lag, base, ids)
        gc_monitor = getattr(ctx, "gc_monitor", None)
        if gc_monitor is not None:
            pause = HistogramMetricFamily("ferrymq_gc_pause_seconds", GC_PAUSE_DOC, labels=base)
            pause.add_metric(ids, gc_monitor.cumulative(), gc_monitor.sum_s)
            yield pause
            yield self._gauge("ferrymq_gc_frozen_objects", GC_FROZEN_DOC, base, ids, gc_monitor.frozen_objects())
        pool = getattr(getattr(ctx.store, "queues", None), "pool", None)
        if pool is not None:  # the process's descriptors vs its limit: process_open_fds / process_max_fds
            yield self._gauge("ferrymq_store_open_files", "Consume queue files mapped now (two file descriptors "
                              "each)", base, ids, pool.mapped_files)
            yield self._gauge("ferrymq_store_open_files_limit", "Consume queue files mapped at most at once "
                              "(maxOpenSegmentFiles)", base, ids, pool.max_open)
            fails = CounterMetricFamily("ferrymq_store_file_open_failures", "Store files that could not be opened "
                                        "for lack of file descriptors (EMFILE/ENFILE)", labels=base)
            fails.add_metric(ids, pool.open_failures_total)
            yield fails

        yield from self._replication(base, ids, st)

    @staticmethod
    def _gauge(name: str, doc: str, labels: list[str], values: list[str], v: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=labels)
        g.add_metric(values, v)
        return g

    def _replication(self, base: list[str], ids: list[str], st: BrokerStats) -> Iterator[Metric]:
        ack = GaugeMetricFamily("ferrymq_ha_slave_ack_offset", "Commit log offset acked by a slave",
                                labels=[*base, "slave"])
        lag = GaugeMetricFamily("ferrymq_ha_slave_lag_bytes", "Commit log bytes a slave has not acked",
                                labels=[*base, "slave"])
        ha = self.ctx.ha_service
        if ha is not None:
            for s in ha.slave_status():
                ack.add_metric([*ids, str(s["addr"])], s["ackOffset"])
                lag.add_metric([*ids, str(s["addr"])], s["lagBytes"])
        role = getattr(self.ctx, "controller_role", None)
        if role is not None and role.is_master:
            max_phy = int(self.ctx.store.max_phy_offset)
            for s in role.ha_master.slave_status():
                ack.add_metric([*ids, f"replica-{s['replicaId']}"], s["ackPhyOffset"])
                lag.add_metric([*ids, f"replica-{s['replicaId']}"], max(0, max_phy - s["ackPhyOffset"]))
        yield ack
        yield lag
        if role is not None:
            yield from self._controller_mode(base, ids, role)
        yield histogram_family("ferrymq_sync_replica_wait_seconds", "SYNC_MASTER wait for a slave's ack", base,
                               [(ids, st.sync_wait)])
        fails = CounterMetricFamily("ferrymq_replica_failures", "Sends answered FLUSH_SLAVE_TIMEOUT or "
                                    "SLAVE_NOT_AVAILABLE", labels=[*base, "status"])
        for status, n in sorted(st.replica_failures.items()):
            fails.add_metric([*ids, status], n)
        yield fails


    @staticmethod
    def _controller_mode(base: list[str], ids: list[str], role: Any) -> Iterator[Metric]:
        """Controller mode: this replica's view of its group (broker/controller_mode.py)."""
        for name, doc, value in (
            ("ferrymq_controller_master_epoch", "Master epoch this replica knows", role.master_epoch),
            ("ferrymq_controller_is_master", "1 while this replica is the master", int(role.is_master)),
            ("ferrymq_controller_lease_valid", "1 while this master may acknowledge sends (lease)", int(role.can_ack())),
            ("ferrymq_controller_sync_state_set_size", "Members of the SyncStateSet (master's view; 0 on a slave)",
             len(role.ha_master.sync_state_set) if role.is_master else 0),
        ):
            g = GaugeMetricFamily(name, doc, labels=base)
            g.add_metric(ids, value)
            yield g
        c = CounterMetricFamily("ferrymq_controller_role_changes", "Times this replica became or stopped being "
                                "master (elections it took part in)", labels=base)
        c.add_metric(ids, role.elections_seen)
        yield c


# ---- request timing (installed only when the endpoint is on) ---------------------------------------
def _timed(handler: Callable[..., Any], observe: Callable[[int, float], None]) -> Callable[..., Any]:
    perf = time.perf_counter

    async def finish(started_s: float, pending: Awaitable[Any]) -> Any:
        resp = await pending
        observe(resp.code if isinstance(resp, RemotingCommand) else 0, perf() - started_s)
        return resp

    def wrapped(conn: Any, cmd: RemotingCommand) -> Any:
        started_s = perf()
        resp = handler(conn, cmd)
        if isinstance(resp, RemotingCommand):
            observe(resp.code, perf() - started_s)
            return resp
        if isinstance(resp, bytes):  # the templated SEND_OK frame
            observe(0, perf() - started_s)
            return resp
        if resp is None:  # answered later by a callback (SYNC_MASTER slave ack): timed until handed over
            observe(ANSWERED_LATER_CODE, perf() - started_s)
            return resp
        return finish(started_s, resp)

    return wrapped


def instrument(dispatcher: Any, stats: BrokerStats) -> None:
    """Wrap the SEND and PULL handlers of ``dispatcher`` to time them by response code (0 = SUCCESS,
    ``ANSWERED_LATER_CODE`` = handed to a callback)."""

    def on_send(code: int, seconds: float) -> None:
        if code == 0:
            stats.on_put_time(seconds)
        h = stats.send_latency.get(code)
        if h is None:
            h = stats.send_latency[code] = LatencyHistogram()
        h.observe(seconds)

    def on_pull(_code: int, seconds: float) -> None:
        stats.pull_latency.observe(seconds)

    for code in SEND_CODES:
        handler = dispatcher.get(code)
        if handler is not None:
            dispatcher.register(code, _timed(handler, on_send))
    handler = dispatcher.get(RequestCode.PULL_MESSAGE)
    if handler is not None:
        dispatcher.register(RequestCode.PULL_MESSAGE, _timed(handler, on_pull))


class BrokerMetricsServer(MetricsServer):
    """The endpoint plus the exporter families; stopping it also stops their consumer polls."""

    def __init__(self, exposition: ExporterExposition, registry: CollectorRegistry, host: str, port: int,
                 auth: HttpAuth) -> None:
        super().__init__(registry, host, port, auth, extra=exposition.render)
        self.exposition = exposition

    async def stop(self) -> None:
        await self.exposition.poller.stop()
        await super().stop()


def broker_metrics_server(ctx: Any) -> MetricsServer | None:
    """The broker's endpoint, None when ``metricsPort`` is -1 (off; 0 = any free port)."""
    port = ctx.config.metrics_port
    if port < 0:
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(ctx))
    ProcessCollector(registry=registry)
    instrument(ctx.dispatcher, ctx.stats)
    cfg = ctx.config
    auth = HttpAuth(token=cfg.metrics_auth_token, basic=cfg.metrics_basic_auth)
    if not auth.required and not is_loopback(cfg.metrics_listen_host):
        log.warning("metrics on %s:%s without metricsAuthToken or metricsBasicAuth: whoever reaches it reads "
                    "topic and group names", cfg.metrics_listen_host, port)
    return BrokerMetricsServer(ExporterExposition(ctx), registry, cfg.metrics_listen_host, port, auth)
