"""Codes 221/223 (consumer status asked of the clients), 307 (running info forwarded), 328 (every producer),
306 (expired consume queues) and 316 (unused topics) through a raw remoting client of an in-process broker; the
raw client also plays the consumer that the broker asks."""

from __future__ import annotations

import json

from broker_helpers import Client, send_v1

from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode as C
from ferrymq.remoting.codes import ResponseCode as R

GROUP = "cq-group"
TOPIC = "CqTopic"


def _heartbeat(client_id: str) -> bytes:
    return json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": "cq-pg"}], "consumerDataSet": [
        {"groupName": GROUP, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
         "subscriptionDataSet": [{"topic": TOPIC, "subString": "*"}]}]}).encode()


async def test_consumer_status_and_running_info_come_from_the_client(broker, client: Client) -> None:
    asked: list[RemotingCommand] = []

    def answer_status(_conn: object, cmd: RemotingCommand) -> RemotingCommand:
        asked.append(cmd)
        rows = [{"topic": TOPIC, "brokerName": "broker-t", "queueId": 1, "offset": 7}]
        return cmd.response(R.SUCCESS, body=jsonx.dumps({"messageQueueTable": rows}))

    def answer_info(_conn: object, cmd: RemotingCommand) -> RemotingCommand:
        asked.append(cmd)
        return cmd.response(R.SUCCESS, body=b'{"properties":{"consumeType":"CONSUME_PASSIVELY"}}')

    client.dispatcher.register(C.GET_CONSUMER_STATUS_FROM_CLIENT, answer_status)
    client.dispatcher.register(C.GET_CONSUMER_RUNNING_INFO, answer_info)
    assert (await client.call(C.HEART_BEAT, {}, _heartbeat("cid-1"))).code == R.SUCCESS

    status = await client.call(C.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": TOPIC, "group": GROUP})
    assert status.code == R.SUCCESS, status.remark
    table = jsonx.loads(status.body)["consumerTable"]
    assert table == {"cid-1": {"messageQueueTable": [{"topic": TOPIC, "brokerName": "broker-t", "queueId": 1,
                                                      "offset": 7}]}}
    assert asked[0].ext_fields["topic"] == TOPIC and asked[0].ext_fields["group"] == GROUP

    info = await client.call(C.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": GROUP, "clientId": "cid-1",
                                                          "jstackEnable": "false"})
    assert (info.code, info.body) == (R.SUCCESS, b'{"properties":{"consumeType":"CONSUME_PASSIVELY"}}')
    missing = await client.call(C.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": GROUP, "clientId": "nobody"})
    assert missing.code == R.SYSTEM_ERROR and "nobody" in (missing.remark or "")
    nobody = await client.call(C.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": TOPIC, "group": "other"})
    assert nobody.code == R.SYSTEM_ERROR and "other" in (nobody.remark or "")
    bad = await client.call(C.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"group": GROUP})
    assert bad.code == R.SYSTEM_ERROR and "topic" in (bad.remark or "")

    producers = await client.call(C.GET_ALL_PRODUCER_INFO)
    data = jsonx.loads(producers.body)["data"]
    assert [p["clientId"] for p in data["cq-pg"]] == ["cid-1"]


async def test_clean_unused_topics_and_expired_queues(broker, client: Client) -> None:
    for topic in ("KeepMe", "DropMe"):
        assert (await client.call(C.SEND_MESSAGE, send_v1(topic, 0), b"x")).code == R.SUCCESS
    broker.writer.reput_now()
    assert {"KeepMe", "DropMe"} <= set(broker.store.topic_queue_ids())
    broker.topics.delete("DropMe")  # the config is gone, the files stayed (as after a delete on a slave)
    resp = await client.call(C.CLEAN_UNUSED_TOPIC)
    assert (resp.code, resp.ext_fields["deletedTopics"]) == (R.SUCCESS, "1")
    left = set(broker.store.topic_queue_ids())
    assert "DropMe" not in left and "KeepMe" in left
    assert (await client.call(C.CLEAN_UNUSED_TOPIC)).ext_fields["deletedTopics"] == "0"
    resp = await client.call(C.CLEAN_EXPIRED_CONSUMEQUEUE)
    assert (resp.code, resp.ext_fields["deletedFiles"]) == (R.SUCCESS, "0")  # nothing expired yet
