"""Pure unit tests: routes, allocation, offset stores, selectors, headers, fault tolerance."""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ferrymq.client import api, routes
from ferrymq.client.consumer.offset_store import LocalFileOffsetStore, RemoteOffsetStore
from ferrymq.client.consumer.process_queue import ProcessQueue
from ferrymq.client.consumer.push import PushConsumer
from ferrymq.client.consumer.rebalance import allocate_averagely, allocate_averagely_by_circle
from ferrymq.client.fault import LatencyFaultTolerance, not_available_duration_ms
from ferrymq.client.instance import Backoff, parse_offset_table
from ferrymq.client.jsonmq import dumps_mq_keys, loads_mq_keys, mq_keyed_map
from ferrymq.client.producer import new_uniq_key
from ferrymq.client.selectors import RoundRobin, select_by_hash
from ferrymq.client.values import ConsumeStatus, PullStatus, SendStatus, new_message
from ferrymq.common.message import MessageExt, MessageExtBrokerInner, tags_hash_code
from ferrymq.common.message_codec import encode_record
from ferrymq.common.route import BrokerData, MessageQueue, QueueData, TopicRouteData
from ferrymq.errors import TopicNotExistError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand, decode_frame, encode
from support.shared import CAPTURES  # noqa: E402


def route(*brokers: tuple[str, dict[int, str], int, int, int]) -> TopicRouteData:
    return TopicRouteData(
        queue_datas=[QueueData(name, r, w, perm) for name, _, r, w, perm in brokers],
        broker_datas=[BrokerData("C", name, addrs) for name, addrs, *_ in brokers],
    )


# ---- routes -----------------------------------------------------------------------------------------
def test_publish_and_subscribe_queues() -> None:
    rt = route(("b", {0: "m2", 1: "s2"}, 2, 3, 6), ("a", {0: "m1"}, 4, 4, 6))
    pub = routes.publish_queues("T", rt)
    assert [(m.broker_name, m.queue_id) for m in pub] == [("a", 0), ("a", 1), ("a", 2), ("a", 3),
                                                        ("b", 0), ("b", 1), ("b", 2)]
    sub = routes.subscribe_queues("T", rt)
    assert [(m.broker_name, m.queue_id) for m in sub] == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0), ("b", 1)]


def test_slave_only_broker_is_readable_not_writable() -> None:
    rt = route(("a", {1: "slave:1"}, 2, 2, 6), ("b", {0: "m"}, 1, 1, 6))
    assert [m.broker_name for m in routes.publish_queues("T", rt)] == ["b"]
    assert [(m.broker_name, m.queue_id) for m in routes.subscribe_queues("T", rt)] == [("a", 0), ("a", 1), ("b", 0)]
    assert routes.pick_addr({1: "s1", 2: "s2"}) == ("s1", 1)
    assert routes.pick_addr({0: "m", 1: "s1"}, 1) == ("s1", 1)
    assert routes.pick_addr({0: "m"}, 1, only_this=True) is None


def test_perm_and_tbw102_cap() -> None:
    rt = route(("a", {0: "m"}, 8, 8, 4), ("b", {0: "m2"}, 8, 8, 7))
    assert {m.broker_name for m in routes.publish_queues("T", rt)} == {"b"}
    assert len(routes.publish_queues("T", rt, max_queue_nums=4)) == 4
    rt2 = route(("a", {0: "m"}, 8, 8, 2))
    assert routes.subscribe_queues("T", rt2) == []


def test_order_topic_conf() -> None:
    rt = route(("a", {0: "m"}, 8, 8, 6))
    rt.order_topic_conf = "a:2;b:1"
    assert len(routes.publish_queues("T", rt)) == 3


# ---- rebalance --------------------------------------------------------------------------------------------
def mqs(n: int, broker: str = "b") -> list[MessageQueue]:
    return [MessageQueue("T", broker, i) for i in range(n)]


@pytest.mark.parametrize("n_mq,n_cid", [(8, 3), (3, 8), (4, 4), (5, 2), (1, 1), (16, 5)])
def test_allocate_averagely_partitions_exactly(n_mq: int, n_cid: int) -> None:
    queues = mqs(n_mq)
    cids = [f"c{i}" for i in range(n_cid)]
    parts = [allocate_averagely("g", c, list(reversed(queues)), cids) for c in cids]
    flat = [mq for p in parts for mq in p]
    assert sorted(flat) == queues  # every queue once
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # extra queues go to the first consumers
    for p in parts:  # contiguous ranges
        assert [m.queue_id for m in p] == list(range(p[0].queue_id, p[0].queue_id + len(p))) if p else True


def test_allocate_averagely_examples() -> None:
    q = mqs(8)
    assert [m.queue_id for m in allocate_averagely("g", "c0", q, ["c0", "c1", "c2"])] == [0, 1, 2]
    assert [m.queue_id for m in allocate_averagely("g", "c1", q, ["c2", "c1", "c0"])] == [3, 4, 5]
    assert [m.queue_id for m in allocate_averagely("g", "c2", q, ["c0", "c1", "c2"])] == [6, 7]
    assert allocate_averagely("g", "stranger", q, ["c0"]) == []
    assert [m.queue_id for m in allocate_averagely_by_circle("g", "c1", q, ["c0", "c1", "c2"])] == [1, 4, 7]


# ---- offset stores ------------------------------------------------------------------------------------------
async def test_local_file_offset_store_round_trip(tmp_path: Path) -> None:
    store = LocalFileOffsetStore(tmp_path, "g")
    mq = MessageQueue("T", "b", 1)
    assert await store.read(mq) == -1
    store.update(mq, 5)
    store.update(mq, 3, increase_only=True)
    assert store.read_memory(mq) == 5
    await store.persist()
    store.update(mq, 9)
    await store.persist()
    data = json.loads((tmp_path / "g" / "offsets.json").read_text())
    assert data == {"offsetTable": [{"brokerName": "b", "queueId": 1, "topic": "T", "offset": 9}]}
    again = LocalFileOffsetStore(tmp_path, "g")
    assert await again.read(mq) == 9
    (tmp_path / "g" / "offsets.json").write_text("{broken")
    assert await LocalFileOffsetStore(tmp_path, "g").read(mq) == 5  # falls back to the .bak


async def test_remote_offset_store_persists_through_writer() -> None:
    written: dict[MessageQueue, int] = {}

    async def reader(mq: MessageQueue) -> int:
        return 7

    async def writer(mq: MessageQueue, off: int) -> None:
        written[mq] = off

    store = RemoteOffsetStore(reader, writer)
    a, b = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    assert await store.read(a) == 7
    store.update(b, 3)
    store.update(b, -1)  # never sent
    await store.persist([a, b])
    assert written == {a: 7}


def test_process_queue_flow_control_and_commit_offset() -> None:
    pq = ProcessQueue(MessageQueue("T", "b", 0))
    msgs = [ext(offset=o, body=b"x" * 10) for o in (5, 6, 7)]
    pq.put(msgs)
    assert pq.count == 3 and pq.msg_bytes == 30
    assert pq.over_limit(3, 1000) and pq.over_limit(100, 30) and not pq.over_limit(4, 31)
    assert pq.remove([msgs[1]]) == 5  # lowest pending
    assert pq.remove([msgs[0]]) == 7
    assert pq.remove([msgs[2]]) == 8  # one past the largest seen
    assert [m.queue_offset for m in pq.take_in_order(2)] == []


# ---- selectors & fault tolerance ----------------------------------------------------------------------------------
def test_select_by_hash_is_stable() -> None:
    q = mqs(4)
    m = new_message("T", "x")
    assert select_by_hash(q, m, "order-1") == select_by_hash(q, m, "order-1")
    assert select_by_hash(q, m, 6) == q[2]
    assert len({select_by_hash(q, m, f"k{i}").queue_id for i in range(50)}) == 4
    rr = RoundRobin(start=0)
    assert [rr(q).queue_id for _ in range(5)] == [1, 2, 3, 0, 1]


def test_latency_fault_tolerance() -> None:
    now = [0.0]
    f = LatencyFaultTolerance(lambda: now[0])
    assert not_available_duration_ms(10) == 0 and not_available_duration_ms(600) == 30_000
    f.update("a", 20)
    assert f.is_available("a")
    f.update("b", 0, isolation=True)
    assert not f.is_available("b")
    f.update("c", 1200)
    assert not f.is_available("c")
    assert f.pick_one_at_least() == "a"
    now[0] = 60_000
    assert f.is_available("c") and not f.is_available("b")
    now[0] = 600_000
    assert f.is_available("b")


def test_backoff_is_capped_with_jitter() -> None:
    b = Backoff(100, 1000)
    delays = [b.next_delay_ms() for _ in range(10)]
    assert 50 <= delays[0] <= 100
    assert all(d <= 1000 for d in delays) and delays[-1] >= 500


# ---- header building / parsing -------------------------------------------------------------------------------------
def capture_frames(name: str) -> list[dict]:
    out = []
    for line in (CAPTURES / name).read_text().splitlines():
        o = json.loads(line)
        if o.get("kind") == "frame":
            o["header"] = json.loads(o["header_raw"])
            out.append(o)
    return out


def test_send_v2_header_matches_ali_ons_shape() -> None:
    ali = next(f["header"] for f in capture_frames("capture_alions.jsonl") if f["header"]["code"] == 310)
    cmd = api.build_send(producer_group="pg", topic="TopicTest", queue_id=0, sys_flag=0, born_timestamp_ms=1,
                         flag=0, properties="TAGS\x01TagA", body=b"x")
    assert cmd.code == 310
    assert set(ali["extFields"]) <= set(cmd.ext_fields)
    assert all(isinstance(v, str) for v in cmd.ext_fields.values())
    assert cmd.ext_fields["c"] == "TBW102" and cmd.ext_fields["k"] == "false" and "m" not in cmd.ext_fields
    batch = api.build_send(producer_group="pg", topic="T", queue_id=1, sys_flag=0, born_timestamp_ms=1, flag=0,
                           properties="", body=b"x", batch=True)
    assert batch.code == 320 and batch.ext_fields["m"] == "true"
    # language/version stamped by the instance; the frame round-trips
    back = decode_frame(encode(cmd)[4:])
    assert back.ext_fields == cmd.ext_fields and back.body == b"x"


def test_pull_header_matches_captured_fields() -> None:
    cpp = next(f["header"] for f in capture_frames("capture_cpp.jsonl") if f["header"]["code"] == 11)
    cmd = api.build_pull(group="cg1", mq=MessageQueue("TopicTest", "b", 0), queue_offset=0, max_nums=32,
                         sys_flag=api.PULL_FLAG_SUBSCRIPTION | api.PULL_FLAG_SUSPEND, commit_offset=0,
                         suspend_timeout_ms=15000, subscription="TagA || TagB", sub_version=5)
    wanted = set(cpp["extFields"]) - {"AccessKey", "OnsChannel", "Signature"}
    assert wanted <= set(cmd.ext_fields)
    assert cmd.ext_fields["sysFlag"] == "6" and cmd.ext_fields["suspendTimeoutMillis"] == "15000"


def test_heartbeat_body_shape() -> None:
    ali = next(f for f in capture_frames("capture_alions.jsonl") if f["header"]["code"] == 34)
    ali_body = json.loads(ali["body"])
    data = api.subscription_data("TopicTest", "TagA || TagB", 1)
    assert data["codeSet"] == [2598919, 2598920] == ali_body["consumerDataSet"][0]["subscriptionDataSet"][0]["codeSet"]
    cmd = api.build_heartbeat("cid", ["pg"], [{"groupName": "cg", "subscriptionDataSet": [data]}])
    body = jsonx.loads(cmd.body)
    assert body["clientID"] == "cid" and body["producerDataSet"] == [{"groupName": "pg"}]
    assert set(ali_body) <= set(body)
    assert api.parse_tags("*") == [] and api.parse_tags(" A ||B ") == ["A", "B"]


def test_unregister_update_offset_and_others() -> None:
    u = api.build_unregister("cid", consumer_group="cg")
    assert u.code == 35 and u.ext_fields == {"clientID": "cid", "consumerGroup": "cg"}
    mq = MessageQueue("T", "b", 2)
    up = api.build_update_consumer_offset("cg", mq, 5)
    assert up.ext_fields == {"consumerGroup": "cg", "topic": "T", "queueId": "2", "commitOffset": "5"}
    back = api.build_send_back(group="cg", phy_offset=10, delay_level=0, origin_msg_id="X", origin_topic="T",
                               max_reconsume_times=3)
    assert back.ext_fields["offset"] == "10" and back.ext_fields["maxReconsumeTimes"] == "3"
    lock = api.build_lock(41, "cg", "cid", [mq])
    assert jsonx.loads(lock.body) == {"clientId": "cid", "consumerGroup": "cg", "mqSet": [mq.to_json()]}
    addr, view = api.build_view_message("7F000001000051AF0000000000000010")
    assert addr == "127.0.0.1:20911" and view.ext_fields == {"offset": "16"}


def response(code: int, fields: dict, body: bytes = b"", remark: str | None = None) -> RemotingCommand:
    return RemotingCommand.request(0, {}).response(code, fields, body, remark)


def test_parse_send_statuses_and_errors() -> None:
    mq = MessageQueue("T", "b", 0)
    for code, status in ((0, SendStatus.SEND_OK), (10, SendStatus.FLUSH_DISK_TIMEOUT),
                         (11, SendStatus.SLAVE_NOT_AVAILABLE), (12, SendStatus.FLUSH_SLAVE_TIMEOUT)):
        r = api.parse_send(response(code, {"msgId": "ID", "queueId": "3", "queueOffset": "7"}), mq, "U")
        assert r.status is status and r.queue_offset == 7 and r.message_queue.queue_id == 3 and r.msg_id == "U"
    with pytest.raises(TopicNotExistError) as ei:
        api.parse_send(response(17, {}, remark="nope"), mq, "U")
    assert ei.value.retriable
    with pytest.raises(Exception) as e2:
        api.parse_send(response(13, {}), mq, "U")
    assert not getattr(e2.value, "retriable", True)


def ext(offset: int = 0, body: bytes = b"b", tags: str = "", sys_flag: int = 0) -> MessageExt:
    props = f"TAGS\x01{tags}" if tags else ""
    inner = MessageExtBrokerInner(topic="T", queue_id=0, body=body, properties_string=props, sys_flag=sys_flag)
    from ferrymq.common.message_codec import decode_record
    return decode_record(encode_record(inner, offset, offset * 100, 1))


def test_parse_pull_found_decompresses_and_filters_tags() -> None:
    raw = b"hello " * 1000
    recs = [
        encode_record(MessageExtBrokerInner(topic="T", queue_id=0, body=zlib.compress(raw), sys_flag=1,
                                            properties_string="TAGS\x01A"), 0, 0, 1),
        encode_record(MessageExtBrokerInner(topic="T", queue_id=0, body=b"other", properties_string="TAGS\x01B"),
                      1, 500, 1),
    ]
    resp = response(0, {"nextBeginOffset": "2", "minOffset": "0", "maxOffset": "2", "suggestWhichBrokerId": "1"},
                    b"".join(recs))
    res = api.parse_pull(resp, tags=["A"])
    assert res.status is PullStatus.FOUND and res.suggest_which_broker_id == 1 and res.next_begin_offset == 2
    assert [m.body for m in res.messages] == [raw]
    assert res.messages[0].properties["MAX_OFFSET"] == "2"
    assert api.parse_pull(resp, decode=False).messages == [] and api.parse_pull(resp, decode=False).raw_body
    nf = api.parse_pull(response(19, {"nextBeginOffset": "5", "minOffset": "0", "maxOffset": "5",
                                      "suggestWhichBrokerId": "0"}))
    assert nf.status is PullStatus.NO_NEW_MSG and nf.next_begin_offset == 5
    assert api.parse_pull(response(21, {"nextBeginOffset": "0"})).status is PullStatus.OFFSET_ILLEGAL
    assert api.parse_query_consumer_offset(response(22, {})) == -1
    assert api.parse_query_consumer_offset(response(0, {"offset": "12"})) == 12


def test_route_parsing_accepts_bare_keys() -> None:
    body = (b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:1",1:"127.0.0.1:2"},"brokerName":"a","cluster":"C"}],'
            b'"queueDatas":[{"brokerName":"a","perm":6,"readQueueNums":2,"writeQueueNums":2}]}')
    rt = api.parse_route(response(0, {}, body))
    assert rt.broker("a").broker_addrs == {0: "127.0.0.1:1", 1: "127.0.0.1:2"}  # type: ignore[union-attr]
    with pytest.raises(TopicNotExistError):
        api.parse_route(response(17, {}, remark="No topic route info"))


def test_mq_keyed_maps_fastjson_and_list_shapes() -> None:
    fj = b'{"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:{"maxOffset":5},{"brokerName":"b","queueId":0,"topic":"T"}:{"maxOffset":2}}}'
    got = dict(mq_keyed_map(fj, "offsetTable"))
    assert got[MessageQueue("T", "b", 1)] == {"maxOffset": 5}
    lst = b'{"offsetTable":[{"brokerName":"b","queueId":0,"topic":"T","offset":4}]}'
    assert parse_offset_table(lst) == {MessageQueue("T", "b", 0): 4}
    assert parse_offset_table(b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:9}}') == {
        MessageQueue("T", "b", 0): 9}


def test_new_message_and_uniq_key() -> None:
    m = new_message("T", "héllo", tags="A", keys=["k1", "k2"], properties={"p": 1}, delay_level=3)
    assert m.body == "héllo".encode() and m.tags == "A" and m.keys == ["k1", "k2"] and m.delay_level == 3
    assert m.properties["p"] == "1"
    a, b = new_uniq_key(), new_uniq_key()
    assert len(a) == 32 and a != b and a == a.upper()
    assert ConsumeStatus.SUCCESS is ConsumeStatus.CONSUME_SUCCESS
    assert ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT is ConsumeStatus.RECONSUME_LATER
    assert tags_hash_code("TagA") == 2598919


async def test_process_queue_wait_change_wakes_on_remove() -> None:
    pq = ProcessQueue(MessageQueue("T", "b", 0))
    m = ext(1)
    pq.put([m])
    waiter = asyncio.create_task(pq.wait_change(5))
    await asyncio.sleep(0)
    pq.remove([m])
    await asyncio.wait_for(waiter, 1)


# ---- push consumer: running info and client-side retry messages ----------------------------------------
def _bare_push_consumer(**kw: Any) -> PushConsumer:
    """A PushConsumer wired to a stub core (client id only) and an in-memory offset store, not started."""
    c = PushConsumer("127.0.0.1:9876", "cg", **kw)
    c._core = SimpleNamespace(instance=SimpleNamespace(client_id="cid@1"))  # type: ignore[assignment]
    c._offsets = RemoteOffsetStore(_no_offset, _no_commit)
    return c


async def _no_offset(mq: MessageQueue) -> int:
    return -1


async def _no_commit(mq: MessageQueue, offset: int) -> None:
    return None


def test_running_info_mq_table_is_fastjson_keyed_process_queue_info() -> None:
    c = _bare_push_consumer()
    mq0, mq1 = MessageQueue("T", "b", 0), MessageQueue("%RETRY%cg", "b", 1)
    pq0, pq1 = ProcessQueue(mq0), ProcessQueue(mq1)
    pq0.put([ext(5, b"x" * 1000), ext(6, b"y" * 10)])
    pq0.remove([ext(5)])
    pq1.locked = True
    c.process_queues = {mq1: pq1, mq0: pq0}
    c.offset_store.update(mq0, 6)
    body = dumps_mq_keys(c.running_info())
    # the C++/Java shape: {"mqTable":{{"brokerName":..,"queueId":..,"topic":..}:{...},...}} (not plain JSON)
    assert b'"mqTable":{{"brokerName":"b","queueId":1,"topic":"%RETRY%cg"}:{' in body
    assert b',{"brokerName":"b","queueId":0,"topic":"T"}:{' in body
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)
    table = dict(mq_keyed_map(body, "mqTable"))
    assert set(table) == {mq0, mq1}
    info0, info1 = table[mq0], table[mq1]
    assert info0["commitOffset"] == 6 and info0["cachedMsgCount"] == 1 and info0["cachedMsgSizeInMiB"] == 0
    assert info0["cachedMsgMinOffset"] == 6 and info0["cachedMsgMaxOffset"] == 6
    assert info0["locked"] is False and info0["lastPullTimestamp"] > 0 and info0["lastConsumeTimestamp"] > 0
    assert info1["commitOffset"] == -1 and info1["cachedMsgCount"] == 0 and info1["locked"] is True
    assert info1["lastPullTimestamp"] == 0 and info1["lastConsumeTimestamp"] == 0
    for info in (info0, info1):
        assert {"commitOffset", "cachedMsgCount", "cachedMsgSizeInMiB", "locked", "lastPullTimestamp",
                "lastConsumeTimestamp", "droped", "tryUnlockTimes"} <= info.keys()
    rest = loads_mq_keys(body)
    assert rest["processQueues"] == [{**mq.to_json(), **table[mq]} for mq in (mq1, mq0)]  # sorted by mq
    assert rest["properties"]["clientId"] == "cid@1" and rest["statusTable"] == {}
    assert {s["topic"] for s in rest["subscriptionSet"]} == set()
    # an empty table stays valid JSON
    c.process_queues = {}
    assert json.loads(dumps_mq_keys(c.running_info()))["mqTable"] == {}


def test_captured_cpp_running_info_reads_with_jsonmq() -> None:
    capture = CAPTURES / "capture_cpp.jsonl"
    for line in capture.read_text().splitlines():
        frame = json.loads(line)
        if '"mqTable"' in (frame.get("body") or ""):
            table = dict(mq_keyed_map(frame["body"].encode(), "mqTable"))
            assert MessageQueue("TopicTest", "broker-a", 0) in table
            assert "cachedMsgCount" in table[MessageQueue("TopicTest", "broker-a", 0)]
            return
    pytest.skip("no running info frame captured")


def test_retry_message_copies_the_message_for_the_retry_topic() -> None:
    c = _bare_push_consumer(max_reconsume_times=5)
    m = ext(3, b"payload", tags="A")
    m.flag = 7
    m.reconsume_times = 2
    m.properties["TRAN_MSG"] = "true"
    r = c.retry_message(m)
    assert r.topic == "%RETRY%cg" and r.body == b"payload" and r.flag == 7
    assert r.properties["TAGS"] == "A" and "TRAN_MSG" not in r.properties
    assert r.properties["RETRY_TOPIC"] == "T" and r.properties["ORIGIN_MESSAGE_ID"] == m.msg_id
    assert r.properties["RECONSUME_TIME"] == "3" and r.properties["MAX_RECONSUME_TIMES"] == "5"
    assert r.properties["DELAY"] == "5"
    assert m.properties["TRAN_MSG"] == "true"  # the consumed message is left alone
    # an already retried message keeps its first topic and origin id
    m.properties.update({"RETRY_TOPIC": "Orig", "ORIGIN_MESSAGE_ID": "ABC"})
    r = c.retry_message(m, to_dlq=True)
    assert r.properties["RETRY_TOPIC"] == "Orig" and r.properties["ORIGIN_MESSAGE_ID"] == "ABC"
    assert "DELAY" not in r.properties


# ---- producer send-path caches ---------------------------------------------------------------------------------
def _reference_select(mqs: list[MessageQueue], start: int, fault: LatencyFaultTolerance,
                      last_broker: str | None) -> MessageQueue:
    """The selection rule spelled out with a candidate list (what Producer._select must choose)."""
    candidates = [mqs[(start + i) % len(mqs)] for i in range(len(mqs))]
    if fault.enabled:
        for mq in candidates:
            if fault.is_available(mq.broker_name) and mq.broker_name != last_broker:
                return mq
        for mq in candidates:
            if fault.is_available(mq.broker_name):
                return mq
    for mq in candidates:
        if mq.broker_name != last_broker:
            return mq
    return candidates[0]


def test_producer_select_matches_the_rule() -> None:
    import random

    from ferrymq.client.producer import Producer

    rnd = random.Random(3)
    now = [0.0]
    for trial in range(400):
        p = Producer("127.0.0.1:9876", "pg", send_latency_fault_enable=rnd.random() < 0.7)
        p.fault = LatencyFaultTolerance(lambda: now[0], enabled=p.fault.enabled)
        brokers = ["a", "b", "c"][: rnd.randint(1, 3)]
        mqs = [MessageQueue("T", b, q) for b in brokers for q in range(rnd.randint(1, 4))]
        for b in brokers:
            if rnd.random() < 0.5:
                p.fault.update(b, rnd.choice([0, 20, 600, 5000]), isolation=rnd.random() < 0.3)
        last = rnd.choice([None, *brokers])
        start = rnd.randrange(1 << 20)
        p._rr = RoundRobin(start)
        assert p._select(mqs, last) == _reference_select(mqs, start + 1, p.fault, last), trial


async def test_producer_publish_queue_cache_follows_the_route_object() -> None:
    from ferrymq.client.producer import Producer

    rt1 = route(("a", {0: "m1"}, 4, 4, 6))
    inst = SimpleNamespace(routes={"T": rt1}, trigger_route_refresh=lambda: None)

    async def get_route(topic: str) -> TopicRouteData:
        return inst.routes[topic]

    inst.get_route = get_route
    p = Producer("127.0.0.1:9876", "pg")
    p._instance = inst  # type: ignore[assignment]
    assert p._queues_now("T") is None  # nothing computed yet
    mqs, via = await p.publish_queues("T")
    assert not via and [m.queue_id for m in mqs] == [0, 1, 2, 3]
    mqs.clear()  # callers get their own list: the cache is not affected
    cached = p._queues_now("T")
    assert cached is not None and len(cached) == 4
    assert (await p.fetch_publish_message_queues("T")) == cached
    inst.routes["T"] = route(("a", {0: "m1"}, 2, 2, 6), ("b", {0: "m2"}, 1, 1, 6))  # a refresh replaces it
    assert p._queues_now("T") is None
    mqs, _ = await p.publish_queues("T")
    assert [(m.broker_name, m.queue_id) for m in mqs] == [("a", 0), ("a", 1), ("b", 0)]
    assert p._queues_now("T") == mqs
    p._fallback_since["T"] = 0.0  # a topic on the TBW102 fallback never uses the cache
    assert p._queues_now("T") is None


def test_validate_caches_only_good_topics() -> None:
    from ferrymq.client.producer import Producer
    from ferrymq.errors import ClientError

    p = Producer("127.0.0.1:9876", "pg")
    for _ in range(2):
        with pytest.raises(ClientError, match="illegal characters"):
            p._validate(new_message("bad topic", b"x"))
        with pytest.raises(ClientError, match="forbidden"):
            p._validate(new_message("SCHEDULE_TOPIC_XXXX", b"x"))
        p._validate(new_message("GoodTopic", b"x"))
        with pytest.raises(ClientError, match="empty"):
            p._validate(new_message("GoodTopic", b""))
    assert p._valid_topics == {"GoodTopic"}


async def test_producer_rereads_the_route_after_a_timeout_or_a_refusing_master() -> None:
    """Controller mode: a paused (SIGSTOP) or deposed master stops answering or answers SERVICE_NOT_AVAILABLE;
    the producer asks for the route at once instead of waiting for the 30 s poll (the new master is only in
    the route)."""
    from ferrymq.client import new_message
    from ferrymq.client.producer import Producer
    from ferrymq.errors import BrokerError, RemotingTimeoutError
    from ferrymq.remoting.codec import RemotingCommand

    refreshes = []
    answers: list[Any] = []

    class Conn:
        async def request(self, cmd: Any, timeout_ms: int) -> Any:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    inst = SimpleNamespace(routes={"T": route(("a", {0: "m1"}, 1, 1, 6))},
                           trigger_route_refresh=lambda: refreshes.append(1),
                           master_addr=lambda name: "m1", ready_connection=lambda addr: Conn(),
                           _stamp=lambda cmd: cmd)

    async def get_route(topic: str) -> TopicRouteData:
        return inst.routes[topic]

    inst.get_route = get_route
    p = Producer("127.0.0.1:9876", "pg", retry_times_when_send_failed=0)
    p._instance = inst  # type: ignore[assignment]
    answers.append(RemotingTimeoutError("no answer"))
    with pytest.raises(RemotingTimeoutError):
        await p.send(new_message("T", b"x"))
    assert refreshes == [1]
    answers.append(RemotingCommand.request(0, {}).response(14, remark="not the master"))
    with pytest.raises(BrokerError):
        await p.send(new_message("T", b"y"))
    assert refreshes == [1, 1]


async def test_producer_leaves_the_tbw102_fallback_when_it_routes_nowhere() -> None:
    """A topic auto-created on a master that died before registering it: the TBW102 route names no master any
    more; the producer asks for the topic's own route at the next send (the new master registered it) instead
    of failing for a whole poll interval."""
    from ferrymq.client.producer import Producer
    from ferrymq.errors import ClientError, TopicNotExistError

    refreshes = []
    inst = SimpleNamespace(routes={"TBW102": route(("a", {1: "s1"}, 4, 4, 6))},
                           trigger_route_refresh=lambda: refreshes.append(1))

    async def get_route(topic: str) -> TopicRouteData:
        if topic not in inst.routes:
            raise TopicNotExistError(topic)
        return inst.routes[topic]

    inst.get_route = get_route
    p = Producer("127.0.0.1:9876", "pg")
    p._instance = inst  # type: ignore[assignment]
    with pytest.raises(ClientError):
        await p.publish_queues("Fresh")  # TBW102 names no master
    assert refreshes
    inst.routes["Fresh"] = route(("a", {0: "m2"}, 4, 4, 6))  # the new master registered the topic
    mqs, via_default = await p.publish_queues("Fresh")
    assert not via_default and len(mqs) == 4
