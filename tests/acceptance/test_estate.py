"""Estate scale with real processes (issue 24; issue 25 #11).

* A broker holding 2,000 topics and 1,000 groups keeps answering a probe client (GET_MAX_OFFSET) within
  PROBE_BOUND_S while another client sends one heartbeat declaring 1,000 new groups.
* A topic create acknowledged to an admin survives a SIGKILL right after the answer (the change journal).
* consumerOffset.json and its .bak both unreadable: the broker refuses to start (``config error:`` naming
  the file, exit 2) instead of answering offset 0.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from procs import ferry_argv, request, start_broker, start_namesrv, wait_for

from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import connect

ESTATE_TOPICS = 2_000
ESTATE_GROUPS = 1_000
NEW_GROUPS_IN_HEARTBEAT = 1_000
#: longest answer time of the probe while the big heartbeat is served
PROBE_BOUND_S = 0.050
REQUEST_TIMEOUT_MS = 30_000
#: SIGKILL rounds of the create-then-kill scenario
KILL_ROUNDS = 3
EXIT_CONFIG_ERROR = 2


async def _fill(addr: str) -> None:
    conn = await connect(addr, timeout_ms=3000)
    try:
        for i in range(ESTATE_TOPICS):
            resp = await conn.invoke(RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
                "topic": f"Estate{i}", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6}), REQUEST_TIMEOUT_MS)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        for i in range(ESTATE_GROUPS):
            body = jsonx.dumps({"groupName": f"EstateGroup{i}", "consumeEnable": True})
            resp = await conn.invoke(RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                                                             body), REQUEST_TIMEOUT_MS)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
    finally:
        conn.close()


def _big_heartbeat() -> RemotingCommand:
    consumers = [{
        "groupName": f"NewGroup{i}", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": f"Estate{i % ESTATE_TOPICS}", "subString": "TagA || TagB",
                                 "subVersion": 1}],
    } for i in range(NEW_GROUPS_IN_HEARTBEAT)]
    body = {"clientID": "127.0.0.1@estate", "producerDataSet": [], "consumerDataSet": consumers}
    return RemotingCommand.request(RequestCode.HEART_BEAT, {}, jsonx.dumps(body))


async def _probe_during_heartbeat(addr: str) -> tuple[float, int, Any]:
    probe = await connect(addr, timeout_ms=3000)
    client = await connect(addr, timeout_ms=3000)
    try:
        # warm the probe's connection up
        for _ in range(5):
            await probe.invoke(RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "Estate0", "queueId": 0}))
        heartbeat = asyncio.ensure_future(client.invoke(_big_heartbeat(), REQUEST_TIMEOUT_MS))
        worst_s = 0.0
        probes = 0
        while not heartbeat.done():
            t0 = time.perf_counter()
            resp = await probe.invoke(RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                                              {"topic": "Estate1", "queueId": 3}), 3000)
            worst_s = max(worst_s, time.perf_counter() - t0)
            probes += 1
            assert resp.code == ResponseCode.SUCCESS
        hb = await heartbeat
        listed = await client.invoke(RemotingCommand.request(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": f"NewGroup{NEW_GROUPS_IN_HEARTBEAT - 1}"}))
        return worst_s, probes, (hb.code, listed.code)
    finally:
        probe.close()
        client.close()


def test_big_heartbeat_does_not_stall_a_broker_with_an_estate(procs) -> None:
    ns = start_namesrv(procs)
    broker = start_broker(procs, [ns.addr])
    asyncio.run(_fill(broker.addr))
    worst_s, probes, (hb_code, listed_code) = asyncio.run(_probe_during_heartbeat(broker.addr))
    assert hb_code == ResponseCode.SUCCESS and listed_code == ResponseCode.SUCCESS
    assert probes >= 1
    assert worst_s < PROBE_BOUND_S, f"a probe waited {worst_s * 1000:.1f} ms during the heartbeat ({probes} probes)"


def test_acknowledged_topic_create_survives_sigkill(procs) -> None:
    ns = start_namesrv(procs)
    broker = start_broker(procs, [ns.addr])
    for round_no in range(KILL_ROUNDS):
        topic = f"Durable{round_no}"
        resp = request(broker.addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                       {"topic": topic, "readQueueNums": 5, "writeQueueNums": 5, "perm": 6})
        assert resp.code == ResponseCode.SUCCESS
        broker.restart(kill=True)  # SIGKILL right after the answer, before any snapshot
        table = jsonx.loads(request(broker.addr, RequestCode.GET_ALL_TOPIC_CONFIG).body)["topicConfigTable"]
        for earlier in range(round_no + 1):
            assert table[f"Durable{earlier}"]["readQueueNums"] == 5


def test_unreadable_consumer_offsets_refuse_to_start(procs) -> None:
    ns = start_namesrv(procs)
    broker = start_broker(procs, [ns.addr])
    resp = request(broker.addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                   {"consumerGroup": "g", "topic": "T", "queueId": 0, "commitOffset": 2})
    assert resp.code == ResponseCode.SUCCESS
    broker.stop()  # persists consumerOffset.json
    config_dir = broker.store_dir / "config"
    (config_dir / "consumerOffset.json").write_bytes(b"\x00\xffnot json")
    (config_dir / "consumerOffset.json.bak").write_bytes(b"{truncated")
    proc = procs.spawn("broker-damaged", ferry_argv("broker", "-c", str(broker.conf_path)))
    wait_for(lambda: proc.exited, timeout_s=60, what="the broker to refuse to start")
    assert proc.returncode == EXIT_CONFIG_ERROR
    assert "config error: consumerOffset.json" in proc.log_text()
    assert "Traceback" not in proc.log_text()
