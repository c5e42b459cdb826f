"""The 5.x pull consumer's RPCs (PullMessage, UpdateOffset, GetOffset, QueryOffset) and SyncLiteSubscription
through the generated stubs against an in-process proxy, name server and broker. (The Python SDK has no pull
consumer: these are the calls the Java SDK's PullConsumer makes.)"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_grpc_auth_tls import ACL_TEXT, CONSUMER, GROUP, PRODUCER, TOPIC, metadata

from ferrymq.proxy.pull import LITE_TOPICS_UNSUPPORTED, MAX_PULL_BATCH
from ferrymq.proxy.v2 import definition_pb2 as pb
from ferrymq.proxy.v2 import service_pb2 as spb
from ferrymq.proxy.v2 import service_pb2_grpc as sgrpc
from support.aio import wait_for

#: deadline of one call (generous: the CI machine is shared)
RPC_TIMEOUT_S = 60
#: a long poll that finds nothing answers after this long
SHORT_POLL_MS = 300
#: a long poll woken by a message answers well before this long
LONG_POLL_MS = 10_000


def uniq(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


async def create_topic(namesrv: Any, broker: Any, proxy: Any, topic: str, queues: int = 2) -> None:
    from ferrymq.client.admin import Admin

    async with Admin(namesrv.addr) as admin:
        await admin.create_topic(topic, broker_addr=broker.broker_addr, read_queue_nums=queues,
                                 write_queue_nums=queues)

    async def routed() -> bool:
        try:
            await proxy.service.instance.update_route(topic)
        except Exception:
            return False
        return True

    await wait_for(routed, timeout_s=30, what=f"route of {topic}")


@pytest.fixture
async def stub(proxy_server: Any) -> AsyncIterator[sgrpc.MessagingServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy_server.port}") as channel:
        yield sgrpc.MessagingServiceStub(channel)


def message(topic: str, body: str, tag: str = "") -> pb.Message:
    out = pb.Message(topic=pb.Resource(name=topic), body=body.encode(), system_properties=pb.SystemProperties(
        message_id=uuid.uuid4().hex.upper(), body_encoding=pb.IDENTITY, message_type=pb.NORMAL))
    if tag:
        out.system_properties.tag = tag
    return out


async def send(stub: sgrpc.MessagingServiceStub, topic: str, bodies: list[str], tag: str = "",
               meta: Any = None) -> None:
    for body in bodies:
        answer = await stub.SendMessage(spb.SendMessageRequest(messages=[message(topic, body, tag)]),
                                        metadata=meta, timeout=RPC_TIMEOUT_S)
        assert answer.status.code == pb.OK, answer.status


async def queues_of(stub: sgrpc.MessagingServiceStub, topic: str, meta: Any = None) -> list[pb.MessageQueue]:
    route = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=meta, timeout=RPC_TIMEOUT_S)
    assert route.status.code == pb.OK, route.status
    return [q for q in route.message_queues if q.permission in (pb.READ, pb.READ_WRITE)]


async def pull(stub: sgrpc.MessagingServiceStub, group: str, mq: pb.MessageQueue, queue_offset: int, *,
               batch: int = 0, poll_ms: int = 0, expression: pb.FilterExpression | None = None,
               meta: Any = None) -> list[spb.PullMessageResponse]:
    request = spb.PullMessageRequest(group=pb.Resource(name=group), message_queue=mq, offset=queue_offset,
                                     batch_size=batch, filter_expression=expression)
    if poll_ms:
        request.long_polling_timeout.FromMilliseconds(poll_ms)
    return [r async for r in stub.PullMessage(request, metadata=meta, timeout=RPC_TIMEOUT_S)]


async def query_offset(stub: sgrpc.MessagingServiceStub, mq: pb.MessageQueue, policy: int,
                       timestamp_ms: int | None = None, meta: Any = None) -> spb.QueryOffsetResponse:
    request = spb.QueryOffsetRequest(message_queue=mq, query_offset_policy=policy)  # type: ignore[arg-type]
    if timestamp_ms is not None:
        request.timestamp.FromMilliseconds(timestamp_ms)
    return await stub.QueryOffset(request, metadata=meta, timeout=RPC_TIMEOUT_S)


def split(answers: list[spb.PullMessageResponse]) -> tuple[pb.Status, list[pb.Message], int | None]:
    """(status, messages, next offset) of a PullMessage stream, checking its shape: the status first, then
    the messages, then the next offset last."""
    assert answers and answers[0].WhichOneof("content") == "status", answers
    messages = [a.message for a in answers[1:] if a.WhichOneof("content") == "message"]
    kinds = [a.WhichOneof("content") for a in answers[1:]]
    assert kinds == ["message"] * len(messages) + ["next_offset"] * (len(kinds) - len(messages)), kinds
    assert kinds.count("next_offset") <= 1, kinds
    next_offset = answers[-1].next_offset if kinds and kinds[-1] == "next_offset" else None
    return answers[0].status, messages, next_offset


async def test_pull_consumer_reads_every_queue_from_the_beginning_with_filters_and_offsets(
        stub: sgrpc.MessagingServiceStub, namesrv: Any, broker: Any, proxy_server: Any) -> None:
    topic, group = uniq("TP"), uniq("gp")
    await create_topic(namesrv, broker, proxy_server, topic)
    await send(stub, topic, [f"a-{i}" for i in range(6)], tag="A")
    await send(stub, topic, [f"b-{i}" for i in range(6)], tag="B")
    got: list[str] = []
    tagged_a: list[str] = []
    mqs = await queues_of(stub, topic)

    async def all_dispatched() -> bool:  # the broker makes stored messages pullable asynchronously
        return sum([(await query_offset(stub, mq, pb.END)).offset for mq in mqs]) == 12

    await wait_for(all_dispatched, timeout_s=30, what="every message in its queue")
    for mq in mqs:
        begin = await query_offset(stub, mq, pb.BEGINNING)
        end = await query_offset(stub, mq, pb.END)
        assert begin.status.code == end.status.code == pb.OK
        assert begin.offset == 0 and end.offset > 0
        st, messages, next_offset = split(await pull(stub, group, mq, begin.offset))
        assert st.code == pb.OK, st
        assert next_offset == end.offset
        assert [m.system_properties.queue_offset for m in messages] == list(range(end.offset))
        assert all(m.system_properties.body_digest.checksum for m in messages)
        got.extend(m.body.decode() for m in messages)
        # a tag filter: only A, and the offset moves past the B ones all the same
        st, messages, next_offset = split(await pull(stub, group, mq, 0, expression=pb.FilterExpression(
            type=pb.TAG, expression="A")))
        if messages:
            assert st.code == pb.OK
        tagged_a.extend(m.body.decode() for m in messages)
        assert {m.system_properties.tag for m in messages} <= {"A"}
        # at the end: nothing new, the same next offset
        st, messages, next_offset = split(await pull(stub, group, mq, end.offset))
        assert st.code == pb.MESSAGE_NOT_FOUND and not messages and next_offset == end.offset
        # offsets of the group on this queue: none yet (the broker answers 0 while the queue's first message
        # is in memory, as RocketMQ's does), then what UpdateOffset wrote
        req = spb.GetOffsetRequest(group=pb.Resource(name=group), message_queue=mq)
        before = await stub.GetOffset(req, timeout=RPC_TIMEOUT_S)
        assert (before.status.code, before.offset) in ((pb.OK, 0), (pb.OFFSET_NOT_FOUND, 0)), before
        update = await stub.UpdateOffset(spb.UpdateOffsetRequest(group=pb.Resource(name=group), message_queue=mq,
                                                                 offset=end.offset), timeout=RPC_TIMEOUT_S)
        assert update.status.code == pb.OK, update.status
        answer = await stub.GetOffset(req, timeout=RPC_TIMEOUT_S)
        assert answer.status.code == pb.OK and answer.offset == end.offset
        # the same offset as 4.x clients see it
        from ferrymq.common.route import MessageQueue

        stored = await proxy_server.service._core(group).fetch_committed_offset(
            MessageQueue(topic, mq.broker.name, mq.id))
        assert stored == end.offset
        # timestamps: before every message is the first offset, after every message the end
        assert (await query_offset(stub, mq, pb.TIMESTAMP, 0)).offset == 0
        late = await query_offset(stub, mq, pb.TIMESTAMP, int(time.time() * 1000) + 3_600_000)
        assert late.status.code == pb.OK and late.offset == end.offset
    assert sorted(got) == sorted([f"a-{i}" for i in range(6)] + [f"b-{i}" for i in range(6)])
    assert sorted(tagged_a) == [f"a-{i}" for i in range(6)]


async def test_pull_batches_are_bounded(stub: sgrpc.MessagingServiceStub, namesrv: Any, broker: Any,
                                        proxy_server: Any) -> None:
    topic, group = uniq("TB"), uniq("gb")
    await create_topic(namesrv, broker, proxy_server, topic, queues=1)
    await send(stub, topic, [f"m-{i}" for i in range(MAX_PULL_BATCH + 8)])
    [mq] = await queues_of(stub, topic)

    async def all_dispatched() -> bool:
        return (await query_offset(stub, mq, pb.END)).offset == MAX_PULL_BATCH + 8

    await wait_for(all_dispatched, timeout_s=30, what="every message in the queue")
    st, messages, next_offset = split(await pull(stub, group, mq, 0, batch=5))
    assert st.code == pb.OK and len(messages) == 5 and next_offset == 5
    st, messages, next_offset = split(await pull(stub, group, mq, 5, batch=10_000))
    assert st.code == pb.OK and len(messages) == MAX_PULL_BATCH and next_offset == 5 + MAX_PULL_BATCH


async def test_pull_long_polls_until_a_message_comes(stub: sgrpc.MessagingServiceStub, namesrv: Any, broker: Any,
                                                     proxy_server: Any) -> None:
    topic, group = uniq("TL"), uniq("gl")
    await create_topic(namesrv, broker, proxy_server, topic, queues=1)
    [mq] = await queues_of(stub, topic)
    # nothing comes: the answer waits the polling time, then says so
    started = time.monotonic()
    st, messages, next_offset = split(await pull(stub, group, mq, 0, poll_ms=SHORT_POLL_MS))
    assert st.code == pb.MESSAGE_NOT_FOUND and not messages and next_offset == 0
    assert time.monotonic() - started >= SHORT_POLL_MS / 1000 * 0.9
    # a message sent while the pull waits ends the wait
    waiting = asyncio.create_task(pull(stub, group, mq, 0, poll_ms=LONG_POLL_MS))
    await wait_for(lambda: broker.long_polling.parked_count == 1, timeout_s=30, what="the broker to hold the pull")
    await send(stub, topic, ["late"])
    sent = time.monotonic()
    st, messages, next_offset = split(await asyncio.wait_for(waiting, 30))
    assert st.code == pb.OK and [m.body for m in messages] == [b"late"] and next_offset == 1
    assert time.monotonic() - sent < LONG_POLL_MS / 1000 / 2


@pytest.mark.parametrize("broker_settings", [{"enable_property_filter": True}])
async def test_bad_pull_and_offset_requests_get_their_status(stub: sgrpc.MessagingServiceStub, namesrv: Any,
                                                             broker: Any, proxy_server: Any) -> None:
    topic, group = uniq("TX"), uniq("gx")
    await create_topic(namesrv, broker, proxy_server, topic, queues=1)
    await send(stub, topic, ["x-0", "x-1"])
    [mq] = await queues_of(stub, topic)

    async def all_dispatched() -> bool:
        return (await query_offset(stub, mq, pb.END)).offset == 2

    await wait_for(all_dispatched, timeout_s=30, what="every message in the queue")
    # beyond the end of the queue: ILLEGAL_OFFSET and where to go on (the broker's rule, RocketMQ's: the
    # queue's first offset while nothing of it was deleted yet)
    st, messages, next_offset = split(await pull(stub, group, mq, 50))
    assert st.code == pb.ILLEGAL_OFFSET and not messages and next_offset == 0, st
    st, _, next_offset = split(await pull(stub, group, mq, -1))
    assert st.code == pb.ILLEGAL_OFFSET and next_offset is None
    st, _, _ = split(await pull(stub, "", mq, 0))
    assert st.code == pb.ILLEGAL_CONSUMER_GROUP
    other_broker = pb.MessageQueue(topic=mq.topic, id=0, broker=pb.Broker(name="no-such-broker"))
    st, _, _ = split(await pull(stub, group, other_broker, 0))
    assert st.code == pb.BAD_REQUEST and "no-such-broker" in st.message
    no_queue = pb.MessageQueue(topic=mq.topic, id=7, broker=mq.broker)
    st, _, _ = split(await pull(stub, group, no_queue, 0))
    assert st.code == pb.BAD_REQUEST
    missing = pb.MessageQueue(topic=pb.Resource(name=uniq("Missing")), id=0, broker=mq.broker)
    st, _, _ = split(await pull(stub, group, missing, 0))
    assert st.code == pb.TOPIC_NOT_FOUND
    st, _, _ = split(await pull(stub, group, mq, 0, expression=pb.FilterExpression(type=pb.SQL, expression="a >")))
    assert st.code == pb.ILLEGAL_FILTER_EXPRESSION, st
    st, messages, _ = split(await pull(stub, group, mq, 0, expression=pb.FilterExpression(
        type=pb.SQL, expression="TAGS = 'x'")))
    assert st.code == pb.MESSAGE_NOT_FOUND and not messages, st
    assert (await query_offset(stub, mq, pb.TIMESTAMP)).status.code == pb.BAD_REQUEST  # no timestamp
    assert (await query_offset(stub, mq, 99)).status.code == pb.BAD_REQUEST
    assert (await query_offset(stub, missing, pb.END)).status.code == pb.TOPIC_NOT_FOUND
    update = await stub.UpdateOffset(spb.UpdateOffsetRequest(group=pb.Resource(name=group), message_queue=mq,
                                                             offset=-5), timeout=RPC_TIMEOUT_S)
    assert update.status.code == pb.ILLEGAL_OFFSET
    get = await stub.GetOffset(spb.GetOffsetRequest(message_queue=mq), timeout=RPC_TIMEOUT_S)
    assert get.status.code == pb.ILLEGAL_CONSUMER_GROUP


async def test_sync_lite_subscription_is_declined_with_a_status(stub: sgrpc.MessagingServiceStub) -> None:
    answer = await stub.SyncLiteSubscription(spb.SyncLiteSubscriptionRequest(
        action=pb.COMPLETE_ADD, topic=pb.Resource(name="Parent"), group=pb.Resource(name="g"),
        lite_topic_set=["a"]), timeout=RPC_TIMEOUT_S)
    assert answer.status.code == pb.NOT_IMPLEMENTED
    assert answer.status.message == LITE_TOPICS_UNSUPPORTED


class TestPullAcl:
    @pytest.fixture
    def proxy_settings(self, tmp_path: Path) -> dict[str, Any]:
        path = tmp_path / "plain_acl.yml"
        path.write_text(ACL_TEXT)
        return {"acl_path": str(path)}

    async def test_pull_rpcs_need_sub_on_topic_and_group(self, stub: sgrpc.MessagingServiceStub, namesrv: Any,
                                                         broker: Any, proxy_server: Any) -> None:
        await create_topic(namesrv, broker, proxy_server, TOPIC, queues=1)
        await send(stub, TOPIC, ["acl-0"], meta=metadata(*PRODUCER))
        [mq] = await queues_of(stub, TOPIC, meta=metadata(*CONSUMER))
        consumer, producer = metadata(*CONSUMER), metadata(*PRODUCER)
        st, messages, _ = split(await pull(stub, GROUP, mq, 0, poll_ms=LONG_POLL_MS, meta=consumer))
        assert st.code == pb.OK and [m.body for m in messages] == [b"acl-0"]
        assert split(await pull(stub, GROUP, mq, 0))[0].code == pb.UNAUTHORIZED
        assert split(await pull(stub, GROUP, mq, 0, meta=producer))[0].code == pb.FORBIDDEN
        st = split(await pull(stub, "otherGroup", mq, 0, meta=consumer))[0]
        assert st.code == pb.FORBIDDEN and "group otherGroup" in st.message
        group = pb.Resource(name=GROUP)
        for meta, code in ((consumer, pb.OK), (producer, pb.FORBIDDEN), (None, pb.UNAUTHORIZED)):
            update = await stub.UpdateOffset(spb.UpdateOffsetRequest(group=group, message_queue=mq, offset=1),
                                             metadata=meta, timeout=RPC_TIMEOUT_S)
            assert update.status.code == code, (meta, update.status)
            get = await stub.GetOffset(spb.GetOffsetRequest(group=group, message_queue=mq), metadata=meta, timeout=RPC_TIMEOUT_S)
            assert get.status.code == code, (meta, get.status)
            assert (await query_offset(stub, mq, pb.END, meta=meta)).status.code == code
            lite = await stub.SyncLiteSubscription(spb.SyncLiteSubscriptionRequest(
                topic=pb.Resource(name=TOPIC), group=group), metadata=meta, timeout=RPC_TIMEOUT_S)
            assert lite.status.code == (pb.NOT_IMPLEMENTED if code == pb.OK else code)
