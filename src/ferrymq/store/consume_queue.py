"""Consume queue: per (topic, queue id) index of the commit log, one 20-byte unit per message.

| offset | size | field                                                         |
|--------|------|---------------------------------------------------------------|
| 0      | 8    | commit log physical offset                                    |
| 8      | 4    | record size (TOTALSIZE)                                       |
| 12     | 8    | tagsCode (tag hash; delivery time for SCHEDULE_TOPIC_XXXX)    |

Unit *n* (queue offset *n*) lives at global byte n×20; files are named by their first global
byte. When a queue's first file starts below its first unit (a slave that joined late, or a
queue whose first message has queue offset > 0), the leading slots hold blank units
``(0, 0x7FFFFFFF, 0)``. A blank unit is never served.

Files keep their full logical size (``mappedFileSizeConsumeQueue``, as RocketMQ's) but are sparse: their blocks
are reserved ``CQ_RESERVE_CHUNK_BYTES`` at a time ahead of the writes (``MappedFile.reserve_ahead``), so a queue
with one message costs one chunk of disk and a full disk is a clean ``StoreDiskFullError`` (the put is refused,
or the dispatch retries) instead of a SIGBUS on a write into a hole of the map. The files are mapped through the
store's ``OpenFilePool`` (at most ``maxOpenSegmentFiles`` at once); every access goes through
``MappedFile.mapped()``.
"""

from __future__ import annotations

import array
import os
import struct
import sys
import threading
from collections.abc import Callable
from itertools import chain

from ferrymq.store.config import CQ_STORE_UNIT_SIZE
from ferrymq.store.errors import StoreError
from ferrymq.store.mapped_file import MappedFile, OpenFilePool, offset_to_file_name
from ferrymq.store.mapped_file_queue import MappedFileQueue

UNIT = struct.Struct(">qiq")
BLANK_SIZE = 0x7FFFFFFF
BLANK_UNIT = UNIT.pack(0, BLANK_SIZE, 0)
_PHY_SIZE = struct.Struct(">qi")  # the first two fields of a unit
_SCAN_CHUNK_UNITS = 4096
_WORDS_PER_UNIT = CQ_STORE_UNIT_SIZE // 4
#: most units ``put_units`` packs with one struct (a Struct per count is cached)
_UNITS_PACK_MAX = 256
_UNITS_PACKERS: dict[int, struct.Struct] = {}
#: blocks of a consume queue file reserved at a time, ahead of the writes (a multiple of the 4 KiB page)
CQ_RESERVE_CHUNK_BYTES = 64 * 1024


def queue_file_path(root_dir: str, topic: str, queue_id: int, byte_offset: int, file_size: int) -> str:
    """The path of the file of queue (topic, queue_id) under ``root_dir`` that holds global byte ``byte_offset``."""
    return os.path.join(root_dir, topic, str(queue_id), offset_to_file_name(byte_offset - byte_offset % file_size))


def _chunk_all_valid(chunk: bytes) -> bool:
    """True if every unit in ``chunk`` has phy >= 0 and size > 0 (min() over strided int32 views)."""
    if not chunk or len(chunk) % CQ_STORE_UNIT_SIZE:
        return False
    words = array.array("i")
    if words.itemsize != 4:  # pragma: no cover - exotic platform: let the unit loop decide
        return False
    words.frombytes(chunk)
    if sys.byteorder == "little":
        words.byteswap()
    # unit = [phy hi, phy lo, size, tags hi, tags lo] as big-endian int32 words
    return min(words[2::_WORDS_PER_UNIT]) > 0 and min(words[0::_WORDS_PER_UNIT]) >= 0


class LogFloor:
    """What the consume queues of a store share about its commit log (one object for all of them).

    * ``phy_offset``: the log's min phy offset as the queues last heard it. Moving it is O(1): each queue corrects
      its min offset against it on its next use (``min_logic_offset``).
    * ``valid_end``: where the last recovery found the valid log to end (-1: not set). A queue loaded after the
      start (lazily, on its first use) drops the units it finds pointing at or beyond it: units written before a
      crash for records the recovery cut.
    * ``on_mismatch``: called with a queue loaded lazily that holds another number of units than the
      ``queueoffsets`` snapshot said it reached, that number and the end phy offset of the record the snapshot
      named as its newest: fewer (a file damaged on disk) and the store rebuilds the units from the log; more and
      the store's next queue offset follows the queue (it never assigns an offset the queue already holds).
    * ``flush_lock``: serialises the flushes of the queues' files (one flush thread; shared, not one per queue).
    * ``premade``: path -> bytes reserved from the start, for a queue's first file made ahead of its first put on
      another thread (``queue_table.make_consume_queue_file``); the queue takes its entry when it opens the file,
      so it does not reserve those blocks again on the event loop (a ``posix_fallocate`` of an allocated range
      still updates and dirties the inode)."""

    __slots__ = ("phy_offset", "valid_end", "on_mismatch", "flush_lock", "premade")

    def __init__(self) -> None:
        self.phy_offset = 0
        self.valid_end = -1
        self.on_mismatch: Callable[[ConsumeQueue, int, int], None] | None = None
        self.flush_lock = threading.Lock()
        self.premade: dict[str, int] = {}


#: ``ConsumeQueue._expected_units`` of a queue that is loaded, or whose size is not known before it is
_UNKNOWN_UNITS = -1


class ConsumeQueue:
    """One consume queue. It may be *unloaded*: created from the ``queueoffsets`` snapshot at start (``recorded``)
    it knows only its unit count and the record its newest unit points at, and opens nothing; its files are listed,
    mapped and checked on its first use that needs them (``mfq``), within the store's open-file budget. A queue
    created without a record (new, or found on disk) is loaded the same way on its first use."""

    __slots__ = ("topic", "queue_id", "file_size", "_root_dir", "_pool", "_floor", "_mfq", "_min_logic_offset",
                 "_floor_seen", "_last_phy", "_last_size", "_expected_units")

    def __init__(self, root_dir: str, topic: str, queue_id: int, file_size: int,
                 pool: OpenFilePool | None = None, floor: LogFloor | None = None,
                 recorded: tuple[int, int, int] | None = None) -> None:
        """``recorded``: (next queue offset, last phy offset, last size) the ``queueoffsets`` snapshot holds for the
        queue, trusted until it is loaded."""
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size
        self._root_dir = root_dir  # the path of its directory is derived (root/topic/queue id) when it is loaded
        # sparse files; blocks reserved a chunk ahead of the writes (CQ_RESERVE_CHUNK_BYTES): a full disk fails
        # the reservation (StoreDiskFullError), never a SIGBUS on a later write into a hole of the map
        self._pool = pool
        self._floor = floor if floor is not None else LogFloor()
        self._mfq: MappedFileQueue | None = None
        self._min_logic_offset = 0  # bytes (queue offset × 20)
        #: the record the newest non-blank unit points at (how far dispatch got: max_phy_end); 0, 0 if none
        self._last_phy = 0
        self._last_size = 0
        if recorded is not None:
            self._expected_units, self._last_phy, self._last_size = recorded
            self._floor_seen = -1  # its units may point below the log's start: corrected on first use
        else:
            self._expected_units = _UNKNOWN_UNITS
            #: the floor phy offset ``_min_logic_offset`` was corrected for (-1: not yet; a new queue needs none)
            self._floor_seen = self._floor.phy_offset

    # --- lazy load ---------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._mfq is not None

    @property
    def mfq(self) -> MappedFileQueue:
        """The queue's files, loaded (listed, the last one mapped and its end found) on the first call."""
        mfq = self._mfq
        return mfq if mfq is not None else self._load_now()

    @property
    def store_path(self) -> str:
        return os.path.join(self._root_dir, self.topic, str(self.queue_id))

    def _load_now(self) -> MappedFileQueue:
        mfq = MappedFileQueue(self.store_path, self.file_size, pool=self._pool, flush_lock=self._floor.flush_lock)
        mfq.load()
        expected = self._expected_units
        recorded_end = self._last_phy + self._last_size
        self._mfq = mfq
        try:
            self._floor_seen = -1  # loaded units may point below the log's start: corrected on first use
            self._recover_tail()
        except BaseException:
            self._mfq = None
            mfq.close()
            raise
        self._expected_units = _UNKNOWN_UNITS
        floor = self._floor
        if 0 <= floor.valid_end < self.max_phy_end:
            self.truncate_dirty(floor.valid_end)  # units of records a recovery cut (written before a crash)
        if expected >= 0 and expected != self.max_offset_in_queue and floor.on_mismatch is not None:
            floor.on_mismatch(self, expected, recorded_end)
        return mfq

    @property
    def min_logic_offset(self) -> int:
        """Min logical offset in bytes, corrected against the shared ``LogFloor`` if it moved since (one binary
        search in the first file); left as it was when that file cannot be opened now (no descriptor)."""
        floor = self._floor.phy_offset
        if self._floor_seen != floor:
            try:
                self.correct_min_offset(floor)
            except (OSError, StoreError):
                pass
        return self._min_logic_offset

    @min_logic_offset.setter
    def min_logic_offset(self, value: int) -> None:
        self._min_logic_offset = value

    # --- bounds ------------------------------------------------------------------------------

    @property
    def max_offset_in_queue(self) -> int:
        mfq = self._mfq
        if mfq is None:
            if self._expected_units >= 0:
                return self._expected_units
            mfq = self._load_now()
        return mfq.max_offset // CQ_STORE_UNIT_SIZE

    @property
    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    @property
    def max_phy_end(self) -> int:
        """Phy offset + size of the record the newest unit points at (how far dispatch got); 0 if none."""
        if self._mfq is None and self._expected_units < 0:
            self._load_now()
        return self._last_phy + self._last_size

    @property
    def last_unit(self) -> tuple[int, int]:
        """(phy offset, size) of the record the newest non-blank unit points at ((0, 0) if none), without loading
        the queue; a phy offset of -1 when an unloaded queue's snapshot line did not say."""
        return self._last_phy, self._last_size

    def unloaded_newest_phy(self, queue_offset: int) -> int | None:
        """The phy offset of the unit at ``queue_offset`` when the queue is not loaded, that unit is its newest one
        and the snapshot line names its record at or above the log's start (so the unit has not expired); None
        otherwise (load the queue to know)."""
        if (self._mfq is None and queue_offset == self._expected_units - 1 and self._last_size > 0
                and self._last_phy >= self._floor.phy_offset):
            return self._last_phy
        return None

    def mark(self) -> tuple[int, int, int]:
        """(next queue offset, last phy offset, last size): the queue's ``queueoffsets`` line, never loading it (safe
        from the flush thread); (0, 0, 0), no expectation, for a queue not loaded whose size is not known."""
        mfq = self._mfq
        if mfq is None:
            if self._expected_units < 0:
                return 0, 0, 0
            return self._expected_units, self._last_phy, self._last_size
        return mfq.max_offset // CQ_STORE_UNIT_SIZE, self._last_phy, self._last_size

    def roll_next_file(self, queue_offset: int) -> int:
        per_file = self.file_size // CQ_STORE_UNIT_SIZE
        return queue_offset + per_file - queue_offset % per_file

    # --- load / recover ----------------------------------------------------------------------

    def load(self) -> None:
        """Load the queue now (its files listed, the last one mapped, its end found)."""
        if self._mfq is None:
            self._load_now()

    def _recover_tail(self) -> None:
        """Find the written end of the last file (earlier files are full): first unit with size 0."""
        mfq = self.mfq
        last = mfq.last()
        if last is None:
            self._last_phy = self._last_size = 0
            return
        mm = last.mapped()
        pos = 0
        while pos < last.file_size:
            end = min(last.file_size, pos + _SCAN_CHUNK_UNITS * CQ_STORE_UNIT_SIZE)
            chunk = mm[pos:end]
            if _chunk_all_valid(chunk):  # C-level check of a whole chunk; the unit loop only at the end
                pos = end
                continue
            stop = False
            for phy, size, _tags in UNIT.iter_unpack(chunk):
                if phy < 0 or size <= 0:
                    stop = True
                    break
                pos += CQ_STORE_UNIT_SIZE
            if stop:
                break
        last.wrote_position = last.flushed_position = pos
        last.reserved_position = pos  # the written blocks exist; the next write reserves on from here
        mfq.flushed_where = last.file_from_offset + pos
        self._set_last_unit()

    def _set_last_unit(self) -> None:
        """``_last_phy`` / ``_last_size`` from the newest non-blank unit on file."""
        for mf in reversed(self.mfq.files):
            pos = mf.wrote_position - CQ_STORE_UNIT_SIZE
            if pos < 0:
                continue
            mm = mf.mapped()
            while pos >= 0:
                phy, size, _tags = UNIT.unpack_from(mm, pos)
                if size != BLANK_SIZE:
                    self._last_phy, self._last_size = phy, size
                    return
                pos -= CQ_STORE_UNIT_SIZE
        self._last_phy = self._last_size = 0

    def correct_min_offset(self, min_phy_offset: int) -> None:
        """Min logical offset := first non-blank unit at or above ``min_phy_offset``: in the first file, or in the
        first whose last unit is (leading files wholly below it, not deleted yet, are skipped: one read each)."""
        files = self.mfq.files
        first = files[0] if files else None
        for mf in files[:-1]:
            if mf.wrote_position < mf.file_size:
                break
            phy, size, _tags = UNIT.unpack_from(mf.mapped(), mf.file_size - CQ_STORE_UNIT_SIZE)
            if size == BLANK_SIZE or phy >= min_phy_offset:
                break
            first = files[files.index(mf) + 1]
        if first is None:
            self._min_logic_offset = 0
            self._floor_seen = self._floor.phy_offset
            return
        lo, hi = 0, first.wrote_position // CQ_STORE_UNIT_SIZE
        if hi == 0:
            self._min_logic_offset = first.file_from_offset
            self._floor_seen = self._floor.phy_offset
            return
        mm = first.mapped()
        while lo < hi:  # units are ordered by phy offset; blanks (phy 0) sort first
            mid = (lo + hi) // 2
            phy, size, _tags = UNIT.unpack_from(mm, mid * CQ_STORE_UNIT_SIZE)
            if size != BLANK_SIZE and phy >= min_phy_offset:
                hi = mid
            else:
                lo = mid + 1
        self._min_logic_offset = first.file_from_offset + lo * CQ_STORE_UNIT_SIZE
        self._floor_seen = self._floor.phy_offset

    # --- write -------------------------------------------------------------------------------

    def _start_premade(self, expected: int) -> MappedFileQueue | None:
        """A queue whose first file was made ahead on another thread (``LogFloor.premade`` names it; it was made
        only because the store held no such queue, and only where no file was): its files are not listed nor its
        tail scanned, the queue starts empty and opens that file as its first. None otherwise."""
        premade = self._floor.premade
        if not premade:
            return None
        path = queue_file_path(self._root_dir, self.topic, self.queue_id, expected, self.file_size)
        if path not in premade:
            return None
        mfq = MappedFileQueue(self.store_path, self.file_size, pool=self._pool, flush_lock=self._floor.flush_lock)
        self._mfq = mfq
        self._expected_units = _UNKNOWN_UNITS
        return mfq

    def _first_file(self, expected: int) -> None:
        """Start the queue with the file holding byte ``expected`` (blank units before it)."""
        mf = self.mfq.create_file(self.mfq.segment_start_of(expected))
        premade = self._floor.premade
        if premade:
            reserved = min(premade.pop(mf.path, 0), mf.file_size)
            # the file this queue opened holds those blocks (not one made since under the same name, sparse)
            if reserved > mf.reserved_position and mf.allocated_bytes() >= reserved:
                mf.reserved_position = reserved
        self._fill_blanks(expected)
        self._min_logic_offset = expected
        self._floor_seen = self._floor.phy_offset  # a new queue's units are all above the log's start

    def prepare_unit(self, queue_offset: int) -> None:
        """Make sure the unit for ``queue_offset`` can be written: the file it goes to exists, is mapped and has
        its blocks reserved. Raises StoreDiskFullError / StoreOpenFilesError / StoreDirError otherwise (the put
        is refused before anything is stored). Writes nothing but blank units a new queue starts with."""
        expected = queue_offset * CQ_STORE_UNIT_SIZE
        last = (self._mfq or self._start_premade(expected) or self._load_now()).last()
        if last is None:
            self._first_file(expected)
            last = self.mfq.last()
            assert last is not None
        if expected < last.file_from_offset + last.wrote_position:
            return  # present already (a re-dispatch)
        if last.is_full():
            last = self.mfq.create_file(last.end_offset)
        rel = expected - last.file_from_offset
        if rel >= last.file_size:
            return  # beyond the last file (a gap): the dispatch fills it
        last.mapped()
        last.reserve_ahead(rel + CQ_STORE_UNIT_SIZE, CQ_RESERVE_CHUNK_BYTES)

    def put_unit(self, phy_offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """Write the unit for ``queue_offset``; a unit already present is left alone (re-dispatch)."""
        expected = queue_offset * CQ_STORE_UNIT_SIZE
        last = (self._mfq or self._load_now()).last()
        if last is not None:  # fast path: the unit goes right at the end of a last file with room
            wrote = last.wrote_position
            end = wrote + CQ_STORE_UNIT_SIZE
            if last.file_from_offset + wrote == expected and end <= last.file_size:
                mm = last.mapped()
                if end > last.reserved_position:
                    last.reserve_ahead(end, CQ_RESERVE_CHUNK_BYTES)
                UNIT.pack_into(mm, wrote, phy_offset, size, tags_code)
                last.wrote_position = end
                if phy_offset >= self._last_phy:
                    self._last_phy, self._last_size = phy_offset, size
                return True
        if self.mfq.last() is None:
            self._first_file(expected)
        current = self.mfq.max_offset
        if expected < current:
            return False
        if expected > current:
            self._fill_blanks(expected)
        mf = self.mfq.last_for_write(expected)
        self._append(mf, UNIT.pack(phy_offset, size, tags_code))
        if phy_offset >= self._last_phy:
            self._last_phy, self._last_size = phy_offset, size
        return True

    @staticmethod
    def _append(mf: MappedFile, data: bytes) -> None:
        """Write ``data`` at ``mf``'s wrote position (room checked by the caller), its blocks reserved first."""
        pos = mf.wrote_position
        end = pos + len(data)
        mm = mf.mapped()
        if end > mf.reserved_position:
            mf.reserve_ahead(end, CQ_RESERVE_CHUNK_BYTES)
        mm[pos:end] = data
        mf.wrote_position = end

    def put_units(self, first_queue_offset: int, units: list[tuple[int, int, int]]) -> bool:
        """``put_unit`` for (phy_offset, size, tags_code) units at consecutive queue offsets from
        ``first_queue_offset``, phy offsets ascending; one ``pack_into`` when they all go at the end of the
        last file. True if any unit was written."""
        n = len(units)
        if n == 1:
            phy, size, tags = units[0]
            return self.put_unit(phy, size, tags, first_queue_offset)
        last = (self._mfq or self._load_now()).last()
        if last is not None and 0 < n <= _UNITS_PACK_MAX:
            wrote = last.wrote_position
            end = wrote + n * CQ_STORE_UNIT_SIZE
            if last.file_from_offset + wrote == first_queue_offset * CQ_STORE_UNIT_SIZE and end <= last.file_size:
                packer = _UNITS_PACKERS.get(n)
                if packer is None:
                    packer = _UNITS_PACKERS[n] = struct.Struct(">" + "qiq" * n)
                mm = last.mapped()
                if end > last.reserved_position:
                    last.reserve_ahead(end, CQ_RESERVE_CHUNK_BYTES)
                packer.pack_into(mm, wrote, *chain.from_iterable(units))
                last.wrote_position = end
                phy, size, _tags = units[-1]
                if phy >= self._last_phy:
                    self._last_phy, self._last_size = phy, size
                return True
        wrote_any = False
        for i, (phy, size, tags) in enumerate(units):
            if self.put_unit(phy, size, tags, first_queue_offset + i):
                wrote_any = True
        return wrote_any

    def put_units_packed(self, first_queue_offset: int, units: bytes) -> bool:
        """``put_unit`` for packed 20-byte units (``UNIT`` layout) at consecutive queue offsets from
        ``first_queue_offset``, phy offsets ascending (the native reput's runs). The part that continues the
        end of the last file is copied in one slice; a unit that opens a file, leaves a gap or is already
        present goes through ``put_unit``. True if any unit was written."""
        last = (self._mfq or self._load_now()).last()
        if last is not None:  # fast path: the whole run continues the last file, which has room for it
            wrote = last.wrote_position
            n_bytes = len(units)
            end = wrote + n_bytes
            if (end <= last.file_size and n_bytes and not n_bytes % CQ_STORE_UNIT_SIZE
                    and last.file_from_offset + wrote == first_queue_offset * CQ_STORE_UNIT_SIZE):
                mm = last.mapped()
                if end > last.reserved_position:
                    last.reserve_ahead(end, CQ_RESERVE_CHUNK_BYTES)
                mm[wrote:end] = units
                last.wrote_position = end
                phy, size = _PHY_SIZE.unpack_from(units, n_bytes - CQ_STORE_UNIT_SIZE)
                if phy >= self._last_phy:
                    self._last_phy, self._last_size = phy, size
                return True
        count = len(units) // CQ_STORE_UNIT_SIZE
        wrote_any = False
        i = 0
        while i < count:
            last = self.mfq.last()
            if last is not None:
                wrote = last.wrote_position
                room = (last.file_size - wrote) // CQ_STORE_UNIT_SIZE
                if room > 0 and last.file_from_offset + wrote == (first_queue_offset + i) * CQ_STORE_UNIT_SIZE:
                    n = min(room, count - i)
                    start = i * CQ_STORE_UNIT_SIZE
                    stop = start + n * CQ_STORE_UNIT_SIZE
                    self._append(last, units[start:stop])
                    phy, size, _tags = UNIT.unpack_from(units, stop - CQ_STORE_UNIT_SIZE)
                    if phy >= self._last_phy:
                        self._last_phy, self._last_size = phy, size
                    wrote_any = True
                    i += n
                    continue
            phy, size, tags = UNIT.unpack_from(units, i * CQ_STORE_UNIT_SIZE)
            if self.put_unit(phy, size, tags, first_queue_offset + i):
                wrote_any = True
            i += 1
        return wrote_any

    def _fill_blanks(self, until: int) -> None:
        guard = 1 + (until - self.mfq.max_offset) // self.file_size + 1
        while self.mfq.max_offset < until and guard > 0:
            guard -= 1
            mf = self.mfq.last_for_write(self.mfq.max_offset)
            n = min(mf.remaining, until - self.mfq.max_offset) // CQ_STORE_UNIT_SIZE
            self._append(mf, BLANK_UNIT * n)

    # --- read --------------------------------------------------------------------------------

    def _locate(self, queue_offset: int) -> tuple[MappedFile, int] | None:
        pos = queue_offset * CQ_STORE_UNIT_SIZE
        if pos < self.min_logic_offset:
            return None
        mf = self.mfq.find(pos)
        if mf is None:
            return None
        rel = pos - mf.file_from_offset
        if rel + CQ_STORE_UNIT_SIZE > mf.wrote_position:
            return None
        return mf, rel

    def get_unit(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(phy_offset, size, tags_code) of a written unit, None if absent or blank."""
        loc = self._locate(queue_offset)
        if loc is None:
            return None
        phy, size, tags = UNIT.unpack_from(loc[0].mapped(), loc[1])
        if size == BLANK_SIZE:
            return None
        return phy, size, tags

    def get_units_buffer(self, queue_offset: int, max_bytes: int) -> bytes | None:
        """Raw units from ``queue_offset`` to the end of its file's written part (≤ max_bytes)."""
        loc = self._locate(queue_offset)
        if loc is None:
            return None
        mf, rel = loc
        end = min(mf.wrote_position, rel + max_bytes)
        return mf.mapped()[rel:end]

    # --- shrink ------------------------------------------------------------------------------

    def truncate_dirty(self, phy_offset: int) -> None:
        """Drop units pointing at or beyond ``phy_offset`` (a truncated commit log tail)."""
        if self._mfq is None:
            self._expected_units = _UNKNOWN_UNITS  # what the snapshot said no longer holds
        guard = len(self.mfq.files) + 1
        while guard > 0:
            guard -= 1
            last = self.mfq.last()
            if last is None:
                break
            units = last.wrote_position // CQ_STORE_UNIT_SIZE
            mm = last.mapped()
            lo, hi = 0, units  # first dirty unit in the last file
            while lo < hi:
                mid = (lo + hi) // 2
                phy, size, _tags = UNIT.unpack_from(mm, mid * CQ_STORE_UNIT_SIZE)
                if size != BLANK_SIZE and phy >= phy_offset:
                    hi = mid
                else:
                    lo = mid + 1
            if lo >= units:
                break
            cut = last.file_from_offset + lo * CQ_STORE_UNIT_SIZE
            if lo == 0 and len(self.mfq.files) > 1:
                self.mfq.delete_last()  # whole file dirty: drop it, look at the previous one
                continue
            self.mfq.truncate(cut)
            break
        if self.mfq.max_offset < self._min_logic_offset:
            self._min_logic_offset = self.mfq.max_offset
        self._set_last_unit()

    def may_have_expired_files(self) -> bool:
        """Whether the queue may hold more than one file (only leading files expire, never the last), without
        loading it when its unit count says its units all fit in its first file."""
        if self._mfq is None and self._expected_units >= 0:
            return self._expected_units * CQ_STORE_UNIT_SIZE >= self.file_size  # a full first file: maybe a next
        return len(self.mfq.files) > 1

    def delete_expired(self, min_phy_offset: int) -> int:
        """Delete leading files whose every unit points below ``min_phy_offset`` (never the last)."""
        count = 0
        for mf in self.mfq.files[:-1]:
            phy, size, _tags = UNIT.unpack_from(mf.mapped(), mf.file_size - CQ_STORE_UNIT_SIZE)
            if size != BLANK_SIZE and phy < min_phy_offset:
                count += 1
            else:
                break
        self.mfq.delete_first(count)
        self.correct_min_offset(min_phy_offset)
        return count

    def flush(self) -> int:
        return self.mfq.flush()

    def unflushed(self) -> list[tuple[MappedFile, int]]:
        """``MappedFileQueue.unflushed`` (nothing for a queue not loaded: it has nothing unflushed)."""
        mfq = self._mfq
        return mfq.unflushed() if mfq is not None else []

    def note_flushed(self, synced: list[tuple[MappedFile, int]]) -> None:
        if synced and self._mfq is not None:
            self._mfq.note_flushed(synced)

    def close(self) -> None:
        if self._mfq is not None:
            self._mfq.close()

    def destroy(self) -> None:
        self.mfq.destroy()
        self._min_logic_offset = 0
        self._last_phy = self._last_size = 0
