"""More operations verbs as an operator runs them (``ferry`` subprocesses against real processes): a live
consumer asked for its offsets and running info through the broker, every producer of a broker, groups, the KV
table, a message by queue offset, the consume-queue cleanups, and the name server's runtime config."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from ferry_cli import FAST_CLIENT, aferry_json, ferry, ferry_json
from procs import (
    Cluster,
    Namesrv,
    ProcessGroup,
    cluster_info,
    ferry_argv,
    free_port,
    port_answers,
    request,
    wait_for,
)

from ferrymq.client import ConsumeStatus, MessageExt, Producer, PushConsumer, new_message
from ferrymq.common.properties import parse_properties
from ferrymq.remoting import jsonx
from ferrymq.remoting.codes import RequestCode

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]

#: deadline of the condition waits
WAIT_S = 20.0


def test_live_clients_groups_kv_and_messages(cluster: Callable[..., Cluster]) -> None:
    c = cluster()
    c.create_topic("OpsMoreT", queues=2)
    asyncio.run(_live_clients(c, "OpsMoreT"))

    # groups
    created = ferry_json("group", "create", "-n", c.ns_addr, "-g", "ops-new-group", "--retry-max-times", "3")
    assert created == [{"group": "ops-new-group", "broker": c.broker_addr}]
    groups = jsonx.loads(request(c.broker_addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG).body)
    assert groups["subscriptionGroupTable"]["ops-new-group"]["retryMaxTimes"] == 3
    ferry_json("group", "delete", "-n", c.ns_addr, "-g", "ops-new-group")
    groups = jsonx.loads(request(c.broker_addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG).body)
    assert "ops-new-group" not in groups["subscriptionGroupTable"]

    # the KV table
    assert ferry_json("kv", "set", "-n", c.ns_addr, "ORDER_TOPIC_CONFIG", "OpsMoreT", "broker-a:2")[0]["nameServers"] == 1
    assert ferry_json("kv", "get", "-n", c.ns_addr, "ORDER_TOPIC_CONFIG", "OpsMoreT")[0]["value"] == "broker-a:2"
    ferry_json("kv", "delete", "-n", c.ns_addr, "ORDER_TOPIC_CONFIG", "OpsMoreT")
    gone = ferry("kv", "get", "-n", c.ns_addr, "ORDER_TOPIC_CONFIG", "OpsMoreT")
    assert gone.returncode == 1 and "is not set" in gone.stderr

    # cleanups: nothing to clean on a fresh broker, answered per broker
    assert ferry_json("cluster", "clean-expired", "-n", c.ns_addr) == [
        {"brokerName": "broker-a", "addr": c.broker_addr, "deletedFiles": 0}]
    assert ferry_json("cluster", "clean-unused-topic", "-n", c.ns_addr) == [
        {"brokerName": "broker-a", "addr": c.broker_addr, "deletedTopics": 0}]

    # bad input: one line, non-zero exit, no traceback
    for args in (("message", "show", "-n", c.ns_addr, "-t", "OpsMoreT", "--queue", "0"),
                 ("consumer", "status", "-n", c.ns_addr, "-g", "ops-more-cg"),
                 ("namesrv-config", "set", "-n", c.ns_addr, "noequals")):
        bad = ferry(*args)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, (args, bad.stderr)


async def _live_clients(c: Cluster, topic: str) -> None:
    ns = c.ns_addr
    got: list[str] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(m.body.decode() for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    async with Producer(ns, "ops-more-pg", heartbeat_broker_interval_ms=1000) as producer:
        sent = [await producer.send(new_message(topic, f"m{i}")) for i in range(6)]
        consumer = PushConsumer(ns, "ops-more-cg", consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CLIENT)
        consumer.subscribe(topic, "*")
        consumer.register_message_listener(listener)
        await consumer.start()
        try:
            await asyncio.to_thread(wait_for, lambda: len(got) >= 6, timeout_s=WAIT_S, what="6 messages consumed")
            cid = consumer.instance.client_id

            async def offsets_held() -> list[dict[str, Any]]:
                return await aferry_json("consumer", "status", "-n", ns, "-g", "ops-more-cg", "-t", topic)
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while sum(r["offset"] for r in await offsets_held()) != 6:
                assert asyncio.get_running_loop().time() < deadline, await offsets_held()
                await asyncio.sleep(0.2)
            rows = await offsets_held()
            assert {r["clientId"] for r in rows} == {cid} and sorted(r["queueId"] for r in rows) == [0, 1]

            info = await aferry_json("consumer", "status", "-n", ns, "-g", "ops-more-cg", "-i", cid)
            assert info["properties"]["consumeType"] == "CONSUME_PASSIVELY" and info["broker"] == "broker-a"
            queues = sorted(q for q in info["mqTable"] if q.startswith(f"{topic}/"))
            assert queues == [f"{topic}/broker-a/0", f"{topic}/broker-a/1"]  # and the group's retry queue

            await producer.instance.send_heartbeats()
            producers = await aferry_json("producer", "all", "-n", ns, "-b", c.broker_addr)
            assert producer.instance.client_id in [p["clientId"] for p in producers if p["group"] == "ops-more-pg"]

            first = sent[0]
            shown = await aferry_json("message", "show", "-n", ns, "-t", topic, "--queue",
                                      str(first.message_queue.queue_id), "--offset", str(first.queue_offset))
            assert shown[0]["body"] == "m0" and shown[0]["msgId"] == first.msg_id
        finally:
            await consumer.close()


def test_namesrv_runtime_config(procs: ProcessGroup) -> None:
    port = free_port()
    conf = procs.base_dir / "namesrv.conf"
    conf.write_text(f"listenHost=127.0.0.1\nlistenPort={port}\n")
    proc = procs.spawn("namesrv", ferry_argv("namesrv", "-c", str(conf)))
    ns = Namesrv(proc, port)
    wait_for(lambda: port_answers(port) and cluster_info(ns.addr) is not None, timeout_s=30,
             what="name server", alive=[proc])
    rows = ferry_json("namesrv-config", "get", "-n", ns.addr)
    values = {r["key"]: r["value"] for r in rows}
    assert values["listenPort"] == str(port) and "scanNotActiveBrokerInterval" in values
    out = ferry_json("namesrv-config", "set", "-n", ns.addr, "scanNotActiveBrokerInterval=2500")
    assert out == [{"nameServer": ns.addr, "persisted": str(conf)}]
    assert parse_properties(conf.read_text())["scanNotActiveBrokerInterval"] == "2500"
    refused = ferry("namesrv-config", "set", "-n", ns.addr, "listenPort=1")
    assert refused.returncode == 1 and "listenPort needs a restart" in refused.stderr
