"""The producer's per-send fast paths answer exactly what the general code answers: ``_build`` (cached field
dicts) vs ``_build_general`` / ``api.build_send``, ``new_uniq_key`` (per-millisecond head, byte table) vs the
spelled-out formula, the inlined round-robin choice of ``_send_with_retries`` vs ``_select``, the inlined
validation / UNIQ_KEY of ``send``, and the latency fault tolerance's inline clock."""

from __future__ import annotations

import asyncio
import itertools
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ferrymq.client.producer as producer_mod
from ferrymq.client import api
from ferrymq.client.fault import LatencyFaultTolerance, not_available_duration_ms
from ferrymq.client.producer import Producer, new_uniq_key
from ferrymq.client.selectors import RoundRobin
from ferrymq.client.values import SendStatus
from ferrymq.common.message import Message, properties_to_string
from ferrymq.common.route import BrokerData, MessageQueue, QueueData, TopicRouteData
from ferrymq.errors import ClientError
from ferrymq.remoting.codec import FLAG_ONEWAY, RemotingCommand, encode
from ferrymq.remoting.connection import Connection
from support.transports import StubTransport

_text = st.text(st.sampled_from("aZ_ 9é\u4e2d\x00{}\"\\"), max_size=8)


def _reference_build(p: Producer, msg: Message, mq: MessageQueue, born_ms: int, oneway: bool) -> RemotingCommand:
    """What ``_build`` made before the fast path: ``api.build_send`` with keywords."""
    import zlib

    from ferrymq.client.config import COMPRESS_LEVEL
    body, sys_flag = msg.body, 0
    if len(body) >= p.compress_msg_body_over_bytes:
        body, sys_flag = zlib.compress(body, COMPRESS_LEVEL), 1
    reconsume, max_reconsume = 0, None
    if msg.topic.startswith("%RETRY%"):
        reconsume = int(msg.properties.get("RECONSUME_TIME", "0") or 0)
        raw = msg.properties.get("MAX_RECONSUME_TIMES")
        max_reconsume = int(raw) if raw else None
    return api.build_send(
        producer_group=p.group, topic=msg.topic, queue_id=mq.queue_id, sys_flag=sys_flag,
        born_timestamp_ms=born_ms, flag=msg.flag, properties=properties_to_string(msg.properties), body=body,
        reconsume_times=reconsume, max_reconsume_times=max_reconsume, broker_name=mq.broker_name,
        default_topic_queue_nums=p.default_topic_queue_nums, oneway=oneway)


@settings(max_examples=300, deadline=None)
@given(
    sends=st.lists(st.tuples(
        st.sampled_from(["T", "Topic_2", "%RETRY%cg"]),  # topic
        st.sampled_from(["broker-a", "broker-b"]),  # broker
        st.integers(0, 40),  # queue id
        st.sampled_from([0, 1, -3, 1 << 40]),  # flag
        st.dictionaries(_text, st.one_of(_text, st.none()), max_size=3),  # properties
        st.sampled_from([1, 100, 5000]),  # body size
        st.booleans(),  # oneway
        st.sampled_from(["pg", "pg2"]),  # group (changed between sends: the cache follows)
        st.sampled_from([4, 8]),  # default topic queue nums
    ), min_size=1, max_size=6),
)
def test_build_matches_build_send(sends: list[tuple[Any, ...]]) -> None:
    p = Producer("127.0.0.1:9876", "pg", compress_msg_body_over_bytes=4096)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(producer_mod.time, "time", lambda: 1_700_000_000.123)
        _check_builds(p, sends)


def _check_builds(p: Producer, sends: list[tuple[Any, ...]]) -> None:
    for topic, broker, qid, flag, props, size, oneway, group, dtqn in sends:
        p.group, p.default_topic_queue_nums = group, dtqn
        if topic.startswith("%RETRY%"):
            props = {**props, "RECONSUME_TIME": "2", "MAX_RECONSUME_TIMES": "5"}
        msg = Message(topic, b"y" * size, flag, dict(props))
        mq = MessageQueue(topic, broker, qid)
        got = p._build(msg, mq, False, oneway=oneway)
        want = _reference_build(p, msg, mq, 1_700_000_000_123, oneway)
        assert got == want
        assert list(got.ext_fields.items()) == list(want.ext_fields.items())  # order too
        assert encode(got) == encode(want)
        assert got.flag == (FLAG_ONEWAY if oneway else 0)


def test_build_cache_is_per_topic_broker_group_and_queue_nums() -> None:
    p = Producer("127.0.0.1:9876", "pg")
    msg = Message("T", b"x", 0, {"TAGS": "a"})
    first = p._build(msg, MessageQueue("T", "b1", 1), False)
    assert first.ext_fields["a"] == "pg" and first.ext_fields["n"] == "b1" and first.ext_fields["d"] == "4"
    p.group = "other"
    p.default_topic_queue_nums = 8
    again = p._build(msg, MessageQueue("T", "b2", 2), False)
    assert (again.ext_fields["a"], again.ext_fields["n"], again.ext_fields["d"], again.ext_fields["e"]) == \
        ("other", "b2", "8", "2")
    assert first.ext_fields["a"] == "pg"  # the cached dict is copied, never handed out
    assert p._send_fields["T"]["b1"][2]["e"] == "0"


def _reference_key(prefix: bytes, t: float, counter: int) -> str:
    """The UNIQ_KEY formula spelled out with datetimes (what new_uniq_key computed originally)."""
    import datetime

    now = datetime.datetime.fromtimestamp(t)
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    ms = int((now - month_start).total_seconds() * 1000) & 0xFFFFFFFF
    return prefix.hex().upper() + ((ms << 16) | (counter & 0xFFFF)).to_bytes(6, "big").hex().upper()


def test_new_uniq_key_matches_the_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = bytes.fromhex("7F000001ABCD01020304")
    monkeypatch.setattr(producer_mod, "_UNIQ_PREFIX", prefix)
    monkeypatch.setattr(producer_mod, "_UNIQ_COUNTER", itertools.count(0xFFFD))  # wraps 0xFFFF -> 0x0000
    now = [1_700_000_000.0]
    monkeypatch.setattr(producer_mod.time, "time", lambda: now[0])
    counter = 0xFFFD
    # same millisecond (the cached head), the next ms, the next second, the next month, and back
    for t in (1_700_000_000.0, 1_700_000_000.0004, 1_700_000_000.0011, 1_700_000_001.5, 1_702_000_000.25,
              1_700_000_000.0011, 1_700_000_000.0011):
        now[0] = t
        key = new_uniq_key()
        assert re.fullmatch("[0-9A-F]{32}", key)
        ref = _reference_key(prefix, t, counter)
        assert key[:20] == ref[:20] and key[28:] == ref[28:]
        assert abs(int(key[20:28], 16) - int(ref[20:28], 16)) <= 1  # (float rounding of the datetime path)
        counter += 1
    other = bytes.fromhex("0A000002000100000000")
    monkeypatch.setattr(producer_mod, "_UNIQ_PREFIX", other)  # a new prefix is picked up at once
    assert new_uniq_key().startswith(other.hex().upper())


# ---- a producer over an in-memory broker -------------------------------------------------------------------------
class _Broker(StubTransport):
    """Transport of a client Connection: records each SEND request and answers SEND_OK next iteration."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.sent: list[RemotingCommand] = []

    def write(self, data: bytes) -> None:
        from ferrymq.remoting.codec import FrameDecoder, encode_send_ok_response

        (cmd,) = FrameDecoder().feed(data)
        self.sent.append(cmd)
        frame = encode_send_ok_response(cmd.opaque, "MSGID", int(cmd.ext_fields["e"]), len(self.sent))
        asyncio.get_running_loop().call_soon(self.conn.data_received, frame)


def _wire(p: Producer, queues: int = 5) -> _Broker:
    """Give a (not started) producer an instance with route T (one broker, ``queues`` write queues) and an
    open connection to an in-memory broker."""
    from ferrymq.client.instance import ClientInstance

    inst = ClientInstance(p.config)
    p._instance = inst
    inst.routes["T"] = TopicRouteData(queue_datas=[QueueData("a", queues, queues, 6)],
                                      broker_datas=[BrokerData("c", "a", {0: "127.0.0.1:1"})])
    inst._rebuild_broker_addrs()
    conn = Connection(inst.pool.dispatcher)
    broker = _Broker(conn)
    conn.connection_made(broker)  # type: ignore[arg-type]
    inst.pool._conns["127.0.0.1:1"] = conn
    return broker


@pytest.mark.parametrize("fault", [False, True])
async def test_send_picks_the_queues_select_picks(fault: bool) -> None:
    p = Producer("127.0.0.1:9876", "pg", send_latency_fault_enable=fault)
    broker = _wire(p)
    p._rr = RoundRobin(0x7FFFFFFD)  # wraps
    ref = Producer("127.0.0.1:9876", "pg", send_latency_fault_enable=False)
    ref._rr = RoundRobin(0x7FFFFFFD)
    mqs = [MessageQueue("T", "a", q) for q in range(5)]
    for i in range(9):
        msg = Message("T", b"body", 0, {"TAGS": "x"})
        r = await p.send(msg)
        assert r.status is SendStatus.SEND_OK and r.queue_offset == i + 1
        want = ref._select(mqs, None)
        assert r.message_queue == want and int(broker.sent[-1].ext_fields["e"]) == want.queue_id
        assert r.msg_id == msg.properties["UNIQ_KEY"] and broker.sent[-1].language == "PYTHON"
    p.instance.pool._conns["127.0.0.1:1"].close()


async def test_send_validates_before_anything_else() -> None:
    p = Producer("127.0.0.1:9876", "pg")  # not started
    with pytest.raises(ClientError, match="illegal characters"):
        await p.send(Message("bad topic", b"", 0, {}))
    with pytest.raises(ClientError, match="body is empty"):
        await p.send(Message("T", b"", 0, {}))
    with pytest.raises(ClientError, match="above the 4 limit"):
        p.max_message_size_bytes = 4
        await p.send(Message("T", b"12345", 0, {}))
    p.max_message_size_bytes = 100
    msg = Message("T", b"1", 0, {"UNIQ_KEY": "given"})
    with pytest.raises(ClientError, match="not started"):
        await p.send(msg)
    assert msg.properties["UNIQ_KEY"] == "given"
    msg = Message("T", b"1", 0, {"UNIQ_KEY": ""})  # empty: replaced, before the "not started" error
    with pytest.raises(ClientError, match="not started"):
        await p.send(msg)
    assert len(msg.properties["UNIQ_KEY"]) == 32


def test_fault_tolerance_default_clock_matches_a_custom_monotonic_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import ferrymq.client.fault as fault_mod

    now = [1000.0]
    monkeypatch.setattr(fault_mod.time, "monotonic", lambda: now[0])
    default = LatencyFaultTolerance()
    custom = LatencyFaultTolerance(lambda: now[0] * 1000)
    for latency, isolation, advance in [(10, False, 0), (49.9, False, 0), (50, False, 1), (600, False, 10),
                                        (3000, False, 100), (0, True, 599), (20, False, 2)]:
        for f in (default, custom):
            f.update("b", latency, isolation=isolation)
        assert default._items["b"] == custom._items["b"]
        assert default._items["b"].available_at_ms == now[0] * 1000 + not_available_duration_ms(
            30_000 if isolation else latency)
        now[0] += advance
        assert default.is_available("b") == custom.is_available("b")
        assert default.is_available("nobody") and custom.is_available("nobody")
