"""The console's pages over HTTP (aiohttp on 127.0.0.1, port 0) against an in-process name server and broker:
what each page shows of the live cluster, the sampled series, escaping, and errors as pages (400, 404, 502)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import markupsafe
import pytest
from aiohttp import ClientSession

from ferrymq.client import Admin, Producer, new_message
from ferrymq.console.app import serve
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from support.aio import wait_for

TOPIC = "ConsoleT"
GROUP = "console-cg"
HOSTILE_BODY = "<script>alert('x')</script>"


class Console:
    def __init__(self, base: str, session: ClientSession, sent: list[Any], broker: Any) -> None:
        self.base, self.session, self.sent, self.broker = base, session, sent, broker

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.base + path) as resp:
            return resp.status, await resp.text()


@pytest.fixture
async def console(namesrv: Any, broker: Any) -> AsyncIterator[Console]:
    async with Admin(namesrv.addr) as admin:
        await admin.create_topic(TOPIC, broker_addr=broker.broker_addr, read_queue_nums=2, write_queue_nums=2)
        await admin.wait_for_route(TOPIC)
        await admin.create_subscription_group(GROUP, broker_addr=broker.broker_addr)
        async with Producer(namesrv.addr, "console-pg") as producer:
            sent = [await producer.send(new_message(TOPIC, f"body-{i}", keys=f"k{i}")) for i in range(5)]
            sent.append(await producer.send(new_message(TOPIC, HOSTILE_BODY, keys="hostile")))
        # the group consumed queue 0 up to offset 1 and nothing of queue 1
        resp = await admin.instance.invoke(broker.broker_addr, RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 0,
                                                 "commitOffset": 1}))
        assert resp.code == 0
        broker.writer.reput_now()
        runner, port = await serve(admin, "127.0.0.1", 0, sample_interval_s=0.2)
        try:
            async with ClientSession() as session:
                yield Console(f"http://127.0.0.1:{port}", session, sent, broker)
        finally:
            await runner.cleanup()


async def test_cluster_topics_and_groups(console: Console) -> None:
    status, page = await console.get("/")
    assert status == 200
    assert "broker-a" in page and console.broker.broker_addr in page and "ASYNC_MASTER" in page
    status, page = await console.get("/topics")
    assert status == 200 and f'href="/topics/{TOPIC}"' in page
    status, page = await console.get(f"/topics/{TOPIC}")
    assert status == 200 and "6 messages kept in 2 queues" in page
    status, page = await console.get("/groups")
    assert status == 200 and f'href="/groups/{GROUP}"' in page
    status, page = await console.get(f"/groups/{GROUP}")
    total = sum(1 for s in console.sent) - 1  # queue 0's first message is consumed
    assert status == 200 and f'id="total-lag">{total}<' in page


async def test_message_lookup_escapes_bodies(console: Console) -> None:
    first, hostile = console.sent[0], console.sent[-1]
    status, page = await console.get(f"/messages?id={first.msg_id}")
    assert status == 200 and "body-0" in page and first.offset_msg_id in page
    status, page = await console.get(f"/messages?id={hostile.offset_msg_id}")
    assert status == 200 and HOSTILE_BODY not in page and str(markupsafe.escape(HOSTILE_BODY)) in page
    status, page = await console.get(f"/messages?topic={TOPIC}&key=k3")
    assert status == 200 and "body-3" in page and "1 message(s) found" in page


@pytest.mark.parametrize(("path", "status", "needle"), [
    ("/messages?id=not-a-message-id", 400, "bad message id"),
    ("/messages?key=k1", 400, "needs the topic"),
    ("/topics/NoSuchTopic", 404, "NoSuchTopic"),
    ("/groups/no-such-group", 404, "no-such-group"),
    ("/nowhere", 404, "Not Found"),
])
async def test_errors_are_pages(console: Console, path: str, status: int, needle: str) -> None:
    got_status, page = await console.get(path)
    assert got_status == status and needle in page and "Traceback" not in page


async def test_samples_feed_the_charts(console: Console) -> None:
    async def sampled() -> bool:
        status, text = await console.get("/api/samples.json?prefix=lag%20")
        return status == 200 and f'"lag {GROUP}":[' in text
    await wait_for(sampled, 10, what="a lag sample")
    status, text = await console.get("/api/samples.json?prefix=putTps")
    assert status == 200 and '"putTps broker-a/0"' in text
    status, script = await console.get("/static/uPlot.iife.min.js")
    assert status == 200 and "uPlot" in script


async def test_an_unreachable_cluster_is_a_502_page(namesrv: Any, broker: Any) -> None:
    async with Admin(namesrv.addr) as admin:
        runner, port = await serve(admin, "127.0.0.1", 0, sample_interval_s=60)
        try:
            await broker.stop()
            await namesrv.stop()
            async with ClientSession() as session, session.get(f"http://127.0.0.1:{port}/topics") as resp:
                page = await resp.text()
            assert resp.status == 502 and "the cluster did not answer" in page
        finally:
            await runner.cleanup()


async def test_every_page_renders(console: Console) -> None:
    for path in ("/overview", "/producers", "/ha", "/messages", f"/topics/{TOPIC}", f"/groups/{GROUP}/dlq",
                 f"/brokers/{console.broker.broker_addr}/config"):
        status, page = await console.get(path)
        assert status == 200, (path, page)
        assert "Traceback" not in page and "csrf_token" not in page  # read-only: no form to act


async def test_a_search_by_time_shows_dates_and_consumption_per_group(console: Console) -> None:
    status, page = await console.get(f"/messages?topic={TOPIC}&search=1")
    assert status == 200 and "6 message(s) found" in page
    first = console.sent[0]
    # queue 0's first message is consumed by the group (committed offset 1), the others are not
    assert page.count(f"{GROUP}: consumed") == 1
    assert page.count(f"{GROUP}: not consumed") + page.count(f"{GROUP}: no offset") == 5
    assert first.offset_msg_id in page
    assert re.search(r"<td title=\"\d{13}\">20\d\d-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}</td>", page), "a readable date"
    status, page = await console.get(f"/messages?topic={TOPIC}&begin=2999-01-01T00:00&search=1")
    assert status == 200 and "0 message(s) found" in page
    status, page = await console.get(f"/messages?topic={TOPIC}&begin=yesterday&search=1")
    assert status == 400 and "bad begin time" in page
    status, page = await console.get(f"/brokers/{console.broker.broker_addr}/config")
    assert status == 200 and 'data-key="brokerName">broker-a<' in page
    status, page = await console.get("/brokers/127.0.0.1:1/config")
    assert status == 404




@pytest.mark.parametrize(("lag", "css"), [(0, "ok"), (4, "low"), (999, "low"), (1_000, "warn"), (53_000, "critical")])
def test_lag_colours_by_threshold(lag: int, css: str) -> None:
    from ferrymq.console.data import lag_severity

    assert lag_severity(lag) == css


def test_stored_times_read_as_dates() -> None:
    from ferrymq.console.data import fmt_ms

    assert fmt_ms(0) == "" and fmt_ms(None) == "" and fmt_ms("x") == ""
    assert re.fullmatch(r"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d\.042", fmt_ms(1_767_225_600_042))
