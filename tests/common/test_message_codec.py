from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.common.message import (
    SYSFLAG_BORNHOST_V6,
    MessageExtBrokerInner,
    properties_to_string,
)
from ferrymq.common.message_codec import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    RECORD_FIXED_SIZE,
    RecordCheck,
    RecordFormatError,
    blank_filler,
    check_record,
    decode_batch_body,
    decode_record,
    decode_record_meta,
    encode_batch_body,
    encode_record,
    iter_records,
    store_timestamp_of,
)

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
prop_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00\x01\x02"), max_size=20)
topics = st.text(
    alphabet=st.characters(whitelist_categories=("Lu", "Ll", "Nd"), max_codepoint=0x7F),
    min_size=1,
    max_size=127,
)
properties = st.dictionaries(prop_text.filter(lambda k: len(k) > 0), prop_text, max_size=6)


@st.composite
def inners(draw: st.DrawFn) -> MessageExtBrokerInner:
    return MessageExtBrokerInner(
        topic=draw(topics),
        queue_id=draw(st.integers(0, 2**31 - 1)),
        body=draw(st.binary(max_size=2000)),
        flag=draw(i32),
        properties_string=properties_to_string(draw(properties)),
        sys_flag=draw(st.sampled_from([0, 1, 2, 4, 8, 12])),
        born_timestamp=draw(i64),
        born_host=draw(st.binary(min_size=8, max_size=8)),
        store_host=draw(st.binary(min_size=8, max_size=8)),
        reconsume_times=draw(i32),
        prepared_transaction_offset=draw(i64),
    )


@settings(max_examples=200)
@given(inners(), i64, i64, i64)
def test_record_round_trip(
    m: MessageExtBrokerInner, queue_offset: int, phy_offset: int, store_ts: int
) -> None:
    raw = encode_record(m, queue_offset, phy_offset, store_ts)
    topic_len = len(m.topic.encode())
    assert len(raw) == RECORD_FIXED_SIZE + len(m.body) + topic_len + len(m.properties_string.encode())
    ext = decode_record(raw)
    assert ext.topic == m.topic
    assert ext.body == m.body
    assert ext.flag == m.flag
    assert ext.queue_id == m.queue_id
    assert ext.queue_offset == queue_offset
    assert ext.phy_offset == phy_offset
    assert ext.store_size == len(raw)
    assert ext.body_crc == zlib.crc32(m.body) & 0x7FFFFFFF
    assert ext.sys_flag == m.sys_flag
    assert ext.born_timestamp == m.born_timestamp
    assert ext.born_host == m.born_host
    assert ext.store_timestamp == store_ts
    assert ext.store_host == m.store_host
    assert ext.reconsume_times == m.reconsume_times
    assert ext.prepared_transaction_offset == m.prepared_transaction_offset
    assert properties_to_string(ext.properties) == m.properties_string
    assert check_record(raw, 0, True) == (RecordCheck.OK, len(raw))
    assert store_timestamp_of(raw, 0) == store_ts
    meta = decode_record_meta(raw, 0)
    assert (meta.topic, meta.queue_id, meta.queue_offset, meta.phy_offset) == (
        m.topic,
        m.queue_id,
        queue_offset,
        phy_offset,
    )
    assert meta.properties == m.properties_string


@settings(max_examples=50)
@given(st.lists(inners(), max_size=8))
def test_iter_records_concatenation(msgs: list[MessageExtBrokerInner]) -> None:
    parts = [encode_record(m, i, i * 1000, 5) for i, m in enumerate(msgs)]
    decoded = list(iter_records(b"".join(parts)))
    assert [d.body for d in decoded] == [m.body for m in msgs]
    assert [d.queue_offset for d in decoded] == list(range(len(msgs)))


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(i32, st.binary(max_size=500), st.builds(properties_to_string, properties)), max_size=10
    )
)
def test_batch_body_round_trip(entries: list[tuple[int, bytes, str]]) -> None:
    assert decode_batch_body(encode_batch_body(entries)) == entries


def test_batch_body_layout() -> None:
    raw = encode_batch_body([(7, b"abc", "K\x01V")])
    assert (
        raw == struct.pack(">iiiii", 20 + 3 + 2 + 3, 0, 0, 7, 3) + b"abc" + struct.pack(">h", 3) + b"K\x01V"
    )


@pytest.mark.parametrize("cut", [1, 10, 19, 24, 27])
def test_batch_body_truncated(cut: int) -> None:
    raw = encode_batch_body([(0, b"abcd", "K\x01V")])
    with pytest.raises(RecordFormatError):
        decode_batch_body(raw[:cut])


def _sample() -> bytes:
    m = MessageExtBrokerInner("T", 1, b"payload", properties_string="TAGS\x01a")
    return encode_record(m, 3, 0, 99)


def test_decode_rejects_bad_magic_and_size() -> None:
    raw = bytearray(_sample())
    assert struct.unpack_from(">i", raw, 4)[0] == MESSAGE_MAGIC_CODE
    with pytest.raises(RecordFormatError, match="magic"):
        decode_record(b"\x00" * 4 + b"\x01\x02\x03\x04" + bytes(raw[8:]))
    with pytest.raises(RecordFormatError):
        decode_record(bytes(raw[:-1]))
    bad = bytearray(raw)
    struct.pack_into(">i", bad, 0, len(raw) + 1)
    with pytest.raises(RecordFormatError):
        decode_record(bytes(bad) + b"\x00")
    assert issubclass(RecordFormatError, ValueError)


def test_check_record_statuses() -> None:
    raw = _sample()
    assert check_record(raw, 0, True) == (RecordCheck.OK, len(raw))
    assert check_record(raw[:-3], 0, True)[0] is RecordCheck.INCOMPLETE
    assert check_record(raw[:5], 0, True)[0] is RecordCheck.INCOMPLETE
    assert check_record(bytes(200), 0, True)[0] is RecordCheck.END
    assert check_record(blank_filler(500) + bytes(492), 0, True) == (RecordCheck.BLANK, 500)
    assert struct.unpack(">ii", blank_filler(9))[1] == BLANK_MAGIC_CODE
    body_at = 88
    corrupt = bytearray(raw)
    corrupt[body_at] ^= 0xFF
    assert check_record(bytes(corrupt), 0, True)[0] is RecordCheck.CORRUPT
    assert check_record(bytes(corrupt), 0, False)[0] is RecordCheck.OK
    assert check_record(raw, 0, True, expected_phy_offset=1)[0] is RecordCheck.CORRUPT
    garbage = b"\x12\x34\x56\x78" * 50
    assert check_record(garbage, 0, True)[0] is RecordCheck.CORRUPT


def test_ipv6_born_host_decodes() -> None:
    m = MessageExtBrokerInner("T", 0, b"b", properties_string="A\x01B")
    v4 = encode_record(m, 1, 2, 3)
    # splice a 20-byte born host in by hand and set the flag
    v6 = bytearray(v4[:48] + bytes(range(16)) + v4[52:56] + v4[56:])
    struct.pack_into(">i", v6, 0, len(v6))
    struct.pack_into(">i", v6, 36, SYSFLAG_BORNHOST_V6)
    ext = decode_record(bytes(v6))
    assert ext.born_host == bytes(range(16)) + v4[52:56]
    assert ext.store_timestamp == 3 and ext.body == b"b" and ext.properties == {"A": "B"}
    assert check_record(bytes(v6), 0, True) == (RecordCheck.OK, len(v6))
    assert store_timestamp_of(bytes(v6), 0) == 3


def test_encode_rejects_out_of_range() -> None:
    with pytest.raises(RecordFormatError):
        encode_record(MessageExtBrokerInner("T" * 128, 0, b""), 0, 0, 0)
    with pytest.raises(RecordFormatError):
        encode_record(MessageExtBrokerInner("T", 0, b"", properties_string="x" * 40000), 0, 0, 0)
