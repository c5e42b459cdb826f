"""Checkpoint file (§5.3) and the abort marker (§5.4).

``checkpoint`` is 4096 bytes, big-endian:

| offset | size | field                                                                        |
|--------|------|------------------------------------------------------------------------------|
| 0      | 8    | physicMsgTimestamp: store time of the newest flushed commit log record       |
| 8      | 8    | logicsMsgTimestamp: store time of the newest flushed consume queue unit      |
| 16     | 8    | indexMsgTimestamp: store time of the newest flushed index entry              |
| 24     | 8    | ferrymq: dispatched_phy_offset, everything below is flushed in CQs and index |
| 32     | 8    | ferrymq: data_start_phy_offset, first record of a slave's partial first file |
| 40     | 4056 | zero                                                                         |

Offsets 24..39 are a ferrymq extension (RocketMQ ignores them); 0 there means "unknown", which
makes recovery re-dispatch from the commit log start — slow but safe.

``queueoffsets`` (``write_queue_offsets``, ``append_queue_offsets``) records how far each consume queue reached,
so recovery can tell a queue file deleted or cut by hand from an idle queue; ``indexfiles``
(``write_index_manifest``) lists the index files and where in the commit log each begins, so recovery can tell
an index file deleted or cut.
"""

from __future__ import annotations

import os
import struct

from ferrymq.store.errors import StoreDirError

CHECKPOINT_FILE_SIZE = 4096
_LAYOUT = struct.Struct(">qqqqq")


class StoreCheckpoint:
    def __init__(self, path: str) -> None:
        self.path = path
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.dispatched_phy_offset = 0
        self.data_start_phy_offset = 0
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(self._fd).st_size < CHECKPOINT_FILE_SIZE:
                os.ftruncate(self._fd, CHECKPOINT_FILE_SIZE)
            raw = os.pread(self._fd, _LAYOUT.size, 0)
        except OSError as exc:
            raise StoreDirError(f"cannot open checkpoint {path}: {exc}") from exc
        if len(raw) == _LAYOUT.size:
            (self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
             self.dispatched_phy_offset, self.data_start_phy_offset) = _LAYOUT.unpack(raw)  # fmt: skip

    def min_timestamp(self) -> int:
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp))

    def flush(self) -> None:
        data = _LAYOUT.pack(
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
            self.dispatched_phy_offset, self.data_start_phy_offset,
        )  # fmt: skip
        os.pwrite(self._fd, data, 0)
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def abort_file_exists(path: str) -> bool:
    return os.path.exists(path)


def create_abort_file(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(path))


def remove_abort_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(os.path.dirname(path))


def fsync_dir(path: str) -> None:
    """Persist entries created, renamed or deleted in directory ``path`` (best effort: some file systems
    refuse a directory fsync)."""
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- queue offsets snapshot ------------------------------------------------------------------------------

QUEUE_OFFSETS_FILE = "queueoffsets"
_QUEUE_OFFSETS_HEADER = "ferrymq-queue-offsets-v2"
#: headers read (v1 lines carry no newest unit: such a queue is loaded at start, as without a snapshot)
_QUEUE_OFFSETS_HEADERS = ("ferrymq-queue-offsets-v1", _QUEUE_OFFSETS_HEADER)
#: the phy offset of a ``QueueMark`` whose line does not say (a v1 line)
UNKNOWN_PHY = -1


#: one consume queue's line of the ``queueoffsets`` snapshot: (next queue offset: the queue held units up to, not
#: including, it, 0 meaning no expectation (a deleted queue); phy offset and size of the record its newest non-blank
#: unit points at: (0, 0) if none, (UNKNOWN_PHY, 0) when the line does not say)
QueueMark = tuple[int, int, int]


def write_queue_offsets(path: str, marks: dict[tuple[str, int], QueueMark]) -> None:
    """Write the queue offsets snapshot atomically (a temporary file, fsync, rename, directory fsync).

    ``queueoffsets`` is UTF-8 text, one line per consume queue after a header line:

    | line     | fields (tab-separated)                                  | meaning                                 |
    |----------|---------------------------------------------------------|-----------------------------------------|
    | 1        | ``ferrymq-queue-offsets-v2``                            | format marker (v1: the first 3 fields)  |
    | 2..n     | topic, queue id, next queue offset, last phy, last size | the queue held units up to (not         |
    |          |                                                         | including) that offset; its newest unit |
    |          |                                                         | pointed at the record [last phy, + size)|

    Later lines (``append_queue_offsets``) override earlier ones of the same queue; a next queue offset of 0 means
    "no expectation" (a deleted queue). Recovery reads it as a lower bound: a consume queue found shorter (or
    missing) is rebuilt from the commit log (recovery.rebuild_short_queues). It also makes the start O(queues
    touched): a queue the snapshot accounts for is loaded on its first use, not at start (consume_queue.py).
    Topic names never hold a tab or a newline (topic_dir_name_ok and the broker's topic name rule)."""
    tmp = path + ".tmp"
    write_queue_offsets_tmp(tmp, marks)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def _offset_lines(marks: dict[tuple[str, int], QueueMark]) -> str:
    return "".join(f"{topic}\t{queue_id}\t{m[0]}\t{m[1]}\t{m[2]}\n" for (topic, queue_id), m in marks.items()
                   if "\t" not in topic and "\n" not in topic)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_queue_offsets_tmp(tmp: str, marks: dict[tuple[str, int], QueueMark]) -> None:
    """The whole snapshot into ``tmp`` (fsync'ed), to be renamed over ``queueoffsets``."""
    data = (_QUEUE_OFFSETS_HEADER + "\n" + _offset_lines(marks)).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def append_queue_offsets(path: str, marks: dict[tuple[str, int], QueueMark]) -> int:
    """Append lines for ``marks`` to the snapshot at ``path`` (created with its header if absent) and
    fdatasync; returns the lines appended. A line a crash tore is skipped by the reader: an append that finds the
    file not ending with a newline starts with one."""
    body = _offset_lines(marks)
    if not body:
        return 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            body = _QUEUE_OFFSETS_HEADER + "\n" + body
        else:
            with open(path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    body = "\n" + body
        _write_all(fd, body.encode())
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return body.count("\n")


def read_queue_marks(path: str) -> dict[tuple[str, int], QueueMark] | None:
    """The snapshot ``write_queue_offsets`` wrote (v1 or v2 lines); None when there is none or it is unreadable
    (nothing is then trusted or rebuilt because of it: every queue is loaded at start)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.split("\n")
    if not lines or lines[0] not in _QUEUE_OFFSETS_HEADERS:
        return None
    out: dict[tuple[str, int], QueueMark] = {}
    for line in lines[1:]:
        parts = line.split("\t")
        try:
            if len(parts) == 5:
                out[(parts[0], int(parts[1]))] = (int(parts[2]), int(parts[3]), int(parts[4]))
            elif len(parts) == 3:
                out[(parts[0], int(parts[1]))] = (int(parts[2]), UNKNOWN_PHY, 0)
        except ValueError:
            continue
    return out


def read_queue_offsets(path: str) -> dict[tuple[str, int], int]:
    """Next queue offset per queue of the snapshot (``read_queue_marks``); {} when there is none."""
    return {key: mark[0] for key, mark in (read_queue_marks(path) or {}).items()}


# --- index files manifest --------------------------------------------------------------------------------

INDEX_MANIFEST_FILE = "indexfiles"
_INDEX_MANIFEST_HEADER = "ferrymq-index-files-v1"


def write_index_manifest(path: str, slot_num: int, index_num: int, files: list[tuple[str, int]]) -> None:
    """Write the index files manifest atomically (temporary file, fsync, rename, directory fsync).

    ``indexfiles`` is UTF-8 text:

    | line | fields (tab-separated)                                  | meaning                                         |
    |------|---------------------------------------------------------|-------------------------------------------------|
    | 1    | ``ferrymq-index-files-v1``, slot count, entry count     | format marker and the geometry of the files      |
    | 2..n | file name, begin phy offset                             | an index file, oldest first, and the commit log  |
    |      |                                                         | phy offset of its first entry                    |

    An index file covers the commit log from its begin phy offset up to (and including the record at) the next
    file's; the newest one up to where dispatch got. Recovery rebuilds a listed file that is missing or cut
    (``IndexService.rebuild_missing``); it is rewritten, before the checkpoint, whenever files come or go."""
    lines = [f"{_INDEX_MANIFEST_HEADER}\t{slot_num}\t{index_num}"]
    lines.extend(f"{name}\t{begin_phy}" for name, begin_phy in files)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, ("\n".join(lines) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def read_index_manifest(path: str, slot_num: int, index_num: int) -> list[tuple[str, int]] | None:
    """The files ``write_index_manifest`` listed, oldest first; None when there is no readable manifest or it was
    written for another geometry (nothing is rebuilt then)."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except (OSError, UnicodeDecodeError):
        return None
    if not lines or lines[0] != f"{_INDEX_MANIFEST_HEADER}\t{slot_num}\t{index_num}":
        return None
    out: list[tuple[str, int]] = []
    for line in lines[1:]:
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        try:
            out.append((parts[0], int(parts[1])))
        except ValueError:
            continue
    return out
