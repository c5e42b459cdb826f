"""``syncfs(2)``: persist every dirty page and inode of one file system in one call (Linux).

Flushing N files one ``fdatasync`` at a time costs N synchronous inode writes and N device cache flushes, and while
each inode block is being written the creation of a file whose inode shares it waits; N consume queues written since
the last flush (an estate building 100,000 queues) took the flush thread seconds that way, and the event loop's new
queues waited on it. One ``syncfs`` writes the same pages and inodes back together and flushes the device once.

Errors: since Linux 5.8 ``syncfs`` reports a writeback error recorded on the file system since the descriptor was
opened or last synced, so a ``SyncFs`` keeps its descriptor open for its whole life (an error that happens between
two calls is seen by the second). Where the call does not exist (not Linux, an old C library) ``SyncFs.available``
is False and the caller syncs file by file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
import threading
from collections.abc import Callable

_Syncfs = Callable[[int], int]


def _load_syncfs() -> _Syncfs | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_SYNCFS = _load_syncfs()


class SyncFs:
    """``syncfs`` of the file system holding ``path`` (a directory), through one descriptor kept open."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._lock = threading.Lock()
        self._fn = _SYNCFS
        self.calls_total = 0

    @property
    def available(self) -> bool:
        return self._fn is not None

    def sync(self) -> None:
        """Persist the file system's dirty data; OSError when it cannot (the caller keeps its files dirty)."""
        fn = self._fn
        if fn is None:
            raise OSError(errno.ENOSYS, "syncfs is not available here")
        with self._lock:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            fd = self._fd
            if fn(fd) != 0:  # ctypes releases the GIL around the call
                err = ctypes.get_errno()
                if err == errno.ENOSYS:
                    self._fn = None
                raise OSError(err, f"syncfs of {self.path}: {os.strerror(err)}")
            self.calls_total += 1

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
