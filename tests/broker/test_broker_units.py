"""Unit tests of the broker's pure parts (no sockets)."""

from __future__ import annotations

import json
import logging

import pytest

from ferrymq.broker.config import BrokerRole, FlushDiskType, from_properties, load_config
from ferrymq.broker.consumer_manager import ConsumerData, ConsumerManager, SubscriptionData
from ferrymq.broker.headers import PullHeader, SendHeader
from ferrymq.broker.offset_manager import ConsumerOffsetManager
from ferrymq.broker.status_codes import PUT_STATUS_TABLE, pull_code, send_outcome
from ferrymq.broker.topic_manager import TopicManager
from ferrymq.common.properties import parse_properties
from ferrymq.errors import ConfigError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.store.filter import TagFilter
from ferrymq.store.results import GetMessageStatus, PutMessageStatus

# ---- config --------------------------------------------------------------------------------------


def test_config_reads_rocketmq_keys(tmp_path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text("# comment\nbrokerClusterName = C1\nbrokerName=b1\nbrokerId=0\n"
                    "namesrvAddr=127.0.0.1:9876;127.0.0.1:9877\nlistenPort=20911\nflushDiskType=SYNC_FLUSH\n"
                    "brokerRole=SYNC_MASTER\nautoCreateTopicEnable=false\n")
    cfg = load_config(str(path))
    assert (cfg.broker_cluster_name, cfg.broker_name, cfg.listen_port) == ("C1", "b1", 20911)
    assert cfg.namesrv_addr == ["127.0.0.1:9876", "127.0.0.1:9877"]
    assert cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH and cfg.broker_role is BrokerRole.SYNC_MASTER
    assert cfg.auto_create_topic_enable is False
    assert cfg.effective_ha_listen_port == 20912
    assert cfg.warnings == []


def test_config_unknown_key_warns(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        cfg = from_properties({"brokerName": "x", "noSuchKey": "1"})
    assert any("noSuchKey" in w for w in cfg.warnings)
    assert "noSuchKey" in caplog.text


@pytest.mark.parametrize("key,value", [("listenPort", "abc"), ("autoCreateTopicEnable", "yes"),
                                       ("brokerRole", "BOSS"), ("flushDiskType", "LAZY"),
                                       ("messageDelayLevel", "1x"), ("namesrvAddr", "nohost")])
def test_config_invalid_value_names_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_properties({key: value})
    assert err.value.key == key


def test_slave_needs_nonzero_broker_id_and_master_gets_zero() -> None:
    with pytest.raises(ConfigError) as err:
        from_properties({"brokerRole": "SLAVE", "brokerId": "0"})
    assert err.value.key == "brokerId"
    assert from_properties({"brokerRole": "ASYNC_MASTER", "brokerId": "3"}).broker_id == 0
    assert from_properties({"brokerRole": "SLAVE", "brokerId": "1"}).broker_id == 1


def test_properties_parser() -> None:
    assert parse_properties("a=1\n! c\nb : two\n\nc=x=y\n") == {"a": "1", "b": "two", "c": "x=y"}


# ---- status table --------------------------------------------------------------------------------


def test_put_status_table_covers_every_status() -> None:
    for status in PutMessageStatus:
        send_outcome(status)  # total
    assert {s.name for s in PutMessageStatus} - set(PUT_STATUS_TABLE) <= {"LMQ_CONSUME_QUEUE_NUM_EXCEEDED"}
    assert send_outcome(PutMessageStatus.PUT_OK) == (0, None, True)
    assert send_outcome(PutMessageStatus.FLUSH_DISK_TIMEOUT).code == 10
    assert send_outcome(PutMessageStatus.SLAVE_NOT_AVAILABLE) == (11, None, True)
    assert send_outcome(PutMessageStatus.FLUSH_SLAVE_TIMEOUT).code == 12
    assert send_outcome(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED).code == 13
    assert send_outcome(PutMessageStatus.SERVICE_NOT_AVAILABLE).code == 14
    assert send_outcome(PutMessageStatus.OS_PAGECACHE_BUSY).remark.startswith("[PC_SYNCHRONIZED]")


def test_pull_status_table() -> None:
    G = GetMessageStatus
    assert pull_code(G.FOUND, 3) == 0
    assert pull_code(G.NO_MATCHED_MESSAGE, 3) == 20
    assert pull_code(G.NO_MESSAGE_IN_QUEUE, 0) == 19 and pull_code(G.NO_MESSAGE_IN_QUEUE, 1) == 21
    assert pull_code(G.NO_MATCHED_LOGIC_QUEUE, 0) == 19 and pull_code(G.NO_MATCHED_LOGIC_QUEUE, 2) == 21
    assert pull_code(G.OFFSET_OVERFLOW_ONE, 5) == 19 and pull_code(G.OFFSET_FOUND_NULL, 5) == 19
    assert pull_code(G.OFFSET_OVERFLOW_BADLY, 5) == 21 and pull_code(G.OFFSET_TOO_SMALL, 5) == 21
    assert pull_code(G.MESSAGE_WAS_REMOVING, 5) == 20
    for s in G:
        pull_code(s, 0)


# ---- topics ----------------------------------------------------------------------------------------


def test_topic_auto_create_through_tbw102(tmp_path) -> None:
    changes = []
    tm = TopicManager(str(tmp_path), cluster_name="C", broker_name="B", clock_ms=lambda: 42)
    tm.on_change = lambda urgent=False: changes.append(1 if urgent else 0)
    assert tm.get("TBW102").perm == 7 and tm.get("SCHEDULE_TOPIC_XXXX").read_queue_nums == 18
    tc = tm.create_in_send("New", "TBW102", 4)
    assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (4, 4, 6)
    assert tm.create_in_send("Big", "TBW102", 100).write_queue_nums == 8
    assert tm.create_in_send("X", "SELF_TEST_TOPIC", 4) is None  # template without INHERIT
    assert changes == [1, 1] and tm.data_version.counter == 2  # client-made topics: urgent registrations
    tm2 = TopicManager(str(tmp_path), cluster_name="C", broker_name="B", clock_ms=lambda: 0)
    tm2.load()  # from the journal: the snapshot timer has not run
    assert tm2.get("New") is not None and tm2.data_version.counter == 2
    tm.persist()
    tm.persist()
    saved = json.loads((tmp_path / "topics.json").read_text())
    assert saved["topicConfigTable"]["New"]["perm"] == 6 and (tmp_path / "topics.json.bak").exists()


def test_topic_auto_create_disabled(tmp_path) -> None:
    tm = TopicManager(str(tmp_path), cluster_name="C", broker_name="B", auto_create_topic_enable=False,
                      clock_ms=lambda: 0)
    assert tm.create_in_send("New", "TBW102", 4) is None


# ---- headers -----------------------------------------------------------------------------------------


def test_send_header_v1_cpp_batch_one() -> None:
    cmd = RemotingCommand(code=10, ext_fields={
        "producerGroup": "pg", "topic": "T", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "2", "sysFlag": "0", "bornTimestamp": "17", "flag": "0", "properties": "WAIT\x01true\x02",
        "reconsumeTimes": "0", "unitMode": "0", "batch": "1"})
    h = SendHeader.parse(cmd)
    assert (h.topic, h.queue_id, h.born_timestamp, h.batch, h.unit_mode) == ("T", 2, 17, True, False)
    cmd.ext_fields["batch"] = "0"
    assert SendHeader.parse(cmd).batch is False
    cmd.ext_fields["batch"] = "true"
    assert SendHeader.parse(cmd).batch is True


def test_send_header_v2_letters() -> None:
    cmd = RemotingCommand(code=310, ext_fields={"a": "pg", "b": "T", "c": "TBW102", "d": "4", "e": "1", "f": "0",
                                                "g": "99", "h": "3", "i": "TAGS\x01A", "j": "2", "k": "false",
                                                "l": "5"})
    h = SendHeader.parse(cmd)
    assert (h.producer_group, h.topic, h.queue_id, h.flag, h.reconsume_times, h.max_reconsume_times) == (
        "pg", "T", 1, 3, 2, 5)
    assert h.batch is False
    assert SendHeader.parse(RemotingCommand(code=320, ext_fields=cmd.ext_fields)).batch is True


def test_pull_header_flags() -> None:
    h = PullHeader.parse(RemotingCommand(code=11, ext_fields={
        "consumerGroup": "g", "topic": "T", "queueId": "0", "queueOffset": "5", "maxMsgNums": "32", "sysFlag": "7",
        "commitOffset": "4", "suspendTimeoutMillis": "15000", "subscription": "A || B", "subVersion": "1"}))
    assert h.has_commit_offset and h.has_suspend and h.has_subscription and h.queue_offset == 5


# ---- tag filter / subscriptions --------------------------------------------------------------------------


def test_tag_filter_recomputes_hashes() -> None:
    f = TagFilter("TagA || TagB")
    assert f.is_matched_by_consume_queue(2598919) and not f.is_matched_by_consume_queue(0)
    assert TagFilter("*").is_matched_by_consume_queue(12345) and TagFilter("").is_matched_by_consume_queue(1)
    # C++ heartbeats carry a bogus codeSet of zeros: ignored
    sub = SubscriptionData.from_json({"topic": "T", "subString": "TagA || TagB", "codeSet": [0, 0],
                                      "subVersion": "17"})
    assert sub.code_set == {2598919, 2598920} and sub.sub_version == 17


# ---- consumer manager ------------------------------------------------------------------------------------


class FakeConn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_consumer_manager_expiry_with_injected_clock() -> None:
    now = [0]
    cm = ConsumerManager(clock_ms=lambda: now[0])
    changes: list[tuple[str, int]] = []
    cm.on_ids_changed = lambda g, chans: changes.append((g, len(chans)))
    a, b = FakeConn(), FakeConn()
    data = ConsumerData.from_json({"groupName": "g", "consumeType": 1, "messageModel": "CLUSTERING",
                                   "consumeFromWhere": 4, "subscriptionDataSet": [{"topic": "T", "subString": "*"}]})
    assert data.consume_type == "CONSUME_PASSIVELY" and data.consume_from_where == "CONSUME_FROM_FIRST_OFFSET"
    assert cm.register(a, "A", "CPP", 63, data)
    now[0] = 60_000
    assert cm.register(b, "B", "JAVA", 121, data)
    assert not cm.register(a, "A", "CPP", 63, data)  # refresh, no change
    assert changes == [("g", 1), ("g", 2)]
    now[0] = 150_000
    assert cm.scan_expired() == 0
    cm.register(b, "B", "JAVA", 121, data)
    now[0] = 180_001  # a last heard at 60 000: 120 001 ms ago
    assert cm.scan_expired() == 1 and a.closed and not b.closed
    assert cm.get("g").client_ids() == ["B"]
    cm.channel_closed(b)
    assert cm.get("g") is None


# ---- offsets -----------------------------------------------------------------------------------------------


def test_offset_manager_reads_bare_numeric_keys(tmp_path) -> None:
    (tmp_path / "consumerOffset.json").write_text('{"offsetTable":{"T@g":{0:12,1:5},"U@g":{"3":7}}}')
    om = ConsumerOffsetManager(str(tmp_path))
    om.load()
    assert om.query("g", "T", 0) == 12 and om.query("g", "T", 1) == 5 and om.query("g", "U", 3) == 7
    assert om.query("g", "T", 9) == -1
    om.commit("g", "T", 0, -1)  # ignored
    om.commit("g", "T", 0, 13)
    om.persist()
    assert json.loads((tmp_path / "consumerOffset.json").read_text())["offsetTable"]["T@g"] == {"0": 13, "1": 5}
    assert (tmp_path / "consumerOffset.json.bak").exists()
    assert om.topics_of_group("g") == {"T", "U"}


def test_configuration_reference_lists_every_key() -> None:
    """docs/configuration.md documents every key the broker accepts."""
    from pathlib import Path

    from ferrymq.broker.config import config_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [key for key, _default, _doc in config_table() if f"`{key}`" not in doc]
    assert missing == []


async def test_slave_offset_merge_keeps_its_own_larger_commits_once(tmp_path) -> None:
    """Master wins per queue, except a larger offset committed on the slave since the last merge: kept and
    handed to the master; once the master has it, a later master reset below it is not undone."""
    from ferrymq.broker.offset_manager import ConsumerOffsetManager

    slave = ConsumerOffsetManager(str(tmp_path))
    slave.local_commits = {}
    slave.commit("g", "T", 0, 50)   # committed on the slave while the master was down
    slave.commit("g", "T", 1, 5)    # smaller than the master's: the master wins
    push = await slave.merge_from_master({"offsetTable": {"T@g": {"0": 10, "1": 30, "2": 7}}})
    assert push == {("T@g", 0): 50}
    assert slave.table["T@g"] == {0: 50, 1: 30, 2: 7}
    slave.pushed("T@g", 0, 50)
    assert slave.local_commits == {}
    # the master later resets queue 0 to 3: the slave follows, nothing is pushed back
    assert await slave.merge_from_master({"offsetTable": {"T@g": {"0": 3, "1": 30, "2": 7}}}) == {}
    assert slave.query("g", "T", 0) == 3


async def test_slave_serves_replicated_topics_until_the_master_deletes_them(tmp_path) -> None:
    """A slave answers a read-only config for a topic it holds queues for before the master's config syncs;
    once a synced master table drops the topic (deleted there), the slave stops serving it."""
    from ferrymq.broker.topic_manager import TopicManager
    from ferrymq.common.topic import PERM_READ

    topics = TopicManager(str(tmp_path), cluster_name="c", broker_name="b", clock_ms=lambda: 1)
    held = {"Fresh": 3, "Gone": 2}
    topics.replica_queue_count = lambda name: held.get(name, 0)
    fresh = topics.get("Fresh")
    assert fresh is not None and fresh.perm == PERM_READ and fresh.read_queue_nums == 3
    assert topics.get("Unknown") is None
    master = {"topicConfigTable": {"Gone": {"topicName": "Gone", "readQueueNums": 2, "writeQueueNums": 2,
                                            "perm": 6}},
              "dataVersion": {"counter": 1, "timestamp": 1}}
    await topics.replace_all(master)
    assert topics.get("Gone") is not None and topics.get("Gone").perm == 6
    await topics.replace_all({"topicConfigTable": {}, "dataVersion": {"counter": 2, "timestamp": 2}})
    assert topics.get("Gone") is None, "deleted on the master: not served from the slave's queues"
    assert topics.get("Fresh") is not None


async def test_new_master_adopts_topics_it_only_knows_from_its_queues(tmp_path) -> None:
    """Controller mode: a slave elected before the master's topic config reached it turns the topics it holds
    queues for into read-write topics (so producers go on and the route lists them); known and deleted topics
    are left alone."""
    from ferrymq.broker.topic_manager import TopicManager
    from ferrymq.common.topic import PERM_READ, PERM_WRITE

    topics = TopicManager(str(tmp_path), cluster_name="c", broker_name="b", clock_ms=lambda: 1)
    topics.replica_queue_count = lambda name: 0
    await topics.replace_all({"topicConfigTable": {"Known": {"topicName": "Known", "readQueueNums": 8,
                                                       "writeQueueNums": 8, "perm": 6},
                                             "Gone": {"topicName": "Gone", "readQueueNums": 1,
                                                      "writeQueueNums": 1, "perm": 6}},
                        "dataVersion": {"counter": 1, "timestamp": 1}})
    await topics.replace_all({"topicConfigTable": {"Known": {"topicName": "Known", "readQueueNums": 8,
                                                       "writeQueueNums": 8, "perm": 6}},
                        "dataVersion": {"counter": 2, "timestamp": 2}})
    version = topics.data_version.counter
    adopted = topics.adopt_replicated({"Known": [0, 1], "Fresh": [0, 2], "Gone": [0]})
    assert adopted == ["Fresh"]
    fresh = topics.get("Fresh")
    assert fresh is not None and fresh.write_queue_nums == 3 and fresh.perm == PERM_READ | PERM_WRITE
    assert topics.get("Known").read_queue_nums == 8
    assert topics.get("Gone") is None
    assert topics.data_version.counter > version
