"""REGISTER_BROKER body codec (protocol §3.2), both forms, for the broker (encode) and the name server
(decode). Sans-IO: bytes in, values out; no sockets, no event loop.

Plain form (request header ``compressed`` absent or false): standard or fastjson JSON::

    {"filterServerList": ["ip:port", ...],
     "topicConfigSerializeWrapper": {"dataVersion": {"counter": N, "timestamp": ms},
                                     "topicConfigTable": {"<topic>": TopicConfig JSON, ...}}}

Brokers older than V3_0_11 sent the bare ``topicConfigSerializeWrapper`` object; both shapes decode.

Compressed form (header ``compressed=true``, RocketMQ 4.9's name servers accept it): the body is ONE zlib
stream (RFC 1950: what Java's ``DeflaterOutputStream`` writes; we compress at level 9 as RocketMQ does).
Inflated, it is this sequence, every integer a big-endian signed int32:

| # | field                 | layout                                 | notes                                          |
|---|-----------------------|----------------------------------------|------------------------------------------------|
| 1 | data version length   | int32 L1                               | 0 <= L1 <= MAX_CHUNK_BYTES                      |
| 2 | data version          | L1 bytes, UTF-8 JSON                   | ``{"counter":N,"timestamp":ms}`` (5.x adds keys) |
| 3 | topic count           | int32 n                                | 0 <= n <= MAX_TOPICS_PER_REGISTRATION           |
| 4 | topic entry length    | int32 Li            (repeated n times) | 0 <= Li <= MAX_CHUNK_BYTES                      |
| 5 | topic entry           | Li bytes, UTF-8     (repeated n times) | ``"name read write perm filterType"``, one space |
| 6 | filter servers length | int32 L2                               | 0 <= L2 <= MAX_CHUNK_BYTES                      |
| 7 | filter servers        | L2 bytes, UTF-8 JSON array of strings  | ``[]`` when none                                |

A topic entry is RocketMQ's ``TopicConfig.encode()``: five fields separated by one space. RocketMQ 4.x
name servers accept exactly five, so the encoder writes five; RocketMQ 5.x appends a sixth (attributes
JSON, possibly empty), which the decoder ignores. ``topicSysFlag`` and ``order`` are not carried (0 and
false on the receiving side, as in RocketMQ). ``bodyCrc32`` (a request header) is CRC32 of the body bytes
as sent, masked with 0x7FFFFFFF; 0 means "not checked".

API
---
``encode_compressed_register_body(topic_configs, filter_server_list=(), data_version=None) -> bytes``
    ``topic_configs`` is a mapping name -> ``TopicConfig`` or an iterable of ``TopicConfig``; the result is
    the compressed body to send with ``compressed=true``.
``decode_compressed_register_body(body) -> RegisterBrokerBody``
    The whole body at once; raises ``ProtocolError`` on any malformed or oversized input.
``CompressedRegisterBodyReader(body)``
    The same, in steps: ``.data_version`` and ``.topic_count`` after the constructor (cheap: the data
    version is the stream's first bytes, so a name server can skip an unchanged table without decoding
    it), then ``read_topics(max_count)`` until it returns an empty list, then ``filter_server_list()``.
``encode_register_body(reg, compressed=False)`` / ``decode_register_body(body, compressed=False)``
    Either form, for a ``RegisterBrokerBody``. ``body_crc32(body)`` the header checksum.
``decode_register_envelope(body)``
    A plain body with its topic table left as parsed JSON (``topic_config_from_json`` converts one entry).
``PlainRegisterBodyReader(body)``
    A plain body in steps, so that a 10,000-topic table is never one parse: ``.data_version`` and
    ``.filter_server_list`` after the constructor, then ``read_topics(max_count)`` until it returns an empty
    list. ``.stepped`` is False when the body is not in the layout the steps need (below): it was then
    parsed whole by the constructor and ``read_topics`` hands out that table.

Plain body in steps
-------------------
Every broker we know writes the keys in this order (fastjson sorts a bean's properties, and so does our
encoder): ``{"filterServerList":[...],"topicConfigSerializeWrapper":{"dataVersion":{...},
"topicConfigTable":{ENTRIES}...}...}``. The reader needs only that the table's key comes after
``filterServerList`` and ``dataVersion``:

| step        | what is parsed                                        | how                                         |
|-------------|-------------------------------------------------------|---------------------------------------------|
| constructor | the text before the table, closed by a probe          | first ``"topicConfigTable":{``; the text    |
|             | ``{"\u0000":0}}}`` (one parse of a few hundred bytes)  | before it plus the probe must parse, with   |
|             |                                                       | the probe in the wrapper's table            |
| each step   | ``{`` + entries + ``}``, about ``max_count`` x         | ends at a ``}`` followed by ``, "key": {``  |
|             | ``PLAIN_TOPIC_BYTES_ESTIMATE`` bytes                   | at or after the step's size                 |
| last step   | the body with the entries already read cut out        | one parse of the rest: the table's last     |
|             |                                                       | entries and everything after the table      |

A step's text parses only if its end closes an entry of the table: an end inside a string, or inside an
entry's nested object or array, leaves the text with an open string or container, so the parse fails and
the step tries the next such ``}`` (at most ``PLAIN_SPLIT_TRIALS`` times, then the last step takes the
rest). The entries of a well-formed body therefore come out exactly as one parse would give them. A
malformed body is refused (``ProtocolError``) when the step that reaches the fault parses, possibly after
earlier steps handed out entries, as with the compressed reader.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.errors import ProtocolError

#: Largest inflated compressed body accepted (a broker with ~100k topics fits well below this).
MAX_INFLATED_BODY_BYTES = 64 * 1024 * 1024
#: Largest topic count announced in a compressed body.
MAX_TOPICS_PER_REGISTRATION = 1_000_000
#: Largest single length-prefixed chunk (data version, one topic entry, the filter server list).
MAX_CHUNK_BYTES = 16 * 1024 * 1024
#: zlib level of the encoder (RocketMQ uses Deflater.BEST_COMPRESSION).
COMPRESS_LEVEL = 9
CRC32_MASK = 0x7FFFFFFF
#: Fields of a topic entry RocketMQ 4.x decodes (it refuses any other count).
TOPIC_ENTRY_FIELDS = 5
#: Plain body in steps: bytes of one topic entry, about (a fastjson TopicConfig with a 20-character name is 165),
#: so a step of ``read_topics(n)`` parses about n entries
PLAIN_TOPIC_BYTES_ESTIMATE = 160
#: Plain body in steps: ends a step tries (each a parse of the step's text) before the last step takes the rest
PLAIN_SPLIT_TRIALS = 8

_INT = struct.Struct(">i")
_FASTJSON_BARE_KEY = re.compile(rb'([{,]\s*)(-?\d+)(\s*:)')
#: the wrapper's topic table key and the brace opening the table
_PLAIN_TABLE_KEY = re.compile(rb'"topicConfigTable"\s*:\s*(\{)')
#: a possible end of a step: a '}' (group 1's end) then ', "key": {' (the next entry starts at group 2)
_PLAIN_ENTRY_END = re.compile(rb'\}()\s*,\s*("(?:[^"\\]|\\.)*"\s*:\s*\{)')
#: closes the text before the table for the constructor's probe parse
_PLAIN_PROBE_KEY = "\u0000"
_PLAIN_PROBE = b'{"\\u0000":0}}}'


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


# ---------------------------------------------------------------------------------------------- encode


def encode_topic_entry(tc: TopicConfig) -> bytes:
    """One topic entry (field 5), RocketMQ's ``TopicConfig.encode()``."""
    return (f"{tc.topic_name} {tc.read_queue_nums} {tc.write_queue_nums} {tc.perm} "
            f"{tc.topic_filter_type}").encode()


def encode_compressed_register_body(
    topic_configs: Mapping[str, TopicConfig] | Iterable[TopicConfig],
    filter_server_list: Sequence[str] = (),
    data_version: DataVersion | None = None,
) -> bytes:
    """The compressed REGISTER_BROKER body (send it with header ``compressed=true``)."""
    configs = topic_configs.values() if isinstance(topic_configs, Mapping) else topic_configs
    version = data_version if data_version is not None else DataVersion()
    deflater = zlib.compressobj(COMPRESS_LEVEL)
    parts: list[bytes] = []
    _chunk(parts, orjson.dumps(version.to_json()))
    entries = [encode_topic_entry(tc) for tc in configs]
    parts.append(_INT.pack(len(entries)))
    for entry in entries:
        _chunk(parts, entry)
    _chunk(parts, orjson.dumps([str(a) for a in filter_server_list]))
    return deflater.compress(b"".join(parts)) + deflater.flush()


def _chunk(parts: list[bytes], data: bytes) -> None:
    parts.append(_INT.pack(len(data)))
    parts.append(data)


def encode_register_body(reg: RegisterBrokerBody, *, compressed: bool = False) -> bytes:
    if compressed:
        return encode_compressed_register_body(reg.topic_config_table, reg.filter_server_list, reg.data_version)
    return orjson.dumps(reg.to_json())


# ---------------------------------------------------------------------------------------------- decode


class CompressedRegisterBodyReader:
    """Decodes a compressed body in steps. The constructor inflates (bounded by MAX_INFLATED_BODY_BYTES)
    and reads fields 1-3; ``read_topics`` reads up to ``max_count`` entries of fields 4-5 per call; after
    the last entry ``filter_server_list()`` reads fields 6-7 (absent in very old encoders: [])."""

    __slots__ = ("_buf", "_pos", "data_version", "topic_count", "_topics_left")

    def __init__(self, body: bytes) -> None:
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(body, MAX_INFLATED_BODY_BYTES)
        except zlib.error as exc:
            raise ProtocolError(f"compressed register body: {exc}") from None
        if inflater.unconsumed_tail:
            raise ProtocolError(f"compressed register body inflates beyond {MAX_INFLATED_BODY_BYTES} bytes")
        self._buf = raw
        self._pos = 0
        self.data_version = _data_version(self._read_chunk())
        count = self._read_int32()
        if not 0 <= count <= MAX_TOPICS_PER_REGISTRATION:
            raise ProtocolError(f"compressed register body announces {count} topics")
        self.topic_count = count
        self._topics_left = count

    def read_topics(self, max_count: int) -> list[TopicConfig]:
        out: list[TopicConfig] = []
        while self._topics_left > 0 and len(out) < max_count:
            out.append(_topic_entry(self._read_chunk()))
            self._topics_left -= 1
        return out

    def skip_topics(self) -> None:
        """Pass over the remaining topic entries without decoding them (only their length prefixes)."""
        while self._topics_left > 0:
            n = self._read_int32()
            if n < 0 or n > MAX_CHUNK_BYTES or n > len(self._buf) - self._pos:
                raise ProtocolError(f"compressed register body: chunk length {n} out of range")
            self._pos += n
            self._topics_left -= 1

    def filter_server_list(self) -> list[str]:
        if self._topics_left:
            raise ProtocolError("filter server list read before the topic entries")
        if self._pos >= len(self._buf):
            return []
        try:
            value = orjson.loads(self._read_chunk())
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(f"compressed register body: filter server list: {exc}") from None
        if value is None:
            return []
        if not isinstance(value, list):
            raise ProtocolError("compressed register body: filter server list is not a JSON array")
        return [str(a) for a in value]

    def _read_int32(self) -> int:
        if len(self._buf) - self._pos < 4:
            raise ProtocolError("compressed register body truncated")
        (v,) = _INT.unpack_from(self._buf, self._pos)
        self._pos += 4
        return int(v)

    def _read_chunk(self) -> bytes:
        n = self._read_int32()
        if n < 0 or n > MAX_CHUNK_BYTES or n > len(self._buf) - self._pos:
            raise ProtocolError(f"compressed register body: chunk length {n} out of range")
        data = self._buf[self._pos : self._pos + n]
        self._pos += n
        return data


def _data_version(raw: bytes) -> DataVersion:
    try:
        obj = orjson.loads(raw) if raw else {}
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        return DataVersion.from_json(obj)
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise ProtocolError(f"compressed register body: bad data version: {exc}") from None


def _topic_entry(raw: bytes) -> TopicConfig:
    try:
        parts = raw.decode().split(" ")
        if len(parts) < TOPIC_ENTRY_FIELDS or not parts[0]:
            raise ValueError(f"{len(parts)} fields")
        tc = TopicConfig(parts[0], int(parts[1]), int(parts[2]), int(parts[3]))
        if parts[4]:
            tc.topic_filter_type = parts[4]
        return tc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"bad topic entry in compressed register body {raw[:80]!r}: {exc}") from None


def decode_compressed_register_body(body: bytes) -> RegisterBrokerBody:
    reader = CompressedRegisterBodyReader(body)
    table = {tc.topic_name: tc for tc in reader.read_topics(reader.topic_count)}
    return RegisterBrokerBody(reader.data_version, table, reader.filter_server_list())


@dataclass(slots=True)
class RegisterEnvelope:
    """A plain (JSON) body with its topic table still raw: name -> TopicConfig JSON object."""

    data_version: DataVersion
    raw_topic_table: dict[str, Any]
    filter_server_list: list[str]


def decode_register_envelope(body: bytes) -> RegisterEnvelope:
    """Parse a plain body but leave the topic entries as parsed JSON (``topic_config_from_json`` makes one a
    TopicConfig), so a reader can skip an unchanged table or convert it in steps."""
    if not body:
        return RegisterEnvelope(DataVersion(), {}, [])
    obj = _json_object(body)
    wrapper = obj.get("topicConfigSerializeWrapper")
    if wrapper is None and "topicConfigTable" in obj:
        wrapper = obj  # pre-V3_0_11 brokers send the bare wrapper
    wrapper = wrapper or {}
    if not isinstance(wrapper, dict):
        raise ProtocolError("topicConfigSerializeWrapper is not an object")
    table = wrapper.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise ProtocolError("topicConfigTable is not an object")
    try:
        version = wrapper.get("dataVersion")
        filters = obj.get("filterServerList") or []
        return RegisterEnvelope(DataVersion.from_json(version if isinstance(version, dict) else None), table,
                                [str(a) for a in filters])
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed register body: {exc}") from None


class PlainRegisterBodyReader:
    """A plain body decoded in steps (module docstring, "Plain body in steps"). ``data_version`` and
    ``filter_server_list`` are known after the constructor; ``read_topics`` hands out the entries."""

    __slots__ = ("_body", "_table_open", "_cursor", "_rest", "stepped", "data_version", "filter_server_list")

    def __init__(self, body: bytes) -> None:
        self._body = body
        #: whole-parsed table still to hand out (the fallback, and the last step's entries)
        self._rest: list[tuple[str, Any]] | None = None
        located = _locate_plain_table(body)
        if located is None:
            envelope = decode_register_envelope(body)
            self.stepped = False
            self.data_version = envelope.data_version
            self.filter_server_list = envelope.filter_server_list
            self._rest = list(envelope.raw_topic_table.items())
            self._table_open = self._cursor = -1
            return
        self.stepped = True
        self._table_open, self.data_version, self.filter_server_list = located
        #: where the next step's text starts (the first entry's key); -1 once the last step ran
        self._cursor = self._table_open + 1

    def read_topics(self, max_count: int) -> list[TopicConfig]:
        """About ``max_count`` entries (a step ends at an entry's end); ``[]`` once every entry was read."""
        max_count = max(1, max_count)
        if self._cursor >= 0:
            raw = self._next_step(max_count * PLAIN_TOPIC_BYTES_ESTIMATE)
            if raw is not None:
                return [topic_config_from_json(name, value) for name, value in raw.items()]
            self._last_step()
        rest = self._rest or []
        take, self._rest = rest[:max_count], rest[max_count:]
        return [topic_config_from_json(name, value) for name, value in take]

    def _next_step(self, step_bytes: int) -> dict[str, Any] | None:
        """The entries of the next step, or None when the rest is left to the last step."""
        body, start = self._body, self._cursor
        search_from = start + step_bytes
        for _ in range(PLAIN_SPLIT_TRIALS):
            m = _PLAIN_ENTRY_END.search(body, search_from)
            if m is None:
                return None
            try:
                raw = orjson.loads(b"{" + body[start:m.start(1)] + b"}")
            except orjson.JSONDecodeError:
                search_from = m.start(2)  # the '}' closed something inside an entry: try the next one
                continue
            self._cursor = m.start(2)
            return raw  # "{" ... "}" parsed: an object
        return None

    def _last_step(self) -> None:
        """Parse the body with the entries already read cut out: the table's last entries, and the rest."""
        body = self._body
        envelope = decode_register_envelope(body[: self._table_open + 1] + body[self._cursor:])
        self._cursor = -1
        self._rest = list(envelope.raw_topic_table.items())
        self.filter_server_list = envelope.filter_server_list


def _locate_plain_table(body: bytes) -> tuple[int, DataVersion, list[str]] | None:
    """(index of the table's '{', data version, filter server list) when the body has the layout the steps
    need; None otherwise (then parse it whole)."""
    m = _PLAIN_TABLE_KEY.search(body)
    if m is None:
        return None
    try:
        probe = orjson.loads(body[: m.start(1)] + _PLAIN_PROBE)
    except orjson.JSONDecodeError:
        return None  # the match was inside a string, or the table is not at the wrapper's depth
    wrapper = probe.get("topicConfigSerializeWrapper") if isinstance(probe, dict) else None
    if not isinstance(wrapper, dict) or wrapper.get("topicConfigTable") != {_PLAIN_PROBE_KEY: 0}:
        return None
    version, filters = wrapper.get("dataVersion"), probe.get("filterServerList")
    if not isinstance(version, dict) or not isinstance(filters, list):
        return None  # written after the table: known only from a whole parse
    try:
        return m.start(1), DataVersion.from_json(version), [str(a) for a in filters]
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed register body: {exc}") from None


def topic_config_from_json(name: str, raw: Any) -> TopicConfig:
    """One entry of a plain body's topicConfigTable."""
    try:
        return TopicConfig.from_json({"topicName": name, **raw})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed register body: topic {str(name)[:80]!r}: {exc}") from None


def decode_register_body(body: bytes, *, compressed: bool = False) -> RegisterBrokerBody:
    """Parse a REGISTER_BROKER body. An empty body means no topics and DataVersion(0, 0)."""
    if not body:
        return RegisterBrokerBody()
    if compressed:
        return decode_compressed_register_body(body)
    env = decode_register_envelope(body)
    table = {str(name): topic_config_from_json(name, raw) for name, raw in env.raw_topic_table.items()}
    return RegisterBrokerBody(env.data_version, table, env.filter_server_list)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = _fastjson_loads(body)
    if not isinstance(obj, dict):
        raise ProtocolError("register body is not a JSON object")
    return obj


def _fastjson_loads(body: bytes) -> Any:
    """fastjson writes maps with non-string keys bare ({0:"a"}); quote them and retry."""
    fixed = _FASTJSON_BARE_KEY.sub(rb'\1"\2"\3', bytes(body))
    try:
        return orjson.loads(fixed)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"register body is not JSON: {exc}") from None
