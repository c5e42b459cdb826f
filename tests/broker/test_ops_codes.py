"""Runtime config (25/26) and the operations codes (13, 22, 204, 222, 300, 314, 315, 317, 329, 343) through a
raw remoting client of an in-process broker."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from broker_helpers import Client, pull, send_v1, wait_for

from ferrymq.broker.runtime_config import RUNTIME_KEYS
from ferrymq.client.jsonmq import loads_mq_keys, mq_keyed_map
from ferrymq.common.properties import parse_properties
from ferrymq.common.properties import update_properties_file as write_back
from ferrymq.common.route import MessageQueue
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode as C
from ferrymq.remoting.codes import ResponseCode as R

#: queues of the topics these tests create (send_v1 auto-creates through TBW102 with 4 queues)
QUEUES = 4


async def _send(client: Client, topic: str, n: int, queue_id: int = 0) -> None:
    for _ in range(n):
        assert (await client.call(C.SEND_MESSAGE, send_v1(topic, queue_id), b"x")).code == R.SUCCESS


async def _commit(client: Client, group: str, topic: str, queue_id: int, offset: int) -> None:
    r = await client.call(C.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": queue_id,
                                                     "commitOffset": offset})
    assert r.code == R.SUCCESS


def _heartbeat(client_id: str, *, consumer_group: str = "", topic: str = "", producer_group: str = "") -> bytes:
    body: dict[str, object] = {"clientID": client_id, "consumerDataSet": [], "producerDataSet": []}
    if consumer_group:
        body["consumerDataSet"] = [{"groupName": consumer_group, "consumeType": "CONSUME_PASSIVELY",
                                    "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                                    "subscriptionDataSet": [{"topic": topic, "subString": "*"}]}]
    if producer_group:
        body["producerDataSet"] = [{"groupName": producer_group}]
    return json.dumps(body).encode()


# ---- runtime config ---------------------------------------------------------------------------------------
async def test_get_config_lists_every_key_with_its_value(broker, client: Client) -> None:
    resp = await client.call(C.GET_BROKER_CONFIG)
    assert resp.code == R.SUCCESS
    props = parse_properties(resp.body.decode())
    assert props["brokerName"] == "broker-t" and props["maxMessageSize"] == str(broker.config.max_message_size)
    assert props["longPollingEnable"] == "true" and props["brokerRole"] == "ASYNC_MASTER"
    assert set(RUNTIME_KEYS) <= set(props)
    assert json.loads(resp.ext_fields["version"])["counter"] == 0


def _perm_at_namesrv(namesrv, topic: str) -> int:
    route = namesrv.routes.get_topic_route(topic)
    assert route is not None
    return int(route.queue_datas[0].perm)


async def test_update_applies_runtime_keys_and_writes_them_back(broker, namesrv, client: Client,
                                                                tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("# my broker\nbrokerName=broker-t\nmaxMessageSize=4194304\nflushIntervalCommitLog=500\n")
    broker.config.config_path = str(conf)
    resp = await client.call(C.UPDATE_BROKER_CONFIG, body=b"maxMessageSize=1000\nflushIntervalCommitLog=200\n"
                                                          b"brokerPermission=4\n")
    assert resp.code == R.SUCCESS, resp.remark
    assert resp.ext_fields["persisted"] == str(conf)
    assert broker.config.max_message_size == 1000 and broker.store_config.max_message_size == 1000
    assert broker.flush_service.interval_ms == 200
    assert conf.read_text() == ("# my broker\nbrokerName=broker-t\nmaxMessageSize=1000\nflushIntervalCommitLog=200\n"
                                "brokerPermission=4\n")
    # brokerPermission 4 (read only): the name server routes no writes to it, then does again
    await wait_for(lambda: _perm_at_namesrv(namesrv, "TBW102") == 4, timeout_s=5, what="read-only route")
    resp = await client.call(C.UPDATE_BROKER_CONFIG, body=b"brokerPermission=6")
    assert resp.code == R.SUCCESS
    await wait_for(lambda: _perm_at_namesrv(namesrv, "TBW102") == 7, timeout_s=5, what="writable route")
    r = await client.call(C.SEND_MESSAGE, send_v1("PermT"), b"y" * 1001)
    assert r.code == R.MESSAGE_ILLEGAL  # maxMessageSize 1000 holds
    get = await client.call(C.GET_BROKER_CONFIG)
    assert parse_properties(get.body.decode())["maxMessageSize"] == "1000"
    assert json.loads(get.ext_fields["version"])["counter"] == 2


async def test_update_refuses_a_restart_key_and_changes_nothing(broker, client: Client) -> None:
    before = broker.config.max_message_size
    resp = await client.call(C.UPDATE_BROKER_CONFIG, body=b"maxMessageSize=1000\nlistenPort=1234\nbrokerName=x\n")
    assert resp.code == R.SYSTEM_ERROR
    assert "not updatable at runtime: brokerName, listenPort" in (resp.remark or "")
    assert broker.config.max_message_size == before
    resp = await client.call(C.UPDATE_BROKER_CONFIG, body=b"noSuchKey=1")
    assert resp.code == R.SYSTEM_ERROR and "unknown config key(s): noSuchKey" in (resp.remark or "")
    resp = await client.call(C.UPDATE_BROKER_CONFIG, body=b"diskMaxUsedSpaceRatio=150\nmaxMessageSize=10")
    assert resp.code == R.SYSTEM_ERROR and "diskMaxUsedSpaceRatio" in (resp.remark or "")
    resp = await client.call(C.UPDATE_BROKER_CONFIG, body=b"longPollingEnable=maybe")
    assert resp.code == R.SYSTEM_ERROR and "longPollingEnable" in (resp.remark or "")
    assert broker.config.max_message_size == before and broker.config.long_polling_enable


def test_write_back_keeps_other_lines_drops_duplicates_appends_new_keys(tmp_path: Path) -> None:
    conf = tmp_path / "b.conf"
    conf.write_text("a=1\n! note\nfileReservedTime=72\nb : 2\nfileReservedTime = 48\n")
    write_back(str(conf), {"fileReservedTime": "12", "slaveReadEnable": "true"})
    assert conf.read_text() == "a=1\n! note\nb : 2\nfileReservedTime=12\nslaveReadEnable=true\n"


# ---- offsets ------------------------------------------------------------------------------------------------
async def test_reset_offset_by_time_skip_backlog_and_client_push(broker, client: Client) -> None:
    await _send(client, "ResetT", 3, queue_id=1)
    await wait_for(lambda: broker.store.get_max_offset_in_queue("ResetT", 1) == 3, timeout_s=5, what="dispatch")
    await asyncio.sleep(0.02)  # a distinct store time for the next batch
    middle_ms = int(time.time() * 1000)
    await asyncio.sleep(0.02)
    await _send(client, "ResetT", 2, queue_id=1)
    await wait_for(lambda: broker.store.get_max_offset_in_queue("ResetT", 1) == 5, timeout_s=5, what="dispatch")
    await _commit(client, "rg", "ResetT", 1, 5)
    # an online consumer of the group is told (RESET_CONSUMER_CLIENT_OFFSET)
    pushed: list[RemotingCommand] = []
    client.dispatcher.register(C.RESET_CONSUMER_CLIENT_OFFSET, lambda conn, cmd: pushed.append(cmd))
    hb = await client.call(C.HEART_BEAT, body=_heartbeat("c-1", consumer_group="rg", topic="ResetT"))
    assert hb.code == R.SUCCESS

    resp = await client.call(C.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "ResetT", "group": "rg",
                                                               "timestamp": middle_ms, "isForce": "true"})
    assert resp.code == R.SUCCESS, resp.remark
    table = dict(mq_keyed_map(resp.body, "offsetTable"))
    assert table[MessageQueue("ResetT", "broker-t", 1)] == 3
    assert broker.offsets.query("rg", "ResetT", 1) == 3
    assert resp.ext_fields["clientsNotified"] == "1"
    await wait_for(lambda: pushed, timeout_s=5, what="the reset pushed to the client")
    assert pushed[0].ext_fields["group"] == "rg"
    assert dict(mq_keyed_map(pushed[0].body, "offsetTable"))[MessageQueue("ResetT", "broker-t", 1)] == 3

    # without force a reset never moves forward; skip-backlog (-1, force) goes to the max offset
    resp = await client.call(C.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "ResetT", "group": "rg",
                                                               "timestamp": -1, "isForce": "false"})
    assert broker.offsets.query("rg", "ResetT", 1) == 3
    resp = await client.call(C.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "ResetT", "group": "rg",
                                                               "timestamp": -1, "isForce": "true"})
    assert resp.code == R.SUCCESS and broker.offsets.query("rg", "ResetT", 1) == 5
    # back to the start (a time before every message), and an unknown topic
    resp = await client.call(C.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "ResetT", "group": "rg",
                                                               "timestamp": 0, "isForce": "false"})
    assert broker.offsets.query("rg", "ResetT", 1) == 0
    resp = await client.call(C.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "NoSuchT", "group": "rg", "timestamp": 0})
    assert resp.code == R.TOPIC_NOT_EXIST


async def test_clone_offset_copies_the_committed_offsets(broker, client: Client) -> None:
    await _send(client, "CloneT", 2)
    await _commit(client, "src-g", "CloneT", 0, 2)
    await _commit(client, "src-g", "CloneT", 1, 0)
    resp = await client.call(C.CLONE_GROUP_OFFSET, {"srcGroup": "src-g", "destGroup": "dst-g", "topic": "",
                                                    "offline": "false"})
    assert resp.code == R.SUCCESS and resp.ext_fields["clonedQueues"] == "2"
    assert broker.offsets.query("dst-g", "CloneT", 0) == 2 and broker.offsets.query("dst-g", "CloneT", 1) == 0
    resp = await client.call(C.CLONE_GROUP_OFFSET, {"srcGroup": "src-g"})
    assert resp.code == R.SYSTEM_ERROR and "destGroup" in (resp.remark or "")


# ---- who is connected, who consumes what ----------------------------------------------------------------
async def test_connections_and_consumers_of_topics(broker, client: Client) -> None:
    await _send(client, "WhoT", 1)
    await _commit(client, "offset-g", "WhoT", 0, 1)
    hb = await client.call(C.HEART_BEAT, body=_heartbeat("cli-1", consumer_group="live-g", topic="WhoT",
                                                         producer_group="pg-1"))
    assert hb.code == R.SUCCESS
    resp = await client.call(C.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "pg-1"})
    assert resp.code == R.SUCCESS
    [conn] = jsonx.loads(resp.body)["connectionSet"]
    assert conn["clientId"] == "cli-1" and conn["clientAddr"].startswith("127.0.0.1:")
    resp = await client.call(C.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "nobody"})
    assert resp.code == R.SYSTEM_ERROR and "nobody" in (resp.remark or "")

    resp = await client.call(C.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "WhoT"})
    assert jsonx.loads(resp.body)["groupList"] == ["live-g", "offset-g"]
    resp = await client.call(C.QUERY_TOPICS_BY_CONSUMER, {"group": "offset-g"})
    body = jsonx.loads(resp.body)
    assert body["topicList"] == ["WhoT"] and body["brokerAddr"] == broker.broker_addr
    resp = await client.call(C.QUERY_TOPICS_BY_CONSUMER, {"group": "live-g"})
    assert jsonx.loads(resp.body)["topicList"] == ["WhoT"]


# ---- broker-wide ----------------------------------------------------------------------------------------
async def test_broker_offset_topic_list_cleanup_and_stats(broker, client: Client) -> None:
    await _send(client, "StatT", 3)
    await _commit(client, "stat-g", "StatT", 0, 1)
    resp = await client.call(C.QUERY_BROKER_OFFSET)
    assert resp.code == R.SUCCESS and int(resp.ext_fields["maxOffset"]) == broker.store.max_phy_offset > 0
    resp = await client.call(C.GET_TOPIC_CONFIG_LIST)
    assert "StatT" in jsonx.loads(resp.body)["topicConfigTable"]
    resp = await client.call(C.DELETE_EXPIRED_COMMITLOG)
    assert resp.code == R.SUCCESS and resp.ext_fields["deletedFiles"] == "0"  # one segment: never the newest

    resp = await client.call(C.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "StatT"})
    assert resp.code == R.SUCCESS and jsonx.loads(resp.body)["statsMinute"]["sum"] == 3
    resp = await client.call(C.VIEW_BROKER_STATS_DATA, {"statsName": "BROKER_PUT_NUMS",
                                                        "statsKey": broker.config.broker_cluster_name})
    assert set(jsonx.loads(resp.body)) == {"statsMinute", "statsHour", "statsDay"}
    resp = await client.call(C.VIEW_BROKER_STATS_DATA, {"statsName": "GROUP_GET_NUMS", "statsKey": "x"})
    assert resp.code == R.SYSTEM_ERROR and "GROUP_GET_NUMS" in (resp.remark or "")
    resp = await client.call(C.PULL_MESSAGE, pull("StatT", group="stat-g", suspend_ms=0, sys_flag=4))
    assert resp.code == R.SUCCESS, resp.remark
    resp = await client.call(C.VIEW_BROKER_STATS_DATA, {"statsName": "GROUP_GET_NUMS", "statsKey": "StatT@stat-g"})
    got = jsonx.loads(resp.body)
    assert resp.code == R.SUCCESS and got["statsMinute"]["sum"] == 3 and got["statsMinute"]["tps"] > 0

    resp = await client.call(C.GET_BROKER_CONSUME_STATS, {"isOrder": "false"})
    assert resp.code == R.SUCCESS
    body = loads_mq_keys(resp.body)
    assert body["brokerAddr"] == broker.broker_addr and body["totalDiff"] >= 2
    [entry] = [e for e in body["consumeStatsList"] if "stat-g" in e]
    [stats] = entry["stat-g"]
    assert stats["offsetTable"]


async def test_epoch_cache_of_a_classic_broker_says_it_keeps_none(client: Client) -> None:
    resp = await client.call(C.GET_BROKER_EPOCH_CACHE)
    assert resp.code == R.SYSTEM_ERROR and "not in controller mode" in (resp.remark or "")
