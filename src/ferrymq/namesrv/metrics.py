"""The name server's Prometheus metrics (``ferry namesrv --metrics-port``): route table sizes read at
scrape time, plus the process collector. Served by ``ferrymq.remoting.metrics_http``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ferrymq.common.gc_policy import GC_FROZEN_DOC, GC_PAUSE_DOC
from ferrymq.remoting.metrics_http import MetricsServer

#: RouteTable.counts() key -> (metric name, help)
NAMESRV_GAUGES = {
    "clusters": ("ferrymq_namesrv_clusters", "Clusters known to the name server"),
    "broker_groups": ("ferrymq_namesrv_broker_groups", "Broker names (master/slave groups) registered"),
    "live_brokers": ("ferrymq_namesrv_live_brokers", "Broker addresses with a live registration"),
    "topics": ("ferrymq_namesrv_topics", "Topics with a route"),
}


class NamesrvCollector(Collector):
    def __init__(self, routes: Any, loop_lag: Any = None, gc_monitor: Any = None) -> None:
        self.routes = routes
        #: a common.aio.LoopLagProbe (ferrymq_event_loop_lag_seconds), or None
        self.loop_lag = loop_lag
        #: a common.gc_policy.GcMonitor (ferrymq_gc_pause_seconds, ferrymq_gc_frozen_objects), or None
        self.gc_monitor = gc_monitor

    def collect(self) -> Iterator[Metric]:
        counts = self.routes.counts()
        for key, (name, doc) in NAMESRV_GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=counts[key])
        if self.loop_lag is not None:
            lag = HistogramMetricFamily("ferrymq_event_loop_lag_seconds",
                                        "How late the event loop ran a 10 ms timer (the time it was held by "
                                        "other work)")
            lag.add_metric([], self.loop_lag.cumulative(), self.loop_lag.sum_s)
            yield lag
        if self.gc_monitor is not None:
            pause = HistogramMetricFamily("ferrymq_gc_pause_seconds", GC_PAUSE_DOC)
            pause.add_metric([], self.gc_monitor.cumulative(), self.gc_monitor.sum_s)
            yield pause
            yield GaugeMetricFamily("ferrymq_gc_frozen_objects", GC_FROZEN_DOC,
                                    value=self.gc_monitor.frozen_objects())


def namesrv_metrics_server(routes: Any, host: str, port: int, loop_lag: Any = None,
                           gc_monitor: Any = None) -> MetricsServer | None:
    """None when ``port`` is -1 (off; 0 = any free port)."""
    if port < 0:
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NamesrvCollector(routes, loop_lag, gc_monitor))
    ProcessCollector(registry=registry)
    return MetricsServer(registry, host, port)
