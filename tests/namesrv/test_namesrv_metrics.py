"""``ferry namesrv --metrics-port``: the name server's Prometheus endpoint, scraped over HTTP on 127.0.0.1
while an in-process broker is registered."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from ferrymq.cli.namesrv import command
from ferrymq.namesrv.app import NameServer
from support.aio import wait_for


@pytest.fixture
async def namesrv() -> AsyncIterator[NameServer]:
    ns = NameServer("127.0.0.1", 0, metrics_port=0)
    await ns.start()
    try:
        yield ns
    finally:
        await ns.stop()


async def scrape(port: int) -> dict[str, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200")
    return {s.name: s.value for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


async def test_scrape_counts_the_registered_broker(namesrv: NameServer, broker: Any) -> None:
    assert namesrv.metrics_server is not None
    m = await scrape(namesrv.metrics_server.port)
    assert m["ferrymq_namesrv_live_brokers"] == 1
    assert m["ferrymq_namesrv_broker_groups"] == 1 and m["ferrymq_namesrv_clusters"] == 1
    assert m["ferrymq_namesrv_topics"] >= 1
    assert m["process_resident_memory_bytes"] > 0


async def test_event_loop_lag_histogram(namesrv: NameServer) -> None:
    assert namesrv.metrics_server is not None
    port = namesrv.metrics_server.port

    async def sampled() -> dict[str, float] | None:
        m = await scrape(port)
        return m if m.get("ferrymq_event_loop_lag_seconds_count", 0) > 0 else None

    m = await wait_for(sampled, what="a loop-lag sample")
    assert m["ferrymq_event_loop_lag_seconds_sum"] >= 0
    assert m["ferrymq_event_loop_lag_seconds_bucket"] <= m["ferrymq_event_loop_lag_seconds_count"]


def test_metrics_port_out_of_range_is_a_usage_error() -> None:
    result = CliRunner().invoke(command, ["--listen", "127.0.0.1:0", "--metrics-port", "-2"])
    assert result.exit_code == 2 and "--metrics-port" in result.output


def test_metrics_off_by_default() -> None:
    assert NameServer("127.0.0.1", 0).metrics_server is None


async def test_gc_pause_histogram_and_frozen_objects(namesrv: NameServer) -> None:
    """A full collection while the name server runs is one more ``ferrymq_gc_pause_seconds`` sample; the start
    froze the loaded objects (gcFreezeEnable's default)."""
    assert namesrv.metrics_server is not None
    before = (await scrape(namesrv.metrics_server.port))["ferrymq_gc_pause_seconds_count"]
    gc.collect()
    m = await scrape(namesrv.metrics_server.port)
    assert m["ferrymq_gc_pause_seconds_count"] >= before + 1
    assert m["ferrymq_gc_pause_seconds_sum"] > 0
    assert m["ferrymq_gc_frozen_objects"] > 0


async def test_gc_freeze_can_be_turned_off() -> None:
    gc.unfreeze()
    ns = NameServer("127.0.0.1", 0, metrics_port=0, gc_freeze_enable=False)
    await ns.start()
    try:
        assert ns.metrics_server is not None
        m = await scrape(ns.metrics_server.port)
        assert m["ferrymq_gc_frozen_objects"] == 0
    finally:
        await ns.stop()
