"""How much of a file is in the page cache (Linux ``mincore(2)``), for tests of read-ahead and prefetching."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path


def resident_pages(path: Path | str) -> int:
    """Pages of ``path`` in the page cache (mincore(2) on a private map of it, which faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        mm = mmap.mmap(fh.fileno(), size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        anchor = ctypes.c_char.from_buffer(mm)
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
        assert rc == 0, os.strerror(ctypes.get_errno())
        del anchor
        return sum(b & 1 for b in vec)
    finally:
        mm.close()
