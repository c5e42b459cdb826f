"""The real RocketMQ 5.x Python SDK (``rocketmq-python-client``) against ferrymq through the gRPC proxy:
producer, SimpleConsumer (pop: ack, redelivery after the invisible duration, dead letters), FIFO, delay,
PushConsumer, and interop with 4.x clients on the remoting port."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from typing import Any

import grpc
import pytest

from ferrymq.client.consumer.push import PushConsumer
from ferrymq.client.producer import Producer
from ferrymq.client.values import ConsumeStatus
from ferrymq.common.message import Message, MessageExt
from ferrymq.proxy.v2 import definition_pb2 as pb
from ferrymq.proxy.v2 import service_pb2 as spb
from ferrymq.proxy.v2 import service_pb2_grpc as sgrpc
from support.aio import wait_for

pytestmark = pytest.mark.acceptance


def uniq(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def received(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "body" in r]


def sent_ids(records: list[dict[str, Any]]) -> dict[str, str]:
    bad = [r for r in records if r.get("ok") is False]
    assert not bad, bad[:3]
    return {f"{r['seq']}": r["message_id"] for r in records if r.get("ok")}


def committed_total(broker: Any, group: str, topic: str, queues: int) -> int:
    return sum(max(broker.offsets.query(group, topic, q), 0) for q in range(queues))


async def test_producer_and_simple_consumer_round_trip(grpc_stack: Any) -> None:
    topic, group = uniq("T5"), uniq("g")
    await grpc_stack.create_topic(topic)
    produced = await grpc_stack.sdk("produce", topic=topic, count=20, prefix="m", tag="TagA", keys=True,
                                    props={"color": "red"})
    ids = sent_ids(produced)
    assert len(ids) == 20
    got = received(await grpc_stack.sdk("simple", topic=topic, group=group, expect=20, timeout_s=60))
    assert sorted(r["body"] for r in got) == sorted(f"m-{i}" for i in range(20))
    assert all(r["acked"] and r["attempt"] == 1 for r in got)
    by_body = {r["body"]: r for r in got}
    for seq, message_id in ids.items():
        rec = by_body[f"m-{seq}"]
        assert rec["message_id"] == message_id
        assert (rec["tag"], rec["keys"], rec["props"]) == ("TagA", [f"k{seq}"], {"color": "red"})
    # acks become the group's consumer offsets on the broker
    await wait_for(lambda: committed_total(grpc_stack.broker, group, topic, 4) == 20, timeout_s=10,
                   what="offsets committed")
    # nothing is left for the group
    again = await grpc_stack.sdk("simple", topic=topic, group=group, expect=1, timeout_s=3, await_s=1)
    assert received(again) == []


@pytest.fixture
def proxy_settings() -> dict[str, Any]:
    return {"fifo_groups": frozenset({"fifo_group"}), "max_delivery_attempts": 2}


async def test_fifo_order_per_message_group(grpc_stack: Any) -> None:
    topic = uniq("TF")
    await grpc_stack.create_topic(topic)
    groups = ["A", "B", "C"]
    sent_ids(await grpc_stack.sdk("produce", topic=topic, count=30, prefix="f", groups=groups))
    got = received(await grpc_stack.sdk("simple", topic=topic, group="fifo_group", expect=30, batch=4,
                                        timeout_s=60))
    order: dict[str, list[int]] = defaultdict(list)
    for r in got:
        order[r["group"]].append(int(r["body"].split("-")[1]))
    assert set(order) == set(groups)
    for g, seqs in order.items():
        assert seqs == sorted(seqs), f"group {g} out of order: {seqs}"
        assert len(seqs) == 10


async def test_unacked_message_comes_back_after_its_invisible_duration(grpc_stack: Any) -> None:
    topic, group = uniq("TR"), uniq("g")
    await grpc_stack.create_topic(topic)
    sent_ids(await grpc_stack.sdk("produce", topic=topic, count=3, prefix="r"))
    # ack only the second delivery of each message
    got = received(await grpc_stack.sdk("simple", topic=topic, group=group, expect=3, ack_every=2,
                                        invisible_s=2, await_s=1, timeout_s=40))
    per_body: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in got:
        per_body[r["body"]].append(r)
    assert set(per_body) == {"r-0", "r-1", "r-2"}
    for body, recs in per_body.items():
        assert [r["attempt"] for r in recs] == [1, 2], body
        assert recs[1]["message_id"] == recs[0]["message_id"]
        assert recs[1]["t"] - recs[0]["t"] >= 1.9, f"{body} came back before its invisible duration"
    await wait_for(lambda: committed_total(grpc_stack.broker, group, topic, 4) == 3, timeout_s=10,
                   what="offsets committed")


async def test_never_acked_message_moves_to_the_dead_letter_queue(grpc_stack: Any) -> None:
    topic, group = uniq("TD"), uniq("g")
    await grpc_stack.create_topic(topic, queues=1)
    sent_ids(await grpc_stack.sdk("produce", topic=topic, count=1, prefix="d"))
    got = received(await grpc_stack.sdk("simple", topic=topic, group=group, expect=1, ack_every=0,
                                        invisible_s=1, await_s=1, receives_expected=2, timeout_s=30))
    assert [r["attempt"] for r in got] == [1, 2]  # max_delivery_attempts = 2
    store = grpc_stack.broker.store
    await wait_for(lambda: store.get_max_offset_in_queue(f"%DLQ%{group}", 0) == 1, timeout_s=15,
                   what="message in the dead-letter queue")
    await wait_for(lambda: committed_total(grpc_stack.broker, group, topic, 1) == 1, timeout_s=10,
                   what="offset past the dead letter")


async def test_delivery_timestamp_delays_the_message(grpc_stack: Any) -> None:
    topic, group = uniq("TT"), uniq("g")
    await grpc_stack.create_topic(topic)
    produced = await grpc_stack.sdk("produce", topic=topic, count=1, prefix="t", delay_s=5)
    sent_at = next(r["t"] for r in produced if r.get("ok"))
    got = received(await grpc_stack.sdk("simple", topic=topic, group=group, expect=1, await_s=2, timeout_s=30))
    assert len(got) == 1
    delay_s = got[0]["t"] - sent_at
    # the SDK's timestamp has whole seconds (4..5 s ahead of the send; delivered at it, test_grpc_timer.py)
    assert 3.9 <= delay_s <= 9, delay_s


async def test_remoting_producer_to_simple_consumer(grpc_stack: Any) -> None:
    topic, group = uniq("TI"), uniq("g")
    await grpc_stack.create_topic(topic)
    async with Producer(grpc_stack.namesrv.addr, "pg4") as producer:
        for i in range(10):
            msg = Message(topic, f"x-{i}".encode(), properties={"TAGS": "TagX", "KEYS": f"key{i}", "p": "v"})
            await producer.send(msg)
    got = received(await grpc_stack.sdk("simple", topic=topic, group=group, expect=10, timeout_s=60))
    assert sorted(r["body"] for r in got) == sorted(f"x-{i}" for i in range(10))
    assert all(r["tag"] == "TagX" and r["props"] == {"p": "v"} for r in got)
    assert sorted(r["keys"][0] for r in got) == sorted(f"key{i}" for i in range(10))


async def test_sdk5_producer_to_remoting_push_consumer(grpc_stack: Any) -> None:
    topic = uniq("TP")
    await grpc_stack.create_topic(topic)
    got: list[MessageExt] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(grpc_stack.namesrv.addr, uniq("cg4"), consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                            rebalance_interval_ms=500, heartbeat_broker_interval_ms=1000,
                            poll_name_server_interval_ms=1000)
    consumer.subscribe(topic, "TagP")
    consumer.register_message_listener(listener)
    await consumer.start()
    try:
        ids = sent_ids(await grpc_stack.sdk("produce", topic=topic, count=10, prefix="p", tag="TagP"))
        await wait_for(lambda: len(got) >= 10, timeout_s=30, what="10 messages consumed")
    finally:
        await consumer.close()
    assert sorted(m.body.decode() for m in got) == sorted(f"p-{i}" for i in range(10))
    assert {m.properties["UNIQ_KEY"] for m in got} == set(ids.values())
    assert all(m.tags == "TagP" for m in got)


async def test_sdk5_push_consumer(grpc_stack: Any) -> None:
    topic, group = uniq("TQ"), uniq("g")
    await grpc_stack.create_topic(topic)
    sent_ids(await grpc_stack.sdk("produce", topic=topic, count=10, prefix="q"))
    got = received(await grpc_stack.sdk("push", topic=topic, group=group, expect=10, timeout_s=60))
    assert sorted(r["body"] for r in got) == sorted(f"q-{i}" for i in range(10))
    await wait_for(lambda: committed_total(grpc_stack.broker, group, topic, 4) == 10, timeout_s=15,
                   what="offsets committed")


async def test_every_rpc_answers_cleanly(proxy_server: Any) -> None:
    """No SDK: the generated stubs. Bad input answers a v2 status."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy_server.port}") as channel:
        stub = sgrpc.MessagingServiceStub(channel)
        offset = await asyncio.wait_for(stub.GetOffset(spb.GetOffsetRequest(), timeout=5), 10)
        assert offset.status.code == pb.ILLEGAL_CONSUMER_GROUP
        route = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="NoSuchTopic")), timeout=5)
        assert route.status.code == pb.TOPIC_NOT_FOUND
        ack = await stub.AckMessage(spb.AckMessageRequest(
            group=pb.Resource(name="g"), topic=pb.Resource(name="T"),
            entries=[spb.AckMessageEntry(message_id="x", receipt_handle="garbage")]), timeout=5)
        assert ack.status.code == pb.INVALID_RECEIPT_HANDLE
        send = await stub.SendMessage(spb.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="T"))]),
                                      timeout=5)
        assert send.status.code == pb.ILLEGAL_MESSAGE_ID


async def test_proxy_restart_keeps_acknowledged_progress(grpc_stack: Any, namesrv: Any) -> None:
    """What survives a proxy restart is the consumer offset: the first unacknowledged message and all after
    it come again (at least once), nothing below it does."""
    from ferrymq.proxy.config import ProxyConfig
    from ferrymq.proxy.server import ProxyServer

    topic, group = uniq("TS"), uniq("g")
    await grpc_stack.create_topic(topic, queues=1)
    sent_ids(await grpc_stack.sdk("produce", topic=topic, count=6, prefix="s"))
    first = received(await grpc_stack.sdk("simple", topic=topic, group=group, expect=6, receives_expected=6,
                                          ack_bodies=["s-0", "s-1", "s-2", "s-4"], invisible_s=60, timeout_s=30))
    assert sorted(r["body"] for r in first) == [f"s-{i}" for i in range(6)]
    await grpc_stack.proxy.stop()
    assert grpc_stack.broker.offsets.query(group, topic, 0) == 3
    grpc_stack.proxy = ProxyServer(ProxyConfig(namesrv.addr, listen_port=0))
    await grpc_stack.proxy.start()
    try:
        again = received(await grpc_stack.sdk("simple", topic=topic, group=group, expect=3, await_s=1,
                                              timeout_s=30))
    finally:
        await grpc_stack.proxy.stop()
    assert sorted(r["body"] for r in again) == ["s-3", "s-4", "s-5"]
    assert all(r["attempt"] == 1 for r in again)
