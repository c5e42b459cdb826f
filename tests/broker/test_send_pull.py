"""Integration: raw remoting against an in-process NameServer + BrokerController."""

from __future__ import annotations

from broker_helpers import Client, pull, records, send_v1

from ferrymq.common.message import decode_offset_msg_id
from ferrymq.remoting.codes import ResponseCode as R


async def test_send_then_pull_round_trip(broker, client: Client) -> None:
    resp = await client.call(10, send_v1("TopicA", 1), b"hello")
    assert resp.code == R.SUCCESS, resp.remark
    assert set(resp.ext_fields) >= {"msgId", "queueId", "queueOffset", "MSG_REGION", "TRACE_ON"}
    assert resp.ext_fields["queueId"] == "1" and resp.ext_fields["queueOffset"] == "0"
    ip, port, _ = decode_offset_msg_id(resp.ext_fields["msgId"])
    assert (ip, port) == ("127.0.0.1", broker.port)
    tc = broker.topics.get("TopicA")
    assert tc is not None and tc.write_queue_nums == 4 and tc.perm == 6

    got = await client.call(11, pull("TopicA", queue_id=1))
    assert got.code == R.SUCCESS, got.remark
    assert got.ext_fields["nextBeginOffset"] == "1"
    assert set(got.ext_fields) >= {"suggestWhichBrokerId", "minOffset", "maxOffset"}
    (msg,) = records(got.body)
    assert msg.body == b"hello" and msg.topic == "TopicA"
    props = msg.properties
    assert props["CLUSTER"] == "DefaultCluster" and "WAIT" not in props


async def test_v2_send_and_pull_not_found(broker, client: Client) -> None:
    v2 = {"a": "pg", "b": "TopicB", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0,
          "i": "TAGS\x01TagA\x02KEYS\x01kA kB\x02", "j": 0, "k": False}
    resp = await client.call(310, v2, b"v2 body")
    assert resp.code == R.SUCCESS, resp.remark
    got = await client.call(11, pull("TopicB", offset=1, sys_flag=4))
    assert got.code == R.PULL_NOT_FOUND
    assert got.ext_fields["nextBeginOffset"] == "1"


async def test_pull_offset_moved_and_unknown_topic(broker, client: Client) -> None:
    await client.call(10, send_v1("TopicC"), b"x")
    got = await client.call(11, pull("TopicC", offset=5, sys_flag=4))
    # Java corrects OFFSET_OVERFLOW_BADLY to minOffset when minOffset == 0
    assert got.code == R.PULL_OFFSET_MOVED and got.ext_fields["nextBeginOffset"] == "0"
    got = await client.call(11, pull("NoSuchTopic", sys_flag=4))
    assert got.code == R.TOPIC_NOT_EXIST


def test_a_subscription_to_every_tag_reaches_the_store_without_a_filter() -> None:
    """"*" (and an empty expression) means no filter for the store, so its pull scan can run natively."""
    from types import SimpleNamespace

    from ferrymq.broker.processors.pull import PullProcessor
    from ferrymq.store.filter import TagFilter

    proc = PullProcessor(SimpleNamespace(config=SimpleNamespace(enable_property_filter=False)))  # type: ignore[arg-type]
    for expression in ("*", " * ", "", None):
        assert proc._build_filter("TAG", expression, R.SUBSCRIPTION_PARSE_FAILED, "") is None
    tagged = proc._build_filter("TAG", "a || b", R.SUBSCRIPTION_PARSE_FAILED, "")
    assert isinstance(tagged, TagFilter) and tagged.tags == frozenset({"a", "b"})
