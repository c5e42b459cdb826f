"""Store faults (expected outcomes are status enums in ``results``, not exceptions).

::

    StoreError
    ├── StoreDirError        a store directory cannot be created, opened or locked
    │   ├── StoreLockedError another process holds the store lock
    │   └── StoreDiskFullError no room on disk to reserve a file's blocks (ENOSPC)
    └── StoreCorruptError    files on disk are inconsistent beyond automatic repair
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
