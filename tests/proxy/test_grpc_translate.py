"""The sans-IO parts of the gRPC proxy: message/route/status translation and the pop state, without sockets."""

from __future__ import annotations

import gzip
import hashlib

import pytest

from ferrymq.common.message import MessageExt, host_to_bytes
from ferrymq.common.route import MessageQueue
from ferrymq.errors import BrokerError, RemotingTimeoutError
from ferrymq.proxy import translate as tr
from ferrymq.proxy.pop import MAX_HELD_PER_QUEUE, PopQueue, SerialSource
from ferrymq.proxy.v2 import definition_pb2 as pb

NOW_MS = 1_700_000_000_000


def grpc_message(**system: object) -> pb.Message:
    msg = pb.Message(topic=pb.Resource(name="T"), body=b"hello")
    msg.system_properties.message_id = "01AB"
    for key, value in system.items():
        if key == "keys":
            msg.system_properties.keys.extend(value)  # type: ignore[arg-type]
        elif key == "delivery_timestamp":
            msg.system_properties.delivery_timestamp.CopyFrom(tr.to_timestamp(value))  # type: ignore[arg-type]
        else:
            setattr(msg.system_properties, key, value)
    return msg


def outgoing(msg: pb.Message, **kw: object) -> tr.OutgoingMessage:
    args: dict[str, object] = {"now_ms": NOW_MS, "producer_group": "PG", "max_body_bytes": 1024}
    args.update(kw)
    return tr.to_remoting_message(msg, **args)  # type: ignore[arg-type]


def stored(queue_offset: int, props: dict[str, str] | None = None, body: bytes = b"b") -> MessageExt:
    return MessageExt(topic="T", body=body, flag=0, properties=dict(props or {}), queue_id=1,
                      queue_offset=queue_offset, phy_offset=100 + queue_offset, store_size=0, body_crc=0, sys_flag=0,
                      born_timestamp=NOW_MS - 5, born_host=host_to_bytes("10.0.0.1", 5555), store_timestamp=NOW_MS,
                      store_host=host_to_bytes("127.0.0.1", 10911), reconsume_times=0, prepared_transaction_offset=0)


# ---- 5.x -> 4.x -----------------------------------------------------------------------------------------
def test_normal_message_keeps_id_tag_keys_and_user_properties() -> None:
    msg = grpc_message(tag="TagA", keys=["k1", "k2"])
    msg.user_properties["color"] = "red"
    out = outgoing(msg)
    assert out.message.topic == "T" and out.message.body == b"hello"
    assert out.message.properties == {"color": "red", "UNIQ_KEY": "01AB", "TAGS": "TagA", "KEYS": "k1 k2"}
    assert out.message_group is None and not out.transactional


def test_message_group_becomes_the_sharding_key() -> None:
    out = outgoing(grpc_message(message_group="order-7", message_type=pb.FIFO))
    assert out.message_group == "order-7"
    assert out.message.properties[tr.PROPERTY_SHARDING_KEY] == "order-7"


@pytest.mark.parametrize("ahead_ms", [1, 3_000, 7_200_001, 3 * 86_400_000])
def test_delivery_timestamp_becomes_the_timer_delivery_time_unrounded(ahead_ms: int) -> None:
    out = outgoing(grpc_message(delivery_timestamp=NOW_MS + ahead_ms))
    assert out.message.properties["TIMER_DELIVER_MS"] == str(NOW_MS + ahead_ms)
    assert out.deliver_ms == NOW_MS + ahead_ms and "DELAY" not in out.message.properties


@pytest.mark.parametrize("ahead_ms", [-1, 0])
def test_a_delivery_timestamp_that_is_due_is_a_plain_send(ahead_ms: int) -> None:
    out = outgoing(grpc_message(delivery_timestamp=NOW_MS + ahead_ms))
    assert "TIMER_DELIVER_MS" not in out.message.properties and out.deliver_ms is None


def test_the_brokers_refusal_of_a_delivery_time_is_illegal_delivery_time() -> None:
    refused = BrokerError(13, "timer message refused: delivery time beyond timerMaxDelaySec: 9 ms ahead")
    assert tr.status_of_error(refused).code == pb.ILLEGAL_DELIVERY_TIME
    assert tr.status_of_error(BrokerError(13, "the message is illegal")).code == pb.BAD_REQUEST
    assert tr.status_of_error(BrokerError(22, "recall failed, no pending timer message")).code == pb.MESSAGE_NOT_FOUND


def test_a_delivered_timer_message_reads_back_as_delay_with_its_time() -> None:
    msg = tr.to_grpc_message(stored(0, {"TIMER_DELIVER_MS": str(NOW_MS + 3_000), "UNIQ_KEY": "u"}))
    assert msg.system_properties.message_type == pb.DELAY
    assert tr.timestamp_ms(msg.system_properties.delivery_timestamp) == NOW_MS + 3_000
    assert "TIMER_DELIVER_MS" not in msg.user_properties


@pytest.mark.parametrize(("msg_kw", "code"), [
    ({"message_id": ""}, pb.ILLEGAL_MESSAGE_ID),
    ({"tag": "a|b"}, pb.ILLEGAL_MESSAGE_TAG),
    ({"message_group": ""}, pb.ILLEGAL_MESSAGE_GROUP),
])
def test_bad_system_properties_get_their_status(msg_kw: dict[str, object], code: int) -> None:
    with pytest.raises(tr.TranslateError) as info:
        outgoing(grpc_message(**msg_kw))
    assert info.value.code == code


def test_reserved_user_property_empty_and_large_bodies_are_refused() -> None:
    msg = grpc_message()
    msg.user_properties["DELAY"] = "3"
    with pytest.raises(tr.TranslateError) as info:
        outgoing(msg)
    assert info.value.code == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
    empty = grpc_message()
    empty.body = b""
    with pytest.raises(tr.TranslateError) as info:
        outgoing(empty)
    assert info.value.code == pb.MESSAGE_BODY_EMPTY
    big = grpc_message()
    big.body = b"x" * 1025
    with pytest.raises(tr.TranslateError) as info:
        outgoing(big)
    assert info.value.code == pb.MESSAGE_BODY_TOO_LARGE


def test_gzip_body_is_inflated_and_a_broken_one_refused() -> None:
    msg = grpc_message(body_encoding=pb.GZIP)
    msg.body = gzip.compress(b"payload")
    assert outgoing(msg).message.body == b"payload"
    msg.body = b"not gzip"
    with pytest.raises(tr.TranslateError) as info:
        outgoing(msg)
    assert info.value.code == pb.MESSAGE_CORRUPTED


def test_transactional_message_is_prepared_under_the_proxy_group() -> None:
    out = outgoing(grpc_message(message_type=pb.TRANSACTION))
    assert out.transactional
    assert out.message.properties["TRAN_MSG"] == "true" and out.message.properties["PGROUP"] == "PG"


# ---- 4.x -> 5.x -----------------------------------------------------------------------------------------
def test_stored_message_translates_with_pop_fields() -> None:
    ext = stored(7, {"UNIQ_KEY": "01CD", "TAGS": "TagB", "KEYS": "a b", "__SHARDINGKEY": "g1", "color": "blue"})
    msg = tr.to_grpc_message(ext, receipt_handle="h", invisible_ms=15_000, delivery_attempt=2)
    sp = msg.system_properties
    assert msg.topic.name == "T" and msg.body == b"b"
    assert dict(msg.user_properties) == {"color": "blue"}
    assert (sp.message_id, sp.tag, list(sp.keys), sp.message_group) == ("01CD", "TagB", ["a", "b"], "g1")
    assert sp.message_type == pb.FIFO
    assert sp.body_encoding == pb.IDENTITY  # the Python SDK drops a message whose encoding is unspecified
    assert (sp.queue_id, sp.queue_offset, sp.receipt_handle, sp.delivery_attempt) == (1, 7, "h", 2)
    assert tr.duration_ms(sp.invisible_duration) == 15_000
    assert sp.store_host == "127.0.0.1:10911" and sp.born_host == "10.0.0.1"
    assert tr.timestamp_ms(sp.born_timestamp) == NOW_MS - 5


def test_stored_message_carries_the_body_digest_every_sdk_checks() -> None:
    """The Node 5.x client reads system_properties.body_digest unconditionally (no digest: every receive
    fails); MD5 in upper-case hex is what the Python, Node and Java SDKs compute alike."""
    digest = tr.to_grpc_message(stored(3)).system_properties.body_digest
    assert (digest.type, digest.checksum) == (pb.MD5, hashlib.md5(b"b").hexdigest().upper())


def test_half_message_reads_as_the_message_its_producer_sent() -> None:
    ext = stored(4, {"UNIQ_KEY": "01AB", "REAL_TOPIC": "Orders", "REAL_QID": "3", "TRAN_MSG": "true",
                     "PGROUP": "FERRYMQ_GRPC_PROXY", "TAGS": "TagT"})
    msg = tr.half_to_grpc_message(ext)
    sp = msg.system_properties
    assert (msg.topic.name, sp.queue_id, sp.message_id, sp.tag) == ("Orders", 3, "01AB", "TagT")
    assert sp.message_type == pb.TRANSACTION
    assert dict(msg.user_properties) == {}


def test_transaction_id_is_bound_to_topic_and_key() -> None:
    tid = tr.TransactionId(stored(5).offset_msg_id, 12)
    text = tid.encode(b"k1", "T")
    assert tr.TransactionId.decode(text, b"k1", "T") == tid
    for key, topic, bad in ((b"k2", "T", text), (b"k1", "U", text), (b"k1", "T", "x.y"),
                            (b"k1", "T", text.rsplit(".", 1)[0])):
        with pytest.raises(tr.TranslateError) as info:
            tr.TransactionId.decode(bad, key, topic)
        assert info.value.code == pb.INVALID_TRANSACTION_ID


def test_message_without_uniq_key_uses_the_offset_id() -> None:
    ext = stored(3)
    assert tr.to_grpc_message(ext).system_properties.message_id == ext.offset_msg_id


# ---- routes, statuses, handles ---------------------------------------------------------------------------------
def test_route_queues_carry_permissions_and_the_proxy_endpoint() -> None:
    ep = tr.endpoints_of("127.0.0.1", 8081)
    queues = tr.route_queues(pb.Resource(name="T"), [("b", 0, 6), ("b", 1, 4), ("b", 2, 2), ("b", 3, 0)], ep)
    assert [q.permission for q in queues] == [pb.READ_WRITE, pb.READ, pb.WRITE, pb.NONE]
    assert all(q.broker.endpoints.addresses[0].port == 8081 for q in queues)
    assert set(queues[0].accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}
    assert tr.endpoints_of("proxy.example", 1).scheme == pb.DOMAIN_NAME


def test_fifo_queue_is_stable_per_group() -> None:
    mqs = [MessageQueue("T", "b", i) for i in range(4)]
    assert tr.fifo_queue("g1", mqs) == tr.fifo_queue("g1", list(mqs))
    assert len({tr.fifo_queue(f"g{i}", mqs) for i in range(40)}) > 1
    with pytest.raises(tr.TranslateError):
        tr.fifo_queue("g1", [])


def test_status_of_errors() -> None:
    assert tr.status_of_error(BrokerError(17, "no topic")).code == pb.TOPIC_NOT_FOUND
    assert tr.status_of_error(BrokerError(16, "")).code == pb.FORBIDDEN
    assert tr.status_of_error(BrokerError(999, "")).code == pb.INTERNAL_SERVER_ERROR
    assert tr.status_of_error(RemotingTimeoutError("slow")).code == pb.PROXY_TIMEOUT
    assert tr.status_of_error(ValueError("x")).code == pb.INTERNAL_SERVER_ERROR


def test_receipt_handle_round_trip_and_malformed_ones() -> None:
    handle = tr.ReceiptHandle("ab12", 9, 3, 41, "broker.a.1")
    assert tr.ReceiptHandle.decode(handle.encode()) == handle
    for bad in ("", "x", "ab.1.2.3", "ab.x.2.3.b", "ab.1.2.3."):
        with pytest.raises(tr.TranslateError) as info:
            tr.ReceiptHandle.decode(bad)
        assert info.value.code == pb.INVALID_RECEIPT_HANDLE


def test_filters() -> None:
    assert tr.filter_of(None) == ("*", "TAG")
    assert tr.filter_of(pb.FilterExpression(type=pb.TAG, expression="A || B")) == ("A || B", "TAG")
    assert tr.filter_of(pb.FilterExpression(type=pb.SQL, expression="a > 1")) == ("a > 1", "SQL92")


# ---- pop state -------------------------------------------------------------------------------------------
def test_pop_delivers_hides_and_redelivers_with_the_next_attempt() -> None:
    pq, serials = PopQueue(0), SerialSource()
    pq.add_pulled([stored(0), stored(1)], 2)
    first, dead = pq.take(1000, 10, 500, 3, serials)
    assert [d.entry.message.queue_offset for d in first] == [0, 1] and [d.attempt for d in first] == [1, 1]
    assert not dead and pq.take(1499, 10, 500, 3, serials) == ([], [])
    assert pq.ack(1, first[1].serial)
    again, _ = pq.take(1500, 10, 500, 3, serials)
    assert [(d.entry.message.queue_offset, d.attempt) for d in again] == [(0, 2)]
    assert not pq.ack(0, first[0].serial), "a handle of an earlier delivery must not ack"
    assert pq.ack(0, again[0].serial)
    assert pq.commit_offset() == 2


def test_commit_offset_stops_at_the_first_unacked_message() -> None:
    pq, serials = PopQueue(10), SerialSource()
    pq.add_pulled([stored(10), stored(11), stored(13)], 14)  # 12 filtered out by the broker
    taken, _ = pq.take(0, 10, 1000, 5, serials)
    pq.ack(11, taken[1].serial)
    pq.ack(13, taken[2].serial)
    assert pq.commit_offset() == 10
    pq.ack(10, taken[0].serial)
    assert pq.commit_offset() == 14


def test_out_of_attempts_comes_back_as_dead_until_removed() -> None:
    pq, serials = PopQueue(0), SerialSource()
    pq.add_pulled([stored(0)], 1)
    pq.take(0, 1, 100, 2, serials)
    pq.take(100, 1, 100, 2, serials)
    taken, dead = pq.take(200, 1, 100, 2, serials)
    assert taken == [] and [e.message.queue_offset for e in dead] == [0]
    assert pq.take(250, 1, 100, 2, serials) == ([], [])  # not offered again while it moves
    pq.remove(0)
    assert pq.commit_offset() == 1


def test_change_invisible_moves_the_deadline_and_renews_the_handle() -> None:
    pq, serials = PopQueue(0), SerialSource()
    pq.add_pulled([stored(0)], 1)
    (d,), _ = pq.take(0, 1, 100, 5, serials)
    new_serial = pq.change_invisible(0, d.serial, 5000, serials)
    assert new_serial is not None and new_serial != d.serial
    assert pq.take(4999, 1, 100, 5, serials) == ([], [])
    assert pq.change_invisible(0, d.serial, 1, serials) is None
    assert not pq.ack(0, d.serial) and pq.ack(0, new_serial)


def test_fifo_queue_hands_out_nothing_while_a_batch_is_out() -> None:
    pq, serials = PopQueue(0, fifo=True), SerialSource()
    pq.add_pulled([stored(i) for i in range(4)], 4)
    batch, _ = pq.take(0, 2, 1000, 5, serials)
    assert [d.entry.message.queue_offset for d in batch] == [0, 1]
    assert pq.take(10, 2, 1000, 5, serials) == ([], [])
    pq.ack(0, batch[0].serial)
    assert pq.take(10, 2, 1000, 5, serials) == ([], []), "1 is still out"
    pq.ack(1, batch[1].serial)
    nxt, _ = pq.take(10, 5, 1000, 5, serials)
    assert [d.entry.message.queue_offset for d in nxt] == [2, 3]


def test_fifo_redelivers_in_order_after_expiry() -> None:
    pq, serials = PopQueue(0, fifo=True), SerialSource()
    pq.add_pulled([stored(i) for i in range(3)], 3)
    pq.take(0, 3, 100, 5, serials)
    again, _ = pq.take(100, 3, 100, 5, serials)
    assert [(d.entry.message.queue_offset, d.attempt) for d in again] == [(0, 2), (1, 2), (2, 2)]


def test_reset_pull_offset_drops_what_the_broker_no_longer_has() -> None:
    pq = PopQueue(0)
    pq.add_pulled([stored(0), stored(1)], 2)
    pq.reset_pull_offset(5)
    assert pq.entries == {} and pq.commit_offset() == 5


def test_room_is_bounded() -> None:
    pq = PopQueue(0)
    pq.add_pulled([stored(i) for i in range(MAX_HELD_PER_QUEUE)], MAX_HELD_PER_QUEUE)
    assert pq.room() == 0


def test_fresh_counts_the_never_delivered_entries() -> None:
    """``fresh`` drives the receive prefetch: pulled and never delivered entries, kept right through takes,
    acks, removals and an offset reset."""
    pq = PopQueue(0)
    pq.add_pulled([stored(i) for i in range(5)], 5)
    assert pq.fresh == 5
    serials = SerialSource()
    taken, _ = pq.take(NOW_MS, 2, 1_000, 3, serials)
    assert pq.fresh == 3
    assert pq.ack(taken[0].entry.message.queue_offset, taken[0].serial)
    assert pq.fresh == 3  # an acked delivered entry was not fresh
    pq.remove(4)  # a fresh one
    assert pq.fresh == 2
    pq.take(NOW_MS + 5_000, 10, 1_000, 3, serials)  # redelivers 1, delivers 2 and 3
    assert pq.fresh == 0
    pq.add_pulled([stored(5), stored(6)], 7)
    pq.reset_pull_offset(6)
    assert pq.fresh == 1 and list(pq.entries) == [6]
