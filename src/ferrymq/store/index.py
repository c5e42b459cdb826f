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
from types import ModuleType

from ferrymq.common.message import java_string_hash
from ferrymq.store.errors import StoreCorruptError, StoreError
from ferrymq.store.mapped_file import MappedFile
from ferrymq.store.speedups import SCAN_INDEX_ENTRY

log = logging.getLogger(__name__)

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
SLOT = struct.Struct(">i")
HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
_INT_MAX = 0x7FFFFFFF
#: index entries whose blocks are reserved at a time, ahead of the writes (about 1.3 MB)
RESERVE_ENTRIES_CHUNK = 65_536


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


#: topics whose ``topic#`` hash prefix is cached by IndexService.build_index
_PREFIX_CACHE_MAX = 10_000


def _prefix_hash(topic: str) -> int:
    """Java hash of ``topic#`` as uint32, or -1 if not ASCII (the joined-key path is used then)."""
    prefix = build_key(topic, "")
    if not prefix.isascii():
        return -1
    return java_hash_fast(prefix) & 0xFFFFFFFF


def key_hash(key: str) -> int:
    h = abs(java_hash_fast(key))
    return 0 if h > _INT_MAX else h


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


class IndexFile:
    def __init__(self, path: str, slot_num: int, index_num: int) -> None:
        self.slot_num = slot_num
        self.index_num = index_num
        created = not os.path.exists(path)
        self.mf = MappedFile(path, 0, index_file_size(slot_num, index_num))
        self.mf.wrote_position = self.mf.file_size
        self._entries_base = HEADER_SIZE + slot_num * SLOT_SIZE
        if created:
            # the header and the slot table are written anywhere at once: their blocks are reserved now; the
            # entries (appended in order) are reserved ahead of the writes, RESERVE_ENTRIES_CHUNK at a time
            try:
                self.mf.reserve(0, self._entries_base)
            except StoreError:
                self.mf.destroy()
                raise
        (self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
         self.hash_slot_count, self.index_count) = HEADER.unpack_from(self.mf.mm, 0)  # fmt: skip
        if self.index_count <= 0:
            self.index_count = 1
        if self.index_count > index_num:
            raise StoreCorruptError(f"index file {path}: indexCount {self.index_count} > {index_num}")
        #: entry slots whose blocks are reserved (a reopened file reserves again before its next write)
        self.reserved_entries = 0 if created else self.index_count
        self.dirty = False

    def _reserve_entries(self, more: int) -> None:
        """Reserve the blocks of the next ``more`` entries (StoreDiskFullError when the disk is full)."""
        need = min(self.index_num, self.index_count + more)
        if need <= self.reserved_entries:
            return
        target = min(self.index_num, max(need, self.reserved_entries + RESERVE_ENTRIES_CHUNK))
        self.mf.reserve(self._entries_base + self.reserved_entries * ENTRY_SIZE,
                        (target - self.reserved_entries) * ENTRY_SIZE)
        self.reserved_entries = target

    @property
    def path(self) -> str:
        return self.mf.path

    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        return self.put_hashed(key_hash(key), phy_offset, store_timestamp)

    def put_hashed(self, h: int, phy_offset: int, store_timestamp: int) -> bool:
        """``put_key`` for a precomputed ``key_hash``."""
        if self.index_count >= self.index_num:
            return False
        if self.index_count >= self.reserved_entries:
            self._reserve_entries(1)
        mm = self.mf.mm
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

    def put_hashed_many(self, entries: list[tuple[int, int, int]], start: int = 0) -> int:
        """``put_hashed`` for ``entries[start:]`` ((hash, phy_offset, store_timestamp)) in order, with the
        file's counters kept in locals; returns the index of the first entry not put (the file is full)."""
        if self.index_count + len(entries) - start > self.reserved_entries:
            self._reserve_entries(len(entries) - start)
        mm = self.mf.mm
        slot_num = self.slot_num
        index_num = self.index_num
        count = self.index_count
        slots_used = self.hash_slot_count
        entries_base = HEADER_SIZE + slot_num * SLOT_SIZE
        slot_unpack = SLOT.unpack_from
        slot_pack = SLOT.pack_into
        entry_pack = ENTRY.pack_into
        i = start
        n = len(entries)
        phy_offset = store_timestamp = -1
        while i < n and count < index_num:
            h, phy_offset, store_timestamp = entries[i]
            slot_pos = HEADER_SIZE + (h % slot_num) * SLOT_SIZE
            (prev,) = slot_unpack(mm, slot_pos)
            if prev <= 0 or prev >= count:
                prev = 0
            if count <= 1:
                self.begin_timestamp = store_timestamp
                self.begin_phy_offset = phy_offset
            diff = (store_timestamp - self.begin_timestamp) // 1000
            diff = 0 if diff < 0 else min(diff, _INT_MAX)
            entry_pack(mm, entries_base + count * ENTRY_SIZE, h, phy_offset, diff, prev)
            slot_pack(mm, slot_pos, count)
            if prev == 0:
                slots_used += 1
            count += 1
            i += 1
        if i > start:
            self.index_count = count
            self.hash_slot_count = slots_used
            self.end_phy_offset = phy_offset
            self.end_timestamp = store_timestamp
            self.dirty = True
        return i

    def put_packed(self, native: ModuleType, entries: bytes, start: int = 0) -> int:
        """``put_hashed_many`` for packed scan index entries (``speedups.SCAN_INDEX_ENTRY``) by the native
        ``index_put_many``; returns the index of the first entry not put (the file is full)."""
        more = len(entries) // SCAN_INDEX_ENTRY.size - start
        if self.index_count + more > self.reserved_entries:
            self._reserve_entries(more)
        (done, self.index_count, self.hash_slot_count, self.begin_timestamp, self.begin_phy_offset, end_phy,
         end_ts) = native.index_put_many(
            self.mf.mm, entries, start, self.slot_num, self.index_num, self.index_count, self.hash_slot_count,
            self.begin_timestamp, self.begin_phy_offset)  # fmt: skip
        if done > start:
            self.end_phy_offset = end_phy
            self.end_timestamp = end_ts
            self.dirty = True
        return int(done)

    def trailing_entries(self, phy_offset: int) -> int:
        """How many of the newest entries point at ``phy_offset`` (the first keys of a record whose other keys
        went to the next file)."""
        mm = self.mf.mm
        base = HEADER_SIZE + self.slot_num * SLOT_SIZE
        n = 0
        i = self.index_count - 1
        while i >= 1:
            _h, phy, _diff, _prev = ENTRY.unpack_from(mm, base + i * ENTRY_SIZE)
            if phy != phy_offset:
                break
            n += 1
            i -= 1
        return n

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
        #: topic -> signed-free hash of ``topic#`` (uint32), or -1 when the topic is not ASCII
        self._prefix_hashes: dict[str, int] = {}
        #: key entries not indexed because the disk was full
        self.dropped_entries_total = 0

    def load(self) -> None:
        if not os.path.isdir(self.store_path):
            return
        expected = index_file_size(self.slot_num, self.index_num)
        for name in sorted(os.listdir(self.store_path)):
            path = os.path.join(self.store_path, name)
            if not name.isdigit() or not os.path.isfile(path):
                continue
            if os.path.getsize(path) != expected:
                log.warning("index file %s has another size (cut, or another geometry); ignoring it", path)
                continue
            self.files.append(IndexFile(path, self.slot_num, self.index_num))

    def manifest(self) -> list[tuple[str, int]]:
        """(file name, begin phy offset) of every file holding entries, oldest first (checkpoint's ``indexfiles``)."""
        return [(os.path.basename(f.path), f.begin_phy_offset) for f in list(self.files) if f.index_count > 1]

    def missing(self, manifest: list[tuple[str, int]], until_phy: int) -> list[tuple[str, int, int, bool]]:
        """The files ``manifest`` lists that are not loaded (deleted, or cut to another size) as (name, first phy
        offset, last phy offset, whether the record at the last phy offset belongs to it too): a file covers the
        log from its begin phy offset to the next listed (or later loaded) file's, the newest one up to
        ``until_phy`` (exclusive; dispatch goes on from there)."""
        loaded = sorted(os.path.basename(f.path) for f in self.files)
        present = set(loaded)
        out: list[tuple[str, int, int, bool]] = []
        for i, (name, begin_phy) in enumerate(manifest):
            if name in present:
                continue
            if i + 1 < len(manifest):
                out.append((name, begin_phy, manifest[i + 1][1], True))
                continue
            later = [f for f in self.files if os.path.basename(f.path) > name and f.index_count > 1]
            if later:
                out.append((name, begin_phy, later[0].begin_phy_offset, True))
            else:
                out.append((name, begin_phy, until_phy, False))
        return out

    def install_rebuilt(self, name: str, items: list[tuple[str, str, int, int]], newest: bool) -> int:
        """Write ``items`` ((topic, key, phy_offset, store_timestamp), in log order) into a new file ``name`` (a
        cut one of that name is replaced) placed among the others by name; entries beyond its capacity go to new
        files when it is the ``newest``, else are dropped (they are the first keys of a record the next file holds
        the rest of). Returns the entries written."""
        path = os.path.join(self.store_path, name)
        os.makedirs(self.store_path, exist_ok=True)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        f = IndexFile(path, self.slot_num, self.index_num)
        names = [os.path.basename(x.path) for x in self.files]
        at = next((i for i, other in enumerate(names) if other > name), len(names))
        if at > 0 and items:  # the first keys of the first record may be the previous file's last entries
            first_phy = items[0][2]
            held = self.files[at - 1].trailing_entries(first_phy)
            lead = 0
            while lead < len(items) and lead < held and items[lead][2] == first_phy:
                lead += 1
            items = items[lead:]
        self.files.insert(at, f)
        hashed = [(key_hash(build_key(topic, key)), phy, ts) for topic, key, phy, ts in items]
        try:
            done = f.put_hashed_many(hashed, 0) if hashed else 0
            if done < len(hashed) and newest and at == len(self.files) - 1:
                self._build_index_many(items[done:])
                done = len(hashed)
        except StoreError as exc:
            self._dropped(exc, len(hashed))
            return 0
        for g in self.files[at:]:
            g.flush()
        return done

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
        self.build_index_many([(topic, key, phy_offset, store_timestamp) for key in keys])

    def _dropped(self, exc: StoreError, count: int) -> None:
        self.dropped_entries_total += count
        log.error("index: %d key entries not indexed (messages stay readable, not queryable by key): %s",
                  count, exc)

    def build_index_one(self, topic: str, key: str, phy_offset: int, store_timestamp: int) -> None:
        """``build_index(topic, [key], ...)``: see ``_build_index_one``; a full disk drops the entry (logged)."""
        try:
            self._build_index_one(topic, key, phy_offset, store_timestamp)
        except StoreError as exc:
            self._dropped(exc, 1)

    def _build_index_one(self, topic: str, key: str, phy_offset: int, store_timestamp: int) -> None:
        """``build_index(topic, [key], ...)`` without the lists (one dispatched record, one key)."""
        prefix = self._prefix_hashes.get(topic)
        if prefix is None:
            prefix = _prefix_hash(topic)
            if len(self._prefix_hashes) < _PREFIX_CACHE_MAX:
                self._prefix_hashes[topic] = prefix
        n = len(key)
        if prefix >= 0 and n < _POW_COUNT and key.isascii():
            h = (prefix * _POWERS_DESC[_POW_COUNT - 1 - n]
                 + sum(map(operator.mul, key.encode("ascii"), _POWERS_BY_LEN[n]))) & 0xFFFFFFFF
            if h & 0x80000000:
                h = 0x100000000 - h
                if h > _INT_MAX:
                    h = 0
        else:
            h = key_hash(build_key(topic, key))
        f = self.files[-1] if self.files else self._new_file()
        if not f.put_hashed(h, phy_offset, store_timestamp):
            f = self._new_file()
            f.put_hashed(h, phy_offset, store_timestamp)

    def build_index_many(self, items: list[tuple[str, str, int, int]]) -> None:
        """Index (topic, key, phy_offset, store_timestamp) entries in order; a full disk drops them (logged)."""
        try:
            self._build_index_many(items)
        except StoreError as exc:
            self._dropped(exc, len(items))

    def _build_index_many(self, items: list[tuple[str, str, int, int]]) -> None:
        prefixes = self._prefix_hashes
        mul = operator.mul
        powers_by_len = _POWERS_BY_LEN
        hashed: list[tuple[int, int, int]] = []
        for topic, key, phy_offset, store_timestamp in items:
            prefix = prefixes.get(topic)
            if prefix is None:
                prefix = _prefix_hash(topic)
                if len(prefixes) < _PREFIX_CACHE_MAX:
                    prefixes[topic] = prefix
            n = len(key)
            if prefix >= 0 and n < _POW_COUNT and key.isascii():
                # hash("topic#" + key) = hash("topic#") * 31**n + hash(key)  (mod 2**32): no joined key
                h = (prefix * _POWERS_DESC[_POW_COUNT - 1 - n]
                     + sum(map(mul, key.encode("ascii"), powers_by_len[n]))) & 0xFFFFFFFF
                if h & 0x80000000:  # abs() of the signed int32; Integer.MIN_VALUE -> 0
                    h = 0x100000000 - h
                    if h > _INT_MAX:
                        h = 0
            else:
                h = key_hash(build_key(topic, key))
            hashed.append((h, phy_offset, store_timestamp))
        if not hashed:
            return
        total = len(hashed)
        f = self.files[-1] if self.files else self._new_file()
        done = f.put_hashed_many(hashed, 0)
        while done < total:  # f is full: the rest goes to a new file (an entry even a new file refuses is dropped)
            f = self._new_file()
            put = f.put_hashed_many(hashed, done)
            done = put if put > done else done + 1

    def build_index_packed(self, native: ModuleType, entries: bytes) -> None:
        """``build_index_many`` for entries hashed by the native scan (packed ``SCAN_INDEX_ENTRY``s)."""
        try:
            self._build_index_packed(native, entries)
        except StoreError as exc:
            self._dropped(exc, len(entries) // SCAN_INDEX_ENTRY.size)

    def _build_index_packed(self, native: ModuleType, entries: bytes) -> None:
        total = len(entries) // SCAN_INDEX_ENTRY.size
        if not total:
            return
        f = self.files[-1] if self.files else self._new_file()
        done = f.put_packed(native, entries, 0)
        while done < total:  # as build_index_many: the rest goes to a new file, an entry it refuses is dropped
            f = self._new_file()
            put = f.put_packed(native, entries, done)
            done = put if put > done else done + 1

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

    def truncate_to(self, phy_offset: int) -> int:
        """Delete the files whose first entry points at or beyond ``phy_offset`` (a truncated commit log);
        returns how many. Entries beyond it in the file that holds the cut stay: every lookup re-reads the
        record an entry points at and checks its topic, key and time (``StoreReader.query_message``), so an
        entry whose record was cut (or replaced) is never answered."""
        keep = [f for f in self.files if f.index_count <= 1 or f.begin_phy_offset < phy_offset]
        gone = [f for f in self.files if f not in keep]
        self.files = keep
        for f in gone:
            f.destroy()
        return len(gone)

    def flush(self) -> None:
        for f in list(self.files):
            f.flush()

    def close(self) -> None:
        for f in self.files:
            f.close()
