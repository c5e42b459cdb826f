"""Message key index (§5.2): a hash table of ``topic#key`` -> commit log offsets, in files.

| region   | size             | content                                                          |
|----------|------------------|------------------------------------------------------------------|
| header   | 40               | beginTimestamp 8, endTimestamp 8, beginPhyOffset 8,              |
|          |                  | endPhyOffset 8, hashSlotCount 4 (slots used), indexCount 4       |
| slots    | slotNum × 4      | int: newest index number in that slot (0 = empty)                |
| entries  | indexNum × 20    | keyHash 4, phyOffset 8, timeDiff 4 (s since begin), prevIndex 4  |

File size = slotNum×4 + indexNum×20 + 40. indexCount starts at 1 so that 0 means "empty".
Hash = abs(Java ``String.hashCode``) (0 for Integer.MIN_VALUE), slot = hash % slotNum. Files are
named ``yyyyMMddHHmmssSSS`` (local time of creation). Slot and entry counts are configurable
(RocketMQ: 5,000,000 / 20,000,000). A query may return stale or duplicate offsets after a crash;
the store verifies each record before answering.
"""

from __future__ import annotations

import logging
import operator
import os
import struct
import time
from collections.abc import Callable

from ferrymq.common.message import java_string_hash
from ferrymq.store.errors import StoreCorruptError
from ferrymq.store.mapped_file import MappedFile

log = logging.getLogger(__name__)

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
SLOT = struct.Struct(">i")
HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
_INT_MAX = 0x7FFFFFFF


def index_file_size(slot_num: int, index_num: int) -> int:
    return slot_num * SLOT_SIZE + index_num * ENTRY_SIZE + HEADER_SIZE


_POW_COUNT = 512
# 31**(k) mod 2**32, highest power first: a key of n chars uses the last n
_POWERS_DESC = [pow(31, k, 1 << 32) for k in range(_POW_COUNT - 1, -1, -1)]


#: the powers a key of n chars uses, per n (no slicing per call)
_POWERS_BY_LEN = [tuple(_POWERS_DESC[_POW_COUNT - n :]) for n in range(_POW_COUNT + 1)]


def java_hash_fast(text: str) -> int:
    """Java ``String.hashCode`` (signed int32); a C-level dot product for short ASCII strings."""
    n = len(text)
    if n <= _POW_COUNT and text.isascii():
        h = sum(map(operator.mul, text.encode("ascii"), _POWERS_BY_LEN[n])) & 0xFFFFFFFF
        return h - 0x100000000 if h & 0x80000000 else h
    return java_string_hash(text)


def key_hash(key: str) -> int:
    h = abs(java_hash_fast(key))
    return 0 if h > _INT_MAX else h


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


class IndexFile:
    def __init__(self, path: str, slot_num: int, index_num: int) -> None:
        self.slot_num = slot_num
        self.index_num = index_num
        self.mf = MappedFile(path, 0, index_file_size(slot_num, index_num))
        self.mf.wrote_position = self.mf.file_size
        (self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
         self.hash_slot_count, self.index_count) = HEADER.unpack_from(self.mf.mm, 0)  # fmt: skip
        if self.index_count <= 0:
            self.index_count = 1
        if self.index_count > index_num:
            raise StoreCorruptError(f"index file {path}: indexCount {self.index_count} > {index_num}")
        self.dirty = False

    @property
    def path(self) -> str:
        return self.mf.path

    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        if self.is_full():
            return False
        mm = self.mf.mm
        h = key_hash(key)
        slot_pos = HEADER_SIZE + (h % self.slot_num) * SLOT_SIZE
        (prev,) = SLOT.unpack_from(mm, slot_pos)
        if prev <= 0 or prev >= self.index_count:
            prev = 0
        if self.index_count <= 1:
            self.begin_timestamp = store_timestamp
            self.begin_phy_offset = phy_offset
        diff = (store_timestamp - self.begin_timestamp) // 1000
        diff = 0 if diff < 0 else min(diff, _INT_MAX)
        entry_pos = HEADER_SIZE + self.slot_num * SLOT_SIZE + self.index_count * ENTRY_SIZE
        ENTRY.pack_into(mm, entry_pos, h, phy_offset, diff, prev)
        SLOT.pack_into(mm, slot_pos, self.index_count)
        if prev == 0:
            self.hash_slot_count += 1
        self.index_count += 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        # the on-disk header is written by flush()/close(): readers in this process use the attributes,
        # and a reopened file treats slot links >= indexCount as empty
        self.dirty = True
        return True

    def _write_header(self) -> None:
        HEADER.pack_into(
            self.mf.mm, 0, self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
            self.end_phy_offset, self.hash_slot_count, self.index_count,
        )  # fmt: skip

    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        if self.index_count <= 1:
            return False
        return begin_ms <= self.end_timestamp and end_ms >= self.begin_timestamp

    def select_phy_offsets(self, key: str, max_num: int, begin_ms: int, end_ms: int, out: list[int]) -> None:
        """Append offsets of entries for ``key`` whose second-granular time overlaps [begin, end]."""
        if self.index_count <= 1:
            return
        mm = self.mf.mm
        h = key_hash(key)
        (cur,) = SLOT.unpack_from(mm, HEADER_SIZE + (h % self.slot_num) * SLOT_SIZE)
        base = HEADER_SIZE + self.slot_num * SLOT_SIZE
        for _ in range(self.index_count):
            if cur <= 0 or cur >= self.index_count or len(out) >= max_num:
                return
            kh, phy, diff, prev = ENTRY.unpack_from(mm, base + cur * ENTRY_SIZE)
            if diff < 0:
                return
            t = self.begin_timestamp + diff * 1000
            if kh == h and t <= end_ms and t + 999 >= begin_ms:
                out.append(phy)
            if prev == cur:
                return
            cur = prev

    def flush(self) -> None:
        if self.dirty:
            self.dirty = False
            self._write_header()
            self.mf.sync()

    def close(self) -> None:
        if self.dirty and not self.mf.closed:
            self._write_header()
        self.mf.close()

    def destroy(self) -> None:
        self.mf.destroy()


class IndexService:
    def __init__(self, store_path: str, slot_num: int, index_num: int, clock_ms: Callable[[], int]) -> None:
        self.store_path = store_path
        self.slot_num = slot_num
        self.index_num = index_num
        self.clock_ms = clock_ms
        self.files: list[IndexFile] = []

    def load(self) -> None:
        if not os.path.isdir(self.store_path):
            return
        expected = index_file_size(self.slot_num, self.index_num)
        for name in sorted(os.listdir(self.store_path)):
            path = os.path.join(self.store_path, name)
            if not name.isdigit() or not os.path.isfile(path):
                continue
            if os.path.getsize(path) != expected:
                log.warning("index file %s has another geometry; ignoring it", path)
                continue
            self.files.append(IndexFile(path, self.slot_num, self.index_num))

    def _new_file(self) -> IndexFile:
        os.makedirs(self.store_path, exist_ok=True)
        now = self.clock_ms()
        for _ in range(10_000):
            name = time.strftime("%Y%m%d%H%M%S", time.localtime(now / 1000)) + f"{now % 1000:03d}"
            path = os.path.join(self.store_path, name)
            if not os.path.exists(path) and (not self.files or name > os.path.basename(self.files[-1].path)):
                break
            now += 1
        f = IndexFile(path, self.slot_num, self.index_num)
        self.files.append(f)
        return f

    def build_index(self, topic: str, keys: list[str], phy_offset: int, store_timestamp: int) -> None:
        for key in keys:
            full_key = build_key(topic, key)
            f = self.files[-1] if self.files else self._new_file()
            if not f.put_key(full_key, phy_offset, store_timestamp):
                f = self._new_file()
                f.put_key(full_key, phy_offset, store_timestamp)

    def query(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
    ) -> tuple[list[int], int, int]:
        """(phy offsets newest first, last update timestamp, last update phy offset)."""
        out: list[int] = []
        last_ts = last_phy = 0
        full_key = build_key(topic, key)
        for f in reversed(self.files):
            if not last_ts:
                last_ts, last_phy = f.end_timestamp, f.end_phy_offset
            if len(out) >= max_num:
                break
            if f.is_time_matched(begin_ms, end_ms):
                f.select_phy_offsets(full_key, max_num, begin_ms, end_ms, out)
        return out, last_ts, last_phy

    def delete_expired(self, min_phy_offset: int) -> int:
        """Drop leading files whose newest entry points below ``min_phy_offset`` (never the last)."""
        count = 0
        for f in self.files[:-1]:
            if f.end_phy_offset < min_phy_offset:
                count += 1
            else:
                break
        gone, self.files = self.files[:count], self.files[count:]
        for f in gone:
            f.destroy()
        return count

    def flush(self) -> None:
        for f in list(self.files):
            f.flush()

    def close(self) -> None:
        for f in self.files:
            f.close()
