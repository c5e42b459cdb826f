"""SEND_REPLY_MESSAGE (324/325) on the raw wire: the push (326) to the requester's connection with the
ReplyMessageRequestHeader fields, the stored copy, and the refusals."""

from __future__ import annotations

from broker_helpers import Client, pull, records, send_v1

from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode as R

REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"


async def test_reply_is_pushed_to_the_requester_and_stored(broker, client: Client) -> None:
    pushed: list[RemotingCommand] = []
    requester = Client()
    requester.dispatcher.register(326, lambda conn, cmd: (pushed.append(cmd), cmd.response(R.SUCCESS))[1])
    await requester.open(broker.broker_addr)
    try:
        hb = {"clientID": "req-1", "producerDataSet": [{"groupName": "rpg"}], "consumerDataSet": []}
        assert (await requester.call(34, body=jsonx.dumps(hb))).code == R.SUCCESS
        props = "MSG_TYPE\x01reply\x02CORRELATION_ID\x01c-1\x02REPLY_TO_CLIENT\x01req-1\x02TTL\x013000\x02"
        resp = await client.call(324, send_v1(REPLY_TOPIC, 0, props), b"the answer")
        assert resp.code == R.SUCCESS, resp.remark
        assert resp.ext_fields["msgId"] != "0" and resp.ext_fields["queueOffset"] == "0"
        (push,) = pushed
        f = push.ext_fields
        assert push.body == b"the answer" and f["topic"] == REPLY_TOPIC and f["producerGroup"] == "pg"
        assert f["storeHost"] == broker.broker_addr and int(f["storeTimestamp"]) > 0 and ":" in f["bornHost"]
        assert "PUSH_REPLY_TIME\x01" in f["properties"] and "CORRELATION_ID\x01c-1" in f["properties"]
        got = await client.call(11, pull(REPLY_TOPIC, sys_flag=4))
        (stored,) = records(got.body)
        assert stored.body == b"the answer" and stored.properties["CORRELATION_ID"] == "c-1"

        # V2 header (325), the requester answering with an error: SYSTEM_ERROR, stored all the same
        requester.dispatcher.register(326, lambda conn, cmd: cmd.response(R.SYSTEM_ERROR, remark="no"))
        v2 = {"a": "pg", "b": REPLY_TOPIC, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0, "i": props,
              "j": 0, "k": False}
        resp = await client.call(325, v2, b"second")
        assert resp.code == R.SYSTEM_ERROR and "push reply message to req-1" in resp.remark
        assert resp.ext_fields["queueOffset"] == "1"
    finally:
        requester.close()


async def test_reply_refusals(broker, client: Client) -> None:
    no_target = await client.call(324, send_v1(REPLY_TOPIC, 0, "MSG_TYPE\x01reply\x02"), b"x")
    assert no_target.code == R.SYSTEM_ERROR and "REPLY_TO_CLIENT" in no_target.remark
    gone = await client.call(324, send_v1(REPLY_TOPIC, 0, "REPLY_TO_CLIENT\x01nobody\x02"), b"x")
    assert gone.code == R.SYSTEM_ERROR and "channel of <nobody> not found" in gone.remark
    unknown = await client.call(324, send_v1("NoSuchReplyTopic", 0, "REPLY_TO_CLIENT\x01x\x02"), b"x")
    assert unknown.code == R.TOPIC_NOT_EXIST
    broker.config.store_reply_message_enable = False
    not_stored = await client.call(324, send_v1(REPLY_TOPIC, 0, "REPLY_TO_CLIENT\x01nobody\x02"), b"x")
    assert not_stored.ext_fields["msgId"] == "0"
