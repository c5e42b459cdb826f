"""Store faults (expected outcomes are status enums in ``results``, not exceptions).

::

    StoreError
    ├── StoreDirError        a store directory cannot be created, opened or locked
    │   ├── StoreLockedError another process holds the store lock
    │   ├── StoreDiskFullError no room on disk to reserve a file's blocks (ENOSPC)
    │   └── StoreOpenFilesError no file descriptor left to open a store file (EMFILE, ENFILE)
    ├── StoreCorruptError    files on disk are inconsistent beyond automatic repair
    └── StoreConfigMismatchError the files on disk were written with another setting (``key``)
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every store fault."""


class StoreDirError(StoreError):
    """A store directory or file cannot be created or opened."""


class StoreLockedError(StoreDirError):
    """The store directory is locked by another process."""


class StoreCorruptError(StoreError):
    """Segment files are inconsistent (e.g. wrong size or a gap between segments)."""


class StoreDiskFullError(StoreDirError):
    """The file system has no room for the blocks a store file needs (reserved before they are written, so a
    full disk is this error instead of a SIGBUS on a write into a hole of a memory map)."""


class StoreOpenFilesError(StoreDirError):
    """No file descriptor is left to open a store file (EMFILE / ENFILE), even after releasing the least
    recently used consume queue files."""


class StoreConfigMismatchError(StoreError):
    """The store on disk was written with another value of a setting that fixes its layout (e.g. the commit log
    segment size); ``key`` names the broker config key, the message the value found on disk."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
