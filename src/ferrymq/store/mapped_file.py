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
mapped as it is.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading

from ferrymq.store.errors import StoreCorruptError, StoreDirError, StoreDiskFullError

OS_PAGE_SIZE = mmap.PAGESIZE
_ZERO_CHUNK = 1 << 20
#: posix_fallocate errors meaning "this file system cannot do it" (a sparse file is used instead)
_FALLOCATE_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


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


class MappedFile:
    __slots__ = (
        "path", "file_from_offset", "file_size", "mm", "wrote_position", "flushed_position",
        "_fd", "_lock", "_closed",
    )  # fmt: skip

    def __init__(self, path: str, file_from_offset: int, file_size: int, *, preallocate: bool = False) -> None:
        self.path = path
        self.file_from_offset = file_from_offset
        self.file_size = file_size
        self.wrote_position = 0
        self.flushed_position = 0
        self._lock = threading.Lock()
        self._closed = False
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreDirError(f"cannot open segment {path}: {exc}") from exc
        created = False
        try:
            actual = os.fstat(fd).st_size
            if actual == 0:
                created = True
                _size_new_segment(fd, file_size, preallocate)
            elif actual != file_size:
                raise StoreCorruptError(f"segment {path} has size {actual}, expected {file_size}")
            self.mm = mmap.mmap(fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except StoreDiskFullError as exc:
            _abandon(fd, path if created else None)
            raise StoreDiskFullError(f"cannot create segment {path}: {exc}") from exc
        except OSError as exc:
            _abandon(fd, path if created else None)
            raise StoreDirError(f"cannot map segment {path}: {exc}") from exc
        except BaseException:
            _abandon(fd, path if created else None)
            raise
        self._fd = fd

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
        with self._lock:
            if self._closed:
                return flushed
            os.fdatasync(self._fd)
        if wrote > self.flushed_position:
            self.flushed_position = wrote
        return self.flushed_position

    def sync(self) -> None:
        """fdatasync regardless of positions (files written at random positions, e.g. the index)."""
        with self._lock:
            if not self._closed:
                os.fdatasync(self._fd)

    def zero_from(self, pos: int) -> None:
        """Zero [pos, file_size) (torn-tail cleanup). Holes of the sparse file are skipped
        (``SEEK_DATA``) and chunks that already read as zeros are not rewritten."""
        zeros = bytes(_ZERO_CHUNK)
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
            if self.mm[pos:end] != zeros[:n]:
                self.mm[pos:end] = zeros[:n]
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
            try:
                self.mm.close()
            except BufferError:  # an exported memoryview is still alive; the GC will unmap it
                pass
            os.close(self._fd)

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
