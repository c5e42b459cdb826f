"""Request-reply through an in-process broker: Producer.request / Producer.reply, the broker's 325 → 326 push,
the stored copy in <cluster>_REPLY_TOPIC, a request nobody answers, a reply nobody waits for."""

from __future__ import annotations

import asyncio

import pytest
from client_helpers import wait_for

from ferrymq.client import Admin, ConsumeStatus, MessageExt, Producer, PullConsumer, PushConsumer, new_message
from ferrymq.client.request_reply import create_reply_message
from ferrymq.errors import BrokerError, ClientError, RequestTimeoutError
from support.inproc import needs_cluster

pytestmark = needs_cluster

FAST = {"rebalance_interval_ms": 500, "persist_offset_interval_ms": 200, "heartbeat_broker_interval_ms": 1000,
        "poll_name_server_interval_ms": 1000}


async def _topic(ns: str, topic: str) -> None:
    async with Admin(ns) as admin:
        await admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
        await admin.wait_for_route(topic)


async def test_request_gets_the_reply_and_the_broker_keeps_a_copy(ns_addr: str) -> None:
    await _topic(ns_addr, "RR")
    responder = Producer(ns_addr, "rr-responder")
    await responder.start()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            await responder.reply(m, b"re:" + m.body)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(ns_addr, "rr-cg", consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
    consumer.subscribe("RR", "*")
    consumer.register_message_listener(listener)
    await consumer.start()
    try:
        async with Producer(ns_addr, "rr-requester") as requester:
            replies = await asyncio.gather(*(requester.request(new_message("RR", f"q{i}"), 10_000)
                                             for i in range(3)))
            assert sorted(r.body for r in replies) == [b"re:q0", b"re:q1", b"re:q2"]
            reply = replies[0]
            assert reply.topic == "DefaultCluster_REPLY_TOPIC"
            assert reply.properties["MSG_TYPE"] == "reply"
            assert reply.properties["REPLY_TO_CLIENT"] == requester.instance.client_id
            assert reply.properties["TTL"] == "10000"
            assert {"CORRELATION_ID", "PUSH_REPLY_TIME", "ARRIVE_TIME"} <= set(reply.properties)
            assert len(requester.instance.replies) == 0
    finally:
        await consumer.close()
        await responder.close()
    async with PullConsumer(ns_addr, "rr-reader") as reader:  # storeReplyMessageEnable: the copies are stored
        (mq,) = await reader.fetch_subscribe_message_queues("DefaultCluster_REPLY_TOPIC")
        stored = await reader.pull(mq, 0, 32)
        assert sorted(m.body for m in stored.messages) == [b"re:q0", b"re:q1", b"re:q2"]


async def test_unanswered_request_times_out_and_late_reply_is_refused(ns_addr: str) -> None:
    await _topic(ns_addr, "RRNone")
    async with Producer(ns_addr, "rr-lonely") as requester, Producer(ns_addr, "rr-late") as responder:
        msg = new_message("RRNone", "anyone?")
        with pytest.raises(RequestTimeoutError, match="no reply .* within 300 ms"):
            await requester.request(msg, 300)
        assert len(requester.instance.replies) == 0
        async with PullConsumer(ns_addr, "rr-late-reader") as reader:
            async def the_request() -> list[MessageExt]:
                found = []
                for mq in await reader.fetch_subscribe_message_queues("RRNone"):
                    found.extend((await reader.pull(mq, 0, 32)).messages)
                return found
            (received,) = await wait_for(the_request)
        # the requester no longer waits: the push is answered, the reply only logged there
        result = await responder.reply(received, b"too late")
        assert result.offset_msg_id
    async with Producer(ns_addr, "rr-late2") as responder:
        with pytest.raises(BrokerError) as info:  # the requester is gone: its channel is not found
            await responder.reply(received, b"nobody")
        assert info.value.code == 1 and "not found" in info.value.remark
        with pytest.raises(ClientError, match="not a request"):
            create_reply_message(new_message("RRNone", "x", properties={"CLUSTER": "C"}), b"")


async def test_example_script(ns_addr: str) -> None:
    from test_examples_cli import run

    await _topic(ns_addr, "ExRR")
    code, out, err = await run("examples/request_reply.py", ns_addr, "ExRR", "both", "2")
    assert code == 0, err
    assert "reply 'HELLO 0'" in out and "reply 'HELLO 1'" in out
