"""REGISTER_BROKER body codec (protocol §3.2). Sans-IO: bytes in, values out.

Plain form (``compressed`` header absent or false), standard or fastjson JSON::

    {"filterServerList": [...],
     "topicConfigSerializeWrapper": {"dataVersion": {"counter": N, "timestamp": ms},
                                     "topicConfigTable": {"<topic>": TopicConfig, ...}}}

Brokers older than V3_0_11 sent the bare ``topicConfigSerializeWrapper`` object; both shapes are accepted.

Compressed form (``compressed=true``): one zlib stream holding, all integers big-endian int32:

| part                | layout                                                                   |
|---------------------|--------------------------------------------------------------------------|
| data version        | [int32 len][DataVersion JSON]                                            |
| topic count         | [int32 n]                                                                |
| n topic lines       | [int32 len]["topicName readQueueNums writeQueueNums perm topicFilterType"] |
| filter server list  | [int32 len][JSON array of "ip:port"]                                     |

``bodyCrc32`` (header) is CRC32 of the body bytes as sent, masked with 0x7FFFFFFF; 0 means "not checked".
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.errors import ProtocolError
from ferrymq.remoting import jsonx

#: Largest inflated compressed body accepted (a broker with ~100k topics fits well below this).
MAX_INFLATED_BODY_BYTES = 64 * 1024 * 1024
#: Largest topic count announced in a compressed body.
MAX_TOPICS_PER_REGISTRATION = 1_000_000
CRC32_MASK = 0x7FFFFFFF

_INT = struct.Struct(">i")


@dataclass(slots=True)
class RegisterBrokerBody:
    data_version: DataVersion = field(default_factory=DataVersion)
    topic_config_table: dict[str, TopicConfig] = field(default_factory=dict)
    filter_server_list: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "filterServerList": list(self.filter_server_list),
            "topicConfigSerializeWrapper": {
                "dataVersion": self.data_version.to_json(),
                "topicConfigTable": {k: v.to_json() for k, v in self.topic_config_table.items()},
            },
        }


def body_crc32(body: bytes) -> int:
    return zlib.crc32(body) & CRC32_MASK


def decode_register_body(body: bytes, *, compressed: bool = False) -> RegisterBrokerBody:
    """Parse a REGISTER_BROKER body. An empty body means no topics and DataVersion(0, 0)."""
    if not body:
        return RegisterBrokerBody()
    if compressed:
        return _decode_compressed(body)
    try:
        obj = jsonx.loads(body)
    except Exception as exc:  # orjson raises its own JSONDecodeError (a ValueError)
        raise ProtocolError(f"register body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("register body is not a JSON object")
    wrapper = obj.get("topicConfigSerializeWrapper")
    if wrapper is None and "topicConfigTable" in obj:
        wrapper = obj  # pre-V3_0_11 brokers send the bare wrapper
    wrapper = wrapper or {}
    if not isinstance(wrapper, dict):
        raise ProtocolError("topicConfigSerializeWrapper is not an object")
    try:
        table_raw = wrapper.get("topicConfigTable") or {}
        table = {str(name): TopicConfig.from_json({"topicName": name, **tc}) for name, tc in table_raw.items()}
        filters = [str(a) for a in (obj.get("filterServerList") or [])]
        return RegisterBrokerBody(DataVersion.from_json(wrapper.get("dataVersion")), table, filters)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed register body: {exc}") from None


def encode_register_body(reg: RegisterBrokerBody, *, compressed: bool = False) -> bytes:
    if not compressed:
        return jsonx.dumps(reg.to_json())
    out = bytearray()
    _put_chunk(out, jsonx.dumps(reg.data_version.to_json()))
    out += _INT.pack(len(reg.topic_config_table))
    for tc in reg.topic_config_table.values():
        line = f"{tc.topic_name} {tc.read_queue_nums} {tc.write_queue_nums} {tc.perm} {tc.topic_filter_type}"
        _put_chunk(out, line.encode())
    _put_chunk(out, jsonx.dumps(list(reg.filter_server_list)))
    return zlib.compress(bytes(out), 9)


def _put_chunk(out: bytearray, data: bytes) -> None:
    out += _INT.pack(len(data))
    out += data


def _decode_compressed(body: bytes) -> RegisterBrokerBody:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(body, MAX_INFLATED_BODY_BYTES)
    except zlib.error as exc:
        raise ProtocolError(f"compressed register body: {exc}") from None
    if inflater.unconsumed_tail:
        raise ProtocolError(f"compressed register body inflates beyond {MAX_INFLATED_BODY_BYTES} bytes")
    reader = _Reader(raw)
    try:
        version = DataVersion.from_json(jsonx.loads(reader.chunk()))
        count = reader.int32()
        if not 0 <= count <= MAX_TOPICS_PER_REGISTRATION:
            raise ProtocolError(f"compressed register body announces {count} topics")
        table: dict[str, TopicConfig] = {}
        for _ in range(count):
            parts = reader.chunk().decode().split(" ")
            if len(parts) < 4:
                raise ProtocolError(f"bad topic line in compressed register body: {' '.join(parts)[:80]!r}")
            tc = TopicConfig(parts[0], int(parts[1]), int(parts[2]), int(parts[3]))
            if len(parts) > 4 and parts[4]:
                tc.topic_filter_type = parts[4]
            table[tc.topic_name] = tc
        filters = [str(a) for a in (jsonx.loads(reader.chunk()) or [])] if reader.remaining() else []
    except ProtocolError:
        raise
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed compressed register body: {exc}") from None
    return RegisterBrokerBody(version, table, filters)


class _Reader:
    __slots__ = ("_buf", "_pos")

    def __init__(self, buf: bytes) -> None:
        self._buf = buf
        self._pos = 0

    def remaining(self) -> int:
        return len(self._buf) - self._pos

    def int32(self) -> int:
        if self.remaining() < 4:
            raise ProtocolError("compressed register body truncated")
        (v,) = _INT.unpack_from(self._buf, self._pos)
        self._pos += 4
        return int(v)

    def chunk(self) -> bytes:
        n = self.int32()
        if n < 0 or n > self.remaining():
            raise ProtocolError("compressed register body: chunk length out of range")
        data = self._buf[self._pos : self._pos + n]
        self._pos += n
        return data
