"""Sans-IO codec for stored message records (protocol §4.1) and batch send bodies (§4.9).

Commit log record, big-endian, IPv4 born/store hosts (sysFlag bits 0x10/0x20 clear):

| #  | offset | size  | field                                                   |
|----|--------|-------|---------------------------------------------------------|
| 1  | 0      | 4     | TOTALSIZE (whole record, this field included)           |
| 2  | 4      | 4     | MAGICCODE ``0xDAA320A7`` (BLANK filler: ``0xCBD43194``) |
| 3  | 8      | 4     | BODYCRC = ``zlib.crc32(body) & 0x7FFFFFFF``             |
| 4  | 12     | 4     | QUEUEID                                                 |
| 5  | 16     | 4     | FLAG                                                    |
| 6  | 20     | 8     | QUEUEOFFSET (logical index in the consume queue)        |
| 7  | 28     | 8     | PHYSICALOFFSET (commit log offset of this record)       |
| 8  | 36     | 4     | SYSFLAG                                                 |
| 9  | 40     | 8     | BORNTIMESTAMP (ms)                                      |
| 10 | 48     | 8/20  | BORNHOST: IPv4 (4) or IPv6 (16) + int32 port            |
| 11 | 56     | 8     | STORETIMESTAMP (ms)                                     |
| 12 | 64     | 8/20  | STOREHOST: IP + int32 port                              |
| 13 | 72     | 4     | RECONSUMETIMES                                          |
| 14 | 76     | 8     | PREPARED TRANSACTION OFFSET                             |
| 15 | 84     | 4 + n | BODYLENGTH + BODY                                       |
| 16 |        | 1 + t | TOPICLENGTH (signed byte, ≤ 127) + TOPIC (UTF-8)        |
| 17 |        | 2 + p | PROPERTIESLENGTH (int16, ≤ 32767) + PROPERTIES (UTF-8)  |

TOTALSIZE = 91 + n + t + p (each IPv6 host adds 12). End-of-segment filler (§4.8):
``[int32 remaining][int32 BLANK_MAGIC_CODE]``, the remainder of the segment counted as written.

Batch send body entry (§4.9), concatenated:

| size | field                                  |
|------|----------------------------------------|
| 4    | totalSize = 20 + bodyLen + 2 + propLen |
| 4    | magic (0, ignored)                     |
| 4    | bodyCRC (0, ignored)                   |
| 4    | flag                                   |
| 4    | bodyLen                                |
| n    | body                                   |
| 2    | propLen                                |
| p    | properties                             |

We encode IPv4 hosts only (the target clients cannot read anything else); the decoder accepts IPv6.
"""

from __future__ import annotations

import enum
import mmap
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, repeat
from operator import add
from typing import NamedTuple

from ferrymq.common.message import (
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    MessageExt,
    MessageExtBrokerInner,
    string_to_properties,
)

Buffer = bytes | bytearray | memoryview | mmap.mmap

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB (5.x, not produced or accepted)
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8
RECORD_FIXED_SIZE = 91  # TOTALSIZE with empty body, topic and properties (IPv4 hosts)
RECORD_MIN_SIZE = RECORD_FIXED_SIZE
MAX_TOPIC_LENGTH = 127
MAX_PROPERTIES_LENGTH = 32767
CRC_MASK = 0x7FFFFFFF

# offsets of fixed fields (IPv4 layout)
OFFSET_TOTAL_SIZE = 0
OFFSET_MAGIC = 4
OFFSET_BODY_CRC = 8
OFFSET_QUEUE_ID = 12
OFFSET_QUEUE_OFFSET = 20
OFFSET_PHY_OFFSET = 28
OFFSET_SYS_FLAG = 36
OFFSET_BORN_HOST = 48
OFFSET_STORE_TIMESTAMP_V4 = 56

# Fields 1..15 (body length included) for IPv4 hosts: 88 bytes.
HEAD_V4 = struct.Struct(">iiiiiqqiq8sq8siqi")
_PREFIX = struct.Struct(">ii")  # TOTALSIZE, MAGIC
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_Q64 = struct.Struct(">q")
_FRONT = struct.Struct(">iiiiiqqiq")  # fields 1..9 (40 bytes)
_BATCH_HEAD = struct.Struct(">iiiii")
# IPv4 record fields 1..15 minus what dispatch ignores: TOTALSIZE, MAGIC, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET,
# SYSFLAG, STORETIMESTAMP, BODYLENGTH (88 bytes)
_META_V4 = struct.Struct(">ii4xi4xqqi8x8xq8x4x8xi")
assert _META_V4.size == 88
_BLANK = struct.Struct(">ii")

_HOST_V6_EXTRA = 12


class RecordFormatError(ValueError):
    """A byte range is not a valid stored record (bad magic, size or CRC)."""


class RecordCheck(enum.Enum):
    OK = "OK"  # a complete, valid message record
    BLANK = "BLANK"  # end-of-segment filler: continue at the next segment
    END = "END"  # zeros: no more records here
    INCOMPLETE = "INCOMPLETE"  # the record runs past the readable end (slave: wait for more)
    CORRUPT = "CORRUPT"  # bad magic, size or CRC


def body_crc(body: bytes) -> int:
    return zlib.crc32(body) & CRC_MASK


def blank_filler(remaining: int) -> bytes:
    """The 8-byte end-of-segment filler header for ``remaining`` unused bytes."""
    return _BLANK.pack(remaining, BLANK_MAGIC_CODE)


def record_size(body_len: int, topic_len: int, properties_len: int, sys_flag: int = 0) -> int:
    size = RECORD_FIXED_SIZE + body_len + topic_len + properties_len
    if sys_flag & SYSFLAG_BORNHOST_V6:
        size += _HOST_V6_EXTRA
    if sys_flag & SYSFLAG_STOREHOST_V6:
        size += _HOST_V6_EXTRA
    return size


def encode_record_parts(
    inner: MessageExtBrokerInner,
    topic_bytes: bytes,
    properties_bytes: bytes,
    queue_offset: int,
    phy_offset: int,
    store_timestamp: int,
) -> bytes:
    """Encode with pre-encoded topic/properties (the store's hot path). No range checks."""
    body = inner.body
    total = RECORD_FIXED_SIZE + len(body) + len(topic_bytes) + len(properties_bytes)
    head = HEAD_V4.pack(
        total,
        MESSAGE_MAGIC_CODE,
        zlib.crc32(body) & CRC_MASK,
        inner.queue_id,
        inner.flag,
        queue_offset,
        phy_offset,
        inner.sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6),
        inner.born_timestamp,
        inner.born_host,
        store_timestamp,
        inner.store_host,
        inner.reconsume_times,
        inner.prepared_transaction_offset,
        len(body),
    )
    return b"".join(
        (
            head,
            body,
            len(topic_bytes).to_bytes(1, "big"),
            topic_bytes,
            _I16.pack(len(properties_bytes)),
            properties_bytes,
        )
    )


def encode_record(
    inner: MessageExtBrokerInner, queue_offset: int, phy_offset: int, store_timestamp: int
) -> bytes:
    """Encode one commit log record (IPv4 hosts). Raises RecordFormatError on out-of-range fields."""
    topic_bytes = inner.topic.encode("utf-8")
    properties_bytes = inner.properties_string.encode("utf-8")
    if not 0 < len(topic_bytes) <= MAX_TOPIC_LENGTH:
        raise RecordFormatError(f"topic must be 1..{MAX_TOPIC_LENGTH} bytes, got {len(topic_bytes)}")
    if len(properties_bytes) > MAX_PROPERTIES_LENGTH:
        raise RecordFormatError(f"properties exceed {MAX_PROPERTIES_LENGTH} bytes: {len(properties_bytes)}")
    if len(inner.born_host) != 8 or len(inner.store_host) != 8:
        raise RecordFormatError("born_host and store_host must be 8 bytes (IPv4 + int32 port)")
    return encode_record_parts(
        inner, topic_bytes, properties_bytes, queue_offset, phy_offset, store_timestamp
    )


def _host_sizes(sys_flag: int) -> tuple[int, int]:
    born = 20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8
    store = 20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8
    return born, store


def _decode_slow(buf: Buffer, pos: int, total: int) -> MessageExt:
    """Decode a record of any host layout (IPv6 aware)."""
    (_t, _m, crc, queue_id, flag, queue_offset, phy_offset, sys_flag, born_ts) = _FRONT.unpack_from(buf, pos)
    born_len, store_len = _host_sizes(sys_flag)
    p = pos + 48
    born_host = bytes(buf[p : p + born_len])
    p += born_len
    (store_ts,) = _Q64.unpack_from(buf, p)
    p += 8
    store_host = bytes(buf[p : p + store_len])
    p += store_len
    reconsume_times, prepared_offset, body_len = struct.unpack_from(">iqi", buf, p)
    p += 16
    return _decode_tail(
        buf, pos, total, p, body_len, crc, queue_id, flag, queue_offset, phy_offset, sys_flag,
        born_ts, born_host, store_ts, store_host, reconsume_times, prepared_offset,
    )  # fmt: skip


def _decode_tail(
    buf: Buffer, pos: int, total: int, p: int, body_len: int, crc: int, queue_id: int, flag: int,
    queue_offset: int, phy_offset: int, sys_flag: int, born_ts: int, born_host: bytes, store_ts: int,
    store_host: bytes, reconsume_times: int, prepared_offset: int,
) -> MessageExt:  # fmt: skip
    end = pos + total
    if body_len < 0 or p + body_len + 3 > end:
        raise RecordFormatError(f"bad body length {body_len} in record at {pos}")
    body = bytes(buf[p : p + body_len])
    p += body_len
    topic_len = buf[p]
    if topic_len > 127:  # signed byte
        raise RecordFormatError(f"bad topic length in record at {pos}")
    topic = bytes(buf[p + 1 : p + 1 + topic_len]).decode("utf-8", "replace")
    p += 1 + topic_len
    (props_len,) = _I16.unpack_from(buf, p)
    p += 2
    if props_len < 0 or p + props_len != end:
        raise RecordFormatError(f"record at {pos}: TOTALSIZE {total} does not match its fields")
    properties = string_to_properties(bytes(buf[p:end]).decode("utf-8", "replace")) if props_len else {}
    return MessageExt(
        topic, body, flag, properties, queue_id, queue_offset, phy_offset, total, crc, sys_flag,
        born_ts, born_host, store_ts, store_host, reconsume_times, prepared_offset,
    )  # fmt: skip


def decode_record(buf: Buffer, pos: int = 0) -> MessageExt:
    """Decode the record at ``pos``. Raises RecordFormatError on bad magic, size or truncation."""
    if pos < 0 or pos + 8 > len(buf):
        raise RecordFormatError(f"no record header at {pos} (buffer length {len(buf)})")
    total, magic = _PREFIX.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC_CODE:
        raise RecordFormatError(f"bad magic code {magic & 0xFFFFFFFF:#010x} at {pos}")
    if total < RECORD_MIN_SIZE or pos + total > len(buf):
        raise RecordFormatError(f"bad TOTALSIZE {total} at {pos} (buffer length {len(buf)})")
    (sys_flag,) = _I32.unpack_from(buf, pos + OFFSET_SYS_FLAG)
    if sys_flag & (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6):
        return _decode_slow(buf, pos, total)
    (_t, _m, crc, queue_id, flag, queue_offset, phy_offset, sys_flag, born_ts, born_host, store_ts,
     store_host, reconsume_times, prepared_offset, body_len) = HEAD_V4.unpack_from(buf, pos)  # fmt: skip
    return _decode_tail(
        buf, pos, total, pos + 88, body_len, crc, queue_id, flag, queue_offset, phy_offset, sys_flag,
        born_ts, born_host, store_ts, store_host, reconsume_times, prepared_offset,
    )  # fmt: skip


def iter_records(buf: Buffer) -> Iterator[MessageExt]:
    """Decode a concatenation of records (a PULL/QUERY body). Raises RecordFormatError on junk."""
    pos = 0
    end = len(buf)
    while pos < end:
        msg = decode_record(buf, pos)
        yield msg
        pos += msg.store_size


class RecordMeta(NamedTuple):
    """What dispatch needs from a record (no body copy)."""

    phy_offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    store_timestamp: int
    sys_flag: int
    properties: str


def decode_record_meta(buf: Buffer, pos: int) -> RecordMeta:
    """Fields needed to build consume queue and index entries; assumes check_record said OK."""
    total, _magic, _crc, queue_id, _flag, queue_offset, phy_offset, sys_flag, _born_ts = _FRONT.unpack_from(
        buf, pos
    )
    born_len, store_len = _host_sizes(sys_flag)
    p = pos + 48 + born_len
    (store_ts,) = _Q64.unpack_from(buf, p)
    p += 8 + store_len + 12
    (body_len,) = _I32.unpack_from(buf, p)
    p += 4 + body_len
    topic_len = buf[p]
    topic = bytes(buf[p + 1 : p + 1 + topic_len]).decode("utf-8", "replace")
    p += 1 + topic_len
    (props_len,) = _I16.unpack_from(buf, p)
    props = bytes(buf[p + 2 : p + 2 + props_len]).decode("utf-8", "replace") if props_len > 0 else ""
    return RecordMeta(phy_offset, total, topic, queue_id, queue_offset, store_ts, sys_flag, props)


def check_record_meta(buf: Buffer, pos: int, end: int) -> tuple[RecordCheck, int, RecordMeta | None]:
    """``check_record(buf, pos, False, end)`` and, for OK, ``decode_record_meta(buf, pos)`` in one pass
    over the header (the dispatch path of replicated or re-dispatched records)."""
    if pos + 88 <= end:
        # IPv4 hosts (the usual record): every fixed field dispatch needs in one unpack
        total, magic, queue_id, queue_offset, phy_offset, sys_flag, store_ts, body_len = _META_V4.unpack_from(
            buf, pos)
        if (magic == MESSAGE_MAGIC_CODE and not sys_flag & (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
                and RECORD_MIN_SIZE <= total and pos + total <= end):
            record_end = pos + total
            p = pos + 88 + body_len
            if body_len < 0 or p + 3 > record_end:
                return RecordCheck.CORRUPT, 0, None
            tail = _topic_and_properties(buf, p, record_end)
            if tail is None:
                return RecordCheck.CORRUPT, 0, None
            return RecordCheck.OK, total, RecordMeta(phy_offset, total, tail[0], queue_id, queue_offset,
                                                     store_ts, sys_flag, tail[1])
    if pos + 8 > end:
        return RecordCheck.INCOMPLETE, 0, None
    total, magic = _PREFIX.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        if total >= END_FILE_MIN_BLANK_LENGTH:
            return RecordCheck.BLANK, total, None
        return RecordCheck.CORRUPT, 0, None
    if magic != MESSAGE_MAGIC_CODE:
        if total == 0 and magic == 0:
            return RecordCheck.END, 0, None
        return RecordCheck.CORRUPT, 0, None
    if total < RECORD_MIN_SIZE:
        return RecordCheck.CORRUPT, 0, None
    if pos + total > end:
        return RecordCheck.INCOMPLETE, 0, None
    (_t, _m, _crc, queue_id, _flag, queue_offset, phy_offset, sys_flag, _born) = _FRONT.unpack_from(buf, pos)
    born_len = 20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8
    store_len = 20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8
    ts_pos = pos + 48 + born_len
    p = ts_pos + 8 + store_len + 12
    (body_len,) = _I32.unpack_from(buf, p)
    record_end = pos + total
    if body_len < 0 or p + 4 + body_len + 3 > record_end:
        return RecordCheck.CORRUPT, 0, None
    tail = _topic_and_properties(buf, p + 4 + body_len, record_end)
    if tail is None:
        return RecordCheck.CORRUPT, 0, None
    (store_ts,) = _Q64.unpack_from(buf, ts_pos)
    return RecordCheck.OK, total, RecordMeta(phy_offset, total, tail[0], queue_id, queue_offset, store_ts,
                                             sys_flag, tail[1])


def _topic_and_properties(buf: Buffer, p: int, record_end: int) -> tuple[str, str] | None:
    """TOPICLENGTH + TOPIC + PROPERTIESLENGTH + PROPERTIES starting at ``p``, which must end exactly at
    ``record_end``; None when the lengths don't fit (a corrupt record)."""
    topic_len = buf[p]
    if topic_len > 127 or p + 1 + topic_len + 2 > record_end:
        return None
    topic = bytes(buf[p + 1 : p + 1 + topic_len]).decode("utf-8", "replace")
    p += 1 + topic_len
    (props_len,) = _I16.unpack_from(buf, p)
    if props_len < 0 or p + 2 + props_len != record_end:
        return None
    props = bytes(buf[p + 2 : record_end]).decode("utf-8", "replace") if props_len > 0 else ""
    return topic, props


def store_timestamp_of(buf: Buffer, pos: int) -> int:
    """STORETIMESTAMP of the record at ``pos`` (IPv4 or IPv6 born host)."""
    (sys_flag,) = _I32.unpack_from(buf, pos + OFFSET_SYS_FLAG)
    off = OFFSET_STORE_TIMESTAMP_V4 + (_HOST_V6_EXTRA if sys_flag & SYSFLAG_BORNHOST_V6 else 0)
    return int(_Q64.unpack_from(buf, pos + off)[0])


#: TOTALSIZE, MAGICCODE, BODYCRC, PHYSICALOFFSET, SYSFLAG, BODYLENGTH of a record with IPv4 hosts
VERIFY_V4 = struct.Struct(">iiI16xqi44xi")


def verify_stored_record(record: Buffer, phy_offset: int, crc32: Callable[[Buffer], int] = zlib.crc32) -> bool:
    """True when ``record`` (one whole record as read back for a consumer) has the message magic, a TOTALSIZE
    equal to its length, the PHYSICALOFFSET it was read from and a BODYCRC that matches its body. The read
    path calls this on every record it serves: one unpack and the (native) CRC for the usual IPv4 record."""
    view = memoryview(record)
    if len(view) < RECORD_MIN_SIZE:
        return False
    total, magic, crc, phy, sys_flag, body_len = VERIFY_V4.unpack_from(view, 0)
    if magic != MESSAGE_MAGIC_CODE or total != len(view) or phy != phy_offset:
        return False
    if sys_flag & (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6):
        status, size = check_record(view, 0, True, expected_phy_offset=phy_offset, crc32=crc32)
        return status is RecordCheck.OK and size == total
    if body_len < 0 or 88 + body_len + 3 > total:
        return False
    return crc32(view[88:88 + body_len]) & CRC_MASK == crc


def check_record(
    buf: Buffer, pos: int, check_crc: bool, end: int | None = None, expected_phy_offset: int | None = None,
    crc32: Callable[[Buffer], int] = zlib.crc32,
) -> tuple[RecordCheck, int]:
    """Validate the record at ``pos`` without decoding it; ``end`` bounds the readable bytes. ``crc32``
    (``zlib.crc32``'s results) computes BODYCRC when ``check_crc``: the store passes its faster one.

    Returns (status, size): size is TOTALSIZE for OK and BLANK, 0 otherwise. Used by recovery
    (stop at anything but OK/BLANK) and by dispatch on a slave (INCOMPLETE = wait for more bytes).
    """
    limit = len(buf) if end is None else end
    if pos + 8 > limit:
        return RecordCheck.INCOMPLETE, 0
    total, magic = _PREFIX.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return (RecordCheck.BLANK, total) if total >= END_FILE_MIN_BLANK_LENGTH else (RecordCheck.CORRUPT, 0)
    if magic != MESSAGE_MAGIC_CODE:
        if total == 0 and magic == 0:
            return RecordCheck.END, 0
        return RecordCheck.CORRUPT, 0
    if total < RECORD_MIN_SIZE:
        return RecordCheck.CORRUPT, 0
    if pos + total > limit:
        return RecordCheck.INCOMPLETE, 0
    (_t, _m, crc, _qid, _flag, _qoff, phy_offset, sys_flag, _born) = _FRONT.unpack_from(buf, pos)
    if expected_phy_offset is not None and phy_offset != expected_phy_offset:
        return RecordCheck.CORRUPT, 0
    born_len, store_len = _host_sizes(sys_flag)
    p = pos + 48 + born_len + 8 + store_len + 12
    (body_len,) = _I32.unpack_from(buf, p)
    if body_len < 0 or p + 4 + body_len + 3 > pos + total:
        return RecordCheck.CORRUPT, 0
    body_start = p + 4
    p = body_start + body_len
    topic_len = buf[p]
    if topic_len > 127 or p + 1 + topic_len + 2 > pos + total:
        return RecordCheck.CORRUPT, 0
    p += 1 + topic_len
    (props_len,) = _I16.unpack_from(buf, p)
    if props_len < 0 or p + 2 + props_len != pos + total:
        return RecordCheck.CORRUPT, 0
    if check_crc and (crc32(buf[body_start : body_start + body_len]) & CRC_MASK) != crc:
        return RecordCheck.CORRUPT, 0
    return RecordCheck.OK, total


# --- batch send body (§4.9) -------------------------------------------------------------------


def encode_batch_body(messages: Iterable[tuple[int, bytes, str]]) -> bytes:
    """Encode (flag, body, properties_string) entries as a batch SEND body."""
    parts: list[bytes] = []
    for flag, body, properties in messages:
        props = properties.encode("utf-8")
        if len(props) > MAX_PROPERTIES_LENGTH:
            raise RecordFormatError(f"properties exceed {MAX_PROPERTIES_LENGTH} bytes")
        parts.append(_BATCH_HEAD.pack(20 + len(body) + 2 + len(props), 0, 0, flag, len(body)))
        parts.append(body)
        parts.append(_I16.pack(len(props)))
        parts.append(props)
    return b"".join(parts)


def encode_batch_columns(flags: Iterable[int], bodies: Sequence[Buffer], properties: Sequence[bytes]) -> bytes:
    """``encode_batch_body`` from columns, the properties already UTF-8 encoded: the same bytes, built in one
    C-level pass (``map``/``zip``/``join``, no Python bytecode per entry). ``flags`` is consumed alongside
    the other two (one item per entry). RecordFormatError if some properties exceed 32767 bytes."""
    plens = list(map(len, properties))
    if plens and max(plens) > MAX_PROPERTIES_LENGTH:
        raise RecordFormatError(f"properties exceed {MAX_PROPERTIES_LENGTH} bytes")
    blens = list(map(len, bodies))
    # entry header: totalSize = 20 + bodyLen + 2 + propLen, magic 0, bodyCRC 0, flag, bodyLen
    heads = map(_BATCH_HEAD.pack, map(add, blens, map(add, plens, repeat(22))), repeat(0), repeat(0), flags, blens)
    return b"".join(chain.from_iterable(zip(heads, bodies, map(_I16.pack, plens), properties, strict=False)))


def encode_batch_shared_properties(flags: list[int], bodies: Sequence[Buffer], body_lens: list[int], head: bytes,
                                   tails: bytes, tail_slices: Sequence[slice]) -> bytes:
    """``encode_batch_body`` of entries whose properties (UTF-8) are ``head + tails[tail_slices[i]]``, every
    tail the same length (the batch of one producer: the same properties but for the UNIQ_KEY's last
    characters). One C-level pass; when all flags and body lengths agree, the entry header is one object."""
    n = len(bodies)
    plen = len(head) + (len(tails) // n if n else 0)
    if plen > MAX_PROPERTIES_LENGTH:
        raise RecordFormatError(f"properties exceed {MAX_PROPERTIES_LENGTH} bytes")
    prop_head = _I16.pack(plen) + head
    if n and flags.count(flags[0]) == n and body_lens.count(body_lens[0]) == n:
        heads: Iterable[bytes] = repeat(_BATCH_HEAD.pack(22 + body_lens[0] + plen, 0, 0, flags[0], body_lens[0]))
    else:
        heads = map(_BATCH_HEAD.pack, map(add, body_lens, repeat(22 + plen)), repeat(0), repeat(0), flags, body_lens)
    return b"".join(chain.from_iterable(zip(heads, bodies, repeat(prop_head), map(tails.__getitem__, tail_slices))))


def inflate_bounded(data: bytes, max_bytes: int) -> bytes:
    """Inflate a zlib-compressed body (sysFlag bit 0, as RocketMQ clients compress bodies and batch bodies
    past ``compressMsgBodyOverHowmuch``), refusing more than ``max_bytes`` of output without producing it,
    so a small "zip bomb" costs at most ``max_bytes`` of memory. Raises ValueError when the data is not a
    whole zlib stream or inflates past the limit."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise ValueError(f"compressed body does not inflate: {exc}") from None
    if len(out) > max_bytes:
        raise ValueError(f"compressed body inflates past {max_bytes} bytes")
    if not inflater.eof:
        raise ValueError("compressed body is truncated")
    return out


def decode_batch_body(body: bytes) -> list[tuple[int, bytes, str]]:
    """Decode a batch SEND body into (flag, body, properties_string). RecordFormatError on junk."""
    result: list[tuple[int, bytes, str]] = []
    pos = 0
    end = len(body)
    while pos < end:
        if pos + 20 > end:
            raise RecordFormatError(f"truncated batch entry header at {pos}")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(body, pos)
        if body_len < 0 or pos + 20 + body_len + 2 > end:
            raise RecordFormatError(f"bad batch entry body length {body_len} at {pos}")
        msg_body = body[pos + 20 : pos + 20 + body_len]
        p = pos + 20 + body_len
        (props_len,) = _I16.unpack_from(body, p)
        if props_len < 0 or p + 2 + props_len > end or total != 20 + body_len + 2 + props_len:
            raise RecordFormatError(f"bad batch entry size at {pos}")
        props = body[p + 2 : p + 2 + props_len].decode("utf-8", "replace")
        result.append((flag, msg_body, props))
        pos += total
    return result


__all__ = [
    "BLANK_MAGIC_CODE",
    "END_FILE_MIN_BLANK_LENGTH",
    "HEAD_V4",
    "MAX_PROPERTIES_LENGTH",
    "MAX_TOPIC_LENGTH",
    "MESSAGE_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE_V2",
    "RECORD_FIXED_SIZE",
    "RecordCheck",
    "RecordFormatError",
    "RecordMeta",
    "blank_filler",
    "body_crc",
    "check_record",
    "check_record_meta",
    "decode_batch_body",
    "decode_record",
    "decode_record_meta",
    "encode_batch_body",
    "encode_batch_columns",
    "encode_batch_shared_properties",
    "encode_record",
    "encode_record_parts",
    "iter_records",
    "record_size",
    "store_timestamp_of",
]
