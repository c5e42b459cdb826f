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

The IPv4 fast path unpacks the fixed head with one struct call per record and appends to column
lists; records with IPv6 hosts go through ``message_codec.decode_record``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import pyarrow as pa

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


class BatchBuilder:
    """Accumulates decoded rows of one Spark task; ``flush()`` returns a RecordBatch."""

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


def batch_from_records(
    raw_bodies: Iterable[bytes], broker_name: str, start: int = 0, end: int = 2**63 - 1
) -> pa.RecordBatch:
    """Convenience for tests and tools: decode several PULL bodies into one batch."""
    builder = BatchBuilder()
    for raw in raw_bodies:
        builder.append_raw(raw, broker_name, start, end)
    return builder.flush()
