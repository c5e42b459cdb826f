"""REGISTER_BROKER body codec (protocol §3.2)."""

from __future__ import annotations

import zlib

import pytest

from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.errors import ProtocolError
from ferrymq.namesrv.register_body import (
    RegisterBrokerBody,
    body_crc32,
    decode_register_body,
    encode_register_body,
)


def sample() -> RegisterBrokerBody:
    return RegisterBrokerBody(
        DataVersion(7, 1_700_000_000_123),
        {"T1": TopicConfig("T1", 4, 4, 6), "TBW102": TopicConfig("TBW102", 8, 8, 7)},
        ["10.0.0.1:4000"],
    )


@pytest.mark.parametrize("compressed", [False, True])
def test_round_trip(compressed: bool) -> None:
    body = encode_register_body(sample(), compressed=compressed)
    assert decode_register_body(body, compressed=compressed) == sample()


def test_java_fastjson_body_and_bare_wrapper() -> None:
    java = (b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":2,"timestamp":5},'
            b'"topicConfigTable":{"T":{"order":false,"perm":6,"readQueueNums":16,"topicFilterType":"SINGLE_TAG",'
            b'"topicName":"T","topicSysFlag":0,"writeQueueNums":16}}}}')
    reg = decode_register_body(java)
    assert reg.data_version == DataVersion(2, 5)
    assert reg.topic_config_table["T"].write_queue_nums == 16
    bare = b'{"dataVersion":{"counter":1,"timestamp":1},"topicConfigTable":{"U":{"topicName":"U","perm":6}}}'
    assert list(decode_register_body(bare).topic_config_table) == ["U"]


def test_empty_body() -> None:
    assert decode_register_body(b"") == RegisterBrokerBody()


@pytest.mark.parametrize("raw,compressed", [
    (b"not json", False),
    (b"[1,2]", False),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":5}}}', False),
    (b"\x00\x01garbage", True),
    (zlib.compress(b"\x00\x00\x00\x02{}\x7f\xff\xff\xff"), True),
    (zlib.compress(b"\x00\x00\x00\x02{}\x00\x00\x00\x01\x00\x00\x00\x03a b"), True),
])
def test_malformed_bodies_raise_protocol_error(raw: bytes, compressed: bool) -> None:
    with pytest.raises(ProtocolError):
        decode_register_body(raw, compressed=compressed)


def test_crc32_masked() -> None:
    assert body_crc32(b"abc") == zlib.crc32(b"abc") & 0x7FFFFFFF
    assert 0 <= body_crc32(b"\xff" * 100) <= 0x7FFFFFFF
