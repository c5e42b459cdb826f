"""The web console in headless Chromium (Debian's ``chromium``) against real processes: a name server, a master
and a slave, a producer and a consumer group; ``ferry console`` serves the pages; Chromium renders them with
their charts (the scripts ran: uPlot drew the sampled series) and takes a screenshot."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from procs import Cluster, ProcessGroup, ferry_argv, free_port, port_answers, start_broker, wait_for

from ferrymq.client import Admin, Producer, new_message
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
