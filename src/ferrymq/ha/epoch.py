"""The epoch file of a controller-mode replica, and the truncation point search.

Every master term (epoch, issued by the controller) starts at the phy offset the new master's commit log
had when it took over. A replica keeps the <epoch, start_phy_offset> entries of every term its log holds
records of (or that it learned from its master), oldest first. An epoch's records end where the next
epoch starts, the last one at the log's max phy offset.

File ``epochFile`` in the store root, big-endian, rewritten whole for every change (it holds one entry
per failover: a few hundred bytes):

| off      | size | field              | type   | meaning                                          |
|----------|------|--------------------|--------|--------------------------------------------------|
| 0        | 4    | magic              | bytes  | ``FEPO``                                         |
| 4        | 4    | version            | int32  | 1                                                |
| 8        | 4    | entry_count        | int32  | n, at most ``MAX_EPOCH_ENTRIES``                 |
| 12 + 16i | 8    | epoch              | int64  | entry i: the term number, strictly increasing    |
| 20 + 16i | 8    | start_phy_offset   | int64  | entry i: its first byte, non-decreasing          |
| 12 + 16n | 4    | crc32              | uint32 | zlib CRC-32 of bytes [0, 12 + 16n)               |

A change is written to ``epochFile.tmp``, fsynced, renamed over ``epochFile`` and the directory fsynced:
a crash leaves either the old or the new file, never a torn one (a stray ``.tmp`` is ignored and replaced).
A file with a wrong magic, version, size or CRC is a ``StoreCorruptError`` (never silently emptied: an
empty epoch file makes a replica drop its whole log at the next handshake).

Truncation point (``find_common_point``): the newest epoch present in both lists with the same start
offset is the last common epoch; both logs hold the same records of it up to the shorter of the two
ends, so that is where the replica cuts its log (and ``truncate_after`` its epoch entries). No common
epoch: 0 (the replica keeps nothing).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from typing import NamedTuple

from ferrymq.store.checkpoint import fsync_dir
from ferrymq.store.errors import StoreCorruptError, StoreDirError

__all__ = [
    "EPOCH_FILE_NAME",
    "MAX_EPOCH_ENTRIES",
    "EpochEntry",
    "EpochFile",
    "end_of_epoch",
    "find_common_point",
]

EPOCH_FILE_NAME = "epochFile"
_MAGIC = b"FEPO"
_VERSION = 1
_HEAD = struct.Struct(">4sii")
_ENTRY = struct.Struct(">qq")
_CRC = struct.Struct(">I")
#: most entries a file (and a handshake) may carry: one per failover, far more than a group ever sees
MAX_EPOCH_ENTRIES = 100_000


class EpochEntry(NamedTuple):
    epoch: int
    start_phy_offset: int


def end_of_epoch(entries: Sequence[tuple[int, int]], epoch: int, max_phy_offset: int) -> int:
    """Where ``epoch``'s records end in a log with these entries and this max phy offset; -1 if absent."""
    for i, (e, _start) in enumerate(entries):
        if e == epoch:
            return entries[i + 1][1] if i + 1 < len(entries) else max_phy_offset
    return -1


def find_common_point(local_entries: Sequence[tuple[int, int]], remote_entries: Sequence[tuple[int, int]],
                      local_max: int, remote_max: int) -> int:
    """The phy offset up to which two logs with these epoch entries hold the same records (pure)."""
    remote_start = {e: start for e, start in remote_entries}
    for i in range(len(local_entries) - 1, -1, -1):
        epoch, start = local_entries[i]
        if remote_start.get(epoch) != start:
            continue
        local_end = local_entries[i + 1][1] if i + 1 < len(local_entries) else local_max
        remote_end = end_of_epoch(remote_entries, epoch, remote_max)
        return max(start, min(local_end, remote_end))
    return 0


def encode_entries(entries: Sequence[tuple[int, int]]) -> bytes:
    body = _HEAD.pack(_MAGIC, _VERSION, len(entries)) + b"".join(_ENTRY.pack(e, s) for e, s in entries)
    return body + _CRC.pack(zlib.crc32(body))


def decode_entries(data: bytes, where: str) -> list[EpochEntry]:
    if len(data) < _HEAD.size + _CRC.size:
        raise StoreCorruptError(f"{where}: {len(data)} bytes, too short for an epoch file")
    magic, version, count = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC or version != _VERSION:
        raise StoreCorruptError(f"{where}: not an epoch file (magic {magic!r}, version {version})")
    if not 0 <= count <= MAX_EPOCH_ENTRIES or len(data) != _HEAD.size + count * _ENTRY.size + _CRC.size:
        raise StoreCorruptError(f"{where}: {count} entries do not match the file size {len(data)}")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc != zlib.crc32(data[: len(data) - _CRC.size]):
        raise StoreCorruptError(f"{where}: CRC mismatch")
    entries = [EpochEntry(e, s) for e, s in _ENTRY.iter_unpack(data[_HEAD.size : len(data) - _CRC.size])]
    check_entries(entries, where)
    return entries


def check_entries(entries: Sequence[tuple[int, int]], where: str) -> None:
    """Epochs strictly increasing and > 0, starts non-decreasing and >= 0."""
    prev_epoch, prev_start = 0, 0
    for epoch, start in entries:
        if epoch <= prev_epoch or start < prev_start:
            raise StoreCorruptError(f"{where}: entry ({epoch}, {start}) out of order after ({prev_epoch}, "
                                    f"{prev_start})")
        prev_epoch, prev_start = epoch, start


class EpochFile:
    """The persisted entries (see the module table). Not thread-safe: one owner (the broker's HA role)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._entries: list[EpochEntry] = []
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreDirError(f"cannot read epoch file {path}: {exc}") from exc
        self._entries = decode_entries(data, path)

    @classmethod
    def in_store(cls, store_root: str) -> EpochFile:
        return cls(os.path.join(store_root, EPOCH_FILE_NAME))

    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def entries_view(self) -> list[EpochEntry]:
        """The entries without a copy (hot paths; never modify it)."""
        return self._entries

    def last_epoch(self) -> int:
        """The newest epoch, 0 when there is none."""
        return self._entries[-1].epoch if self._entries else 0

    def last_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    def start_of(self, epoch: int) -> int:
        """The start phy offset of ``epoch``; -1 if absent."""
        for e, start in self._entries:
            if e == epoch:
                return start
        return -1

    def end_of_epoch(self, epoch: int, max_phy_offset: int) -> int:
        return end_of_epoch(self._entries, epoch, max_phy_offset)

    def epoch_at(self, phy_offset: int) -> int:
        """The epoch whose records hold ``phy_offset`` (the newest entry starting at or below it); 0 if none."""
        found = 0
        for e, start in self._entries:
            if start > phy_offset:
                break
            found = e
        return found

    def append(self, epoch: int, start_phy_offset: int) -> None:
        """Add a term (persisted before returning). Appending the last entry again is a no-op; an older
        epoch or a start below the last one is a ``ValueError``."""
        last = self.last_entry()
        if last is not None:
            if last == (epoch, start_phy_offset):
                return
            if epoch <= last.epoch or start_phy_offset < last.start_phy_offset:
                raise ValueError(f"epoch entry ({epoch}, {start_phy_offset}) does not follow {tuple(last)}")
        if epoch <= 0 or start_phy_offset < 0:
            raise ValueError(f"invalid epoch entry ({epoch}, {start_phy_offset})")
        if len(self._entries) >= MAX_EPOCH_ENTRIES:
            raise ValueError(f"more than {MAX_EPOCH_ENTRIES} epoch entries")
        self._write([*self._entries, EpochEntry(epoch, start_phy_offset)])

    def truncate_after(self, phy_offset: int) -> None:
        """Drop the entries that start at or beyond ``phy_offset`` (their records were cut from the log)."""
        keep = [entry for entry in self._entries if entry.start_phy_offset < phy_offset]
        if len(keep) != len(self._entries):
            self._write(keep)

    def replace(self, entries: Sequence[tuple[int, int]]) -> None:
        """Write exactly ``entries`` (validated)."""
        new = [EpochEntry(e, s) for e, s in entries]
        check_entries(new, self.path)
        self._write(new)

    def _write(self, entries: list[EpochEntry]) -> None:
        data = encode_entries(entries)
        tmp = self.path + ".tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            fsync_dir(os.path.dirname(self.path) or ".")
        except OSError as exc:
            raise StoreDirError(f"cannot write epoch file {self.path}: {exc}") from exc
        self._entries = entries


