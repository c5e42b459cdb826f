"""Broker statistics and the Prometheus endpoint: rate windows on an injected clock (unit), and an in-process
broker scraped over HTTP on 127.0.0.1 after known sends and pulls (counts exact, lag per queue)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from broker_helpers import BROKER_SETTINGS, Client, pull, send_v1
from prometheus_client.parser import text_string_to_metric_families

from ferrymq.broker.app import BrokerController
from ferrymq.broker.stats import BrokerStats, local_midnight_ms
from ferrymq.remoting import jsonx
from ferrymq.remoting.codes import ResponseCode as R

#: one hour after a local midnight, so the tests never cross a day by accident
T0_MS = local_midnight_ms(1_700_000_000_000) + 3_600_000


class FakeClock:
    def __init__(self) -> None:
        self.now_ms: int = T0_MS

    def __call__(self) -> int:
        return self.now_ms


def test_tps_windows_follow_the_injected_clock() -> None:
    clock = FakeClock()
    stats = BrokerStats(clock)
    # 10 messages a second for 20 s, then 100 a second for 10 s, sampling every second
    for second in range(30):
        stats.on_put("T", 10 if second < 20 else 100, 1000)
        clock.now_ms += 1000
        stats.sample()
    tps10s, tps1m, tps10m = stats.put_tps()
    assert tps10s == pytest.approx(100.0)
    assert tps1m == pytest.approx((20 * 10 + 10 * 100) / 30)  # only 30 s of history: rate over what exists
    assert tps10m == pytest.approx(tps1m)
    assert stats.put_msgs_by_topic == {"T": 1200} and stats.put_bytes_by_topic == {"T": 30_000}
    info = stats.runtime_info()
    assert info["putTps"] == "100.00 40.00 40.00"
    assert info["msgPutTotalTodayNow"] == "1200"


def test_old_samples_leave_the_windows() -> None:
    clock = FakeClock()
    stats = BrokerStats(clock)
    stats.on_get("T", 600, 6000)
    for _ in range(700):  # 700 s with no traffic after the burst
        clock.now_ms += 1000
        stats.sample()
    assert stats.get_tps() == (0.0, 0.0, 0.0)
    assert len(stats._samples) <= 600 + 10  # bounded by the longest window
    stats.on_get("T", 60, 600)
    assert stats.get_tps()[0] == pytest.approx(6.0)  # 60 messages over the last 10 s


def test_today_totals_roll_at_midnight() -> None:
    clock = FakeClock()
    stats = BrokerStats(clock)
    stats.on_put("T", 7, 70)
    assert stats.runtime_info()["msgPutTotalTodayNow"] == "7"
    clock.now_ms += 86_400_000
    stats.sample()  # the broker's once-a-second timer: the day rolls at the first sample after midnight
    stats.on_put("T", 2, 20)
    info = stats.runtime_info()
    assert (info["msgPutTotalTodayNow"], info["msgPutTotalTodayMorning"]) == ("2", "7")


async def scrape(port: int) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200")
    samples: dict[str, Any] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("cluster", "broker"))))
            samples[key] = s.value
    return samples


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    return {**BROKER_SETTINGS, "listen_host": "127.0.0.1", "metrics_port": 0}


async def test_scrape_after_sends_and_pulls(broker: BrokerController) -> None:
    assert broker.metrics_server is not None and broker.metrics_server.port > 0
    client = await Client().open(broker.broker_addr)
    try:
        for _ in range(5):
            assert (await client.call(10, send_v1("Met", queue_id=0), b"abcd")).code == R.SUCCESS
        got = await client.call(11, pull("Met", group="cg", queue_id=0, offset=0, suspend_ms=1000))
        assert got.code == R.SUCCESS
        done = await client.call(15, {"consumerGroup": "cg", "topic": "Met", "queueId": 0, "commitOffset": 2})
        assert done.code == R.SUCCESS
        m = await scrape(broker.metrics_server.port)
        topic = (("topic", "Met"),)
        assert m[("ferrymq_put_messages_total", topic)] == 5
        assert m[("ferrymq_get_messages_total", topic)] == 5
        assert m[("ferrymq_put_bytes_total", topic)] > 5 * 4  # records: body plus the record head
        assert m[("ferrymq_consume_queue_lag", (("group", "cg"), ("queue_id", "0"), ("topic", "Met")))] == 3
        assert m[("rocketmq_message_accumulation", (("group", "cg"), ("topic", "Met")))] == 3
        assert m[("ferrymq_send_latency_seconds_count", (("code", "0"),))] == 5
        assert m[("ferrymq_pull_latency_seconds_count", ())] == 1
        assert m[("ferrymq_long_poll_waiters", ())] == 0
        assert m[("ferrymq_replica_failures_total", (("status", "FLUSH_SLAVE_TIMEOUT"),))] == 0
        assert 1 <= m[("ferrymq_store_open_files", ())] <= m[("ferrymq_store_open_files_limit", ())]
        assert m[("ferrymq_store_file_open_failures_total", ())] == 0
        assert m[("process_open_fds", ())] <= m[("process_max_fds", ())]
        assert m[("ferrymq_gc_frozen_objects", ())] > 0  # the start froze the loaded objects (gcFreezeEnable)
        passes = m[("ferrymq_gc_pause_seconds_count", ())]
        gc.collect()
        m = await scrape(broker.metrics_server.port)
        assert m[("ferrymq_gc_pause_seconds_count", ())] >= passes + 1

        info = jsonx.loads((await client.call(28)).body)["table"]
        tps10s, tps1m, tps10m = (float(x) for x in info["putTps"].split(" "))
        assert tps10s > 0 and tps1m > 0 and tps10m > 0
        assert float(info["getTransferedTps"].split(" ")[0]) > 0
        assert (info["msgPutTotalTodayNow"], info["msgGetTotalTodayNow"]) == ("5", "5")
    finally:
        client.close()


async def test_other_paths_are_404(broker: BrokerController) -> None:
    assert broker.metrics_server is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.metrics_server.port)
    try:
        writer.write(b"GET /secret HTTP/1.0\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert raw.startswith(b"HTTP/1.0 404")


def test_metrics_port_out_of_range_is_a_config_error(tmp_path: Any) -> None:
    from broker_helpers import make_config

    from ferrymq.errors import ConfigError

    cfg = make_config(str(tmp_path), metrics_port=70_000)
    with pytest.raises(ConfigError, match="metricsPort"):
        cfg.validate()


async def test_oversized_request_head_is_400(broker: BrokerController) -> None:
    assert broker.metrics_server is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.metrics_server.port)
    try:
        writer.write(b"GET /metrics HTTP/1.0\r\nX-Pad: " + b"a" * 10_000 + b"\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert raw.startswith(b"HTTP/1.0 400")  # 10 KB > METRICS_MAX_HEAD_BYTES, all of it read by the server


async def test_sync_master_without_slave_counts_slave_not_available(tmp_path: Any, namesrv: Any) -> None:
    from broker_helpers import make_config

    from ferrymq.broker.config import BrokerRole

    cfg = make_config(str(tmp_path / "store"), namesrv.addr, listen_host="127.0.0.1", metrics_port=0,
                      broker_role=BrokerRole.SYNC_MASTER)
    ctl = BrokerController(cfg)
    await ctl.start()
    try:
        assert ctl.metrics_server is not None
        client = await Client().open(ctl.broker_addr)
        try:
            for _ in range(3):
                resp = await client.call(10, send_v1("Sync", queue_id=0), b"x")
                assert resp.code == R.SLAVE_NOT_AVAILABLE
        finally:
            client.close()
        m = await scrape(ctl.metrics_server.port)
        assert m[("ferrymq_replica_failures_total", (("status", "SLAVE_NOT_AVAILABLE"),))] == 3
        assert m[("ferrymq_replica_failures_total", (("status", "FLUSH_SLAVE_TIMEOUT"),))] == 0
        assert m[("ferrymq_put_messages_total", (("topic", "Sync"),))] == 3  # stored, only not replicated
    finally:
        await ctl.stop()


async def test_parked_pull_is_a_long_poll_waiter_until_a_send_wakes_it(broker: BrokerController) -> None:
    from broker_helpers import wait_for

    assert broker.metrics_server is not None
    client = await Client().open(broker.broker_addr)
    try:
        assert (await client.call(10, send_v1("Park", queue_id=0), b"a")).code == R.SUCCESS
        parked = asyncio.ensure_future(client.call(11, pull("Park", queue_id=0, offset=1, suspend_ms=20_000)))
        await wait_for(lambda: broker.long_polling.parked_count == 1, what="pull parked")
        m = await scrape(broker.metrics_server.port)
        assert m[("ferrymq_long_poll_waiters", ())] == 1
        assert (await client.call(10, send_v1("Park", queue_id=0), b"b")).code == R.SUCCESS
        assert (await asyncio.wait_for(parked, 20)).code == R.SUCCESS
        m = await scrape(broker.metrics_server.port)
        assert m[("ferrymq_long_poll_waiters", ())] == 0
        assert m[("ferrymq_get_messages_total", (("topic", "Park"),))] == 1
        assert m[("ferrymq_pull_latency_seconds_count", ())] == 1
    finally:
        client.close()
