"""5.x timer messages through the gRPC endpoint: SendMessage with a delivery timestamp (the real 5.x SDK; raw
stubs for the recall handle, which the SDK does not expose) and RecallMessage."""

from __future__ import annotations

import time
import uuid
from typing import Any

import grpc

from ferrymq.common.message_codec import iter_records
from ferrymq.common.timer import TIMER_TOPIC
from ferrymq.proxy import translate as tr
from ferrymq.proxy.v2 import definition_pb2 as pb
from ferrymq.proxy.v2 import service_pb2 as spb
from ferrymq.proxy.v2 import service_pb2_grpc as sgrpc
from support.aio import wait_for


def _stored(broker: Any, topic: str) -> list[Any]:
    return list(iter_records(broker.store.get_message("g", topic, 0, 0, 10, None).body()))


def uniq(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def _message(topic: str, deliver_ms: int) -> pb.Message:
    msg = pb.Message(topic=pb.Resource(name=topic), body=b"timed")
    msg.system_properties.message_id = uuid.uuid4().hex.upper()
    msg.system_properties.message_type = pb.DELAY
    msg.system_properties.delivery_timestamp.CopyFrom(tr.to_timestamp(deliver_ms))
    return msg


async def test_sdk_delivery_timestamp_is_kept_to_the_millisecond_not_rounded_to_a_level(grpc_stack: Any) -> None:
    """The 5.x Python SDK sends a whole-second timestamp 2..3 s ahead (delay_s=3); the message waits in the timer
    topic and is delivered at that time (before, it waited for the 5 s delay level), never earlier. A plain send
    first warms the SDK's first-send path up (on a loaded machine it took seconds, eating the delay)."""
    topic, group = uniq("TT"), uniq("g")
    await grpc_stack.create_topic(topic, queues=1)
    await grpc_stack.sdk("produce", topic=topic, count=1, prefix="w")
    await grpc_stack.sdk("produce", topic=topic, count=1, prefix="t", delay_s=3)
    got = [r for r in await grpc_stack.sdk("simple", topic=topic, group=group, expect=2, await_s=2, timeout_s=30)
           if r.get("body") == "t-0"]
    assert len(got) == 1
    broker = grpc_stack.broker
    (stored,) = [m for m in _stored(broker, topic) if m.body == b"t-0"]
    deliver_ms = int(stored.properties["TIMER_DELIVER_MS"])
    timer_units = broker.store.get_consume_queue_units(TIMER_TOPIC, 0, 0, 1_000)
    waited = [broker.store.look_message_by_offset(phy) for phy, _, _ in timer_units]
    assert [m.properties["TIMER_OUT_MS"] for m in waited if m.properties.get("REAL_TOPIC") == topic] == \
        [str(deliver_ms)]  # it went through the timer topic
    assert stored.store_timestamp >= deliver_ms  # not early
    assert got[0]["t"] * 1000 >= deliver_ms
    # on time to the timer's precision (a loop timer at the delivery time; 500 ms is generous for a loaded host)
    assert stored.store_timestamp - deliver_ms < 500, stored.store_timestamp - deliver_ms


async def test_recall_message_stops_a_pending_delivery(grpc_stack: Any) -> None:
    topic = uniq("TR")
    await grpc_stack.create_topic(topic, queues=1)
    broker = grpc_stack.broker
    async with grpc.aio.insecure_channel(grpc_stack.endpoints) as channel:
        stub = sgrpc.MessagingServiceStub(channel)
        warm = _message(topic, 0)  # a plain send first: routes and connections (seconds on a loaded host)
        warm.system_properties.ClearField("delivery_timestamp")
        assert (await stub.SendMessage(spb.SendMessageRequest(messages=[warm]), timeout=30)).status.code == pb.OK
        deliver_ms = int(time.time() * 1000) + 2_000
        both = await stub.SendMessage(spb.SendMessageRequest(messages=[_message(topic, deliver_ms),
                                                                       _message(topic, deliver_ms)]), timeout=10)
        assert both.status.code == pb.OK, both.status.message
        keep, entry = both.entries
        assert entry.recall_handle
        recall = spb.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=entry.recall_handle)
        answer = await stub.RecallMessage(recall, timeout=10)
        assert answer.status.code == pb.OK, answer.status.message
        assert answer.message_id == entry.message_id
        again = await stub.RecallMessage(recall, timeout=10)
        assert again.status.code == pb.MESSAGE_NOT_FOUND, again.status.message
        bad = await stub.RecallMessage(spb.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle="??"),
                                       timeout=10)
        assert bad.status.code == pb.BAD_REQUEST
        too_far = _message(topic, int(time.time() * 1000) + (broker.config.timer_max_delay_sec + 60) * 1000)
        refused = await stub.SendMessage(spb.SendMessageRequest(messages=[too_far]), timeout=10)
        assert refused.status.code == pb.ILLEGAL_DELIVERY_TIME, refused.status.message

    await wait_for(lambda: broker.store.get_max_offset_in_queue(topic, 0) == 2, timeout_s=10,
                   what="the kept message delivered")
    # the recalled one (and its marker) are done by then: nothing pending, nothing else delivered
    await wait_for(lambda: broker.timer.pending_count == 0, timeout_s=5, what="timer queue drained")
    assert [m.properties["UNIQ_KEY"] for m in _stored(broker, topic)] == [warm.system_properties.message_id,
                                                                            keep.message_id]
    assert broker.store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 3  # two messages and the recall marker
