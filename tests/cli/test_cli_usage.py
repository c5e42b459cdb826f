"""Operator mistakes and outages the verbs must report: usage errors exit 2 with a usage line, an unknown
broker group or topic is an error, and a change that the missing master would undo is refused, not reported
as done. The verbs run as subprocesses against the in-process name server and broker."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import orjson
import pytest
from cli_run import ferry

from ferrymq.client import Admin
from ferrymq.common.route import MASTER_ID
from ferrymq.namesrv.register_body import body_crc32
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.connection import connect
from support.aio import wait_for
from support.inproc import needs_cluster

pytestmark = needs_cluster

#: a broker group registered with its slave only (its master "down")
HEADLESS_GROUP = "broker-headless"
HEADLESS_TOPIC = "HeadlessT"




def register_cmd(broker_id: int, port: int) -> RemotingCommand:
    body = orjson.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1, "timestamp": 1},
        "topicConfigTable": {HEADLESS_TOPIC: {"topicName": HEADLESS_TOPIC, "perm": 6, "readQueueNums": 2,
                                              "writeQueueNums": 2}}}})
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, {
        "brokerName": HEADLESS_GROUP, "brokerAddr": f"127.0.0.1:{port}", "clusterName": "DefaultCluster",
        "haServerAddr": f"127.0.0.1:{port + 1}", "brokerId": broker_id, "bodyCrc32": body_crc32(body)}, body)


@pytest.fixture
async def headless_group(ns_addr: str) -> AsyncIterator[None]:
    """A group whose master registered and then went away (its connection closed) while its slave stays: what
    the name server holds right after a master dies."""
    master, slave = await connect(ns_addr), await connect(ns_addr)
    try:
        assert (await master.invoke(register_cmd(0, 1))).code == 0
        assert (await slave.invoke(register_cmd(1, 3))).code == 0
        master.close()
        async with Admin(ns_addr) as admin:
            async def master_gone() -> bool:
                addrs = (await admin.cluster_info())["brokerAddrTable"][HEADLESS_GROUP]["brokerAddrs"]
                return MASTER_ID not in addrs and bool(addrs)
            await wait_for(master_gone, what="the name server dropped the closed master")
        yield
    finally:
        master.close()
        slave.close()


@pytest.mark.parametrize("args", [
    ("cluster", "list", "-n", "localhost"),
    ("topic", "list", "-n", "127.0.0.1:notaport"),
    ("topic", "list", "-n", "127.0.0.1:9876;nohost"),
    ("broker", "config", "get", "-n", "127.0.0.1:9876", "-b", "broker-a"),
    ("topic", "create", "-n", "127.0.0.1:9876", "-t", "T", "-b", "127.0.0.1:70000"),
])
async def test_malformed_addresses_are_usage_errors(args: tuple[str, ...]) -> None:
    code, out, err = await ferry(*args)
    assert code == 2, (out, err)
    assert "Usage:" in err and "Invalid value for" in err
    assert "Traceback" not in err


async def test_wipe_write_perm_of_an_unknown_group_fails(ns_addr: str) -> None:
    code, _, err = await ferry("broker", "wipe-write-perm", "-n", ns_addr, "-b", "nosuch")
    assert code == 1
    assert "nosuch" in err and "no name server knows" in err
    code, out, err = await ferry("broker", "wipe-write-perm", "-n", ns_addr, "-b", "broker-a", "--json")
    assert code == 0, err
    assert all(r["error"] == "" for r in json.loads(out))
    code, _, err = await ferry("broker", "add-write-perm", "-n", ns_addr, "-b", "broker-a")
    assert code == 0, err


async def test_consume_from_a_missing_topic_fails(ns_addr: str) -> None:
    code, _, err = await ferry("consume", "-n", ns_addr, "-t", "NoSuchTopic", "-g", "g1", "--timeout-s", "2")
    assert code == 1
    assert "NoSuchTopic does not exist" in err


async def test_topic_delete_prints_json(ns_addr: str) -> None:
    code, _, err = await ferry("topic", "create", "-n", ns_addr, "-t", "DelJ", "-w", "1", "-r", "1")
    assert code == 0, err
    code, out, err = await ferry("topic", "delete", "-n", ns_addr, "-t", "DelJ", "--json")
    assert code == 0, err
    assert json.loads(out) == {"topic": "DelJ", "cluster": None, "deleted": True}


async def test_changes_a_missing_master_would_undo_are_refused(ns_addr: str, headless_group: None) -> None:
    code, out, err = await ferry("topic", "delete", "-n", ns_addr, "-t", HEADLESS_TOPIC)
    assert code == 1, (out, err)
    assert HEADLESS_GROUP in err and "no master" in err and "deleted" not in out
    code, out, err = await ferry("topic", "route", "-n", ns_addr, "-t", HEADLESS_TOPIC, "--json")
    assert code == 0, err
    assert [r["brokerName"] for r in json.loads(out)] == [HEADLESS_GROUP]
    code, out, err = await ferry("group", "create", "-n", ns_addr, "-g", "cg-headless")
    assert code == 1, (out, err)
    assert HEADLESS_GROUP in err and "no master" in err
    # a topic only the healthy group serves is still deleted
    code, _, err = await ferry("topic", "create", "-n", ns_addr, "-t", "HealthyT", "-w", "1", "-r", "1")
    assert code == 0, err
    code, out, err = await ferry("topic", "delete", "-n", ns_addr, "-t", "HealthyT")
    assert code == 0, err
    assert "deleted HealthyT" in out


async def test_many_sends_print_a_summary_not_a_row_each(ns_addr: str) -> None:
    code, out, err = await ferry("produce", "-n", ns_addr, "-t", "SumT", "--count", "50", "x")
    assert code == 0, err
    assert "50 messages sent to SumT" in out
    assert out.count("SEND_OK") <= 8  # a row per queue, not per message
    code, out, err = await ferry("produce", "-n", ns_addr, "-t", "SumT", "--count", "30", "--json", "x")
    assert code == 0, err
    assert len(json.loads(out)) == 30


async def test_top_help_lists_whole_first_sentences_without_markup() -> None:
    code, out, err = await ferry("--help")
    assert code == 0, err
    commands = out.split("Commands:", 1)[1]
    assert "``" not in commands and "..." not in commands
    assert "(e.g. ORDER_TOPIC_CONFIG)" in " ".join(commands.split())
