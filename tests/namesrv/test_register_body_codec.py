"""The shared compressed REGISTER_BROKER codec (common/register_body_codec.py): its layout, read back by an
independent parser of the field table, and what RocketMQ 4.x/5.x brokers send."""

from __future__ import annotations

import struct
import zlib

import orjson
import pytest

from ferrymq.common.register_body_codec import (
    MAX_CHUNK_BYTES,
    CompressedRegisterBodyReader,
    decode_compressed_register_body,
    decode_register_envelope,
    encode_compressed_register_body,
    topic_config_from_json,
)
from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.errors import ProtocolError


def _java_style_body(version: bytes, entries: list[bytes], filters: bytes | None) -> bytes:
    out = struct.pack(">i", len(version)) + version + struct.pack(">i", len(entries))
    for e in entries:
        out += struct.pack(">i", len(e)) + e
    if filters is not None:
        out += struct.pack(">i", len(filters)) + filters
    return zlib.compress(out, 9)


def test_encoder_writes_the_documented_layout() -> None:
    body = encode_compressed_register_body(
        {"A": TopicConfig("A", 4, 8, 6), "B": TopicConfig("B", 1, 1, 2, "MULTI_TAG")},
        ["1.2.3.4:5"], DataVersion(3, 99))
    raw = zlib.decompress(body)
    pos = 0

    def chunk() -> bytes:
        nonlocal pos
        (n,) = struct.unpack_from(">i", raw, pos)
        pos += 4 + n
        return raw[pos - n:pos]

    assert orjson.loads(chunk()) == {"counter": 3, "timestamp": 99}
    (count,) = struct.unpack_from(">i", raw, pos)
    pos += 4
    assert count == 2
    assert [chunk(), chunk()] == [b"A 4 8 6 SINGLE_TAG", b"B 1 1 2 MULTI_TAG"]  # exactly 5 fields for 4.x
    assert orjson.loads(chunk()) == ["1.2.3.4:5"]
    assert pos == len(raw)


def test_decodes_rocketmq_5_entries_with_attributes_field() -> None:
    body = _java_style_body(b'{"counter":1,"stateVersion":0,"timestamp":2}',
                            [b"T 8 8 6 SINGLE_TAG ", b'U 2 2 6 SINGLE_TAG {"+queue.type":"BatchCQ"}'], b"[]")
    reg = decode_compressed_register_body(body)
    assert reg.data_version == DataVersion(1, 2)
    assert {n: (t.read_queue_nums, t.perm) for n, t in reg.topic_config_table.items()} == {"T": (8, 6),
                                                                                          "U": (2, 6)}


def test_reader_in_steps_and_missing_filter_list() -> None:
    entries = [f"T{i} 4 4 6 SINGLE_TAG".encode() for i in range(10)]
    reader = CompressedRegisterBodyReader(_java_style_body(b'{"counter":5,"timestamp":1}', entries, None))
    assert (reader.data_version.counter, reader.topic_count) == (5, 10)
    seen = []
    while batch := reader.read_topics(3):
        assert len(batch) <= 3
        seen += [t.topic_name for t in batch]
    assert seen == [f"T{i}" for i in range(10)]
    assert reader.filter_server_list() == []


def test_round_trip_large_table() -> None:
    table = {f"topic-{i}": TopicConfig(f"topic-{i}", 8, 8, 6) for i in range(10_000)}
    body = encode_compressed_register_body(table, [], DataVersion(1, 1))
    assert len(body) < 200_000
    assert decode_compressed_register_body(body).topic_config_table == table


@pytest.mark.parametrize("raw", [
    _java_style_body(b"[1]", [], b"[]"),
    _java_style_body(b"{}", [b"T x 4 6 SINGLE_TAG"], b"[]"),
    _java_style_body(b"{}", [b" 4 4 6 SINGLE_TAG"], b"[]"),
    _java_style_body(b"{}", [], b'{"a":1}'),
    _java_style_body(b"{}", [], b"not json"),
    zlib.compress(struct.pack(">i", MAX_CHUNK_BYTES + 1)),
    zlib.compress(struct.pack(">i", -1)),
    zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", -5)),
    zlib.compress(b"\x00\x00"),
    b"",
])
def test_malformed_raises_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_compressed_register_body(raw)


def test_skip_topics_reads_lengths_only_then_the_filter_list() -> None:
    body = _java_style_body(b'{"counter":2,"timestamp":1}', [b"not a topic entry", b"x"], b'["1.1.1.1:1"]')
    reader = CompressedRegisterBodyReader(body)
    reader.skip_topics()
    assert reader.filter_server_list() == ["1.1.1.1:1"]


def test_plain_envelope_leaves_entries_raw() -> None:
    body = orjson.dumps({"filterServerList": ["f:1"], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 4, "timestamp": 2}, "topicConfigTable": {"T": {"perm": "bad"}}}})
    env = decode_register_envelope(body)
    assert (env.data_version, env.raw_topic_table, env.filter_server_list) == (DataVersion(4, 2),
                                                                             {"T": {"perm": "bad"}}, ["f:1"])
    with pytest.raises(ProtocolError):
        topic_config_from_json("T", env.raw_topic_table["T"])
    with pytest.raises(ProtocolError):
        decode_register_envelope(b'{"topicConfigSerializeWrapper":{"topicConfigTable":[1]}}')
