"""The rocketmq-exporter's two Grafana dashboards against the broker's own /metrics (no exporter process).

``tests/fixtures/exporter_dashboards/queries.json`` holds every panel query of ``rocketmq_exporter_overview.json``
and ``rocketmq_exporter.json`` (apache/rocketmq-exporter, commit and panel titles recorded there), and
``collector_metrics.json`` every family ``RMQMetricsCollector`` defines. After a known workload:

* every metric selector of every query (name plus ``{label op "value"}`` matchers, dashboard variables set as an
  operator would pick them) selects at least one scraped series, with ``Env`` / ``Cluster`` added as the scrape
  configuration documented in docs/metrics.md adds them;
* counts the workload fixes are exact (producer offset = messages sent, consumer offset = messages consumed,
  diff = their difference, dead letters, send-backs, client counts, put distribution);
* the Apache C++ client's consumer (PyPI rocketmq==0.4.4) is asked GET_CONSUMER_RUNNING_INFO by the broker and
  its group's offsets are exact;
* a real Prometheus (Debian's ``prometheus`` package, when installed) scrapes the broker and evaluates every
  query: each returns data (threshold panels: their expression without the threshold).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from broker_helpers import BROKER_SETTINGS, Client, wait_for
from prometheus_client.parser import text_string_to_metric_families

from ferrymq.broker.app import BrokerController
from ferrymq.client import Admin, ConsumeStatus, MessageExt, Producer, PushConsumer, new_message
from ferrymq.common.message import decode_offset_msg_id
from ferrymq.remoting.codes import ResponseCode as R
from support.ports import free_port

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "exporter_dashboards"
TOPIC = "ExpDash"
GROUP = "exp-cg"
PRODUCER_GROUP = "exp-pg"
CPP_GROUP = "exp-cpp-cg"
SENT = 12
#: what an operator picks in the rocketmq_exporter.json variables (=~ matchers: all values)
ENV = "test"
VARIABLES = {"$env": ENV, "$broker": ".*", "$topic": ".*", "$group": ".*"}
#: client timer periods that make the test quick (rebalance, heartbeat; offset persistence)
FAST_MS = 300
PERSIST_MS = 200
#: comparison filters of alert-style panels (backlog < 0, > 100000): without them the expression has data
THRESHOLD = re.compile(r"\s*(>=|<=|<|>)\s*\d+\s*$")
SELECTOR = re.compile(r"\b(rocketmq_[a-zA-Z0-9_]+)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
PROMETHEUS_WAIT_S = 60


def load_queries() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "queries.json").read_text(encoding="utf-8"))
    return data


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    out = []
    for m in SELECTOR.finditer(expr):
        matchers: list[tuple[str, str, str]] = []
        body = (m.group(2) or "{}")[1:-1]
        pos = 0
        while pos < len(body.strip()):
            mm = MATCHER.match(body, pos)
            assert mm, f"cannot parse matchers of {m.group(0)!r}"
            matchers.append((mm.group(1), mm.group(2), mm.group(3)))
            pos = mm.end()
        out.append((m.group(1), matchers))
    return out


def substitute(expr: str, cluster: str) -> str:
    for var, value in {**VARIABLES, "$cluster": cluster}.items():
        expr = expr.replace(var, value)
    return expr


def matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        got = labels.get(name, "")
        if op == "=" and got != value or op == "!=" and got == value:
            return False
        if op == "=~" and not re.fullmatch(value, got) or op == "!~" and re.fullmatch(value, got):
            return False
    return True


async def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), head
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(body.decode())
            for s in fam.samples]


def one(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    found = [v for n, lab, v in samples if n == name and all(lab.get(k) == v2 for k, v2 in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    return {**BROKER_SETTINGS, "metrics_port": 0}


class Workload:
    """SENT messages to TOPIC by our producer, all consumed by our push consumer (GROUP); one of them sent back
    to the dead letter queue and one to the retry topic (1 s delay) with CONSUMER_SEND_MSG_BACK."""

    def __init__(self, ns_addr: str) -> None:
        self.ns_addr = ns_addr
        self.producer = Producer(ns_addr, PRODUCER_GROUP, heartbeat_broker_interval_ms=FAST_MS)
        self.consumer = PushConsumer(ns_addr, GROUP, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                     rebalance_interval_ms=FAST_MS, persist_offset_interval_ms=PERSIST_MS)
        self.consumed: set[str] = set()
        self.send_backs = 0

    async def run(self, broker: BrokerController) -> None:
        async with Admin(self.ns_addr) as admin:
            await admin.create_topic(TOPIC, read_queue_nums=2, write_queue_nums=2)
            await admin.wait_for_route(TOPIC)
        await self.producer.start()
        results = [await self.producer.send(new_message(TOPIC, f"m-{i}", tags="T")) for i in range(SENT)]

        async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            self.consumed.update(m.msg_id for m in msgs if m.topic == TOPIC and m.reconsume_times == 0)
            return ConsumeStatus.CONSUME_SUCCESS

        self.consumer.subscribe(TOPIC, "*")
        self.consumer.register_message_listener(listener)
        await self.consumer.start()
        await wait_for(lambda: len(self.consumed) == SENT, what="every message consumed")
        client = await Client().open(broker.broker_addr)
        try:
            for result, delay_level in ((results[0], -1), (results[1], 1)):
                _host, _port, phy_offset = decode_offset_msg_id(result.offset_msg_id)
                resp = await client.call(36, {"offset": phy_offset, "group": GROUP, "delayLevel": delay_level,
                                              "originMsgId": result.msg_id, "originTopic": TOPIC,
                                              "maxReconsumeTimes": 16})
                assert resp.code == R.SUCCESS, resp.remark
                self.send_backs += 1
        finally:
            client.close()

    async def close(self) -> None:
        await self.consumer.close()
        await self.producer.close()


@pytest.fixture
async def workload(namesrv: Any, broker: BrokerController) -> AsyncIterator[Workload]:
    w = Workload(namesrv.addr)
    try:
        await w.run(broker)
        yield w
    finally:
        await w.close()


async def settled_scrape(broker: BrokerController) -> list[tuple[str, dict[str, str], float]]:
    """A scrape once the consumer committed every offset, the retried message came back through the retry topic
    and the broker's poll of GET_CONSUMER_RUNNING_INFO holds the consumer's statusTable."""
    assert broker.metrics_server is not None
    port = broker.metrics_server.port

    async def ready() -> list[tuple[str, dict[str, str], float]] | None:
        s = await scrape(port)
        offsets = [v for n, lab, v in s if n == "rocketmq_consumer_offset" and lab.get("group") == GROUP
                   and lab.get("topic") == TOPIC]
        retried = [v for n, lab, v in s if n == "rocketmq_group_retrydiff" and lab.get("group") == GROUP]
        clients = [v for n, lab, v in s if n == "rocketmq_client_consume_ok_msg_tps" and lab.get("group") == GROUP
                   and lab.get("topic") == TOPIC]
        producers = [v for n, lab, v in s if n == "rocketmq_producer_count" and lab.get("group") == PRODUCER_GROUP]
        return s if offsets == [SENT] and retried and clients and producers else None

    return await wait_for(ready, timeout_s=60, interval_s=0.5,
                          what="offsets committed, retry consumed, 307 polled, producer heartbeat")


def test_fixture_lists_both_dashboards_and_every_collector_family() -> None:
    q = load_queries()
    by_file: dict[str, int] = {}
    for query in q["queries"]:
        by_file[query["file"]] = by_file.get(query["file"], 0) + 1
    assert by_file == {"rocketmq_exporter_overview.json": 52, "rocketmq_exporter.json": 50}
    assert re.fullmatch(r"[0-9a-f]{40}", q["source"]["commit"])
    families = json.loads((FIXTURES / "collector_metrics.json").read_text())["metrics"]
    assert len(families) == 89 and len({f["name"] for f in families}) == 89


async def test_every_dashboard_selector_selects_series_and_counts_are_exact(broker: BrokerController,
                                                                          workload: Workload) -> None:
    samples = await settled_scrape(broker)
    cluster = broker.config.broker_cluster_name
    # what the documented scrape configuration adds to every series of the target
    with_target = [(n, {**lab, "Env": ENV, "Cluster": cluster}, v) for n, lab, v in samples]
    names = {n for n, _, _ in samples}

    collector = json.loads((FIXTURES / "collector_metrics.json").read_text())["metrics"]
    missing_families = [f["name"] for f in collector if f["name"] not in names and f["name"] not in (
        # never filled by the exporter either; the commit log diff needs a slave
        "rocketmq_group_dlqdiff", "rocketmq_group_consume_tps", "rocketmq_group_consume_total_offset",
        "rocketmq_broker_commitlog_diff")]
    assert not missing_families, f"collector families without a series: {missing_families}"
    for fam in collector:  # the exporter's label names, all of them
        for n, lab, _ in samples:
            if n == fam["name"]:
                assert set(fam["labels"]) <= set(lab), (n, fam["labels"], sorted(lab))
                break

    q = load_queries()
    empty = []
    for query in [*q["queries"], *({"expr": v["query"], "panel_title": v["name"]} for v in q["variables"])]:
        expr = substitute(query["expr"], cluster)
        for name, matchers in selectors(expr):
            if not any(n == name and matches(lab, matchers) for n, lab, _ in with_target):
                empty.append((query["panel_title"], name, matchers))
    assert not empty, f"selectors with no series: {empty}"

    # exact counts of the workload
    assert one(samples, "rocketmq_producer_offset", topic=TOPIC) == SENT
    assert one(samples, "rocketmq_consumer_offset", topic=TOPIC, group=GROUP) == SENT
    assert one(samples, "rocketmq_group_diff", topic=TOPIC, group=GROUP) == 0
    diff_labels = next(lab for n, lab, _ in samples if n == "rocketmq_group_diff" and lab["group"] == GROUP)
    assert (diff_labels["countOfOnlineConsumers"], diff_labels["msgModel"]) == ("1", "1")
    assert one(samples, "rocketmq_group_get_latency_by_storetime", topic=TOPIC, group=GROUP) == 0
    assert one(samples, "rocketmq_topic_dlq_offset", group=GROUP) == 1
    assert one(samples, "rocketmq_send_back_nums", topic=TOPIC, group=GROUP) == workload.send_backs
    assert one(samples, "rocketmq_producer_count", group=PRODUCER_GROUP) == 1
    assert one(samples, "rocketmq_group_count", group=GROUP) == 1
    assert one(samples, "rocketmq_client_consume_fail_msg_count", group=GROUP, topic=TOPIC) == 0
    assert one(samples, "rocketmq_client_consume_ok_msg_tps", group=GROUP, topic=TOPIC) > 0
    assert one(samples, "rocketmq_consumer_tps", topic=TOPIC, group=GROUP) > 0
    assert one(samples, "rocketmq_producer_tps", topic=TOPIC) > 0
    runtime = {"brokerIP": broker.broker_addr, "role": "master", "brokerId": "0"}
    assert one(samples, "rocketmq_brokeruntime_commitlog_maxoffset", **runtime) == broker.store.max_phy_offset
    # every stored SEND of the producer counted once in this minute's put distribution
    if broker.stats.put_distribution.periods == 0:  # still the broker's first minute
        pmdt = sum(v for n, lab, v in samples if n.startswith("rocketmq_brokeruntime_pmdt_"))
        assert pmdt == SENT
    # no series of the exporter families counted twice (one label set per series)
    seen = [(n, tuple(sorted(lab.items()))) for n, lab, _ in samples]
    assert len(seen) == len(set(seen))


CPP_CONSUMER = r'''
import json, os, sys, time
from rocketmq.client import PushConsumer
a = json.loads(sys.argv[1])
seen = set()
def on_message(msg):
    seen.add(msg.id)
c = PushConsumer(a["group"])
c.set_namesrv_addr(a["namesrv"])
c.subscribe(a["topic"], on_message)
c.start()
while not os.path.exists(a["stop"]):
    time.sleep(0.05)
c.shutdown()
print(json.dumps({"seen": len(seen)}), flush=True)
os._exit(0)
'''


def _cpp_available() -> bool:
    try:
        import rocketmq.client  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.acceptance
@pytest.mark.skipif(not _cpp_available(), reason="the Apache C++ client (PyPI rocketmq==0.4.4) is not installed")
async def test_cpp_consumer_offsets_exact_and_asked_for_running_info(tmp_path: Path, broker: BrokerController,
                                                                    workload: Workload) -> None:
    assert broker.metrics_server is not None
    port = broker.metrics_server.port
    stop = tmp_path / "stop"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CPP_CONSUMER,
        json.dumps({"namesrv": workload.ns_addr, "topic": TOPIC, "group": CPP_GROUP, "stop": str(stop)}),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async def committed() -> list[tuple[str, dict[str, str], float]] | None:
            s = await scrape(port)
            got = [v for n, lab, v in s if n == "rocketmq_consumer_offset" and lab.get("group") == CPP_GROUP]
            return s if got == [SENT] else None

        # the C++ client commits its offsets every 5 s
        samples = await wait_for(committed, timeout_s=90, interval_s=0.5, what="C++ consumer committed")
        assert one(samples, "rocketmq_group_diff", group=CPP_GROUP, topic=TOPIC) == 0
        assert one(samples, "rocketmq_group_count", group=CPP_GROUP) == 1
        poller = broker.metrics_server.exposition.poller  # type: ignore[attr-defined]

        async def asked() -> bool:
            await scrape(port)  # a scrape starts a poll once the last is older than the interval
            return any(group == CPP_GROUP for group, _ in poller.answers)

        await wait_for(asked, timeout_s=60, interval_s=0.5, what="the C++ consumer answered 307")
        (_at, addr, table), = [v for (group, _), v in poller.answers.items() if group == CPP_GROUP]
        assert addr.startswith("127.0.0.1:")
        # the C++ client (2.x core) answers without a statusTable: no client series, as with the exporter
        assert table == {}
        assert not [lab for n, lab, _ in await scrape(port)
                    if n.startswith("rocketmq_client_") and lab.get("group") == CPP_GROUP]
    finally:
        stop.touch()
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        except BaseException:
            proc.kill()
            await proc.wait()
            raise
    assert proc.returncode == 0, err.decode()[-2000:]
    assert json.loads(out.decode().strip().splitlines()[-1])["seen"] >= SENT


def _prometheus() -> str | None:
    return shutil.which("prometheus")


def _query(base: str, expr: str) -> list[Any]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", (expr, body)
    result: list[Any] = body["data"]["result"]
    return result


@pytest.mark.acceptance
@pytest.mark.skipif(_prometheus() is None, reason="no prometheus binary (Debian: apt-get install prometheus)")
async def test_prometheus_evaluates_every_dashboard_query_with_data(tmp_path: Path, broker: BrokerController,
                                                                   workload: Workload) -> None:
    assert broker.metrics_server is not None
    await settled_scrape(broker)
    cluster = broker.config.broker_cluster_name
    web_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: ferrymq\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{broker.metrics_server.port}'], "
        f"labels: {{Env: {ENV}, Cluster: {cluster}}}}}]\n")
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [str(_prometheus()), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web_port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{web_port}"
    try:
        def scraped() -> bool:
            try:
                up = _query(base, 'up{job="ferrymq"} == 1')
                return bool(up) and bool(_query(base, "rocketmq_client_consume_rt"))
            except OSError:
                return False

        await wait_for(lambda: asyncio.to_thread(scraped), timeout_s=PROMETHEUS_WAIT_S, interval_s=0.5,
                       what="prometheus scraped the broker")
        q = load_queries()
        no_data = []
        for query in [*q["queries"], *({"expr": v["query"], "panel_title": v["name"]} for v in q["variables"])]:
            expr = substitute(query["expr"], cluster)
            if expr.startswith("label_values("):  # Grafana's variable function: the series it reads
                inner = expr[len("label_values("):].rstrip().removesuffix(")").rsplit(",", 1)
                values = {r["metric"].get(inner[1].strip()) for r in await asyncio.to_thread(
                    _query, base, inner[0])} if len(inner) == 2 else set()
                if not values - {None}:
                    no_data.append((query["panel_title"], expr))
                continue
            if await asyncio.to_thread(_query, base, expr):
                continue
            # an alert-style panel (backlog < 0, > 100000) is empty while the estate is healthy: its expression
            # without the threshold must have data
            bare = THRESHOLD.sub("", expr.split(" and ")[0])
            if bare == expr or not await asyncio.to_thread(_query, base, bare):
                no_data.append((query["panel_title"], expr))
        assert not no_data, f"queries without data: {no_data}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        if os.environ.get("FERRYMQ_KEEP_PROMETHEUS_LOG"):
            print((tmp_path / "prometheus.log").read_text()[-3000:])


async def test_master_and_slave_publish_once_what_they_share(tmp_path: Path, namesrv: Any) -> None:
    """A master and its slave, both scraped: the slave's series say role="slave", brokerId="1"; offsets are
    published by the master only (``sum by (topic)`` counts them once); the master publishes how far the
    slave's commit log is behind (rocketmq_broker_commitlog_diff, brokerIP = the slave)."""
    from broker_helpers import make_config, send_v1

    from ferrymq.broker.config import BrokerRole

    master = BrokerController(make_config(str(tmp_path / "m"), namesrv.addr, metrics_port=0, broker_name="bx",
                                          broker_role=BrokerRole.ASYNC_MASTER))
    slave = BrokerController(make_config(str(tmp_path / "s"), namesrv.addr, metrics_port=0, broker_name="bx",
                                         broker_id=1, broker_role=BrokerRole.SLAVE))
    await master.start()
    try:
        await slave.start()
        try:
            client = await Client().open(master.broker_addr)
            try:
                for i in range(3):
                    assert (await client.call(10, send_v1("HaT", queue_id=0), b"m%d" % i)).code == R.SUCCESS
            finally:
                client.close()
            assert master.metrics_server is not None and slave.metrics_server is not None

            async def replicated() -> list[tuple[str, dict[str, str], float]] | None:
                s = await scrape(master.metrics_server.port)  # type: ignore[union-attr]
                diff = [v for n, lab, v in s if n == "rocketmq_broker_commitlog_diff"]
                caught_up = slave.store.max_phy_offset == master.store.max_phy_offset
                return s if diff == [0] and caught_up else None

            m = await wait_for(replicated, timeout_s=30, interval_s=0.2, what="slave caught up")
            (diff_labels,) = [lab for n, lab, _ in m if n == "rocketmq_broker_commitlog_diff"]
            assert diff_labels["broker"] == "bx" and diff_labels["role"] == "master"
            assert diff_labels["brokerIP"].startswith("127.0.0.1:")  # the slave's end of its HA connection
            assert one(m, "rocketmq_producer_offset", topic="HaT") == 3
            s = await scrape(slave.metrics_server.port)
            assert not [n for n, lab, _ in s if n in ("rocketmq_producer_offset", "rocketmq_consumer_offset",
                                                      "rocketmq_group_diff", "rocketmq_broker_commitlog_diff")]
            (rt,) = [lab for n, lab, _ in s if n == "rocketmq_brokeruntime_commitlog_maxoffset"]
            assert (rt["role"], rt["brokerId"], rt["brokerIP"]) == ("slave", "1", slave.broker_addr)
            assert one(s, "rocketmq_brokeruntime_commitlog_maxoffset") == master.store.max_phy_offset
            # both scraped: the offsets summed by topic are the master's alone
            both = [*m, *s]
            assert sum(v for n, lab, v in both if n == "rocketmq_producer_offset" and lab["topic"] == "HaT") == 3
        finally:
            await slave.stop()
    finally:
        await master.stop()
