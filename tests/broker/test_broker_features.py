"""Integration: long polling, batch, delay, send-back/DLQ, persistence, queries, robustness."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import pytest
from broker_helpers import Client, make_config, pull, records, send_v1, wait_for

from ferrymq.broker.app import BrokerController
from ferrymq.common.message import decode_offset_msg_id
from ferrymq.common.message_codec import encode_batch_body
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import FrameDecoder
from ferrymq.remoting.codes import ResponseCode as R
from support.shared import CAPTURES  # noqa: E402


async def test_long_poll_is_woken_by_a_send(broker, client: Client) -> None:
    await client.call(10, send_v1("LP"), b"first")
    parked = asyncio.ensure_future(client.call(11, pull("LP", offset=1, suspend_ms=15000), timeout_ms=20000))
    await wait_for(lambda: broker.long_polling.parked_count == 1)
    sender = await Client().open(broker.broker_addr)
    try:
        assert (await sender.call(10, send_v1("LP"), b"second")).code == R.SUCCESS
    finally:
        sender.close()
    got = await asyncio.wait_for(parked, 5)
    assert got.code == R.SUCCESS
    assert [m.body for m in records(got.body)] == [b"second"]


async def test_long_poll_times_out_with_19(broker, client: Client) -> None:
    await client.call(10, send_v1("LP2"), b"x")
    got = await client.call(11, pull("LP2", offset=1, suspend_ms=200))
    assert got.code == R.PULL_NOT_FOUND and got.ext_fields["nextBeginOffset"] == "1"


async def test_cpp_batch_flag_one_is_a_batch(broker, client: Client) -> None:
    body = encode_batch_body([(0, b"batch 0", "TAGS\x01TagB\x02UNIQ_KEY\x01A\x02"),
                              (0, b"batch 1", "TAGS\x01TagB\x02UNIQ_KEY\x01B\x02")])
    resp = await client.call(10, send_v1("Batchy", 0, "WAIT\x01true\x02", batch="1"), body)
    assert resp.code == R.SUCCESS, resp.remark
    assert len(resp.ext_fields["msgId"].split(",")) == 2 and resp.ext_fields["queueOffset"] == "0"
    got = await client.call(11, pull("Batchy", sub="TagB"))
    msgs = records(got.body)
    assert [m.body for m in msgs] == [b"batch 0", b"batch 1"]
    assert [m.queue_offset for m in msgs] == [0, 1]
    assert "WAIT" not in msgs[0].properties and msgs[0].properties["CLUSTER"] == "DefaultCluster"


async def test_delay_level_one_arrives_a_second_later(broker, client: Client) -> None:
    resp = await client.call(10, send_v1("Later", 0, "DELAY\x011\x02TAGS\x01T\x02"), b"delayed")
    assert resp.code == R.SUCCESS
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    sched = broker.store.look_message_by_offset(phy)
    assert sched.topic == "SCHEDULE_TOPIC_XXXX" and sched.queue_id == 0
    assert sched.properties["REAL_TOPIC"] == "Later"

    async def arrived():
        r = await client.call(11, pull("Later", sys_flag=4))
        return r if r.code == R.SUCCESS else None

    got = await wait_for(arrived, timeout_s=10, interval_s=0.1)
    (msg,) = records(got.body)
    assert msg.body == b"delayed" and "DELAY" not in msg.properties
    assert msg.store_timestamp - sched.store_timestamp >= 1000


async def test_send_back_retry_then_dlq(broker, client: Client) -> None:
    resp = await client.call(10, send_v1("Orig"), b"payload")
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    back = await client.call(36, {"offset": phy, "group": "cgx", "delayLevel": 0})
    assert back.code == R.SUCCESS, back.remark
    assert broker.topics.get("%RETRY%cgx") is not None
    # the retry copy sits in SCHEDULE_TOPIC_XXXX at level 3 (queue 2), reconsumeTimes 1
    units = await wait_for(lambda: broker.store.get_consume_queue_units("SCHEDULE_TOPIC_XXXX", 2, 0, 10))
    retry = broker.store.look_message_by_offset(units[0][0])
    assert retry.reconsume_times == 1 and retry.properties["REAL_TOPIC"] == "%RETRY%cgx"
    assert retry.properties["RETRY_TOPIC"] == "Orig"
    # lower the group's retry limit to 1: the next send-back goes to the DLQ
    upd = await client.call(200, body=jsonx.dumps({"groupName": "cgx", "retryMaxTimes": 1}))
    assert upd.code == R.SUCCESS
    back2 = await client.call(36, {"offset": units[0][0], "group": "cgx", "delayLevel": 0})
    assert back2.code == R.SUCCESS
    got = await wait_for(lambda: client.call(11, pull("%DLQ%cgx", group="admin", sys_flag=4)))
    (dlq,) = records(got.body)
    assert dlq.body == b"payload" and dlq.reconsume_times == 2


async def test_retry_topic_send_past_max_goes_to_dlq(broker, client: Client) -> None:
    fields = send_v1("%RETRY%g2", 0, "TAGS\x01A\x02", reconsumeTimes="16", maxReconsumeTimes="16")
    resp = await client.call(10, fields, b"dead", version=407)
    assert resp.code == R.SUCCESS
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    assert broker.store.look_message_by_offset(phy).topic == "%DLQ%g2"


async def test_offsets_survive_restart(tmp_path, namesrv) -> None:
    cfg = make_config(str(tmp_path / "s"), namesrv.addr)
    async with BrokerController(cfg) as ctl:
        c = await Client().open(ctl.broker_addr)
        await c.call(10, send_v1("Persist"), b"m")
        assert (await c.call(15, {"consumerGroup": "cg", "topic": "Persist", "queueId": 0,
                                  "commitOffset": 1})).code == R.SUCCESS
        assert (await c.call(15, {"consumerGroup": "cg", "topic": "Persist", "queueId": 1,
                                  "commitOffset": -1})).code == R.SUCCESS
        c.close()
    raw = (tmp_path / "s" / "config" / "consumerOffset.json").read_text()
    assert json.loads(raw)["offsetTable"]["Persist@cg"] == {"0": 1}
    async with BrokerController(make_config(str(tmp_path / "s"), namesrv.addr)) as ctl:
        c = await Client().open(ctl.broker_addr)
        q = await c.call(14, {"consumerGroup": "cg", "topic": "Persist", "queueId": 0})
        assert q.code == R.SUCCESS and q.ext_fields["offset"] == "1"
        q = await c.call(14, {"consumerGroup": "cg", "topic": "Nope", "queueId": 0})
        assert q.code == R.SUCCESS and q.ext_fields["offset"] == "0"  # empty queue, message 0 "in memory"
        c.close()


async def test_view_by_id_and_query_by_key(broker, client: Client) -> None:
    resp = await client.call(10, send_v1("Q", 0, "KEYS\x01order-1 order-2\x02TAGS\x01A\x02"), b"find me")
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    view = await client.call(33, {"offset": phy})
    assert view.code == R.SUCCESS and records(view.body)[0].body == b"find me"
    await wait_for(lambda: broker.store.reput_phy_offset >= broker.store.max_phy_offset)
    q = await client.call(12, {"topic": "Q", "key": "order-2", "maxNum": 32, "beginTimestamp": 0,
                               "endTimestamp": 2**62})
    assert q.code == R.SUCCESS and [m.body for m in records(q.body)] == [b"find me"]
    assert {"indexLastUpdateTimestamp", "indexLastUpdatePhyoffset"} <= set(q.ext_fields)
    missing = await client.call(33, {"offset": 10**9})
    assert missing.code == R.SYSTEM_ERROR


async def test_runtime_info_and_offsets(broker, client: Client) -> None:
    await client.call(10, send_v1("Info"), b"abc")
    info = await client.call(28)
    table = jsonx.loads(info.body)["table"]
    assert info.code == R.SUCCESS and all(isinstance(v, str) for v in table.values())
    assert int(table["commitLogMaxOffset"]) > 0 and "brokerVersion" in table
    mx = await client.call(30, {"topic": "Info", "queueId": 0})
    mn = await client.call(31, {"topic": "Info", "queueId": 0})
    ts = await client.call(32, {"topic": "Info", "queueId": 0})
    assert (mx.ext_fields["offset"], mn.ext_fields["offset"]) == ("1", "0") and int(ts.ext_fields["timestamp"]) > 0
    so = await client.call(29, {"topic": "Info", "queueId": 0, "timestamp": 0})
    assert so.code == R.SUCCESS and so.ext_fields["offset"] == "0"


async def test_heartbeat_consumer_list_and_notify(broker, client: Client) -> None:
    hb = {"clientID": "1-127.0.0.1@A", "consumerDataSet": [{
        "consumeFromWhere": 0, "consumeType": 1, "groupName": "cgh", "messageModel": 1,
        "subscriptionDataSet": [{"codeSet": [0], "subString": "TagA", "subVersion": "5", "tagsSet": ["TagA"],
                                 "topic": "HB"}]}]}
    assert (await client.call(34, body=jsonx.dumps(hb) + b"\n")).code == R.SUCCESS
    assert broker.topics.get("%RETRY%cgh").perm == 6
    lst = await client.call(38, {"consumerGroup": "cgh"})
    assert jsonx.loads(lst.body)["consumerIdList"] == ["1-127.0.0.1@A"]
    other = await Client().open(broker.broker_addr)
    try:
        hb2 = dict(hb, clientID="2-127.0.0.1@B")
        hb2["consumerDataSet"] = [dict(hb["consumerDataSet"][0], consumeType="CONSUME_PASSIVELY")]
        await other.call(34, body=jsonx.dumps(hb2))
        await wait_for(lambda: client.notifications)
        assert client.notifications[0].ext_fields["consumerGroup"] == "cgh"
    finally:
        other.close()
    await wait_for(lambda: len(broker.consumers.get("cgh").channels) == 1)
    none = await client.call(38, {"consumerGroup": "nobody"})
    assert none.code == R.SYSTEM_ERROR and none.remark == "no consumer for this group, nobody"
    # pull without the subscription flag uses the heartbeat's subscription (hash recomputed from "TagA")
    await client.call(10, send_v1("HB", 0, "TAGS\x01TagA\x02"), b"a")
    await client.call(10, send_v1("HB", 0, "TAGS\x01TagB\x02"), b"b")
    got = await client.call(11, pull("HB", group="cgh", sys_flag=0))
    assert [m.body for m in records(got.body)] == [b"a"]


async def test_unknown_code_and_garbage(broker, client: Client) -> None:
    unk = await client.call(9999)
    assert unk.code == R.REQUEST_CODE_NOT_SUPPORTED
    host, port = broker.broker_addr.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(struct.pack(">i", 8) + b"\x00\x00\x00\x04{{{{")  # a frame with a broken JSON header
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # the broker closed it
    writer.close()
    s = socket.create_connection((host, int(port)))
    s.sendall(b"\xff" * 64)  # absurd length prefix
    s.close()
    assert (await client.call(10, send_v1("Alive"), b"still here")).code == R.SUCCESS


async def test_replay_cpp_capture_frames(broker) -> None:
    lines = [json.loads(x) for x in (CAPTURES / "capture_cpp.jsonl").read_text().splitlines() if x.strip()]
    frames = [x for x in lines if x.get("kind") == "frame" and x.get("role") == "broker"]
    wanted = [f for f in frames if json.loads(f["header_raw"])["code"] in (10, 34, 38, 14, 15, 35)]
    first_pull = next(f for f in frames if json.loads(f["header_raw"])["code"] == 11
                      and json.loads(f["header_raw"])["extFields"]["topic"] == "TopicTest")
    host, port = broker.broker_addr.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    decoder = FrameDecoder()
    try:
        for f in wanted + [first_pull]:
            header = f["header_raw"].encode()
            body = bytes.fromhex(f["body_hex"])
            writer.write(struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body)
            await writer.drain()
            opaque = json.loads(header)["opaque"]
            resp = None
            while resp is None:
                data = await asyncio.wait_for(reader.read(65536), 5)
                assert data, "broker closed the connection"
                for cmd in decoder.feed(data):
                    if cmd.opaque == opaque and cmd.is_response:
                        resp = cmd
            code = json.loads(header)["code"]
            assert all(isinstance(v, str) for v in resp.ext_fields.values())
            if code == 10:
                assert resp.code == R.SUCCESS, resp.remark
                assert {"msgId", "queueId", "queueOffset"} <= set(resp.ext_fields)
            elif code == 11:
                assert resp.code == R.SUCCESS and len(records(resp.body)) >= 1
                assert {"suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"} <= set(resp.ext_fields)
            elif code == 14:
                assert "offset" in resp.ext_fields
            elif code in (34, 15, 35):
                assert resp.code == R.SUCCESS
    finally:
        writer.close()


async def test_broker_max_reconsume_times_caps_client_header(tmp_path, namesrv) -> None:
    """``maxReconsumeTimes=2`` in broker.conf: a send-back carrying the client's default 16 (as the Apache C++
    consumer sends it) goes to the DLQ once the message has been retried twice, and so does a send to the
    retry topic with reconsumeTimes 2."""
    async with BrokerController(make_config(str(tmp_path / "s"), namesrv.addr, max_reconsume_times=2)) as ctl:
        c = await Client().open(ctl.broker_addr)
        try:
            resp = await c.call(10, send_v1("Orig"), b"payload")
            _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
            back = await c.call(36, {"offset": phy, "group": "cgm", "delayLevel": 0, "maxReconsumeTimes": 16},
                                version=407)
            assert back.code == R.SUCCESS, back.remark
            units = await wait_for(lambda: ctl.store.get_consume_queue_units("SCHEDULE_TOPIC_XXXX", 2, 0, 10))
            first_retry = units[0][0]
            assert ctl.store.look_message_by_offset(first_retry).reconsume_times == 1
            back = await c.call(36, {"offset": first_retry, "group": "cgm", "delayLevel": 0,
                                     "maxReconsumeTimes": 16}, version=407)
            assert back.code == R.SUCCESS, back.remark
            units = await wait_for(lambda: ctl.store.get_consume_queue_units("SCHEDULE_TOPIC_XXXX", 3, 0, 10))
            second_retry = units[0][0]
            assert ctl.store.look_message_by_offset(second_retry).reconsume_times == 2
            back = await c.call(36, {"offset": second_retry, "group": "cgm", "delayLevel": 0,
                                     "maxReconsumeTimes": 16}, version=407)
            assert back.code == R.SUCCESS, back.remark
            got = await wait_for(lambda: c.call(11, pull("%DLQ%cgm", group="admin", sys_flag=4)))
            (dlq,) = records(got.body)
            assert dlq.body == b"payload" and dlq.reconsume_times == 3

            fields = send_v1("%RETRY%cgm", 0, "TAGS\x01A\x02", reconsumeTimes="2", maxReconsumeTimes="16")
            resp = await c.call(10, fields, b"dead", version=407)
            assert resp.code == R.SUCCESS
            _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
            assert ctl.store.look_message_by_offset(phy).topic == "%DLQ%cgm"
        finally:
            c.close()


async def test_compressed_batch_body_is_inflated(broker, client: Client) -> None:
    """The Apache C++ client 1.x deflates a batch body of >= 4 KiB and sets sysFlag bit 0: every entry is stored
    as its own uncompressed record, without the compressed flag."""
    import zlib

    bodies = [bytes([65 + i]) * 3000 for i in range(3)]
    body = encode_batch_body([(0, b, f"TAGS\x01TagZ\x02UNIQ_KEY\x01Z{i}\x02") for i, b in enumerate(bodies)])
    resp = await client.call(10, send_v1("Zipped", 0, "", batch="1", sysFlag=1), zlib.compress(body, 5))
    assert resp.code == R.SUCCESS, resp.remark
    assert len(resp.ext_fields["msgId"].split(",")) == 3
    got = await client.call(11, pull("Zipped", sub="TagZ"))
    msgs = records(got.body)
    assert [m.body for m in msgs] == bodies
    assert all(m.sys_flag & 1 == 0 for m in msgs)


@pytest.mark.parametrize("payload, reason", [
    (lambda zlib: zlib.compress(b"\0" * (64 * 1024 * 1024), 9), "inflates past"),  # a 64 KiB "zip bomb"
    (lambda zlib: b"not zlib at all", "does not inflate"),
    (lambda zlib: zlib.compress(b"x" * 10_000)[:-8], "truncated"),
])
async def test_bad_compressed_batch_body_is_refused(broker, client: Client, payload, reason) -> None:
    import zlib

    resp = await client.call(10, send_v1("Zipped", 0, "", batch="1", sysFlag=1), payload(zlib))
    assert resp.code == R.MESSAGE_ILLEGAL and reason in (resp.remark or "")
    ok = await client.call(10, send_v1("Zipped"), b"still serving")
    assert ok.code == R.SUCCESS


@pytest.mark.parametrize("field", ["flag", "sysFlag", "reconsumeTimes"])
async def test_header_int_beyond_int32_is_answered_clearly(broker, client: Client, caplog, field: str) -> None:
    resp = await client.call(10, send_v1("Ranges", **{field: "99999999999"}), b"x")
    assert resp.code == R.SYSTEM_ERROR
    assert resp.remark == f"header field '{field}' is outside the 32-bit int range: 99999999999"
    assert not [r for r in caplog.records if r.exc_info], "no traceback is logged for a bad header"
    assert (await client.call(10, send_v1("Ranges"), b"x")).code == R.SUCCESS
