"""Deviations found by the conformance review: each test passes once its finding is fixed and is marked
``xfail(strict=True)`` until then. Finding ids (CONF-nn) match the review report."""

from __future__ import annotations

import json

from conf_helpers import Client, pull, records, running_broker, send_v1, wait_for

from ferrymq.common.message import decode_offset_msg_id
from ferrymq.common.topic import TopicConfig
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode as R
from ferrymq.remoting.connection import connect

#: one past Java's long range: Long.parseLong refuses it (Java answers SYSTEM_ERROR)
BEYOND_LONG = 2**64



async def test_conf01_out_of_range_commit_offset_does_not_break_offset_persistence(tmp_path) -> None:
    """One UPDATE_CONSUMER_OFFSET with commitOffset > Long.MAX poisons the offset table: persisting
    consumerOffset.json (every 5 s and at stop) raises from then on, GET_ALL_CONSUMER_OFFSET (slave sync)
    fails, and BrokerController.stop() aborts before flushing/shutting the store."""
    async with running_broker(str(tmp_path / "s")) as b:
        c = await Client().open(b.broker_addr)
        try:
            await c.call(15, {"consumerGroup": "bad", "topic": "T", "queueId": 0, "commitOffset": BEYOND_LONG})
            ok = await c.call(15, {"consumerGroup": "good", "topic": "T", "queueId": 0, "commitOffset": 7})
            assert ok.code == R.SUCCESS
            assert (await c.call(43)).code == R.SUCCESS  # GET_ALL_CONSUMER_OFFSET still answers
            b.offsets.persist()
            saved = json.loads((tmp_path / "s" / "config" / "consumerOffset.json").read_text())
            assert saved["offsetTable"]["T@good"] == {"0": 7}
        finally:
            c.close()
            b.offsets.table.pop("T@bad", None)  # let the fixture's stop() complete while unfixed



async def test_conf02_out_of_range_queue_nums_do_not_break_topic_table(tmp_path, namesrv) -> None:
    """UPDATE_AND_CREATE_TOPIC with readQueueNums > Long.MAX is stored as is: topics.json can no longer be
    written, every later topic create/auto-create answers SYSTEM_ERROR, GET_ALL_TOPIC_CONFIG fails and the
    broker's name server registration body cannot be built (the broker expires from the name server)."""
    async with running_broker(str(tmp_path / "s"), namesrv.addr) as b:
        c = await Client().open(b.broker_addr)
        try:
            await c.call(17, {"topic": "Big", "readQueueNums": BEYOND_LONG, "writeQueueNums": 4, "perm": 6})
            later = await c.call(17, {"topic": "Later", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6})
            assert later.code == R.SUCCESS, later.remark
            assert (await c.call(21)).code == R.SUCCESS
            assert await b.registrar.register_all() == 1
        finally:
            c.close()
            b.topics.table.pop("Big", None)



async def test_conf03_out_of_range_group_config_does_not_break_group_auto_create(tmp_path) -> None:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP with retryMaxTimes > Long.MAX is stored; afterwards every
    auto-created group fails to persist, so PULL / HEART_BEAT of any new consumer group answer SYSTEM_ERROR."""
    async with running_broker(str(tmp_path / "s")) as b:
        c = await Client().open(b.broker_addr)
        try:
            await c.call(200, body=b'{"groupName":"G","retryMaxTimes":%d}' % BEYOND_LONG)
            await c.call(10, send_v1("AfterG"), b"x")
            got = await c.call(11, pull("AfterG", group="brand-new", sys_flag=4))
            assert got.code == R.SUCCESS, got.remark
        finally:
            c.close()
            b.groups.table.pop("G", None)



async def test_conf04_sql92_subscription_is_refused_not_tag_matched(broker, client: Client) -> None:
    """§2.7 PULL: a non-TAG expressionType on a broker without property filtering is refused (Java: code 1,
    "The broker does not support consumer to filter message by SQL92"; a bad expression: 23). ferrymq
    evaluates the SQL text as a tag list and answers 20/19, so the consumer silently gets nothing."""
    await client.call(10, send_v1("Sql"), b"x")
    got = await client.call(11, pull("Sql", sys_flag=4, sub="a > 1", expressionType="SQL92"))
    assert got.code in (R.SYSTEM_ERROR, R.SUBSCRIPTION_PARSE_FAILED)



async def test_conf05_send_back_without_group_is_an_error(broker, client: Client) -> None:
    """CONSUMER_SEND_MSG_BACK without the required ``group``: Java fails (SYSTEM_ERROR). ferrymq
    auto-creates a group named "" and the topics "%DLQ%" / "%RETRY%", registers them with the name
    servers and answers SUCCESS."""
    resp = await client.call(10, send_v1("SB"), b"x")
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    back = await client.call(36, {"offset": phy, "delayLevel": -1})
    assert back.code != R.SUCCESS
    assert "%DLQ%" not in broker.topics.table and "%RETRY%" not in broker.topics.table



async def test_conf06_send_back_origin_message_id_is_the_offset_msg_id(broker, client: Client) -> None:
    """§2.7 CONSUMER_SEND_MSG_BACK step 3: ORIGIN_MESSAGE_ID keeps the stored message's value, else the
    looked-up message's offset msgId. ferrymq takes the request's originMsgId header instead (a Java
    client sends its UNIQ_KEY there)."""
    resp = await client.call(10, send_v1("SB2"), b"x")
    msg_id = resp.ext_fields["msgId"]
    _, _, phy = decode_offset_msg_id(msg_id)
    back = await client.call(36, {"offset": phy, "group": "g6", "delayLevel": -1, "originMsgId": "CLIENTUNIQ",
                                  "originTopic": "SB2"})
    assert back.code == R.SUCCESS
    got = await wait_for(lambda: client.call(11, pull("%DLQ%g6", group="admin", sys_flag=4)))
    (msg,) = records(got.body)
    assert msg.properties["ORIGIN_MESSAGE_ID"] == msg_id


async def test_conf07_read_only_broker_refuses_only_order_topics(tmp_path) -> None:
    """§2.7 SEND check 1: a broker without write permission answers 16 only for order topics. ferrymq
    refuses every send, so producers still holding a pre-wipe route get NO_PERMISSION (C++ throws)."""
    async with running_broker(str(tmp_path / "s"), broker_permission=4) as b:
        conn = await connect(b.broker_addr)
        try:
            b.topics.update(TopicConfig("Plain", 4, 4))
            resp = await conn.invoke(RemotingCommand.request(10, send_v1("Plain"), b"x"), 5000)
            assert resp.code == R.SUCCESS, resp.remark
            b.topics.update(TopicConfig("Ordered", 4, 4, order=True))
            resp = await conn.invoke(RemotingCommand.request(10, send_v1("Ordered"), b"x"), 5000)
            assert resp.code == R.NO_PERMISSION, resp.remark
        finally:
            conn.close()
