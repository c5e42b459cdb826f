"""The web console in headless Chromium (Debian's ``chromium``) against real processes: a name server, a master
and a slave, a producer and a consumer group; ``ferry console`` serves the pages; Chromium renders them with
their charts (the scripts ran: uPlot drew the sampled series) and takes a screenshot.

Logged in (``--users-file``), one Chromium session driven over the DevTools protocol (``cdp.py``) clicks through
every action an admin has (topic create/update/delete, a test send, group create/delete, offset reset and skip,
DLQ resend, broker config set and a refused key), and each effect is checked through the wire with the client;
then a hung slave (SIGSTOP) leaves a marker, not a gap, in the lag chart and a killed one stays as a red row; no
session, a wrong or missing CSRF token and the read-only role each get no action (403)."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cdp import Chromium, Page
from procs import Cluster, ProcessGroup, ferry_argv, free_port, port_answers, start_broker, wait_for

from ferrymq.client import Admin, ConsumeStatus, Producer, PushConsumer, new_message, ops, ops_admin
from ferrymq.common.message import decode_offset_msg_id
from ferrymq.console import auth
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: the flags that work in this sandbox (no GPU, no network beyond loopback, a fresh profile per run)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=6000", "--window-size=1280,900"]
TOPIC = "ConsoleBrowserT"
GROUP = "console-browser-cg"


def _chromium(tmp: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    assert Path(CHROMIUM).exists(), "Debian's chromium is not installed (.ci/run installs it)"
    return subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / ('profile-' + name)}", *args],
                          capture_output=True, text=True, timeout=90)


async def _traffic(ns: str, broker_addr: str) -> None:
    async with Admin(ns) as admin:
        await admin.create_topic(TOPIC, broker_addr=broker_addr, read_queue_nums=2, write_queue_nums=2)
        await admin.wait_for_route(TOPIC)
        await admin.create_subscription_group(GROUP, broker_addr=broker_addr)
        async with Producer(ns, "console-browser-pg") as producer:
            for i in range(30):
                await producer.send(new_message(TOPIC, f"m{i}"))
        # the group has consumed 5 messages of queue 0 and none of queue 1
        for queue_id, offset in ((0, 5), (1, 0)):
            resp = await admin.instance.invoke(broker_addr, RemotingCommand.request(
                RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id,
                                                     "commitOffset": offset}))
            assert resp.code == 0, resp.remark


def test_console_pages_render_in_chromium(cluster: Callable[..., Cluster], procs: ProcessGroup,
                                          tmp_path: Path) -> None:
    c = cluster(brokerRole="SYNC_MASTER")
    slave = start_broker(procs, [c.ns_addr], name="slave", brokerRole="SLAVE", brokerId=1, haListenPort=free_port())
    asyncio.run(_traffic(c.ns_addr, c.broker_addr))
    port = free_port()
    console = procs.spawn("console", ferry_argv("console", "-n", c.ns_addr, "--listen", f"127.0.0.1:{port}",
                                               "--sample-interval", "0.5"))
    wait_for(lambda: port_answers(port), timeout_s=30, what="the console to listen", alive=[console])
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _has_samples(base), timeout_s=30, what="a lag sample of the group", alive=[console])

    dom = _chromium(tmp_path, "cluster", "--dump-dom", f"{base}/").stdout
    assert "broker-a" in dom and c.broker_addr in dom and slave.addr in dom
    assert "SYNC_MASTER" in dom and "SLAVE" in dom
    assert dom.count('class="uplot') == 2, "both charts drawn by the page's scripts"
    assert 'data-points="0"' not in dom

    dom = _chromium(tmp_path, "group", "--dump-dom", f"{base}/groups/{GROUP}").stdout
    assert 'id="total-lag">25<' in dom and 'class="uplot' in dom

    dom = _chromium(tmp_path, "topic", "--dump-dom", f"{base}/topics/{TOPIC}").stdout
    assert "30 messages kept in 2 queues" in dom

    shot = tmp_path / "console.png"
    _chromium(tmp_path, "shot", f"--screenshot={shot}", f"{base}/")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert console.exited is False


def _has_samples(base: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/api/samples.json?prefix=lag", timeout=2) as resp:
            return GROUP.encode() in resp.read()
    except OSError:
        return False


# ---- acting, logged in ------------------------------------------------------------------------------------------
ADMIN, ADMIN_PW = "alice", "alice-pass"
VIEWER, VIEWER_PW = "bob", "bob-pass"
#: a cheap scrypt cost: the test checks the log-in flow, not the KDF's strength
TEST_SCRYPT_N = 2 ** 4
LIVE_GROUP = "console-live-cg"
LIVE_PRODUCER_GROUP = "console-live-pg"
NEW_TOPIC = "ConsoleNewT"
NEW_GROUP = "console-new-cg"
POLL_S = 0.1


async def _until(cond: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {timeout_s} s")
        await asyncio.sleep(POLL_S)


def _users_file(tmp: Path) -> Path:
    path = tmp / "users.yml"
    path.write_text("users:\n"
                    + auth.users_file_entry(ADMIN, auth.Role.ADMIN, auth.hash_password(ADMIN_PW, n=TEST_SCRYPT_N))
                    + "\n" + auth.users_file_entry(VIEWER, auth.Role.READ_ONLY,
                                                   auth.hash_password(VIEWER_PW, n=TEST_SCRYPT_N)) + "\n")
    return path


async def _dead_letter(admin: Admin, broker_addr: str, offset_msg_id: str) -> None:
    """Move a stored message of TOPIC to %DLQ%GROUP as a consumer giving up on it would (send back, level -1)."""
    _ip, _port, phy_offset = decode_offset_msg_id(offset_msg_id)
    resp = await admin.instance.invoke(broker_addr, RemotingCommand.request(
        RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": phy_offset, "group": GROUP, "delayLevel": -1,
                                             "originMsgId": offset_msg_id, "originTopic": TOPIC,
                                             "maxReconsumeTimes": 16}))
    assert resp.code == 0, resp.remark


async def _committed(admin: Admin, broker_addr: str, group: str, topic: str) -> dict[int, tuple[int, int]]:
    stats = await admin.consume_stats(broker_addr, group, topic)
    return {mq.queue_id: (s["consumerOffset"], s["brokerOffset"]) for mq, s in stats.items()}


async def _act_in_chromium(tmp: Path, base: str, ns: str, master: Any, slave: Any) -> None:
    async with Admin(ns) as admin:
        sent = []
        async with Producer(ns, "console-browser-pg2") as producer:
            for i in range(3):
                sent.append(await producer.send(new_message(TOPIC, f"dlq-{i}", keys=f"dk{i}")))
        await _dead_letter(admin, master.addr, sent[0].offset_msg_id)
        live_producer = Producer(ns, LIVE_PRODUCER_GROUP, heartbeat_broker_interval_ms=300)
        await live_producer.start()
        await live_producer.send(new_message(TOPIC, "from a live producer"))
        live = PushConsumer(ns, LIVE_GROUP, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        live.subscribe(TOPIC)
        live.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
        await live.start()
        try:
            async with Chromium(CHROMIUM, CHROMIUM_FLAGS[:-2] + ["--window-size=1280,900"], tmp / "cdp") as chrome:
                page = await chrome.new_page()
                await _no_session(page, base, admin)
                await _login(page, base, ADMIN, ADMIN_PW, "/overview")
                await _csrf_refused(page, admin)
                await _topic_actions(page, base, admin)
                await _group_actions(page, base, admin, master.addr)
                await _dlq_resend(page, base, admin, sent[0])
                await _message_search(page, base)
                await _producers_and_config(page, base, admin, master.addr)
                await _deletes(page, base, admin)
                await page.click("#logout")
                await _read_only(page, base, admin)
                await _hung_then_dead_slave(page, base, slave)
                await _killed_master(page, base, master)
        finally:
            await live.close()
            await live_producer.close()


async def _no_session(page: Page, base: str, admin: Admin) -> None:
    await page.goto(f"{base}/topics")
    assert "/login?next=" in await page.url(), "no session: a page sends to the log-in form"
    status, text = await page.status_of("POST", "/topics", {"topic": "NoSessionT", "csrf_token": "x"})
    assert status == 403 and "log in first" in text
    assert NEW_TOPIC not in await admin.topic_list()


async def _login(page: Page, base: str, user: str, password: str, landing: str) -> None:
    await page.goto(f"{base}{landing}")
    text = await page.submit("#login", {"user": user, "password": "wrong"})
    assert "wrong user name or password" in text
    text = await page.submit("#login", {"user": user, "password": password})
    assert (await page.url()).endswith(landing), await page.url()
    assert f"{user} (" in text


async def _csrf_refused(page: Page, admin: Admin) -> None:
    form = {"topic": "CsrfT", "read_queue_nums": "1", "write_queue_nums": "1", "perm": "6"}
    status, text = await page.status_of("POST", "/topics", form)
    assert status == 403 and "CSRF" in text
    status, text = await page.status_of("POST", "/topics", dict(form, csrf_token="forged"))
    assert status == 403 and "CSRF" in text
    assert "CsrfT" not in await admin.topic_list()


async def _topic_actions(page: Page, base: str, admin: Admin) -> None:
    await page.goto(f"{base}/topics")
    text = await page.submit("#create-topic", {"topic": NEW_TOPIC, "read_queue_nums": "4",
                                               "write_queue_nums": "4", "perm": "6"})
    assert f"topic {NEW_TOPIC} created on 1 master(s)" in text
    route = await admin.wait_for_route(NEW_TOPIC)
    assert (route.queue_datas[0].write_queue_nums, route.queue_datas[0].perm) == (4, 6)

    await page.goto(f"{base}/topics/{NEW_TOPIC}")
    text = await page.submit("#update-topic", {"read_queue_nums": "2", "write_queue_nums": "2", "perm": "4"})
    assert "updated on 1 master(s)" in text

    async def updated() -> bool:
        admin.instance.routes.pop(NEW_TOPIC, None)
        qd = (await admin.topic_route(NEW_TOPIC)).queue_datas[0]
        return (qd.read_queue_nums, qd.write_queue_nums, qd.perm) == (2, 2, 4)
    await _until(updated, "the topic's new queue counts and perm in its route")
    await page.submit("#update-topic", {"perm": "6"})
    await _until(lambda: _perm_is(admin, NEW_TOPIC, 6), "perm 6 again")

    text = await page.submit("#send-message", {"tags": "TagA", "keys": "console-key", "body": "hello from the console"})
    assert f"sent to {NEW_TOPIC}: SEND_OK" in text
    found = await admin.query_messages_by_key(NEW_TOPIC, "console-key")
    assert [m.body for m in found] == [b"hello from the console"] and found[0].tags == "TagA"


async def _perm_is(admin: Admin, topic: str, perm: int) -> bool:
    admin.instance.routes.pop(topic, None)
    return (await admin.topic_route(topic)).queue_datas[0].perm == perm


async def _group_actions(page: Page, base: str, admin: Admin, master_addr: str) -> None:
    await page.goto(f"{base}/groups")
    text = await page.submit("#create-group", {"group": NEW_GROUP, "retry_max_times": "3"})
    assert f"consumer group {NEW_GROUP} created" in text
    assert (await ops_admin.group_config(admin, NEW_GROUP))[0]["retryMaxTimes"] == 3

    await page.goto(f"{base}/groups/{GROUP}")
    text = await page.submit("#reset-offset", {"topic": TOPIC, "timestamp": "2001-01-01T00:00:00"})
    assert f"offsets of {GROUP} on {TOPIC} reset" in text, text
    assert all(c == 0 for c, _ in (await _committed(admin, master_addr, GROUP, TOPIC)).values())
    text = await page.submit("#skip-backlog", {"topic": TOPIC})
    assert "skipped" in text
    committed = await _committed(admin, master_addr, GROUP, TOPIC)
    assert committed and all(c == b and b > 0 for c, b in committed.values())
    assert 'id="total-lag">0<' in await page.html()

    async def client_listed() -> bool:
        await page.goto(f"{base}/groups/{LIVE_GROUP}")
        html = await page.html()
        return "no client of this group is online" not in html and "PYTHON" in html.upper()
    await _until(client_listed, "the live consumer in the group's client table")


async def _dlq_resend(page: Page, base: str, admin: Admin, dead: Any) -> None:
    await page.goto(f"{base}/groups/{GROUP}/dlq")
    text = await page.text()
    assert "1 dead-lettered message(s)" in text and "dlq-0" in text
    await page.submit("form.resend", {"target": "retry"})
    flash = await page.eval("[...document.querySelectorAll('.flash')].map(e => e.textContent).join(' | ')")
    assert f"sent again to %RETRY%{GROUP}: SEND_OK" in flash, flash

    async def in_retry_topic() -> list[Any]:
        try:
            return [m async for m in ops_admin.messages_in_range(admin, f"%RETRY%{GROUP}") if m.body == b"dlq-0"]
        except Exception:
            return []
    resent = await _until(in_retry_topic, "the resent message in the retry topic")
    assert resent[0].properties.get("KEYS") == "dk0" and resent[0].properties.get("RETRY_TOPIC") == TOPIC


async def _message_search(page: Page, base: str) -> None:
    await page.goto(f"{base}/messages")
    text = await page.submit("#search", {"topic": TOPIC, "begin": "2001-01-01T00:00:00"})
    assert "message(s) found" in text and f"{GROUP}: consumed" in text, text[:2000]
    await page.goto(f"{base}/messages")
    text = await page.submit("#search", {"topic": TOPIC, "key": "dk1"})
    assert "1 message(s) found" in text and "dlq-1" in text


async def _producers_and_config(page: Page, base: str, admin: Admin, master_addr: str) -> None:
    async def producer_listed() -> bool:
        await page.goto(f"{base}/producers")
        return LIVE_PRODUCER_GROUP in await page.text()
    await _until(producer_listed, "the live producer's connection")
    await page.goto(f"{base}/brokers/{master_addr}/config")
    text = await page.submit("#set-config", {"key": "fileReservedTime", "value": "49"})
    assert "fileReservedTime=49 set on" in text
    assert (await ops.broker_config(admin, master_addr))["fileReservedTime"] == "49"
    text = await page.submit("#set-config", {"key": "brokerName", "value": "renamed"})
    assert "refused:" in text and "brokerName" in text
    assert (await ops.broker_config(admin, master_addr))["brokerName"] == "broker-a"


async def _hung_then_dead_slave(page: Page, base: str, slave: Any) -> None:
    series = f"replicaLagBytes broker-a/{slave.broker_id}"

    async def samples() -> dict[str, Any]:
        return json.loads((await page.status_of("GET", "/api/samples.json?prefix=replicaLagBytes"))[1])
    await _until(lambda: _has(samples, series), "the slave's lag sampled")
    slave.proc.signal(signal.SIGSTOP)  # hung: connected, silent
    try:
        await _until(lambda: _unknown(samples, series), "the hung slave's sample marked unknown", 30)
        data = await samples()
        values = data["series"][series]
        assert None not in values[values.index(next(v for v in values if v is not None)):], "no gap"
        await page.goto(f"{base}/")
        unknown = await _until(lambda: page.eval("document.getElementById('replica-chart').dataset.unknown"),
                               "the chart's unknown markers")
        assert int(unknown) >= 1
    finally:
        slave.proc.kill()  # and now dead

    await _until(lambda: _dead_row(page, base, slave.addr), "the killed slave's row, red", 40)
    assert "DEAD" in await page.text()
    await page.goto(f"{base}/overview")
    assert await page.eval("document.getElementById('dead-brokers').textContent") == "1"


async def _dead_row(page: Page, base: str, addr: str) -> bool:
    await page.goto(f"{base}/")
    return bool(await page.eval(f"!!document.querySelector('tr.dead[data-addr=\"{addr}\"]')"))


async def _killed_master(page: Page, base: str, master: Any) -> None:
    """docs/operations.md: "the console shows the master's row in red" (the name server forgets it at once)."""
    master.kill()
    await _until(lambda: _dead_row(page, base, master.addr), "the killed master's row, red", 40)
    assert await _dead_row(page, base, master.addr)
    await page.goto(f"{base}/overview")
    assert await page.eval("document.getElementById('dead-brokers').textContent") == "2"


async def _has(samples: Callable[[], Awaitable[dict[str, Any]]], series: str) -> bool:
    return series in (await samples())["series"]


async def _unknown(samples: Callable[[], Awaitable[dict[str, Any]]], series: str) -> bool:
    return bool((await samples())["unknown"].get(series))


async def _deletes(page: Page, base: str, admin: Admin) -> None:
    await page.goto(f"{base}/groups/{NEW_GROUP}")
    text = await page.submit("#delete-group", {"confirm": NEW_GROUP})
    assert f"consumer group {NEW_GROUP} deleted" in text
    assert NEW_GROUP not in await _group_names(admin)
    await page.goto(f"{base}/topics/{NEW_TOPIC}")
    text = await page.submit("#delete-topic", {"confirm": "not-the-name"})
    assert "not deleted" in text
    text = await page.submit("#delete-topic", {"confirm": NEW_TOPIC})
    assert f"topic {NEW_TOPIC} deleted" in text
    assert NEW_TOPIC not in await admin.topic_list()


async def _group_names(admin: Admin) -> set[str]:
    try:
        return {r["groupName"] for r in await ops_admin.group_config(admin, NEW_GROUP)}
    except Exception:
        return set()


async def _read_only(page: Page, base: str, admin: Admin) -> None:
    await _login(page, base, VIEWER, VIEWER_PW, "/topics")
    html = await page.html()
    assert 'id="create-topic"' not in html and "bob (read-only)" in html
    await page.goto(f"{base}/groups/{GROUP}")
    assert 'id="reset-offset"' not in await page.html()
    token = await page.eval("document.querySelector('input[name=csrf_token]').value")  # the log-out form's
    status, text = await page.status_of("POST", "/topics", {"topic": "ViewerT", "csrf_token": token})
    assert status == 403 and "read-only" in text
    assert "ViewerT" not in await admin.topic_list()


def test_console_actions_in_chromium(cluster: Callable[..., Cluster], procs: ProcessGroup, tmp_path: Path) -> None:
    c = cluster(brokerRole="SYNC_MASTER")
    slave = start_broker(procs, [c.ns_addr], name="slave", brokerRole="SLAVE", brokerId=1, haListenPort=free_port())
    asyncio.run(_traffic(c.ns_addr, c.broker_addr))
    port = free_port()
    console = procs.spawn("console", ferry_argv("console", "-n", c.ns_addr, "--listen", f"127.0.0.1:{port}",
                                               "--sample-interval", "0.5", "--users-file", str(_users_file(tmp_path))))
    wait_for(lambda: port_answers(port), timeout_s=30, what="the console to listen", alive=[console])
    asyncio.run(_act_in_chromium(tmp_path, f"http://127.0.0.1:{port}", c.ns_addr, c.broker, slave))
    assert console.exited is False


# ---- controller mode ----------------------------------------------------------------------------------------------
async def _controller_mode_in_chromium(tmp: Path, base: str, ng: Any) -> None:
    from controller_support import BROKER_NAME, REPLICA_IDS

    from ferrymq.client.controller_admin import ControllerAdmin

    async with Chromium(CHROMIUM, CHROMIUM_FLAGS[:-2] + ["--window-size=1280,900"], tmp / "cdp") as chrome:
        page = await chrome.new_page()
        await _login(page, base, ADMIN, ADMIN_PW, "/")

        async def shown_ids() -> list[int]:
            await page.goto(f"{base}/")
            ids = await page.eval("[...document.querySelectorAll('table.brokers tr[data-addr] td:first-child')]"
                                  ".map(td => +td.textContent)")
            return sorted(ids) if sorted(ids) == sorted(REPLICA_IDS) else []
        await _until(shown_ids, "the controller's replica ids (not the name server's 0) on the cluster page", 30)

        await page.goto(f"{base}/ha")
        text = await page.text()
        assert "Leader" in text and BROKER_NAME in text
        sets = await page.eval("[...document.querySelectorAll('td.sync-state-set')].map(td => td.textContent)")
        assert set(sets) == {",".join(map(str, REPLICA_IDS))}, sets
        async with ControllerAdmin([c.addr for c in ng.controllers]) as controllers:
            before = await controllers.replica_info(BROKER_NAME)
            new_master = next(r for r in REPLICA_IDS if r != before["masterId"])
            text = await page.submit("#elect", {"broker_name": BROKER_NAME, "broker_id": str(new_master)})
            assert f"{BROKER_NAME}: master is replica {new_master}" in text, text
            after = await controllers.replica_info(BROKER_NAME)
            assert after["masterId"] == new_master and after["masterEpoch"] == before["masterEpoch"] + 1


def test_console_controller_mode_in_chromium(procs: ProcessGroup, tmp_path: Path) -> None:
    from controller_support import NemesisGroup

    ng = NemesisGroup.start(procs)
    try:
        port = free_port()
        # no --controller: the console finds the controllers from the brokers' controllerAddr
        console = procs.spawn("console", ferry_argv("console", "-n", ng.ns.addr, "--listen", f"127.0.0.1:{port}",
                                                   "--sample-interval", "1", "--users-file",
                                                   str(_users_file(tmp_path))))
        wait_for(lambda: port_answers(port), timeout_s=30, what="the console to listen", alive=[console])
        asyncio.run(_controller_mode_in_chromium(tmp_path, f"http://127.0.0.1:{port}", ng))
        assert console.exited is False
    finally:
        ng.close()
