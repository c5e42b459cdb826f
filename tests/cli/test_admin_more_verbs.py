"""mqadmin's updateTopicPerm, brokerStatus, brokerConsumeStats, getConsumerConfig and printMsg as ferry verbs,
run as subprocesses against the in-process name server and broker; each effect checked through the wire."""

from __future__ import annotations

import json
import time

from cli_run import ferry, ferry_json

from ferrymq.client import Admin, Producer, new_message
from ferrymq.client.consumer.core import ConsumerCore
from ferrymq.common.route import MessageQueue
from support.aio import wait_for
from support.inproc import needs_cluster

pytestmark = needs_cluster

RUN_TIMEOUT_S = 60






async def test_update_perm_changes_the_permission_only(ns_addr: str) -> None:
    async with Admin(ns_addr) as admin:
        await admin.create_topic("PermT", read_queue_nums=3, write_queue_nums=2, order=True)
        await admin.wait_for_route("PermT")
        rows = await ferry_json("topic", "update-perm", "-n", ns_addr, "-t", "PermT", "-p", "4")
        assert [(r["oldPerm"], r["perm"]) for r in rows] == [(6, 4)]  # type: ignore[index]

        async def read_only() -> bool:
            admin.instance.routes.pop("PermT", None)
            route = await admin.topic_route("PermT")
            return [(q.perm, q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas] == [(4, 3, 2)]
        await wait_for(read_only, what="the route to show PermT read-only with its queue counts")
        async with Producer(ns_addr, "perm-producer") as producer:
            try:
                await producer.send(new_message("PermT", b"x"))
            except Exception as exc:  # noqa: BLE001 - any refusal will do; SEND_OK would be the bug
                assert "perm" in str(exc).lower() or "permission" in str(exc).lower() or "route" in str(exc).lower()
            else:
                raise AssertionError("a send to a read-only topic was accepted")
    code, _, err = await ferry("topic", "update-perm", "-n", ns_addr, "-t", "PermT", "-p", "5")
    assert code == 2 and "Invalid value" in err


async def test_broker_status_and_consume_stats(ns_addr: str, broker: object) -> None:
    addr = broker.broker_addr  # type: ignore[attr-defined]
    status = await ferry_json("broker", "status", "-n", ns_addr, "-b", addr)
    assert isinstance(status, dict) and status["brokerAddr"] and "commitLogMaxOffset" in status
    async with Admin(ns_addr) as admin:
        await admin.create_topic("StatsT", read_queue_nums=1, write_queue_nums=1)
        await admin.wait_for_route("StatsT")
        async with Producer(ns_addr, "stats-producer") as producer:
            for i in range(5):
                await producer.send(new_message("StatsT", b"m%d" % i))
        core = ConsumerCore(admin.instance, "stats-group")
        await core.commit_offset(MessageQueue("StatsT", "broker-a", 0), 2)
    rows = await ferry_json("broker", "consume-stats", "-n", ns_addr, "-b", addr)
    mine = [r for r in rows if r["group"] == "stats-group"]  # type: ignore[index,union-attr]
    assert [(r["topic"], r["queueId"], r["brokerOffset"], r["consumerOffset"], r["lag"]) for r in mine] == [
        ("StatsT", 0, 5, 2, 3)]


async def test_consumer_config_and_a_missing_group(ns_addr: str) -> None:
    code, _, err = await ferry("group", "create", "-n", ns_addr, "-g", "cfg-group", "--retry-max-times", "3")
    assert code == 0, err
    rows = await ferry_json("consumer", "config", "-n", ns_addr, "-g", "cfg-group")
    assert [(r["groupName"], r["retryMaxTimes"]) for r in rows] == [("cfg-group", 3)]  # type: ignore[index]
    code, _, err = await ferry("consumer", "config", "-n", ns_addr, "-g", "no-such-group")
    assert code == 1 and "no-such-group" in err


async def test_print_messages_by_queue_and_time(ns_addr: str) -> None:
    async with Admin(ns_addr) as admin:
        await admin.create_topic("PrintT", read_queue_nums=2, write_queue_nums=2)
        await admin.wait_for_route("PrintT")
    async with Producer(ns_addr, "print-producer") as producer:
        first = [await producer.send(new_message("PrintT", b"early-%d" % i)) for i in range(6)]
        split_ms = int(time.time() * 1000) + 1
        await wait_for(lambda: int(time.time() * 1000) > split_ms + 1, what="the clock to pass the split")
        later = [await producer.send(new_message("PrintT", b"late-%d" % i)) for i in range(4)]
    code, out, err = await ferry("message", "print", "-n", ns_addr, "-t", "PrintT", "--json")
    assert code == 0, err
    bodies = sorted(json.loads(line)["body"] for line in out.splitlines())
    assert bodies == sorted([f"early-{i}" for i in range(6)] + [f"late-{i}" for i in range(4)])
    code, out, err = await ferry("message", "print", "-n", ns_addr, "-t", "PrintT", "--begin", str(split_ms), "--json")
    assert code == 0, err
    assert sorted(json.loads(line)["body"] for line in out.splitlines()) == sorted(f"late-{i}" for i in range(4))
    q0 = [r for r in first + later if r.message_queue.queue_id == 0]
    code, out, err = await ferry("message", "print", "-n", ns_addr, "-t", "PrintT", "--queue", "0", "--json")
    assert code == 0, err
    assert [json.loads(line)["queueOffset"] for line in out.splitlines()] == sorted(r.queue_offset for r in q0)
    code, out, err = await ferry("message", "print", "-n", ns_addr, "-t", "PrintT", "--limit", "3", "--json")
    assert code == 0 and len(out.splitlines()) == 3
    code, _, err = await ferry("message", "print", "-n", ns_addr, "-t", "PrintT", "--begin", "yesterday")
    assert code == 2


async def test_stats_all_counts_a_topic_and_its_group(ns_addr: str) -> None:
    async with Admin(ns_addr) as admin:
        await admin.create_topic("StatsAllT", read_queue_nums=1, write_queue_nums=1)
        await admin.wait_for_route("StatsAllT")
        async with Producer(ns_addr, "statsall-producer") as producer:
            for i in range(4):
                await producer.send(new_message("StatsAllT", b"s%d" % i))
        core = ConsumerCore(admin.instance, "statsall-group")
        mq = MessageQueue("StatsAllT", "broker-a", 0)
        result = await core.pull(mq, 0, 32, timeout_ms=3000)
        assert len(result.messages) == 4
        await core.commit_offset(mq, 4)
    rows = await ferry_json("stats", "all", "-n", ns_addr, "-t", "StatsAllT")
    assert [(r["group"], r["inTotal"], r["outTotal"]) for r in rows] == [  # type: ignore[index,union-attr]
        ("statsall-group", 4, 4)]
    assert rows[0]["inTps"] > 0 and rows[0]["outTps"] > 0  # type: ignore[index]
    everything = await ferry_json("stats", "all", "-n", ns_addr)
    assert "StatsAllT" in {r["topic"] for r in everything}  # type: ignore[index,union-attr]
    assert not any(r["topic"].startswith(("%RETRY%", "TBW102")) for r in everything)  # type: ignore[index,union-attr]
