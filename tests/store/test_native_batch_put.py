"""``CommitLog.put_batch_raw`` (the C extension's ``put_batch``) stores exactly what ``put_messages`` stores for
the ``MessageExtBrokerInner`` list the send processor builds from the same batch body: the same result,
commit log bytes (BLANK fillers and segment rolls included), consume queues and index; and it declines
(None) whatever the Python path must answer (malformed bodies, DELAY / TRAN_MSG, a delivery time, non-ASCII,
size limits)."""

from __future__ import annotations

import struct

from dispatch_streams import (
    BORN_HOST,
    STORE_HOST,
    dispatch_state,
    files_snapshot,
    require_extension,
    stores_in_both_modes,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferrymq.common.message import MessageExtBrokerInner, encode_offset_msg_id_raw, string_to_properties
from ferrymq.common.message_codec import decode_batch_body, decode_record, encode_batch_body
from ferrymq.store import MessageStore
from ferrymq.store.results import PutMessageResult

SEGMENT = 4096
CLUSTER = "DefaultCluster"
BORN_TS = 1_690_000_000_000
NAMES = ["TAGS", "KEYS", "UNIQ_KEY"] * 3 + ["WAIT", "CLUSTER", "X", "DELAY", "TRAN_MSG", "TIMER_DELAY_SEC",
                                               "__STARTDELIVERTIME"]
value_st = st.one_of(st.sampled_from(["", "0", "2", "true", "k1 k2", "v\x01w"]),
                     st.text(alphabet="abXY09 #-", max_size=12), st.text(alphabet="ab", min_size=50, max_size=200))
item_st = st.one_of(st.tuples(st.sampled_from(NAMES), value_st).map(lambda nv: f"{nv[0]}\x01{nv[1]}"),
                    st.sampled_from(["", "\x01", "a", "\x01v", "é\x01x"]))
props_st = st.lists(item_st, max_size=4).map("\x02".join)
entry_st = st.tuples(st.sampled_from([0, 3, -1]), st.binary(max_size=400), props_st)


def reference_inners(body: bytes, header_props: str, topic: str, queue_id: int) -> list[MessageExtBrokerInner]:
    """What SendProcessor._send_batch hands put_messages (decode, merge, WAIT dropped, CLUSTER set)."""
    batch = string_to_properties(header_props)
    batch.pop("WAIT", None)
    inners = []
    for flag, msg, text in decode_batch_body(body):
        props = string_to_properties(text)
        props.update(batch)
        props.pop("WAIT", None)
        props["CLUSTER"] = CLUSTER
        inners.append(MessageExtBrokerInner(topic, queue_id, msg, flag, "\x02".join(map("\x01".join, props.items())),
                                            0, 0, BORN_TS, BORN_HOST, STORE_HOST, 2))
    return inners


def merge_bytes(header_props: str) -> bytes:
    batch = string_to_properties(header_props)
    batch.pop("WAIT", None)
    return "\x02".join(map("\x01".join, batch.items())).encode("ascii")


def put_raw(store: MessageStore, body: bytes, header_props: str, topic: str = "TopicA",
            queue_id: int = 0) -> PutMessageResult | None:
    if not header_props.isascii():
        return None  # SendProcessor._put_batch_native declines non-ASCII batch properties
    return store.put_batch_raw(topic, queue_id, body, merge_bytes(header_props), CLUSTER.encode(), 0, BORN_TS,
                               BORN_HOST, STORE_HOST, 2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.tuples(st.lists(entry_st, min_size=1, max_size=12), props_st, st.integers(0, 2)),
                        min_size=1, max_size=8))
def test_put_batch_raw_matches_put_messages(batches: list[tuple]) -> None:  # type: ignore[type-arg]
    require_extension()
    with stores_in_both_modes(mapped_file_size_commit_log=SEGMENT, max_properties_size=120,
                              max_message_size=3000) as (native, pure):
        for entries, header_props, queue_id in batches:
            body = encode_batch_body(entries)
            ref = pure.put_messages(reference_inners(body, header_props, "TopicA", queue_id))
            got = put_raw(native, body, header_props, queue_id=queue_id)
            odd = any(("DELAY\x01" in p or "TRAN_MSG\x01" in p or "TIMER_" in p or "__STARTDELIVERTIME\x01" in p
                       or "é" in p)
                      for p in [header_props, *(e[2] for e in entries)])
            if got is None:  # the processor's Python path: put_messages (or its own refusal first)
                assert odd or ref.append_result is None
                got = native.put_messages(reference_inners(body, header_props, "TopicA", queue_id))
            else:
                assert not odd
                assert got.append_result is not None
                assert got.append_result.msg_id == ",".join(
                    encode_offset_msg_id_raw(STORE_HOST, off) for off in got.append_result.record_offsets)
            assert got == ref
            if ref.append_result is not None:
                assert got.append_result is not None and got.append_result.msg_id == ref.append_result.msg_id
        native.reput()
        pure.reput()
        assert dispatch_state(native) == dispatch_state(pure)
        assert files_snapshot(native) == files_snapshot(pure)
        assert native.commit_log.read_from(0, 1 << 20) == pure.commit_log.read_from(0, 1 << 20)
        assert native.commit_log.max_offset == pure.commit_log.max_offset
        for seg_n, seg_p in zip(native.commit_log.mfq.files, pure.commit_log.mfq.files, strict=True):
            assert seg_n.wrote_position == seg_p.wrote_position
            assert seg_n.mm[:] == seg_p.mm[:]


def test_put_batch_raw_declines_what_python_answers() -> None:
    require_extension()
    good = encode_batch_body([(0, b"abc", "TAGS\x01t"), (0, b"defg", "")])
    bad = [
        b"",  # empty batch
        good[:-1],  # truncated
        good + b"\x00",  # trailing junk
        struct.pack(">i", 99) + good[4:],  # totalSize does not match
        encode_batch_body([(0, b"x", "DELAY\x010")]),
        encode_batch_body([(0, b"x", "TRAN_MSG\x01false")]),
        encode_batch_body([(0, b"x", "TIMER_DELIVER_MS\x011")]),
        encode_batch_body([(0, b"x", "TIMER_ROLL_FROM\x011")]),
        encode_batch_body([(0, b"x", "X\x01y\x02__STARTDELIVERTIME\x011")]),
        encode_batch_body([(0, b"x", "K\x01é")]),
        encode_batch_body([(0, b"x", "\x02".join(f"k{i}\x01v" for i in range(70)))]),  # too many items
        encode_batch_body([(0, b"x", "K\x01" + "v" * 200)]),  # merged properties over max_properties_size
        encode_batch_body([(0, b"x" * 2000, "")] * 2),  # bodies over max_message_size
        encode_batch_body([(0, b"", "")] * 60),  # records larger than a segment
    ]
    with stores_in_both_modes(mapped_file_size_commit_log=SEGMENT, max_properties_size=120,
                              max_message_size=3000) as (native, _pure):
        for body in bad:
            assert put_raw(native, body, "") is None, body[:40]
        assert put_raw(native, good, "", topic="a/b") is None  # a topic the consume queues refuse
        assert native.commit_log.max_offset == 0 and not native.commit_log.mfq.files  # nothing written, no file
        assert native.commit_log.clock_ms() == _pure.commit_log.clock_ms()  # nor the clock read
        r = put_raw(native, good, "WAIT\x01false\x02KEYS\x01k")
        assert r is not None and r.append_result is not None and r.append_result.msg_num == 2
        first = decode_record(native.commit_log.read_from(0, 4096))
        assert first.properties == {"TAGS": "t", "KEYS": "k", "CLUSTER": CLUSTER}


def test_put_batch_direct_room_and_ids() -> None:
    ext = require_extension()
    body = encode_batch_body([(7, b"hello", "UNIQ_KEY\x01u1\x02WAIT\x01true"), (0, b"", "CLUSTER\x01x\x02TAGS\x01a")])
    ticks: list[int] = []

    def clock() -> int:
        ticks.append(1)
        return 1234

    args = (body, b"T", 5, 10, 0, b"", b"C", BORN_HOST, STORE_HOST, BORN_TS, clock, 0, 0, 32767, 1 << 20)
    count, total, offsets, ids, ts = ext.put_batch(b"", 0, -1, *args)  # type: ignore[attr-defined]
    assert (count, offsets, ids, ts, ticks) == (2, None, None, None, [])  # sized only: no room, no clock
    buf = bytearray(total + 100)
    count, total2, offsets, ids, ts = ext.put_batch(buf, 100, total, *args[:4], 5000, *args[5:])  # type: ignore[attr-defined]
    assert (total2, ts, ticks, buf[:100]) == (total, 1234, [1], bytearray(100))
    assert offsets == (5000, 5000 + decode_record(bytes(buf), 100).store_size)
    assert ids == ",".join(encode_offset_msg_id_raw(STORE_HOST, off) for off in offsets)
    one = decode_record(bytes(buf), 100)
    two = decode_record(bytes(buf), 100 + one.store_size)
    assert (one.flag, one.queue_offset, one.queue_id, one.properties) == (7, 10, 5, {"UNIQ_KEY": "u1", "CLUSTER": "C"})
    assert (two.body, two.queue_offset, two.properties) == (b"", 11, {"CLUSTER": "C", "TAGS": "a"})
    assert (one.born_host, one.store_host, one.born_timestamp, one.store_timestamp, one.reconsume_times) == (
        BORN_HOST, STORE_HOST, BORN_TS, 1234, 0)
