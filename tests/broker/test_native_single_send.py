"""SEND_MESSAGE / SEND_MESSAGE_V2 through the C extension's single put (``CommitLog.put_one_raw``) answers and
stores exactly what the pure-Python path (``_parse_properties`` + ``MessageExtBrokerInner`` + ``put_message``)
answers and stores: the same responses (or the same wait for SYNC_FLUSH), commit log segments, consume queues and
index files, on hypothesis-generated sends — plain ones, odd properties (WAIT, DELAY, TRAN_MSG, CLUSTER,
duplicates, junk items, non-ASCII), transaction flags, retry / DLQ / system topics, size limits and segment
rolls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_twins import MAX_MESSAGE, answer, brokers, stored_files

from ferrymq.broker.app import BrokerController
from ferrymq.remoting.codec import RemotingCommand

EXAMPLES = 80
NAMES = ["TAGS", "KEYS", "UNIQ_KEY"] * 5 + ["WAIT", "WAIT", "CLUSTER", "X", "a", "PGROUP", "DELAY", "TRAN_MSG",
                                            "REAL_TOPIC"]
VALUES = ["", "true", "false", "FALSE", "False", "TRUE", "0", "3", "-1", " 2", "99", "abc", "k1 k2", "TagA",
          "v\x01w", "falsee", "fals"]
TOPICS = ["SingleT"] * 8 + ["Other"] * 3 + [ "%RETRY%g1", "%RETRY%nogroup", "SCHEDULE_TOPIC_XXXX",
          "RMQ_SYS_TRANS_HALF_TOPIC", "bad/topic", "%DLQ%g1"]
SYS_FLAGS = [0] * 20 + [0x4, 0x8, 0xC, 0x10, 0x30, 0x1, 0x2]





value_st = st.one_of(st.sampled_from(VALUES), st.text(alphabet="abXY09 #-\x01", max_size=10),
                     st.text(alphabet="ab", min_size=20, max_size=60))
name_value = st.tuples(st.sampled_from(NAMES), value_st).map(lambda nv: f"{nv[0]}\x01{nv[1]}")
junk_item = st.sampled_from(["", "\x01", "a", "\x01v", "ab", "\x01\x01"])  # items string_to_properties skips
non_ascii_item = st.sampled_from(["ü\x01x", "K\x01é", "TAGS\x01ü"])
item_st = st.one_of(*[name_value] * 8, junk_item, non_ascii_item)
props_st = st.one_of(
    st.none(),
    st.tuples(st.lists(item_st, max_size=7), st.booleans()).map(
        lambda t: "\x02".join(t[0]) + ("\x02" if t[1] else "")),
    st.just("WAIT\x01false"), st.just("TAGS\x01H\x02WAIT\x01true\x02"), st.just("TAGS\x01a\x02TAGS\x01b"),
    # around the properties limit once WAIT is out and CLUSTER in
    st.tuples(st.integers(110, 150), st.sampled_from(["", "\x02WAIT\x01false", "\x02CLUSTER\x01c"])).map(
        lambda t: "TAGS\x01t\x02KEYS\x01" + "k" * t[0] + t[1]),
)
large_body = st.tuples(st.integers(0, 255), st.integers(5900, 6100)).map(  # cheap to generate, not all alike
    lambda t: (bytes(range(t[0], 256)) + bytes(range(t[0]))) * (t[1] // 256) + bytes(t[1] % 256))
body_st = st.one_of(st.binary(max_size=300), st.binary(max_size=300), large_body)
send_st = st.tuples(
    st.sampled_from(TOPICS),
    st.sampled_from([0, 1, 2, 3, 3, 9]),  # 9: out of range
    props_st,
    body_st,
    st.sampled_from(SYS_FLAGS),
    st.sampled_from([0, 0, 1, -7, 0x7FFFFFFF]),  # flag
    st.sampled_from([0, 0, 1, 16, 17]),  # reconsume times (retry topics go to the DLQ past the maximum)
    st.sampled_from([10, 10, 310]),  # SEND_MESSAGE / SEND_MESSAGE_V2
)


def request(code: int, topic: str, queue_id: int, props: str | None, body: bytes, sys_flag: int, flag: int,
            reconsume: int, opaque: int) -> RemotingCommand:
    fields: dict[str, Any] = {
        "producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": queue_id, "sysFlag": sys_flag, "bornTimestamp": 1_690_000_000_000, "flag": flag,
        "properties": props, "reconsumeTimes": reconsume, "unitMode": "false", "maxReconsumeTimes": 16,
    }
    if props is None:
        del fields["properties"]
    if code == 310:
        to_v2 = {"producerGroup": "a", "topic": "b", "defaultTopic": "c", "defaultTopicQueueNums": "d",
                 "queueId": "e", "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i",
                 "reconsumeTimes": "j", "unitMode": "k", "maxReconsumeTimes": "l"}
        fields = {to_v2[k]: v for k, v in fields.items()}
    cmd = RemotingCommand.request(code, fields, body)
    cmd.opaque = opaque
    cmd.version = 400
    return cmd








def subscribe_group(ctl: BrokerController) -> None:
    """Subscription group g1 (retry topic %RETRY%g1 and its DLQ)."""
    from ferrymq.broker.subscription_manager import SubscriptionGroupConfig  # noqa: PLC0415

    ctl.groups.update(SubscriptionGroupConfig(group_name="g1", retry_max_times=16))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sends=st.lists(send_st, min_size=1, max_size=30),
       cluster=st.sampled_from(["DefaultCluster"] * 4 + ["C", "Clüster"]), sync_flush=st.booleans())
def test_single_send_native_matches_pure(sends: list[tuple[Any, ...]], cluster: str, sync_flush: bool) -> None:
    with brokers(cluster, sync_flush) as (native, pure):
        for ctl in (native, pure):
            subscribe_group(ctl)
        for opaque, (topic, queue_id, props, body, sys_flag, flag, reconsume, code) in enumerate(sends, 1):
            answers = [answer(ctl, request(code, topic, queue_id, props, body, sys_flag, flag, reconsume, opaque))
                       for ctl in (native, pure)]
            assert answers[0] == answers[1]
        assert native.store.commit_log.topic_queue_table == pure.store.commit_log.topic_queue_table
        assert stored_files(native) == stored_files(pure)


def test_a_send_stored_in_another_queue_leaves_no_file_for_its_own() -> None:
    """A DELAY or transactional single send is stored in the delay level's or the half topic's queue: the native
    path must not create (reserve) the consume queue file of the queue it names (hypothesis found SingleT/1's file
    on the native broker only, after a DELAY send to queue 1)."""
    with brokers("DefaultCluster") as (native, pure):
        for ctl in (native, pure):
            subscribe_group(ctl)
        for i, (props, sys_flag) in enumerate((("DELAY\x013", 0), ("TRAN_MSG\x01true", 0x4))):
            a, b = (answer(ctl, request(10, "SingleT", 1, props, b"", sys_flag, 0, 0, i)) for ctl in (native, pure))
            assert a == b
        assert stored_files(native) == stored_files(pure)
        assert not any(name.startswith("consumequeue/SingleT/") for name in stored_files(native))


def test_native_single_path_is_taken_for_plain_sends() -> None:
    """A plain send goes through put_one_raw (not put_message) in native mode and gives the pure answer; DELAY,
    TRAN_MSG, transaction flags, retry topics and non-ASCII properties take the Python path."""
    with brokers("DefaultCluster") as (native, pure):
        calls: list[str] = []
        real = native.store.commit_log.put_message
        native.store.commit_log.put_message = lambda inner: calls.append(inner.topic) or real(inner)  # type: ignore[method-assign]
        for ctl in (native, pure):
            subscribe_group(ctl)
        plain = [("TAGS\x01T\x02KEYS\x01a b\x02WAIT\x01false\x02CLUSTER\x01x\x02TAGS\x01U", 0),
                 (None, 0), ("", 0), ("TAGS\x01t", 0x10)]
        for i, (props, sys_flag) in enumerate(plain):
            a, b = (answer(ctl, request(10, "SingleT", 1, props, b"body", sys_flag, 0, 0, i)) for ctl in (native, pure))
            assert a == b and a[0] == 0
        assert calls == []
        odd = [("DELAY\x013", 0, "SingleT"), ("TRAN_MSG\x01true", 0, "SingleT"), ("DELAY\x010", 0, "SingleT"),
               ("TAGS\x01t", 0x4, "SingleT"), ("TAGS\x01t", 0x8, "SingleT"), ("TAGS\x01ü", 0, "SingleT"),
               ("TAGS\x01t", 0, "%RETRY%g1")]
        for i, (props, sys_flag, topic) in enumerate(odd, 10):
            a, b = (answer(ctl, request(10, topic, 0, props, b"body", sys_flag, 0, 0, i)) for ctl in (native, pure))
            assert a == b and a[0] == 0
        assert len(calls) == len(odd)
        assert stored_files(native) == stored_files(pure)


def test_native_single_rolls_segments_and_refuses_like_python() -> None:
    """Sends that do not fit in the rest of a segment: BLANK filler, next segment (same bytes both ways);
    too long properties and too large bodies: the same codes and remarks."""
    with brokers("DefaultCluster") as (native, pure):
        for i in range(40):
            body = bytes(range(250)) * (1 + i % 9)
            a, b = (answer(ctl, request(10, "SingleT", i % 2, f"TAGS\x01T{i}\x02UNIQ_KEY\x01U{i}", body, 0, 0, 0, i))
                    for ctl in (native, pure))
            assert a == b and a[0] == 0
        assert len(native.store.commit_log.mfq.files) > 3
        long_props = "KEYS\x01" + "k" * 200
        a, b = (answer(ctl, request(10, "SingleT", 0, long_props, b"x", 0, 0, 0, 99)) for ctl in (native, pure))
        assert a == b and a[0] != 0
        a, b = (answer(ctl, request(10, "SingleT", 0, "", b"x" * (MAX_MESSAGE + 1), 0, 0, 0, 100))
                for ctl in (native, pure))
        assert a == b and a[0] == 13
        assert native.store.commit_log.topic_queue_table == pure.store.commit_log.topic_queue_table
        assert stored_files(native) == stored_files(pure)


def test_stored_files_leave_out_a_segment_still_warming() -> None:
    """The twins' comparison reads the store as the store does: a ``.prep`` segment half zero-filled by the
    warmer thread (its bytes depend on the thread's progress) is not part of the log and not compared."""
    with brokers("DefaultCluster") as (native, pure):
        for ctl, filled in ((native, 10), (pure, 4000)):
            commitlog = Path(ctl.store.config.store_path_commit_log)
            (commitlog / ("9" * 20 + ".prep")).write_bytes(b"\0" * filled)
        assert stored_files(native) == stored_files(pure)
        assert not any(name.endswith(".prep") for name in stored_files(native))
