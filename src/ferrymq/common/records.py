"""One pass over a PULL body (concatenated commit log records): the fixed fields of every record and the
boundaries of its variable parts, as packed native arrays (the Spark source builds Arrow columns from them).

``scan_pull_body(raw, base, start, end)`` -> ``PullScan`` or None. None means a record has IPv6 hosts or a
compressed body, which the caller decodes row by row. ``RecordFormatError`` names a malformed record. The C
extension ``ferrymq.common._records`` (field table at the top of ``_records.c``) does the walk when it was
built and ``FERRYMQ_PURE_PYTHON`` is not set; ``_scan_python`` below is the reference and the fallback.

| PullScan field | type (native order)   | per record                                                          |
|----------------|-----------------------|---------------------------------------------------------------------|
| records        | int                   |                                                                     |
| segs           | int64 x 6             | base + offsets of head, body, topic length, topic, properties length, properties |
| queue_ids      | int32                 | QUEUEID                                                             |
| queue_offsets  | int64                 | QUEUEOFFSET                                                         |
| phy_offsets    | int64                 | PHYSICALOFFSET                                                      |
| born_ms        | int64                 | BORNTIMESTAMP                                                       |
| store_ms       | int64                 | STORETIMESTAMP                                                      |
| store_hosts    | 8 bytes               | STOREHOST (IPv4 + port), for the offset msgId                       |
| keep           | uint8                 | 1 when start <= QUEUEOFFSET < end                                   |
| repeated       | int (whole body)      | 1 when some record names a property twice (named items only)        |

``build_columns`` (C only; ``spark/arrow.py`` builds the same columns with Arrow kernels without it) turns the
concatenated bodies and the scans' arrays into Arrow buffers, layout in ``_records.c``.
"""

from __future__ import annotations

import importlib
import os
from array import array
from types import ModuleType
from typing import NamedTuple

from ferrymq.common.message import SYSFLAG_BORNHOST_V6, SYSFLAG_COMPRESSED, SYSFLAG_STOREHOST_V6
from ferrymq.common.message_codec import HEAD_V4, MESSAGE_MAGIC_CODE, RecordFormatError

PURE_PYTHON_ENV = "FERRYMQ_PURE_PYTHON"
SEGMENTS = 6
_HEAD_SIZE = HEAD_V4.size
_SLOW_FLAGS = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6 | SYSFLAG_COMPRESSED


class PullScan(NamedTuple):
    records: int
    segs: bytes
    queue_ids: bytes
    queue_offsets: bytes
    phy_offsets: bytes
    born_ms: bytes
    store_ms: bytes
    store_hosts: bytes
    keep: bytes
    repeated: int


def _load() -> ModuleType | None:
    try:
        return importlib.import_module("ferrymq.common._records")
    except ImportError:
        return None


#: the extension whatever the environment says (tests compare it with the reference), and the one in use
EXTENSION: ModuleType | None = _load()
NATIVE: ModuleType | None = None if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0") else EXTENSION


def scan_pull_body(raw: bytes, base: int, start: int, end: int) -> PullScan | None:
    if NATIVE is not None:
        try:
            out = NATIVE.scan_pull_body(raw, base, start, end)
        except ValueError as exc:
            raise RecordFormatError(str(exc)) from None
        return None if out is None else PullScan(*out)
    return _scan_python(raw, base, start, end)


def _scan_python(raw: bytes, base: int, start: int, end: int) -> PullScan | None:
    segs, qids, qoffs, phys, borns, stores = (array("q"), array("i"), array("q"), array("q"), array("q"),
                                              array("q"))
    hosts = bytearray()
    keep = bytearray()
    repeated = 0
    unpack = HEAD_V4.unpack_from
    size = len(raw)
    pos = 0
    while pos < size:
        if pos + _HEAD_SIZE > size:
            raise RecordFormatError(f"truncated record header at {pos} of a {size}-byte pull body")
        (total, magic, _crc, queue_id, _flag, queue_offset, phy_offset, sys_flag, born_ms, _born_host,
         store_ms, store_host, _reconsume, _prepared, body_len) = unpack(raw, pos)  # fmt: skip
        record_end = pos + total
        if magic != MESSAGE_MAGIC_CODE or total < _HEAD_SIZE or record_end > size:
            raise RecordFormatError(
                f"bad record at {pos} of a pull body (magic {magic & 0xFFFFFFFF:#x}, size {total})")
        if sys_flag & _SLOW_FLAGS:
            return None
        body_end = pos + _HEAD_SIZE + body_len
        if body_len < 0 or body_end >= record_end:
            raise RecordFormatError(f"record at {pos}: TOTALSIZE {total} does not match its fields")
        topic_end = body_end + 1 + raw[body_end]
        props_start = topic_end + 2
        if props_start > record_end or props_start + int.from_bytes(raw[topic_end:props_start], "big") > record_end:
            raise RecordFormatError(f"record at {pos}: TOTALSIZE {total} does not match its fields")
        if not repeated:
            repeated = _has_repeated_name(raw[props_start:props_start + int.from_bytes(raw[topic_end:props_start], "big")])
        segs.extend((base + pos, base + pos + _HEAD_SIZE, base + body_end, base + body_end + 1, base + topic_end,
                     base + props_start))  # fmt: skip
        qids.append(queue_id)
        qoffs.append(queue_offset)
        phys.append(phy_offset)
        borns.append(born_ms)
        stores.append(store_ms)
        hosts += store_host
        keep.append(1 if start <= queue_offset < end else 0)
        pos = record_end
    return PullScan(len(qids), segs.tobytes(), qids.tobytes(), qoffs.tobytes(), phys.tobytes(), borns.tobytes(),
                    stores.tobytes(), bytes(hosts), bytes(keep), repeated)


def _has_repeated_name(props: bytes) -> int:
    """1 when two ``name\x01value`` items of a properties text share a name (items without one are skipped)."""
    names = [item.partition(b"\x01")[0] for item in props.split(b"\x02") if item.find(b"\x01") > 0]
    return 1 if len(set(names)) != len(names) else 0
