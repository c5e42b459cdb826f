"""The operations verbs as an operator runs them: ``ferry`` subprocesses against a real name server and
broker process (runtime config written back to broker.conf and kept over a restart, write permission wiped
and restored, offsets reset by time under a live consumer, backlog skipped, offsets cloned, who is connected)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from ferry_cli import FAST_CLIENT, aferry_json, ferry, ferry_json
from procs import Cluster, route, wait_for

from ferrymq.client import ConsumeStatus, MessageExt, Producer, PushConsumer, new_message
from ferrymq.common.properties import parse_properties
from ferrymq.common.topic import PERM_WRITE

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]

#: deadline of the condition waits
WAIT_S = 20.0


def test_broker_config_and_write_permission(cluster: Callable[..., Cluster]) -> None:
    c = cluster()
    addr, ns = c.broker_addr, c.ns_addr
    c.create_topic("OpsPermT", queues=2)
    values = ferry_json("broker", "config", "get", "-b", addr)
    assert values["brokerName"] == "broker-a" and values["listenPort"] == str(c.broker.port)

    out = ferry_json("broker", "config", "set", "-b", addr, "maxMessageSize=2048", "fileReservedTime=24")
    assert out["persisted"] == str(c.broker.conf_path)
    props = parse_properties(c.broker.conf_path.read_text())
    assert props["maxMessageSize"] == "2048" and props["fileReservedTime"] == "24"
    assert props["brokerName"] == "broker-a"  # the rest of the file is kept
    refused = ferry("broker", "config", "set", "-b", addr, "listenPort=1", "maxMessageSize=1")
    assert refused.returncode != 0 and "not updatable at runtime: listenPort" in refused.stderr
    assert "Traceback" not in refused.stderr
    c.broker.restart()
    assert ferry_json("broker", "config", "get", "-b", addr)["maxMessageSize"] == "2048"

    def perm() -> int:
        rt = route(ns, "OpsPermT")
        assert rt is not None
        return int(rt["queueDatas"][0]["perm"])
    [row] = ferry_json("broker", "wipe-write-perm", "-n", ns, "-b", "broker-a")
    assert row["topics"] >= 1 and not row["error"]
    assert not perm() & PERM_WRITE
    ferry_json("broker", "add-write-perm", "-n", ns, "-b", "broker-a")
    assert perm() & PERM_WRITE
    [cleanup] = ferry_json("broker", "delete-expired-commitlog", "-n", ns)
    assert cleanup["addr"] == addr and cleanup["deletedFiles"] == 0


def test_offsets_and_connections_under_live_clients(cluster: Callable[..., Cluster]) -> None:
    c = cluster()
    c.create_topic("OpsOffT", queues=2)
    asyncio.run(_offsets_and_connections(c.ns_addr, "OpsOffT"))


async def _offsets_and_connections(ns: str, topic: str) -> None:
    got: list[str] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(m.body.decode() for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    async with Producer(ns, "ops-pg", heartbeat_broker_interval_ms=FAST_CLIENT["heartbeat_broker_interval_ms"]
                        ) as producer:
        for body in ("m0", "m1"):
            await producer.send(new_message(topic, body))
        await asyncio.sleep(0.05)
        middle_ms = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        for body in ("m2", "m3"):
            await producer.send(new_message(topic, body))
        consumer = PushConsumer(ns, "ops-cg", consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CLIENT)
        consumer.subscribe(topic, "*")
        consumer.register_message_listener(listener)
        await consumer.start()
        try:
            await asyncio.to_thread(wait_for, lambda: len(got) >= 4, timeout_s=WAIT_S, what="4 messages consumed")
            await producer.instance.send_heartbeats()
            rows = await aferry_json("producer", "connection", "-n", ns, "-g", "ops-pg")
            assert [r["clientId"] for r in rows] == [producer.instance.client_id]
            conns = await aferry_json("consumer", "connection", "-n", ns, "-g", "ops-cg")
            assert len(conns["connections"]) == 1 and conns["subscriptions"][topic] == "*"
            assert "ops-cg" in [r["group"] for r in await aferry_json("topic", "who-consumes", "-n", ns, "-t", topic)]
            assert topic in [r["topic"] for r in await aferry_json("consumer", "topics", "-n", ns, "-g", "ops-cg")]

            async def lag0() -> bool:
                rows = await aferry_json("consumer", "progress", "-n", ns, "-g", "ops-cg", "-t", topic)
                return sum(r["lag"] for r in rows) == 0
            deadline = time.monotonic() + WAIT_S
            while not await lag0():
                assert time.monotonic() < deadline, "offsets not committed"
                await asyncio.sleep(0.3)

            # reset to the middle time: the live consumer is told and gets m2, m3 again
            reset = await aferry_json("consumer", "reset-offset", "-n", ns, "-g", "ops-cg", "-t", topic,
                                      "-s", str(middle_ms))
            assert sum(r["offset"] for r in reset) == 2 and reset[0]["clientsNotified"] == 1
            await asyncio.to_thread(wait_for, lambda: len(got) >= 6, timeout_s=WAIT_S, what="m2, m3 again")
            assert sorted(got[4:]) == ["m2", "m3"]
        finally:
            await consumer.close()

    # a group with no consumer: skip its backlog, then clone another group's offsets into it
    skipped = await aferry_json("consumer", "skip-backlog", "-n", ns, "-g", "ops-idle", "-t", topic)
    assert sum(r["offset"] for r in skipped) == 4
    await aferry_json("consumer", "reset-offset", "-n", ns, "-g", "ops-idle", "-t", topic, "-s", "0")
    cloned = await aferry_json("consumer", "clone-offset", "-n", ns, "-s", "ops-idle", "-d", "ops-copy", "-t", topic)
    assert cloned == [{"brokerName": "broker-a", "clonedQueues": 2}]
    rows = await aferry_json("consumer", "progress", "-n", ns, "-g", "ops-copy", "-t", topic)
    assert sum(r["lag"] for r in rows) == 4
