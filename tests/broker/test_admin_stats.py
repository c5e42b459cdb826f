"""GET_TOPIC_STATS_INFO (202) and GET_CONSUME_STATS (208) bodies: fastjson's MessageQueue-keyed maps, the
shape Java admin tools decode (``{"offsetTable":{{"brokerName":..,"queueId":..,"topic":..}:{...}}}``), with
real store timestamps."""

from __future__ import annotations

import re
import time

from broker_helpers import Client, send_v1

from ferrymq.client.jsonmq import mq_keyed_map
from ferrymq.common.route import MessageQueue
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

#: one entry of a fastjson map keyed by MessageQueue: the key object, then ':' and the value object
MQ_KEYED_ENTRY = rb'\{"brokerName":"broker-t","queueId":\d+,"topic":"%s"\}:\{'


async def test_topic_stats_are_mq_keyed_with_the_last_store_time(broker, client: Client) -> None:
    before_ms = int(time.time() * 1000)
    for _ in range(3):
        assert (await client.call(10, send_v1("StatsT", 1), b"x")).code == R.SUCCESS
    after_ms = int(time.time() * 1000)
    resp = await client.call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "StatsT"})
    assert resp.code == R.SUCCESS
    assert resp.body.startswith(b'{"offsetTable":{{"brokerName":')
    assert len(re.findall(MQ_KEYED_ENTRY % b"StatsT", resp.body)) == broker.topics.get("StatsT").write_queue_nums
    table = dict(mq_keyed_map(resp.body, "offsetTable"))
    q1 = table[MessageQueue("StatsT", "broker-t", 1)]
    assert (q1["minOffset"], q1["maxOffset"]) == (0, 3)
    assert before_ms <= q1["lastUpdateTimestamp"] <= after_ms
    q0 = table[MessageQueue("StatsT", "broker-t", 0)]
    assert (q0["maxOffset"], q0["lastUpdateTimestamp"]) == (0, 0)


async def test_consume_stats_are_mq_keyed_and_list_the_groups_topics(broker, client: Client) -> None:
    for topic in ("CsA", "CsB"):
        for _ in range(2):
            assert (await client.call(10, send_v1(topic, 0), b"x")).code == R.SUCCESS
    for topic, offset in (("CsA", 1), ("CsB", 2)):
        r = await client.call(RequestCode.UPDATE_CONSUMER_OFFSET,
                              {"consumerGroup": "cs-g", "topic": topic, "queueId": 0, "commitOffset": offset})
        assert r.code == R.SUCCESS
    resp = await client.call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "cs-g", "topic": ""})
    assert resp.code == R.SUCCESS
    assert resp.body.startswith(b'{"consumeTps":0.0,"offsetTable":{{"brokerName":')
    assert re.search(MQ_KEYED_ENTRY % b"CsA", resp.body) and re.search(MQ_KEYED_ENTRY % b"CsB", resp.body)
    table = dict(mq_keyed_map(resp.body, "offsetTable"))
    a0 = table[MessageQueue("CsA", "broker-t", 0)]
    assert (a0["brokerOffset"], a0["consumerOffset"]) == (2, 1) and a0["lastTimestamp"] > 0
    b0 = table[MessageQueue("CsB", "broker-t", 0)]
    assert (b0["brokerOffset"], b0["consumerOffset"]) == (2, 2)
    assert {mq.topic for mq in table} == {"CsA", "CsB"}
