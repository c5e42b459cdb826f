"""The admin verbs a new user runs first, as subprocesses against an in-process name server and broker:
message lookup by either id, consumer progress without a topic, topic status/route output, ``ha status``
reading ``NAMESRV_ADDR``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client import Admin, Producer, SendResult, new_message
from ferrymq.common.route import MessageQueue
from support.aio import wait_for
from support.inproc import needs_cluster

pytestmark = needs_cluster

ROOT = Path(__file__).resolve().parents[2]
#: deadline of one CLI run
CLI_TIMEOUT_S = 60


async def ferry(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``python -m ferrymq.cli ARGS``; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ferrymq.cli", *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


async def setup_topic(ns: str, topic: str, bodies: list[str], queues: int = 2) -> list[SendResult]:
    async with Admin(ns) as admin:
        await admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
        await admin.wait_for_route(topic)
    async with Producer(ns, "cli-test-pg") as p:
        return [await p.send(new_message(topic, b, keys=f"key-{i}")) for i, b in enumerate(bodies)]


async def indexed(ns: str, topic: str, key: str) -> None:
    """Wait until the broker's index answers for ``key`` (dispatch to the index is asynchronous)."""
    async with Admin(ns) as admin:
        await wait_for(lambda: admin.query_messages_by_key(topic, key), timeout_s=20, what=f"{key} indexed")


def assert_clean_failure(code: int, out: str, err: str) -> None:
    """Non-zero exit, a short message, no traceback."""
    assert code != 0, out
    assert "Traceback" not in err and "Traceback" not in out, err
    assert err.strip(), "no error message"


# ---- message show --id ------------------------------------------------------------------------------------
async def test_message_show_accepts_the_client_msgid_and_the_offset_msgid(ns_addr: str) -> None:
    sent = await setup_topic(ns_addr, "MsgIdT", ["first", "second"])
    await indexed(ns_addr, "MsgIdT", "key-1")
    second = sent[1]
    assert second.msg_id != second.offset_msg_id
    n = ["-n", ns_addr]
    # the msgId that produce/consume print (UNIQ_KEY), with and without the topic
    for extra in (["-t", "MsgIdT"], []):
        code, out, err = await ferry("message", "show", *n, "--id", second.msg_id, *extra, "--json")
        assert code == 0, err
        [row] = json.loads(out)
        assert row["body"] == "second" and row["msgId"] == second.msg_id
        assert row["offsetMsgId"] == second.offset_msg_id
    # the offset msgId (store host + commit log offset), in either case
    for given in (second.offset_msg_id, second.offset_msg_id.lower()):
        code, out, err = await ferry("message", "show", *n, "--id", given, "--json")
        assert code == 0, err
        assert json.loads(out)[0]["body"] == "second"


@pytest.mark.parametrize("bad", ["xyz", "0123", "G" * 32, "7F000001000051AF00000000000000001"])
async def test_message_show_malformed_id_is_a_clear_error(ns_addr: str, bad: str) -> None:
    code, out, err = await ferry("message", "show", "-n", ns_addr, "--id", bad)
    assert_clean_failure(code, out, err)
    assert "malformed message id" in err


async def test_message_show_unknown_id_is_a_clear_error(ns_addr: str) -> None:
    await setup_topic(ns_addr, "MsgIdMiss", ["only"])
    # the shape of a C++ client msgId: its port field is valid, its address is no broker
    code, out, err = await ferry("message", "show", "-n", ns_addr, "--id", "0100007F00005D4C0000DFFDA86F0100")
    assert_clean_failure(code, out, err)
    assert "no message with id" in err
    # a client msgId whose port field is out of range (the old crash: OverflowError)
    code, out, err = await ferry("message", "show", "-n", ns_addr, "--id", "C0A80001D3A1FFFF0000000000000000",
                                 "-t", "MsgIdMiss")
    assert_clean_failure(code, out, err)
    assert "no message with id" in err and "MsgIdMiss" in err


# ---- consumer progress ----------------------------------------------------------------------------------------
async def test_consumer_progress_without_topic_lists_the_groups_topics(ns_addr: str) -> None:
    await setup_topic(ns_addr, "ProgA", [f"a{i}" for i in range(4)])
    await setup_topic(ns_addr, "ProgB", [f"b{i}" for i in range(3)], queues=1)
    async with Admin(ns_addr) as admin:
        core = admin._core("prog-cg")
        await admin.topic_route("ProgB")  # the route names the broker to commit to
        await core.commit_offset(MessageQueue("ProgB", "broker-a", 0), 2)
        status = await admin.topic_status("ProgA")
        for mq, _, max_offset, _ in status:
            await core.commit_offset(mq, max_offset)
    code, out, err = await ferry("consumer", "progress", "-n", ns_addr, "-g", "prog-cg", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert {r["topic"] for r in rows} == {"ProgA", "ProgB"}
    lag = {t: sum(r["lag"] for r in rows if r["topic"] == t) for t in ("ProgA", "ProgB")}
    assert lag == {"ProgA": 0, "ProgB": 1}
    # a group with no offsets anywhere: a clear error
    code, out, err = await ferry("consumer", "progress", "-n", ns_addr, "-g", "nobody-cg")
    assert_clean_failure(code, out, err)
    assert "no topic found for group nobody-cg" in err


# ---- topic status / route ------------------------------------------------------------------------------------
async def test_topic_status_last_update_is_the_last_store_time(ns_addr: str) -> None:
    before_ms = int(time.time() * 1000)
    sent = await setup_topic(ns_addr, "StatT", [f"s{i}" for i in range(5)])
    after_ms = int(time.time() * 1000)
    code, out, err = await ferry("topic", "status", "-n", ns_addr, "-t", "StatT", "--json")
    assert code == 0, err
    rows = json.loads(out)
    used = {r.message_queue.queue_id for r in sent}
    for r in rows:
        if r["queueId"] in used:
            assert before_ms <= r["lastUpdateMs"] <= after_ms, r
        else:
            assert r["maxOffset"] == 0 and r["lastUpdateMs"] == 0, r
    assert sum(r["maxOffset"] for r in rows) == 5


async def test_topic_route_prints_json_or_a_table_never_a_repr(ns_addr: str, broker: Any) -> None:
    await setup_topic(ns_addr, "RouteT", [])
    code, out, err = await ferry("topic", "route", "-n", ns_addr, "-t", "RouteT", "--json")
    assert code == 0, err
    [row] = json.loads(out)
    assert row["brokerName"] == "broker-a" and row["brokerAddrs"] == {"0": broker.broker_addr}
    code, out, err = await ferry("topic", "route", "-n", ns_addr, "-t", "RouteT", env={**os.environ,
                                                                                      "COLUMNS": "300"})
    assert code == 0, err
    assert f"0={broker.broker_addr}" in out
    assert "{" not in out and "'" not in out


# ---- ha status -----------------------------------------------------------------------------------------------
async def test_ha_status_reads_namesrv_addr(ns_addr: str, broker: Any) -> None:
    env = {**os.environ, "NAMESRV_ADDR": ns_addr}
    code, out, err = await ferry("ha", "status", "--json", env=env)
    assert code == 0, err
    groups = json.loads(out)
    assert groups[0]["brokerName"] == "broker-a" and groups[0]["master"]["addr"] == broker.broker_addr
