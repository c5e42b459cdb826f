"""Decode raw PULL bodies (concatenated commit log records, protocol §4.1) straight into Arrow batches.

Source row schema (Spark DDL ``SOURCE_SCHEMA_DDL``; Arrow form ``ARROW_SCHEMA`` must equal what
``pyspark.sql.pandas.types.to_arrow_schema(schema, timezone="UTC")`` gives, or Spark rejects the batch):

| column         | Spark type          | Arrow type            | from                                          |
|----------------|---------------------|-----------------------|-----------------------------------------------|
| key            | string              | string                | KEYS property (space-separated keys, as sent) |
| value          | binary              | binary                | body (inflated when sysFlag bit 0 is set)     |
| topic          | string              | string                | record topic                                  |
| brokerName     | string              | string                | the queue's broker                            |
| queueId        | int                 | int32                 | QUEUEID                                       |
| queueOffset    | bigint              | int64                 | QUEUEOFFSET                                   |
| tags           | string              | string                | TAGS property                                 |
| msgId          | string              | string                | UNIQ_KEY, else the offset msgId (§4.5)        |
| bornTimestamp  | timestamp           | timestamp[us, UTC]    | BORNTIMESTAMP (ms)                            |
| storeTimestamp | timestamp           | timestamp[us, UTC]    | STORETIMESTAMP (ms)                           |
| properties     | map<string,string>  | map<string, string>   | all properties                                |

``BatchBuilder`` (the fast path) walks each PULL body once in C (``common.records``); a second C pass
(``records.build_columns``) fills every column's buffers straight from the PULL bodies, or, without the
extension, Arrow kernels build them over the concatenated bodies. ``RowBuilder`` decodes record by record
(IPv6 hosts, compressed bodies, repeated property names, invalid UTF-8).
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ferrymq.common.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    SYSFLAG_STOREHOST_V6,
    MessageExt,
    string_to_properties,
)
from ferrymq.common.message_codec import HEAD_V4, MESSAGE_MAGIC_CODE, RecordFormatError, decode_record
from ferrymq.common.records import NATIVE as _RECORDS_NATIVE
from ferrymq.common.records import scan_pull_body

SOURCE_SCHEMA_DDL = (
    "key string, value binary, topic string, brokerName string, queueId int, queueOffset bigint, "
    "tags string, msgId string, bornTimestamp timestamp, storeTimestamp timestamp, "
    "properties map<string,string>"
)

_TS = pa.timestamp("us", tz="UTC")
_MAP = pa.map_(pa.string(), pa.string())
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("brokerName", pa.string()),
        ("queueId", pa.int32()),
        ("queueOffset", pa.int64()),
        ("tags", pa.string()),
        ("msgId", pa.string()),
        ("bornTimestamp", _TS),
        ("storeTimestamp", _TS),
        ("properties", _MAP),
    ]
)
COLUMN_NAMES = tuple(ARROW_SCHEMA.names)

_HEAD_SIZE = HEAD_V4.size  # 88: fields 1..15 up to BODYLENGTH
_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
_US_PER_MS = 1000


class RowBuilder:
    """Row-at-a-time decoder: the fallback for IPv6 hosts, compressed bodies and odd properties.

    Same interface as ``BatchBuilder``; every record becomes Python values first (slow, but general)."""

    __slots__ = (
        "_key", "_value", "_topic", "_broker", "_qid", "_qoff", "_tags", "_msgid", "_born", "_store",
        "_map_offsets", "_map_keys", "_map_values",
    )  # fmt: skip

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._key: list[str | None] = []
        self._value: list[bytes] = []
        self._topic: list[str] = []
        self._broker: list[str] = []
        self._qid: list[int] = []
        self._qoff: list[int] = []
        self._tags: list[str | None] = []
        self._msgid: list[str] = []
        self._born: list[int] = []
        self._store: list[int] = []
        self._map_offsets: list[int] = [0]
        self._map_keys: list[str] = []
        self._map_values: list[str] = []

    def __len__(self) -> int:
        return len(self._qoff)

    def append_raw(
        self,
        raw: bytes | memoryview,
        broker_name: str,
        start: int,
        end: int,
        tags: frozenset[str] | None = None,
    ) -> int:
        """Decode every record of a PULL body; keep those with start <= queueOffset < end whose TAGS
        is in ``tags`` (None = all). Returns the number of rows kept."""
        kept = 0
        pos = 0
        size = len(raw)
        unpack = HEAD_V4.unpack_from
        while pos < size:
            if pos + _HEAD_SIZE > size:
                raise RecordFormatError(f"truncated record header at {pos} of a {size}-byte pull body")
            (total, magic, _crc, queue_id, _flag, queue_offset, phy_offset, sys_flag, born_ms, _born_host,
             store_ms, store_host, _reconsume, _prepared, body_len) = unpack(raw, pos)  # fmt: skip
            if magic != MESSAGE_MAGIC_CODE or total < _HEAD_SIZE or pos + total > size:
                raise RecordFormatError(
                    f"bad record at {pos} of a pull body (magic {magic & 0xFFFFFFFF:#x}, size {total})"
                )
            if sys_flag & _V6:
                msg = decode_record(raw, pos)
                pos += total
                if start <= msg.queue_offset < end and (tags is None or msg.tags in tags):
                    self.append_message(msg, broker_name)
                    kept += 1
                continue
            record_end = pos + total
            if not start <= queue_offset < end:
                pos = record_end
                continue
            p = pos + _HEAD_SIZE
            body_end = p + body_len
            topic_len = raw[body_end]
            t0 = body_end + 1
            props_start = t0 + topic_len + 2
            if body_len < 0 or props_start > record_end:
                raise RecordFormatError(f"record at {pos}: TOTALSIZE {total} does not match its fields")
            props = (
                string_to_properties(bytes(raw[props_start:record_end]).decode("utf-8", "replace"))
                if props_start < record_end
                else {}
            )
            tag = props.get(PROPERTY_TAGS)
            pos = record_end
            if tags is not None and tag not in tags:
                continue
            body = bytes(raw[p:body_end])
            if sys_flag & SYSFLAG_COMPRESSED:
                body = zlib.decompress(body)
            self._key.append(props.get(PROPERTY_KEYS))
            self._value.append(body)
            self._topic.append(bytes(raw[t0 : t0 + topic_len]).decode("utf-8", "replace"))
            self._broker.append(broker_name)
            self._qid.append(queue_id)
            self._qoff.append(queue_offset)
            self._tags.append(tag)
            uniq = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            self._msgid.append(
                uniq or (store_host + phy_offset.to_bytes(8, "big", signed=True)).hex().upper()
            )
            self._born.append(born_ms * _US_PER_MS)
            self._store.append(store_ms * _US_PER_MS)
            if props:
                self._map_keys.extend(props.keys())
                self._map_values.extend(props.values())
            self._map_offsets.append(len(self._map_keys))
            kept += 1
        return kept

    def append_message(self, msg: MessageExt, broker_name: str) -> None:
        """Append one decoded message (slow path; also used with ``decode=True`` pull results)."""
        body = msg.body
        if msg.sys_flag & SYSFLAG_COMPRESSED:
            body = zlib.decompress(body)
        props = msg.properties
        self._key.append(props.get(PROPERTY_KEYS))
        self._value.append(body)
        self._topic.append(msg.topic)
        self._broker.append(broker_name)
        self._qid.append(msg.queue_id)
        self._qoff.append(msg.queue_offset)
        self._tags.append(props.get(PROPERTY_TAGS))
        self._msgid.append(msg.msg_id)
        self._born.append(msg.born_timestamp * _US_PER_MS)
        self._store.append(msg.store_timestamp * _US_PER_MS)
        self._map_keys.extend(props.keys())
        self._map_values.extend(props.values())
        self._map_offsets.append(len(self._map_keys))

    def flush(self) -> pa.RecordBatch:
        """The rows appended since the last flush, as one RecordBatch of ``ARROW_SCHEMA``."""
        props = pa.MapArray.from_arrays(
            pa.array(self._map_offsets, pa.int32()),
            pa.array(self._map_keys, pa.string()),
            pa.array(self._map_values, pa.string()),
        )
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self._key, pa.string()),
                pa.array(self._value, pa.binary()),
                pa.array(self._topic, pa.string()),
                pa.array(self._broker, pa.string()),
                pa.array(self._qid, pa.int32()),
                pa.array(self._qoff, pa.int64()),
                pa.array(self._tags, pa.string()),
                pa.array(self._msgid, pa.string()),
                pa.array(self._born, _TS),
                pa.array(self._store, _TS),
                props.cast(_MAP),
            ],
            schema=ARROW_SCHEMA,
        )
        self._reset()
        return batch


#: Records with any of these sysFlag bits are decoded by ``RowBuilder`` (rare on the wire).
_SLOW_FLAGS = _V6 | SYSFLAG_COMPRESSED
#: Segment boundaries kept per record (see ``BatchBuilder``): head, body, topic length, topic,
#: properties length, properties.
_SEGMENTS = 6
_SEG_BODY = 1
_SEG_TOPIC = 3
_SEG_PROPS = 5
_PROPERTY_SEPARATOR = "\x02"
_NAME_VALUE_SEPARATOR = "\x01"

#: the C pass that fills every column's buffers (None: Arrow kernels build them)
_BUILD_COLUMNS: Callable[..., tuple[Any, ...]] | None = getattr(_RECORDS_NATIVE, "build_columns", None)

_stride_cache: list[pa.Array] = [pa.array([], pa.int64())]


def _stride(n: int) -> pa.Array:
    """[0, 6, 12, ...] of length n (cached, grown on demand): index of each record's first segment."""
    cached = _stride_cache[0]
    if len(cached) < n:
        cached = pa.array(range(0, _SEGMENTS * max(n, 2 * len(cached)), _SEGMENTS), pa.int64())
        _stride_cache[0] = cached
    return cached.slice(0, n)


def _properties_map(props: pa.Array) -> pa.MapArray:
    """``string_to_properties`` for a whole string column: ``k\\x01v`` items split on ``\\x02``.

    Items without a name (``\\x01v``), empty items (a trailing separator) and junk are dropped as in
    ``string_to_properties``. Rows that repeat a name (a dict keeps only the last value, a map would keep
    both) never get here: ``scan_pull_body`` flags them and the builder decodes those bodies row by row.
    """
    split = pc.split_pattern(props, _PROPERTY_SEPARATOR)
    items = split.flatten()
    offsets = split.offsets
    name_end = pc.find_substring(items, _NAME_VALUE_SEPARATOR)
    valid = pc.greater(name_end, 0)
    if not pc.all(valid).as_py():
        counted = pc.cumulative_sum(valid.cast(pa.int32()))
        offsets = pc.take(pa.concat_arrays([pa.array([0], pa.int32()), counted]), offsets)
        items = items.filter(valid)
    pairs = pc.split_pattern(items, _NAME_VALUE_SEPARATOR, max_splits=1)
    keys = pc.list_element(pairs, 0)
    values = pc.list_element(pairs, 1)
    return pa.MapArray.from_arrays(offsets, keys, values).cast(_MAP)


class BatchBuilder:
    """Accumulates the raw PULL bodies of one Spark task; ``flush()`` returns a RecordBatch.

    Each PULL body is walked once by ``common.records.scan_pull_body`` (C when built, no Python per
    record): it gives the fixed fields as packed arrays and cuts every record into six contiguous segments
    (head, body, topic length, topic, properties length, properties) whose boundaries, together with the
    concatenated bodies, form one zero-copy Arrow binary array; ``flush`` then builds every column with
    Arrow kernels (``take`` of the body / topic / properties segments, vectorised properties parsing,
    ``map_lookup`` for KEYS / TAGS / UNIQ_KEY). With a tag filter the TAGS of each record are read in
    Python. Records with IPv6 hosts or compressed bodies, and properties with repeated names, switch the
    builder to ``RowBuilder`` until the next flush.
    """

    __slots__ = ("_bufs", "_size", "_n", "_segs", "_qid", "_qoff", "_phy", "_born", "_store", "_hosts",
                 "_drops", "_brokers", "_calls", "_rows")  # fmt: skip

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._bufs: list[bytes] = []
        self._size = 0
        self._n = 0
        self._segs = array("q")
        self._qid = array("i")
        self._qoff = array("q")
        self._phy = array("q")
        self._born = array("q")
        self._store = array("q")
        self._hosts = bytearray()
        self._drops: list[int] = []
        self._brokers: list[tuple[str, int]] = []
        self._calls: list[tuple[bytes, str, int, int, frozenset[str] | None]] = []
        self._rows: RowBuilder | None = None

    def __len__(self) -> int:
        if self._rows is not None:
            return len(self._rows)
        return self._n - len(self._drops)

    @property
    def nbytes(self) -> int:
        """Raw bytes held (the caller flushes well before Arrow's 2 GiB binary limit)."""
        return self._size

    def append_raw(
        self,
        raw: bytes | memoryview,
        broker_name: str,
        start: int,
        end: int,
        tags: frozenset[str] | None = None,
    ) -> int:
        """Add every record of a PULL body; keep those with start <= queueOffset < end whose TAGS
        is in ``tags`` (None = all). Returns the number of rows kept."""
        if isinstance(raw, memoryview):
            raw = bytes(raw)
        self._calls.append((raw, broker_name, start, end, tags))
        if self._rows is not None:
            return self._rows.append_raw(raw, broker_name, start, end, tags)
        scan = scan_pull_body(raw, self._size, start, end)
        if scan is None or scan.repeated:  # IPv6 hosts, compressed bodies, a property named twice
            return self._to_rows()
        count = scan.records
        if not count:
            return 0
        first = self._n
        n_drops = len(self._drops)
        keep = scan.keep
        if keep.count(0):
            self._drops.extend(first + i for i, k in enumerate(keep) if not k)
        if tags is not None:
            segs = array("q", scan.segs)
            base = self._size
            for i in range(count):
                if keep[i]:
                    props = raw[segs[i * _SEGMENTS + _SEG_PROPS] - base:
                                (segs[(i + 1) * _SEGMENTS] - base) if i + 1 < count else len(raw)]
                    if string_to_properties(props.decode("utf-8", "replace")).get(PROPERTY_TAGS) not in tags:
                        self._drops.append(first + i)
            self._drops.sort()
        self._segs.frombytes(scan.segs)
        self._qid.frombytes(scan.queue_ids)
        self._qoff.frombytes(scan.queue_offsets)
        self._phy.frombytes(scan.phy_offsets)
        self._born.frombytes(scan.born_ms)
        self._store.frombytes(scan.store_ms)
        self._hosts += scan.store_hosts
        self._n += count
        self._bufs.append(raw)
        self._size += len(raw)
        if self._brokers and self._brokers[-1][0] == broker_name:
            self._brokers[-1] = (broker_name, self._brokers[-1][1] + count)
        else:
            self._brokers.append((broker_name, count))
        return count - (len(self._drops) - n_drops)

    def _to_rows(self) -> int:
        """Switch to the row decoder: replay every body since the last flush; return the last's count."""
        rows = self._rows = RowBuilder()
        kept = 0
        for call in self._calls:
            kept = rows.append_raw(*call)
        return kept

    def append_message(self, msg: MessageExt, broker_name: str) -> None:
        """Append one decoded message (switches this batch to the row decoder)."""
        if self._rows is None:
            self._to_rows()
        assert self._rows is not None
        self._rows.append_message(msg, broker_name)

    def flush(self) -> pa.RecordBatch:
        """The rows appended since the last flush, as one RecordBatch of ``ARROW_SCHEMA``."""
        try:
            if self._rows is not None:
                return self._rows.flush()
            try:
                return self._columnar()
            except pa.ArrowInvalid:
                # e.g. invalid UTF-8 in a topic or properties: decode like the row path ("replace")
                self._to_rows()
                assert self._rows is not None
                return self._rows.flush()
        finally:
            self._reset()

    def _columnar(self) -> pa.RecordBatch:
        n = self._n
        if n == 0:
            return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
        self._segs.append(self._size)
        if _BUILD_COLUMNS is not None and sys.byteorder == "little":
            batch = self._native_columns(_BUILD_COLUMNS, n)
        else:
            batch = self._kernel_columns(n, self._bufs[0] if len(self._bufs) == 1 else b"".join(self._bufs))
        if self._drops:
            keep = [True] * n
            for i in self._drops:
                keep[i] = False
            batch = batch.filter(pa.array(keep, pa.bool_()))
        return batch

    def _broker_column(self, n: int) -> pa.Array:
        if len(self._brokers) == 1:
            return pa.repeat(pa.scalar(self._brokers[0][0], pa.string()), n)
        return pa.array([name for name, count in self._brokers for _ in range(count)], pa.string())

    def _native_columns(self, build: Callable[..., tuple[Any, ...]], n: int) -> pa.RecordBatch:
        """Every column from buffers the C pass fills (``records.build_columns``, straight from the PULL bodies);
        Arrow checks the UTF-8 unless the pass saw only ASCII in topics and properties."""
        value, topic, key, tags, msg_id, map_offsets, map_keys, map_values, born_us, store_us, ascii = build(
            self._bufs, self._segs, self._hosts, self._phy, self._born, self._store
        )
        check = not ascii
        n_items = len(map_keys[0]) // 4 - 1  # int32 offsets: one more than the items
        keys = _string_array(pa.string(), n_items, map_keys, check)
        props = pa.MapArray.from_arrays(
            pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(map_offsets)]),
            keys, _string_array(pa.string(), n_items, map_values, check), type=_MAP,
        )  # fmt: skip
        return pa.RecordBatch.from_arrays(
            [
                _string_array(pa.string(), n, key, check),
                _string_array(pa.binary(), n, value, False),
                _string_array(pa.string(), n, topic, check),
                self._broker_column(n),
                _native_array(pa.int32(), n, self._qid),
                _native_array(pa.int64(), n, self._qoff),
                _string_array(pa.string(), n, tags, check),
                _string_array(pa.string(), n, msg_id, check),
                pa.Array.from_buffers(_TS, n, [None, pa.py_buffer(born_us)]),
                pa.Array.from_buffers(_TS, n, [None, pa.py_buffer(store_us)]),
                props,
            ],
            schema=ARROW_SCHEMA,
        )

    def _kernel_columns(self, n: int, data: bytes) -> pa.RecordBatch:
        """Every column with Arrow kernels over the segments (no extension: the reference of the C pass)."""
        segs = self._segs
        cut = pa.Array.from_buffers(pa.large_binary(), _SEGMENTS * n, [None, pa.py_buffer(segs), pa.py_buffer(data)])
        first = _stride(n)
        value = pc.take(cut, pc.add(first, _SEG_BODY)).cast(pa.binary())
        topic = pc.take(cut, pc.add(first, _SEG_TOPIC)).cast(pa.string())
        props = _properties_map(pc.take(cut, pc.add(first, _SEG_PROPS)).cast(pa.string()))
        uniq = pc.map_lookup(props, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "last")
        if uniq.null_count or not pc.all(pc.greater(pc.binary_length(uniq), 0)).as_py():
            ids = uniq.to_pylist()
            hosts, phys = self._hosts, self._phy
            for i, v in enumerate(ids):
                if not v:  # no UNIQ_KEY: the offset msgId (store host + commit log offset, §4.5)
                    ids[i] = (bytes(hosts[i * 8:i * 8 + 8]) + phys[i].to_bytes(8, "big", signed=True)).hex().upper()
            uniq = pa.array(ids, pa.string())
        return pa.RecordBatch.from_arrays(
            [
                pc.map_lookup(props, PROPERTY_KEYS, "last"),
                value,
                topic,
                self._broker_column(n),
                _native_array(pa.int32(), n, self._qid),
                _native_array(pa.int64(), n, self._qoff),
                pc.map_lookup(props, PROPERTY_TAGS, "last"),
                uniq,
                pc.multiply(_native_array(pa.int64(), n, self._born), _US_PER_MS).view(_TS),
                pc.multiply(_native_array(pa.int64(), n, self._store), _US_PER_MS).view(_TS),
                props,
            ],
            schema=ARROW_SCHEMA,
        )


def _string_array(kind: pa.DataType, n: int, parts: tuple[bytes, bytes, bytes | None], check: bool) -> pa.Array:
    """A string / binary array over (int32 offsets, data, validity bits or None); with ``check`` it is checked
    to be valid (UTF-8 for strings; ``pa.ArrowInvalid`` otherwise, which sends the batch to the row decoder)."""
    offsets, data, valid = parts
    arr = pa.Array.from_buffers(
        kind, n, [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    if check:
        arr.validate(full=True)
    return arr


def _native_array(kind: pa.DataType, n: int, values: array) -> pa.Array:  # type: ignore[type-arg]
    """An Arrow array over a packed ``array`` (Arrow is little-endian; a big-endian host copies)."""
    if sys.byteorder == "little":
        return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(values)])
    return pa.array(values.tolist(), kind)


def batch_from_records(
    raw_bodies: Iterable[bytes], broker_name: str, start: int = 0, end: int = 2**63 - 1
) -> pa.RecordBatch:
    """Convenience for tests and tools: decode several PULL bodies into one batch."""
    builder = BatchBuilder()
    for raw in raw_bodies:
        builder.append_raw(raw, broker_name, start, end)
    return builder.flush()
