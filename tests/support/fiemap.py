"""Which byte ranges of a file are reserved but unwritten extents (``FS_IOC_FIEMAP``, Linux): a
``posix_fallocate``-d block reads as zeros and stays unwritten until data is written back into it."""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

#: _IOWR('f', 11, struct fiemap)
FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_UNWRITTEN = 0x800
#: struct fiemap: fm_start, fm_length (u64), fm_flags, fm_mapped_extents, fm_extent_count, fm_reserved (u32)
_HEAD = struct.Struct("=QQIIII")
#: struct fiemap_extent: fe_logical, fe_physical, fe_length, 2 reserved (u64), fe_flags, 3 reserved (u32)
_EXTENT = struct.Struct("=QQQQQIIII")
MAX_EXTENTS = 512


def unwritten_ranges(fd: int, start: int, length: int) -> list[tuple[int, int]] | None:
    """(start, end) byte ranges within [start, start+length) held by unwritten extents, after syncing the
    file's dirty pages; None when the file system cannot say (no FIEMAP)."""
    buf = bytearray(_HEAD.size + MAX_EXTENTS * _EXTENT.size)
    _HEAD.pack_into(buf, 0, start, length, FIEMAP_FLAG_SYNC, 0, MAX_EXTENTS, 0)
    try:
        fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
    except OSError:
        return None
    mapped = _HEAD.unpack_from(buf, 0)[3]
    out = []
    for i in range(mapped):
        logical, _phys, ext_len, _r1, _r2, flags, *_ = _EXTENT.unpack_from(buf, _HEAD.size + i * _EXTENT.size)
        if flags & FIEMAP_EXTENT_UNWRITTEN:
            lo, hi = max(logical, start), min(logical + ext_len, start + length)
            if lo < hi:
                out.append((lo, hi))
    return out


def fallocate_works(directory: Path, size: int = 1 << 16) -> bool:
    """Whether the file system under ``directory`` reserves blocks with ``posix_fallocate`` (tmpfs, ext4 and
    xfs do; some overlay and network file systems refuse it)."""
    probe = directory / "fallocate-probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()
