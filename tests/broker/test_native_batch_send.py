"""SEND_BATCH_MESSAGE through the C extension's batch put (``CommitLog.put_batch_raw``) answers and stores exactly
what the pure-Python path (``decode_batch_body`` + ``MessageExtBrokerInner`` per entry + ``put_messages``)
answers and stores: the same responses, commit log segments, consume queues and index files, on
hypothesis-generated batches — valid ones, odd properties (WAIT, DELAY, TRAN_MSG, CLUSTER, duplicates, junk
items, non-ASCII), size limits, segment rolls, and malformed batch bodies."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_twins import answer, brokers, stored_files

from ferrymq.remoting.codec import RemotingCommand

EXAMPLES = 80
#: names the fast path merges as text; DELAY / TRAN_MSG / delivery-time entries go to the Python path (which refuses
#: or keeps them)
PLAIN_NAMES = ["TAGS", "KEYS", "UNIQ_KEY"] * 3 + ["WAIT", "CLUSTER", "X", "a", "PGROUP"]
ODD_NAMES = ["DELAY", "TRAN_MSG", "TIMER_DELAY_MS", "TIMER_DELIVER_MS", "__STARTDELIVERTIME"]
VALUES = ["", "true", "false", "FALSE", "TRUE", "0", "3", "-1", " 2", "abc", "k1 k2", "TagA", "v\x01w"]







value_st = st.one_of(st.sampled_from(VALUES), st.text(alphabet="abXY09 #-\x01", max_size=10),
                     st.text(alphabet="ab", min_size=20, max_size=60))
name_value = st.tuples(st.sampled_from(PLAIN_NAMES), value_st).map(lambda nv: f"{nv[0]}\x01{nv[1]}")
junk_item = st.sampled_from(["", "\x01", "a", "\x01v", "ab"])  # items string_to_properties skips
item_st = st.one_of(name_value, name_value, name_value, name_value, junk_item)
odd_item_st = st.one_of(  # the Python path's business: DELAY / TRAN_MSG (refused or kept), non-ASCII text
    item_st,
    st.tuples(st.sampled_from(ODD_NAMES), st.sampled_from(VALUES)).map(lambda nv: f"{nv[0]}\x01{nv[1]}"),
    st.sampled_from(["ü\x01x", "K\x01é"]),
)


def props_of(items: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.tuples(st.lists(items, max_size=5), st.booleans()).map(
        lambda t: "\x02".join(t[0]) + ("\x02" if t[1] else ""))


props_st = props_of(item_st)
flag_st = st.sampled_from([0, 0, 1, -7, 0x7FFFFFFF])
entry_st = st.tuples(flag_st, st.binary(max_size=600), props_st)
odd_entry_st = st.tuples(flag_st, st.binary(max_size=100), props_of(odd_item_st))
entries_st = st.one_of(st.lists(entry_st, min_size=1, max_size=10), st.lists(entry_st, min_size=1, max_size=10),
                       st.lists(odd_entry_st, max_size=4))
MUTATIONS = ["none"] * 20 + ["truncate", "append", "total", "body_len", "props_len", "negative_props", "flip"]


def batch_body(entries: list[tuple[int, bytes, str]]) -> bytes:
    out = b""
    for flag, body, props in entries:
        raw = props.encode("utf-8")
        out += struct.pack(">iiiii", 20 + len(body) + 2 + len(raw), 0, 0, flag, len(body)) + body
        out += struct.pack(">h", len(raw)) + raw
    return out


def mutate(body: bytes, kind: str, at: int) -> bytes:
    if kind == "none" or not body:
        return body
    at %= len(body)
    if kind == "truncate":
        return body[:at]
    if kind == "append":
        return body + body[:at % 30 + 1]
    if kind == "total":  # first entry's totalSize off by a few
        return struct.pack(">i", struct.unpack_from(">i", body)[0] + at % 5 - 2) + body[4:]
    if kind == "body_len":
        return body[:16] + struct.pack(">i", struct.unpack_from(">i", body, 16)[0] + at % 3 + 1) + body[20:]
    if kind == "props_len":
        p = 20 + struct.unpack_from(">i", body, 16)[0]
        return body[:p] + struct.pack(">h", struct.unpack_from(">h", body, p)[0] + 1) + body[p + 2:]
    if kind == "negative_props":
        p = 20 + struct.unpack_from(">i", body, 16)[0]
        return body[:p] + b"\x80\x00" + body[p + 2:]
    return body[:at] + bytes([body[at] ^ 0x80]) + body[at + 1:]  # flip: e.g. an invalid UTF-8 byte


def request(topic: str, queue_id: int, header_props: str | None, body: bytes, opaque: int) -> RemotingCommand:
    fields = {"producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
              "queueId": queue_id, "sysFlag": 0, "bornTimestamp": 1_690_000_000_000, "flag": 0,
              "properties": header_props, "reconsumeTimes": 0, "unitMode": "false", "batch": "true"}
    cmd = RemotingCommand.request(320, fields, body)
    cmd.opaque = opaque
    return cmd








request_st = st.tuples(
    st.sampled_from(["BatchT", "BatchT", "Other"]),
    st.integers(0, 3),
    st.one_of(st.none(), props_st, st.just("WAIT\x01false"), st.just("TAGS\x01H\x02WAIT\x01true\x02")),
    entries_st,
    st.sampled_from(MUTATIONS),
    st.integers(0, 1 << 16),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(request_st, min_size=1, max_size=10),
       cluster=st.sampled_from(["DefaultCluster"] * 4 + ["C", "Clüster"]))
def test_batch_send_native_matches_pure(requests: list[tuple[Any, ...]], cluster: str) -> None:
    with brokers(cluster) as (native, pure):
        for opaque, (topic, queue_id, header_props, entries, kind, at) in enumerate(requests, 1):
            body = mutate(batch_body(entries), kind, at)
            answers = [answer(ctl, request(topic, queue_id, header_props, body, opaque)) for ctl in (native, pure)]
            assert answers[0] == answers[1]
        assert native.store.commit_log.topic_queue_table == pure.store.commit_log.topic_queue_table
        assert stored_files(native) == stored_files(pure)


def test_native_batch_path_is_taken_for_plain_batches() -> None:
    """A plain batch goes through put_batch_raw (not put_messages) in native mode, and gives the pure answer."""
    with brokers("DefaultCluster") as (native, pure):
        calls: list[int] = []
        real = native.store.commit_log.put_messages
        native.store.commit_log.put_messages = lambda inners: calls.append(len(inners)) or real(inners)  # type: ignore[method-assign]
        entries = [(0, b"x" * 100, f"TAGS\x01T{i}\x02UNIQ_KEY\x01U{i}\x02WAIT\x01true") for i in range(20)]
        body = batch_body(entries)
        a = answer(native, request("BatchT", 1, "KEYS\x01k", body, 1))
        b = answer(pure, request("BatchT", 1, "KEYS\x01k", body, 1))
        assert a == b and a[0] == 0
        assert len(a[2]["msgId"].split(",")) == 20
        assert calls == []
        answer(native, request("BatchT", 1, None, batch_body([(0, b"d", "DELAY\x013")]), 2))  # refused by Python
        assert calls == []  # DELAY > 0: the processor refuses before put_messages
        answer(native, request("BatchT", 1, None, batch_body([(0, b"d", "DELAY\x010")]), 3))
        assert calls == [1]  # DELAY 0 is stored as is, by the Python path
        assert stored_files(native) != {}
        calls.clear()
        timer = batch_body([(0, b"d", "TIMER_DELAY_MS\x011000")])
        assert answer(native, request("BatchT", 1, None, timer, 4)) == answer(pure, request("BatchT", 1, None, timer, 4))
        assert calls == []  # a delivery time: refused by the Python path, before put_messages


def test_native_batch_path_is_not_left_for_marks_in_message_bodies() -> None:
    """Only the entries' properties decide: a batch whose message bodies hold the text of a delivery-time
    property is still put natively (the writer used to scan the whole body for it, ~40 % of the loop thread's
    time under 256 KiB batches, and sent such batches down the Python path)."""
    with brokers("DefaultCluster") as (native, pure):
        calls: list[int] = []
        real = native.store.commit_log.put_messages
        native.store.commit_log.put_messages = lambda inners: calls.append(len(inners)) or real(inners)  # type: ignore[method-assign]
        entries = [(0, b"TIMER_DELAY_MS\x011000 __STARTDELIVERTIME\x011", f"UNIQ_KEY\x01U{i}") for i in range(3)]
        body = batch_body(entries)
        a = answer(native, request("BatchT", 1, None, body, 1))
        assert a == answer(pure, request("BatchT", 1, None, body, 1)) and a[0] == 0
        assert calls == []
        assert stored_files(native) == stored_files(pure)


def test_native_batch_rolls_segments_like_python() -> None:
    """Batches that do not fit in the rest of a segment: BLANK filler, next segment (same bytes both ways);
    a batch whose records are larger than a segment: MESSAGE_ILLEGAL from the Python path."""
    with brokers("DefaultCluster") as (native, pure):
        for i in range(12):
            entries = [(0, bytes(range(250)) * 2, f"TAGS\x01T{j}\x02UNIQ_KEY\x01{i}-{j}") for j in range(4)]
            answers = [answer(ctl, request("BatchT", 1, None, batch_body(entries), i)) for ctl in (native, pure)]
            assert answers[0] == answers[1] and answers[0][0] == 0
        too_big = batch_body([(0, b"0123456789", "")] * 80)  # 3.5 KB of body, 8.4 KB of records
        answers = [answer(ctl, request("BatchT", 1, None, too_big, 99)) for ctl in (native, pure)]
        assert answers[0] == answers[1] and answers[0][0] == 13
        assert len(native.store.commit_log.mfq.files) == 4
        assert stored_files(native) == stored_files(pure)
