"""Passing coverage of fact-sheet behaviours (§2.7, §3.5, §6.2, §6.8) that had no test elsewhere."""

from __future__ import annotations

import asyncio

from conf_helpers import PULL_HEADER_KEYS, Client, ManualMs, pull, records, running_broker, send_v1, wait_for

from ferrymq.common.message import decode_offset_msg_id
from ferrymq.common.topic import TopicConfig
from ferrymq.remoting import jsonx
from ferrymq.remoting.codes import ResponseCode as R
from support.ports import free_port

# ---- SEND checks (§2.7 SEND) ------------------------------------------------------------------------


async def test_send_to_not_allowed_system_topics_is_16(client: Client) -> None:
    for topic in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                  "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"):
        resp = await client.call(10, send_v1(topic), b"x")
        assert resp.code == R.NO_PERMISSION, topic
        assert resp.remark == f"Sending message to topic[{topic}] is forbidden."


async def test_invalid_topic_names_are_1(client: Client) -> None:
    for topic in ("bad topic", "a/b", "x" * 128, "tab\t", "dot.ted"):
        resp = await client.call(10, send_v1(topic), b"x")
        assert resp.code == R.SYSTEM_ERROR, topic
    ok = await client.call(10, send_v1("x" * 127), b"x")  # 127 characters is the limit
    assert ok.code == R.SUCCESS


async def test_queue_id_out_of_range_is_1_and_negative_picks_one(broker, client: Client) -> None:
    broker.topics.update(TopicConfig("QRange", 2, 4))
    assert (await client.call(10, send_v1("QRange", 4), b"x")).code == R.SYSTEM_ERROR
    assert (await client.call(10, send_v1("QRange", 3), b"x")).code == R.SUCCESS  # < max(read, write)
    resp = await client.call(10, send_v1("QRange", -1), b"x")
    assert resp.code == R.SUCCESS and 0 <= int(resp.ext_fields["queueId"]) < 4


async def test_send_response_fields_are_strings(client: Client) -> None:
    resp = await client.call(10, send_v1("Fields"), b"x")
    assert resp.code == R.SUCCESS
    for key in ("msgId", "queueId", "queueOffset"):
        assert isinstance(resp.ext_fields[key], str)
    assert len(resp.ext_fields["msgId"]) == 32 and resp.ext_fields["msgId"].upper() == resp.ext_fields["msgId"]


async def test_body_over_max_message_size_is_13(tmp_path) -> None:
    async with running_broker(str(tmp_path / "s"), max_message_size=1024) as b:
        c = await Client().open(b.broker_addr)
        try:
            assert (await c.call(10, send_v1("Big"), b"x" * 1025)).code == R.MESSAGE_ILLEGAL
            assert (await c.call(10, send_v1("Big"), b"x" * 100)).code == R.SUCCESS
        finally:
            c.close()


async def test_properties_over_32767_bytes_are_13(client: Client) -> None:
    props = "TAGS\x01A\x02big\x01" + "p" * 33000 + "\x02"
    resp = await client.call(10, send_v1("Props", properties=props), b"x")
    assert resp.code == R.MESSAGE_ILLEGAL
    assert (await client.call(10, send_v1("Props"), b"x")).code == R.SUCCESS


async def test_delay_level_above_18_is_clamped(broker, client: Client) -> None:
    resp = await client.call(10, send_v1("Clamp", 0, "DELAY\x0199\x02TAGS\x01T\x02"), b"later")
    assert resp.code == R.SUCCESS
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    stored = broker.store.look_message_by_offset(phy)
    assert stored.topic == "SCHEDULE_TOPIC_XXXX" and stored.queue_id == 17
    assert stored.properties["DELAY"] == "18" and stored.properties["REAL_TOPIC"] == "Clamp"
    assert stored.properties["REAL_QID"] == "0"


async def test_retry_send_uses_group_max_for_old_clients(broker, client: Client) -> None:
    """§2.7 SEND 6: below version 121 (C++ 63) the header's maxReconsumeTimes is ignored; the group's
    retryMaxTimes (16) decides."""
    under = send_v1("%RETRY%gold", 0, "TAGS\x01A\x02", reconsumeTimes="3", maxReconsumeTimes="2")
    resp = await client.call(10, under, b"retry", version=63)
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    assert resp.code == R.SUCCESS and broker.store.look_message_by_offset(phy).topic == "%RETRY%gold"
    over = send_v1("%RETRY%gold", 0, "TAGS\x01A\x02", reconsumeTimes="16")
    resp = await client.call(10, over, b"dead", version=63)
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    dead = broker.store.look_message_by_offset(phy)
    assert dead.topic == "%DLQ%gold" and broker.topics.get("%DLQ%gold").perm == 6


async def test_v2_header_with_version_121_honours_max_reconsume(broker, client: Client) -> None:
    fields = {"a": "pg", "b": "%RETRY%gv2", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0,
              "i": "TAGS\x01A\x02", "j": 2, "k": False, "l": 2}
    resp = await client.call(310, fields, b"x", version=121)
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    assert broker.store.look_message_by_offset(phy).topic == "%DLQ%gv2"


# ---- offsets and consumer management (§2.7) ------------------------------------------------------


async def test_query_consumer_offset_22_when_message_0_is_not_in_memory(tmp_path) -> None:
    """No stored offset, and message 0 counts as "in disk" (hot-data ratio 0) → 22 with Java's remark."""
    async with running_broker(str(tmp_path / "s"), access_message_in_memory_max_ratio=0) as b:
        c = await Client().open(b.broker_addr)
        try:
            await c.call(10, send_v1("Cold"), b"a")
            await c.call(10, send_v1("Cold"), b"b")
            q = await c.call(14, {"consumerGroup": "cg", "topic": "Cold", "queueId": 0})
            assert q.code == R.QUERY_NOT_FOUND
            assert q.remark == "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"
            await c.call(15, {"consumerGroup": "cg", "topic": "Cold", "queueId": 0, "commitOffset": 1})
            q = await c.call(14, {"consumerGroup": "cg", "topic": "Cold", "queueId": 0})
            assert q.code == R.SUCCESS and q.ext_fields["offset"] == "1"
        finally:
            c.close()


async def test_update_consumer_offset_minus_one_is_ignored(broker, client: Client) -> None:
    await client.call(15, {"consumerGroup": "cg", "topic": "U", "queueId": 0, "commitOffset": 4})
    resp = await client.call(15, {"consumerGroup": "cg", "topic": "U", "queueId": 0, "commitOffset": -1})
    assert resp.code == R.SUCCESS and broker.offsets.query("cg", "U", 0) == 4


async def test_offset_requests_with_bad_headers_answer_1(client: Client) -> None:
    for code, fields in ((14, {"topic": "T", "queueId": 0}), (14, {"consumerGroup": "g", "topic": "T"}),
                         (15, {"consumerGroup": "g", "topic": "T", "queueId": "zero", "commitOffset": 1}),
                         (30, {"queueId": 0}), (31, {"topic": "T", "queueId": "x"}),
                         (29, {"topic": "T", "queueId": 0}), (32, {"topic": "T"}), (33, {}),
                         (12, {"topic": "T"})):
        resp = await client.call(code, fields)
        assert resp.code == R.SYSTEM_ERROR, (code, fields)
    assert (await client.call(30, {"topic": "T", "queueId": 0})).code == R.SUCCESS  # connection still fine


async def test_offsets_of_unknown_queue(client: Client) -> None:
    for code, key, value in ((30, "offset", "0"), (31, "offset", "0"), (32, "timestamp", "-1")):
        resp = await client.call(code, {"topic": "Nowhere", "queueId": 3})
        assert resp.code == R.SUCCESS and resp.ext_fields[key] == value
    resp = await client.call(29, {"topic": "Nowhere", "queueId": 3, "timestamp": 5})
    assert resp.code == R.SUCCESS and resp.ext_fields["offset"] == "0"


def heartbeat(client_id: str, group: str, topic: str = "HBT") -> bytes:
    return jsonx.dumps({"clientID": client_id, "consumerDataSet": [{
        "consumeFromWhere": 0, "consumeType": 1, "groupName": group, "messageModel": 1,
        "subscriptionDataSet": [{"subString": "*", "subVersion": "1", "topic": topic}]}]}) + b"\n"


async def test_unregister_client_cpp_empty_groups_and_notify(broker, client: Client) -> None:
    other = await Client().open(broker.broker_addr)
    try:
        assert (await client.call(34, body=heartbeat("A", "gu"))).code == R.SUCCESS
        assert (await other.call(34, body=heartbeat("B", "gu"))).code == R.SUCCESS
        await wait_for(lambda: client.notifications)
        client.notifications.clear()
        # C++ sends the unused group as "" (§9.13): nothing is unregistered
        r = await other.call(35, {"clientID": "B", "producerGroup": "", "consumerGroup": ""})
        assert r.code == R.SUCCESS
        lst = jsonx.loads((await client.call(38, {"consumerGroup": "gu"})).body)["consumerIdList"]
        assert sorted(lst) == ["A", "B"]
        r = await other.call(35, {"clientID": "B", "producerGroup": "", "consumerGroup": "gu"})
        assert r.code == R.SUCCESS
        await wait_for(lambda: client.notifications)
        assert client.notifications[0].ext_fields["consumerGroup"] == "gu"
        lst = jsonx.loads((await client.call(38, {"consumerGroup": "gu"})).body)["consumerIdList"]
        assert lst == ["A"]
    finally:
        other.close()
    missing = await client.call(38, {})
    assert missing.code == R.SYSTEM_ERROR and missing.remark.startswith("no consumer for this group")


async def test_malformed_bodies_answer_1_and_keep_the_connection(client: Client) -> None:
    for code, body in ((34, b"{"), (34, b"[]"), (34, b'{"consumerDataSet":5}'), (41, b""), (41, b"[1]"),
                       (41, b'{"mqSet":[{"topic":"a"}]}'), (42, b"{"), (200, b"{"), (200, b'{"retryMaxTimes":1}')):
        resp = await client.call(code, body=body)
        assert resp.code == R.SYSTEM_ERROR, (code, body)
    assert (await client.call(34, body=heartbeat("A", "gm"))).code == R.SUCCESS


# ---- PULL (§2.7 PULL, §6.8) ------------------------------------------------------------------------


async def test_pull_bad_requests_answer_1_with_no_hang(broker, client: Client) -> None:
    broker.topics.update(TopicConfig("PB", 2, 2))
    for fields in (pull("PB", queue_id=-1), pull("PB", queue_id=2), {"consumerGroup": "cg", "topic": "PB"},
                   pull("PB", offset="x"), {"topic": "PB", "queueId": 0, "queueOffset": 0}):
        resp = await client.call(11, fields)
        assert resp.code == R.SYSTEM_ERROR, fields
    assert broker.long_polling.parked_count == 0
    unknown = await client.call(11, pull("NoSuchTopic"))
    assert unknown.code == R.TOPIC_NOT_EXIST


async def test_pull_huge_max_msg_nums_is_capped_by_the_transfer_limits(broker, client: Client) -> None:
    for i in range(40):
        await client.call(10, send_v1("Many"), b"m%d" % i)
    got = await client.call(11, pull("Many", max_msgs=2**31 - 1, sys_flag=4))
    assert got.code == R.SUCCESS and len(records(got.body)) == 32
    assert got.ext_fields["nextBeginOffset"] == "32"


async def test_pull_outcomes_always_carry_the_header(broker, client: Client) -> None:
    await client.call(10, send_v1("Hdr"), b"x")
    cases = {0: R.SUCCESS, 1: R.PULL_NOT_FOUND, 5: R.PULL_OFFSET_MOVED, -3: R.PULL_OFFSET_MOVED}
    for offset, code in cases.items():
        got = await client.call(11, pull("Hdr", offset=offset, sys_flag=4))
        assert got.code == code, offset
        assert PULL_HEADER_KEYS <= set(got.ext_fields), offset
    moved = await client.call(11, pull("Hdr", offset=5, sys_flag=4))
    assert moved.ext_fields["nextBeginOffset"] == "0"  # minOffset 0: Java corrects to minOffset
    small_queue = await client.call(11, pull("Hdr", queue_id=1, offset=3, sys_flag=4))
    assert small_queue.code == R.PULL_OFFSET_MOVED and small_queue.ext_fields["nextBeginOffset"] == "0"


async def test_pull_with_tag_filter_reports_scanned_entries(client: Client) -> None:
    await client.call(10, send_v1("Skip", 0, "TAGS\x01B\x02"), b"b")
    await client.call(10, send_v1("Skip", 0, "TAGS\x01B\x02"), b"b")
    none = await client.call(11, pull("Skip", sub="A", sys_flag=4))
    assert none.code == R.PULL_RETRY_IMMEDIATELY and none.ext_fields["nextBeginOffset"] == "2"
    assert none.remark == "NO_MATCHED_MESSAGE"


async def test_long_poll_answers_19_at_the_deadline_and_a_closed_connection_unparks(broker) -> None:
    broker.topics.update(TopicConfig("LPD", 1, 1))
    c = await Client().open(broker.broker_addr)
    try:
        got = await c.call(11, pull("LPD", suspend_ms=150), timeout_ms=5000)
        assert got.code == R.PULL_NOT_FOUND and PULL_HEADER_KEYS <= set(got.ext_fields)
        pending = asyncio.ensure_future(c.call(11, pull("LPD", suspend_ms=20000), timeout_ms=30000))
        await wait_for(lambda: broker.long_polling.parked_count == 1)
    finally:
        c.close()
    try:
        await pending
    except Exception:
        pass

    def checker_ran() -> bool:  # what the 5 s checker does, once the broker saw the close
        broker.long_polling.notify_all()
        return broker.long_polling.parked_count == 0

    await wait_for(checker_ran, timeout_s=5)


async def test_slave_read_enable_suggests_which_broker(tmp_path) -> None:
    """§6.8: slaveReadEnable=true → whichBrokerWhenConsumeSlowly (1) when the data is "in disk"
    (hot-data ratio 0), else the group's brokerId (0)."""
    for ratio, expected in ((0, "1"), (40, "0")):
        async with running_broker(str(tmp_path / f"s{ratio}"), slave_read_enable=True,
                                  access_message_in_memory_max_ratio=ratio) as b:
            c = await Client().open(b.broker_addr)
            try:
                await c.call(10, send_v1("Slow"), b"a")
                await c.call(10, send_v1("Slow"), b"b")
                got = await c.call(11, pull("Slow", max_msgs=1, sys_flag=4))
                assert got.code == R.SUCCESS
                assert got.ext_fields["suggestWhichBrokerId"] == expected, ratio
            finally:
                c.close()


# ---- LOCK (§2.7, §3.5) -------------------------------------------------------------------------------


def lock_body(client_id: str, *queue_ids: int) -> bytes:
    return jsonx.dumps({"consumerGroup": "og", "clientId": client_id,
                        "mqSet": [{"topic": "Ord", "brokerName": "broker-c", "queueId": q} for q in queue_ids]})


async def test_lock_lives_60_s_and_is_owned_by_client_id(tmp_path) -> None:
    clock = ManualMs(1_700_000_000_000)
    async with running_broker(str(tmp_path / "s"), clock_ms=clock) as b:
        c = await Client().open(b.broker_addr)
        try:
            a = jsonx.loads((await c.call(41, body=lock_body("A", 0, 1))).body)["lockOKMQSet"]
            assert sorted(m["queueId"] for m in a) == [0, 1]
            other = jsonx.loads((await c.call(41, body=lock_body("B", 1, 2))).body)["lockOKMQSet"]
            assert [m["queueId"] for m in other] == [2]
            # UNLOCK by a non-owner always answers SUCCESS but releases nothing
            assert (await c.call(42, body=lock_body("B", 0))).code == R.SUCCESS
            clock.now_ms += 60_000  # exactly 60 s: still owned
            assert jsonx.loads((await c.call(41, body=lock_body("B", 0))).body)["lockOKMQSet"] == []
            clock.now_ms += 1
            took = jsonx.loads((await c.call(41, body=lock_body("B", 0))).body)["lockOKMQSet"]
            assert [m["queueId"] for m in took] == [0]
            assert (await c.call(42, body=lock_body("B", 0))).code == R.SUCCESS
            again = jsonx.loads((await c.call(41, body=lock_body("A", 0))).body)["lockOKMQSet"]
            assert [m["queueId"] for m in again] == [0]
        finally:
            c.close()


# ---- fast port (§6.2) ----------------------------------------------------------------------------------


async def test_fast_port_serves_the_same_requests(tmp_path) -> None:
    port = free_port(broker=True)
    async with running_broker(str(tmp_path / "s"), listen_port=port, fast_listen_enable=True) as b:
        assert b.fast_server is not None and b.fast_server.port == port - 2
        fast = await Client().open(f"127.0.0.1:{port - 2}")
        main = await Client().open(b.broker_addr)
        try:
            sent = await fast.call(10, send_v1("Fast"), b"via fast")
            assert sent.code == R.SUCCESS
            got = await main.call(11, pull("Fast", sys_flag=4))
            assert [m.body for m in records(got.body)] == [b"via fast"]
            assert (await fast.call(30, {"topic": "Fast", "queueId": 0})).ext_fields["offset"] == "1"
        finally:
            fast.close()
            main.close()
