"""One preallocated, fixed-size segment file mapped into memory.

Positions (bytes from the segment start): ``wrote_position`` ≥ ``flushed_position``. The writer
thread appends and moves ``wrote_position``; ``flush`` may run on another thread. Flushing uses
``os.fdatasync`` on the file descriptor: on Linux the pages written through a shared mapping are
page-cache pages, so this persists them like ``msync`` would, and it releases the GIL.

A new segment is either sparse (``ftruncate``: blocks are allocated on the first write of each page,
inside the page fault) or, with ``preallocate=True``, reserved up front with ``posix_fallocate``: the
first write of each 4 KiB page then takes a cheaper fault (no block allocation in the fault; ~0.5 µs
less per 1 KiB record on ext4, benchmarks/PROFILE-NOTES.md "Round 5"), and a full disk shows as a clean
error when the segment is created instead of a SIGBUS on a later write into a hole. File systems without
fallocate get a sparse file. A segment that already exists at its full size (e.g. one zero-filled ahead
by ``segment_warmer``, what the commit log uses by default: ``StoreConfig.commit_log_preallocation``) is
mapped as it is. Reserved blocks stay unwritten extents until data is written back into them, and marking
them written is a journal commit inside that ``fdatasync``: a SYNC_FLUSH broker writes the pages just ahead of
its writes before its flushes (``zero_ahead``), so that one commit covers many sends.

Consume queue files are sparse and reserve their blocks incrementally instead (``reserve_ahead``): a file keeps
its full logical size (the on-disk format of RocketMQ), but only the blocks up to ``reserved_position`` are
allocated, a chunk at a time ahead of the writes, so a queue holding one message costs one chunk of disk.

Files of an ``OpenFilePool`` (the consume queues: one or more per queue, so an estate of 100,000 queues would
otherwise hold 200,000 descriptors and 100,000 maps) are mapped only while in use: the pool keeps at most
``max_open`` of them mapped and releases the least recently used one (unmapped and closed; blocks, positions
and page-cache data stay) when another must open, or when opening fails for lack of descriptors (EMFILE,
ENFILE). Their users reach the map through ``mapped()``, which reopens a released file. They share one lock, the
pool's (a file keeps none of its own: one object fewer per queue for the garbage collector's full passes); it
guards a file's descriptor against a flush on another thread, and a flush holds it only to duplicate the
descriptor, never across the ``fdatasync``.

The maps of pooled files are advised ``MADV_RANDOM``: their writes and reads touch a page or two at a time, and
without that advice the first fault of a file reads around it by the device's read-ahead window, which zero-fills
every hole page of that window in the page cache (``read_ahead_kb`` of 8 MiB zero-filled a whole 6 MB consume
queue file per new queue, on the event loop).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from ferrymq.store.errors import StoreCorruptError, StoreDirError, StoreDiskFullError, StoreOpenFilesError

log = logging.getLogger(__name__)

OS_PAGE_SIZE = mmap.PAGESIZE
_ZERO_CHUNK = 1 << 20
_ZERO_PAGE = bytes(OS_PAGE_SIZE)
#: posix_fallocate errors meaning "this file system cannot do it" (a sparse file is used instead)
_FALLOCATE_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
#: open(2) / dup(2) errors meaning "no descriptor left" (per process, per system)
_NO_DESCRIPTOR = frozenset({errno.EMFILE, errno.ENFILE})
#: the advice for the maps of an OpenFilePool's members (no read-around on a fault); None where the platform has none
_POOLED_MAP_ADVICE: int | None = getattr(mmap, "MADV_RANDOM", None)
#: open(2) flags of an OpenFilePool's members: no access-time update when one is mapped (with ``relatime``, the map
#: of a file written since its last access updates it: one more dirty inode to write back per reopen)
POOLED_OPEN_FLAGS: int = getattr(os, "O_NOATIME", 0)
#: fewest files an OpenFilePool keeps mapped (an operation may use two files of a queue at once)
MIN_POOLED_OPEN_FILES = 4


def _released_map() -> mmap.mmap:
    """A closed map: what a released file's ``mm`` is, so a use without ``mapped()`` fails loudly."""
    mm = mmap.mmap(-1, 1)
    mm.close()
    return mm


_RELEASED = _released_map()
_T = TypeVar("_T")


def offset_to_file_name(offset: int) -> str:
    return f"{offset:020d}"


def pwrite_all(fd: int, data: bytes | memoryview, pos: int, path: str) -> None:
    """Write all of ``data`` at file position ``pos`` (``pwrite(2)`` may write less than asked)."""
    n = len(data)
    with memoryview(data) as view:
        done = 0
        while done < n:
            written = os.pwrite(fd, view[done:], pos + done)
            if written <= 0:
                raise OSError(errno.EIO, f"pwrite wrote nothing at {pos + done} of {path}")
            done += written


def _size_new_segment(fd: int, file_size: int, preallocate: bool) -> None:
    """Give an empty segment file its fixed size: reserved blocks (``preallocate``) or a sparse file."""
    if preallocate:
        try:
            os.posix_fallocate(fd, 0, file_size)
            return
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreDiskFullError(f"no room for a segment of {file_size} bytes: {exc}") from exc
            if exc.errno not in _FALLOCATE_UNSUPPORTED:
                raise  # the segment cannot be had
    os.ftruncate(fd, file_size)


def _abandon(fd: int, created_path: str | None) -> None:
    """Close a segment that could not be set up; remove the file if this call created it (an empty or
    partly reserved file would otherwise be taken for a torn segment on the next start)."""
    os.close(fd)
    if created_path is not None:
        try:
            os.unlink(created_path)
        except OSError:
            pass


def make_sparse_segment(path: str, file_size: int, reserve_bytes: int, flags: int = 0) -> int:
    """Create the segment file ``path`` (and its directories) as a sparse file of ``file_size`` bytes with its first
    ``reserve_bytes`` reserved, without mapping it: for a thread making a file ahead of the one that maps it.
    Returns the bytes reserved (0 on a file system without ``posix_fallocate``), or -1: the file exists already
    (left alone), or it could not be made (what was created is removed)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o644)
    except OSError:
        return -1
    reserved = min(file_size, reserve_bytes)
    try:
        os.ftruncate(fd, file_size)
        os.posix_fallocate(fd, 0, reserved)
    except OSError as exc:
        if exc.errno not in _FALLOCATE_UNSUPPORTED:
            _abandon(fd, path)
            return -1
        reserved = 0
    os.close(fd)
    return reserved


def with_descriptor(pool: OpenFilePool | None, what: str, path: str, call: Callable[[], _T],
                    keep: MappedFile | None = None) -> _T:
    """``call()`` (a listing, an open: anything that takes a descriptor); when none is left, release the pool's least
    recently used file (other than ``keep``) and try again. StoreOpenFilesError when none is left to release."""
    while True:
        try:
            return call()
        except OSError as exc:
            if exc.errno not in _NO_DESCRIPTOR:
                raise
            if pool is None or not pool.release_oldest(keep):
                if pool is not None:
                    pool.open_failures_total += 1
                raise StoreOpenFilesError(f"cannot {what} {path}: {exc}") from exc


class OpenFilePool:
    """The files mapped at once among its members, at most ``max_open``, least recently used first out.

    Used from one thread (the store's writer); a member's ``flush`` may run on another (it opens a transient
    descriptor for a released file). ``mapped_files`` and ``max_open`` are the figures the broker exports."""

    def __init__(self, max_open: int) -> None:
        self.max_open = max(MIN_POOLED_OPEN_FILES, max_open)
        #: the lock of every member (its descriptor and map against a flush on another thread)
        self.lock = threading.Lock()
        self._lru: OrderedDict[MappedFile, None] = OrderedDict()
        #: files released to make room (LRU), and opens that found no descriptor even after releasing
        self.released_total = 0
        self.open_failures_total = 0

    @property
    def mapped_files(self) -> int:
        return len(self._lru)

    def admit(self, mf: MappedFile) -> None:
        """``mf`` was just mapped: make it the most recent, release the oldest beyond ``max_open``."""
        lru = self._lru
        lru[mf] = None
        lru.move_to_end(mf)
        while len(lru) > self.max_open and self.release_oldest(mf):
            pass

    def touch(self, mf: MappedFile) -> None:
        lru = self._lru
        if mf in lru:
            lru.move_to_end(mf)

    def discard(self, mf: MappedFile) -> None:
        self._lru.pop(mf, None)

    def release_oldest(self, keep: MappedFile | None) -> bool:
        """Release the least recently used member other than ``keep``; False if there is none."""
        for mf in self._lru:
            if mf is keep:
                continue
            del self._lru[mf]
            mf.release()
            self.released_total += 1
            return True
        return False


class MappedFile:
    __slots__ = (
        "_where", "_named_by_offset", "file_from_offset", "file_size", "mm", "wrote_position", "flushed_position",
        "reserved_position", "pool", "_fd", "_lock", "_closed",
    )  # fmt: skip

    def __init__(self, path: str, file_from_offset: int, file_size: int, *, preallocate: bool = False,
                 pool: OpenFilePool | None = None, open_now: bool = True, named_by_offset: bool = False) -> None:
        """Open (creating it if absent) and map the segment at ``path``. With ``open_now=False`` (a pooled file
        that exists at its full size, e.g. at load) it starts released: ``mapped()`` opens it. With
        ``named_by_offset``, ``path`` is the directory and the file is named by its start offset
        (``offset_to_file_name``): the file keeps no path string of its own (its queue's directory string is
        shared; ``path`` is derived when needed)."""
        self._where = path
        self._named_by_offset = named_by_offset
        self.file_from_offset = file_from_offset
        self.file_size = file_size
        self.wrote_position = 0
        self.flushed_position = 0
        #: bytes from the segment start whose blocks are known to be reserved (``reserve_ahead``)
        self.reserved_position = 0
        self.pool = pool
        self.mm = _RELEASED
        self._fd = -1
        self._lock = pool.lock if pool is not None else threading.Lock()
        self._closed = False
        if open_now:
            self._open(create=True, preallocate=preallocate)

    def _retry_descriptors(self, what: str, call: Callable[[], _T]) -> _T:
        """``call()``; when it finds no descriptor left, release the pool's least recently used file and try
        again (StoreOpenFilesError when none is left to release)."""
        return with_descriptor(self.pool, what, self.path, call, keep=self)

    def _open(self, *, create: bool, preallocate: bool = False) -> None:
        path = self.path
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        if self.pool is not None:
            flags |= POOLED_OPEN_FLAGS
        try:
            try:
                fd = self._retry_descriptors("open segment", lambda: os.open(path, flags, 0o644))
            except PermissionError:
                if not flags & POOLED_OPEN_FLAGS:
                    raise
                flags &= ~POOLED_OPEN_FLAGS  # O_NOATIME needs the file's owner: open it as any other
                fd = self._retry_descriptors("open segment", lambda: os.open(path, flags, 0o644))
        except StoreOpenFilesError:
            raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreDiskFullError(f"cannot create segment {path}: {exc}") from exc
            raise StoreDirError(f"cannot open segment {path}: {exc}") from exc
        created = False
        allocated = False
        try:
            st = os.fstat(fd)
            actual = st.st_size
            # an existing segment whose every block is allocated (reserved or written before a restart)
            allocated = actual > 0 and st.st_blocks * 512 >= actual
            if actual == 0 and create:
                created = True
                _size_new_segment(fd, self.file_size, preallocate)
            elif actual != self.file_size:
                raise StoreCorruptError(f"segment {path} has size {actual}, expected {self.file_size}")
            size = self.file_size
            mm = self._retry_descriptors(
                "map segment", lambda: mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
        except StoreDiskFullError as exc:
            _abandon(fd, path if created else None)
            raise StoreDiskFullError(f"cannot create segment {path}: {exc}") from exc
        except StoreOpenFilesError:
            _abandon(fd, path if created else None)
            raise
        except OSError as exc:
            _abandon(fd, path if created else None)
            raise StoreDirError(f"cannot map segment {path}: {exc}") from exc
        except BaseException:
            _abandon(fd, path if created else None)
            raise
        if self.pool is not None and _POOLED_MAP_ADVICE is not None:
            try:
                mm.madvise(_POOLED_MAP_ADVICE)
            except OSError:  # advice only: a kernel that refuses it maps the file as before
                pass
        with self._lock:
            self._fd = fd
            self.mm = mm
        if (created and preallocate) or allocated:
            self.reserved_position = self.file_size
        if self.pool is not None:
            self.pool.admit(self)

    def allocated_bytes(self) -> int:
        """Bytes of disk the file holds (``st_blocks`` × 512; reserved and written blocks); -1 if it is not open."""
        if self._fd < 0:
            return -1
        return os.fstat(self._fd).st_blocks * 512

    @property
    def is_mapped(self) -> bool:
        return self._fd >= 0

    def mapped(self) -> mmap.mmap:
        """The map, reopening a released file (StoreOpenFilesError / StoreDirError when it cannot be had);
        a pooled file becomes the pool's most recent."""
        if self._fd >= 0:
            pool = self.pool
            if pool is not None:
                pool.touch(self)
            return self.mm
        if self._closed:
            raise StoreDirError(f"segment {self.path} is closed")
        self._open(create=False)
        return self.mm

    def release(self) -> bool:
        """Unmap and close the file but keep it usable (``mapped()`` reopens it): data already written stays
        in the page cache and is persisted by ``flush`` or the kernel. False if it is still in use."""
        with self._lock:
            if self._closed or self._fd < 0:
                return True
            try:
                self.mm.close()
            except BufferError:  # an exported memoryview is still alive: keep the file mapped
                return False
            os.close(self._fd)
            self._fd = -1
            self.mm = _RELEASED
        return True

    def reserve_ahead(self, end: int, chunk: int) -> None:
        """Make sure the blocks of [0, end) are reserved, reserving up to the next multiple of ``chunk`` past
        ``end`` (one ``posix_fallocate`` per chunk of writes). The file must be mapped (``mapped()``)."""
        if end <= self.reserved_position:
            return
        target = min(self.file_size, -(-max(end, self.reserved_position + chunk) // chunk) * chunk)
        self.reserve(self.reserved_position, target - self.reserved_position)
        self.reserved_position = target

    def reserve(self, pos: int, length: int) -> None:
        """Reserve the blocks of [pos, pos+length) (``posix_fallocate``) so writes there through the map
        cannot fault on a full disk. StoreDiskFullError when there is no room; a no-op on file systems
        without fallocate."""
        end = min(self.file_size, pos + length)
        if end <= pos:
            return
        try:
            os.posix_fallocate(self._fd, pos, end - pos)
        except OSError as exc:
            if exc.errno in _FALLOCATE_UNSUPPORTED:
                return
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreDiskFullError(f"no room to reserve {end - pos} bytes of {self.path}: {exc}") from exc
            raise StoreDirError(f"cannot reserve blocks of {self.path}: {exc}") from exc

    @property
    def path(self) -> str:
        if self._named_by_offset:
            return os.path.join(self._where, offset_to_file_name(self.file_from_offset))
        return self._where

    @property
    def file_name(self) -> str:
        return os.path.basename(self.path)

    @property
    def end_offset(self) -> int:
        """Global offset one past this segment."""
        return self.file_from_offset + self.file_size

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def append(self, data: bytes) -> int:
        """Write at the wrote position; returns the position written at. Caller checks space."""
        pos = self.wrote_position
        end = pos + len(data)
        assert end <= self.file_size, "append past segment end"
        self.mm[pos:end] = data
        self.wrote_position = end
        return pos

    def append_written(self, data: bytes | memoryview) -> int:
        """``append`` through ``pwrite(2)`` on the file instead of the mapping: on Linux both are the same
        page-cache pages, so the mapping sees the bytes at once, but the writer takes no page fault per new
        page (about half the CPU of a slice copy into fresh pages of a sparse file). For large appends
        (replicated chunks). Returns the position written at."""
        pos = self.wrote_position
        n = len(data)
        assert pos + n <= self.file_size, "append past segment end"
        pwrite_all(self._fd, data, pos, self.path)
        self.wrote_position = pos + n
        return pos

    def write_at(self, pos: int, data: bytes) -> None:
        assert 0 <= pos and pos + len(data) <= self.file_size
        self.mm[pos : pos + len(data)] = data

    def read(self, pos: int, size: int) -> bytes | None:
        """Bytes [pos, pos+size) if fully written, else None."""
        if pos < 0 or size < 0 or pos + size > self.wrote_position:
            return None
        return self.mm[pos : pos + size]

    def flush(self, least_pages: int = 0) -> int:
        """Persist written bytes; returns the flushed position. Safe against a concurrent writer."""
        wrote = self.wrote_position
        flushed = self.flushed_position
        if wrote <= flushed:
            return flushed
        if least_pages > 0 and wrote < self.file_size:
            if wrote // OS_PAGE_SIZE - flushed // OS_PAGE_SIZE < least_pages:
                return flushed
        if not self._sync_data():
            return flushed
        if wrote > self.flushed_position:
            self.flushed_position = wrote
        return self.flushed_position

    def zero_ahead(self, zeroed_to: int, ahead_bytes: int) -> int:
        """Write zeros over the whole pages from the first page boundary at or after both ``zeroed_to`` and the
        wrote position, up to ``ahead_bytes`` beyond that boundary (at most to the segment end); returns the
        position zeroed to (``zeroed_to`` when nothing was written).

        For a SYNC_FLUSH commit log: ``posix_fallocate`` leaves the reserved blocks unwritten, so the
        ``fdatasync`` after an append into a new page also commits the file system's journal (the block becomes
        written); pages written ahead become written with the flush that covers them, one journal commit for
        the lot, and later appends' flushes write data only. One 4 KiB ``pwrite`` per page keeps the page cache's
        folios small (a larger write may make large folios, and an append would then dirty all of one).

        Only on the writer's thread (the pages are beyond the wrote position: an append meanwhile could be
        overwritten), and only over reserved blocks (``reserved_position``; a sparse file would allocate them
        here). OSError from ``pwrite`` propagates."""
        page = OS_PAGE_SIZE
        boundary = -(-self.wrote_position // page) * page
        start = max(zeroed_to, boundary)
        end = min(boundary + ahead_bytes, self.reserved_position, self.file_size)
        end -= (end - start) % page if end > start else 0
        fd = self._fd
        if end <= start or fd < 0 or self._closed:
            return zeroed_to
        zeros = _ZERO_PAGE
        for pos in range(start, end, page):
            if os.pwrite(fd, zeros, pos) != page:
                raise OSError(errno.EIO, f"short write of zeros at {pos} of {self.path}")
        return end

    def sync(self) -> None:
        """fdatasync regardless of positions (files written at random positions, e.g. the index)."""
        self._sync_data()

    def _sync_data(self) -> bool:
        """fdatasync the file; False if it is closed. A file of its own lock holds it across the call. A pooled
        file (the lock is shared) syncs a duplicate of its descriptor outside the lock, or a transient one when
        it is released (the page cache is per file, so this persists what was written through the earlier map)."""
        if self.pool is None:
            with self._lock:
                if self._closed:
                    return False
                self._fdatasync()
            return True
        with self._lock:
            if self._closed:
                return False
            if self._fd >= 0:
                try:
                    fd = os.dup(self._fd)
                except OSError as exc:
                    if exc.errno not in _NO_DESCRIPTOR:
                        raise
                    os.fdatasync(self._fd)  # no descriptor to spare: sync under the lock
                    return True
            else:
                fd = -1
        if fd < 0:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:  # destroyed since: nothing left to persist
                return False
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
        return True

    def _fdatasync(self) -> None:
        """fdatasync the file (lock held); a released file through a transient descriptor."""
        if self._fd >= 0:
            os.fdatasync(self._fd)
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def zero_from(self, pos: int) -> None:
        """Zero [pos, file_size) (torn-tail cleanup). Holes of the sparse file are skipped
        (``SEEK_DATA``) and chunks that already read as zeros are not rewritten."""
        zeros = bytes(_ZERO_CHUNK)
        mm = self.mapped()
        while pos < self.file_size:
            try:
                data_at = os.lseek(self._fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    return  # only holes from here on
                data_at = pos  # SEEK_DATA unsupported: check every chunk
            pos = max(pos, data_at)
            end = min(self.file_size, pos + _ZERO_CHUNK)
            n = end - pos
            if mm[pos:end] != zeros[:n]:
                mm[pos:end] = zeros[:n]
            pos = end

    def last_modified_ms(self) -> int:
        try:
            return int(os.stat(self.path).st_mtime * 1000)
        except OSError:
            return 0

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._fd >= 0:
                try:
                    self.mm.close()
                except BufferError:  # an exported memoryview is still alive; the GC will unmap it
                    pass
                os.close(self._fd)
                self._fd = -1
        if self.pool is not None:
            self.pool.discard(self)

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
