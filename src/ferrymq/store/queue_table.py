"""All consume queues of a store, keyed by (topic, queue id); their files share one ``OpenFilePool``.

Estate size (100,000 queues and more): nothing the broker calls per request or per timer walks every queue at
once, and the start opens no queue the ``queueoffsets`` snapshot accounts for (``load``; each is loaded on its
first use, ``ConsumeQueue``). A move of the commit log's start (``correct_min_offsets``) is O(1): each queue corrects its min offset on
its next use (``consume_queue.LogFloor``). The deletion of expired files after a commit log segment went
(``start_expire`` / ``expire_step``) walks the queues with a cursor, a bounded slice per call. The flush visits
only the queues written since the last one, and the queues of one topic are found through a per-topic index.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import threading
import time

from ferrymq.store.checkpoint import QueueMark
from ferrymq.store.config import CQ_STORE_UNIT_SIZE
from ferrymq.store.consume_queue import CQ_RESERVE_CHUNK_BYTES, ConsumeQueue, LogFloor, queue_file_path
from ferrymq.store.errors import StoreError
from ferrymq.store.mapped_file import POOLED_OPEN_FLAGS, OpenFilePool, make_sparse_segment
from ferrymq.store.syncfs import SyncFs

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


#: consume queue files mapped at once by default: this share of the process's descriptor limit (each mapped
#: file holds two descriptors: its own and the one the map keeps), the rest for connections, the commit log, ...
OPEN_SEGMENT_FILES_FD_SHARE = 1 / 8
#: ... and at most this many (each is also one of the kernel's vm.max_map_count maps, 65,530 by default)
OPEN_SEGMENT_FILES_MAX_DEFAULT = 16_384


def default_max_open_segment_files() -> int:
    """``maxOpenSegmentFiles`` when not set: an eighth of the soft RLIMIT_NOFILE, at most 16,384."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return OPEN_SEGMENT_FILES_MAX_DEFAULT
    return max(1, min(OPEN_SEGMENT_FILES_MAX_DEFAULT, int(soft * OPEN_SEGMENT_FILES_FD_SHARE)))


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit, as servers do at start (the default soft limit, often
    1,024, is far below what an estate of queues and connections needs); returns (soft, hard) afterwards.
    Left as it is when the system refuses."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, hard, exc)
            return soft, hard
        soft = hard
    return soft, hard


#: a flush of at least this many queues persists them with one ``syncfs`` of their file system instead of one
#: ``fdatasync`` per queue (each of those writes its inode synchronously and flushes the device's cache)
CQ_SYNCFS_MIN_QUEUES = 64
#: one ``expire_step`` stops after this long (the broker's event loop runs it; 50 ms is the loop's stall budget)
EXPIRE_STEP_BUDGET_S = 0.010
#: queues an ``expire_step`` looks at between two looks at the clock
_EXPIRE_CLOCK_EVERY = 64


def make_consume_queue_file(path: str, file_size: int) -> int:
    """Create the consume queue file ``path`` as ``prepare_unit`` would (its directories, the sparse file of
    ``file_size`` bytes, its first ``CQ_RESERVE_CHUNK_BYTES`` reserved), so that the event loop's preparation finds
    it made: for a thread, ahead of a send to a new queue. Touches no store object, only the file system. Returns
    the bytes it reserved from the start of the file it made (0 on a file system without ``posix_fallocate``), or
    -1: a file that exists already is left alone; on a failure (no room, no descriptor) it removes what it created,
    and the loop's own preparation then meets the same failure and refuses the send with its status."""
    return make_sparse_segment(path, file_size, CQ_RESERVE_CHUNK_BYTES, POOLED_OPEN_FLAGS)


def process_fds() -> tuple[int, int]:
    """(file descriptors the process holds now, its soft RLIMIT_NOFILE); -1 where unknown. One listing of
    /proc/self/fd (bounded by the limit)."""
    try:
        open_fds = len(os.listdir("/proc/self/fd")) - 1  # less the listing's own descriptor
    except OSError:
        open_fds = -1
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return open_fds, (-1 if soft == resource.RLIM_INFINITY else soft)


def topic_dir_name_ok(topic: str) -> bool:
    return bool(topic) and "/" not in topic and "\x00" not in topic and topic not in (".", "..")


class ConsumeQueueTable:
    def __init__(self, root_dir: str, file_size: int, max_open_files: int = 0) -> None:
        """``max_open_files``: consume queue files mapped at once (0: ``default_max_open_segment_files()``)."""
        self.root_dir = root_dir
        self.file_size = file_size
        self.pool = OpenFilePool(max_open_files or default_max_open_segment_files())
        self.queues: dict[QueueKey, ConsumeQueue] = {}
        #: topic -> its queue ids here (queue_count, delete_topic, topic_queue_ids without a walk of every queue);
        #: dicts of ints to None, which the garbage collector does not track (a set would be one more object per
        #: topic for every full pass to walk)
        self._topic_ids: dict[str, dict[int, None]] = {}
        #: the commit log start every queue's min offset follows (lazily)
        self.floor = LogFloor()
        self._dirty: set[ConsumeQueue] = set()
        self._dirty_lock = threading.Lock()
        #: the expiry round in progress (``start_expire``): the keys still to visit, from the end, and its floor
        self._expire_keys: list[QueueKey] = []
        self._expire_floor = 0
        #: consume queue files deleted by expiry rounds
        self.expired_files_total = 0
        #: flushes of many queues at once (``syncfs`` of the file system holding the root)
        self._syncfs = SyncFs(root_dir)

    def load(self, marks: dict[QueueKey, QueueMark] | None = None) -> None:
        """Find the queues on disk: one listing of the root and one per topic directory. A queue the
        ``queueoffsets`` snapshot (``marks``) accounts for is created unloaded (it opens nothing until its first
        use, see ``ConsumeQueue``); any other queue on disk (none in the snapshot, or a line without its newest
        unit) is loaded now. Queues the snapshot lists but not found on disk are not created (recovery rebuilds
        them)."""
        if not os.path.isdir(self.root_dir):
            return
        marks = marks or {}
        with os.scandir(self.root_dir) as topics:
            topic_entries = sorted((e.name, e.path) for e in topics if e.is_dir())
        for topic, topic_dir in topic_entries:
            with os.scandir(topic_dir) as entries:
                ids = sorted(int(e.name) for e in entries if e.name.isdigit() and e.is_dir())
            for queue_id in ids:
                mark = marks.get((topic, queue_id))
                if mark is not None and mark[0] > 0 and mark[1] >= 0:
                    cq = ConsumeQueue(self.root_dir, topic, queue_id, self.file_size, self.pool, self.floor,
                                      recorded=mark)
                else:
                    cq = ConsumeQueue(self.root_dir, topic, queue_id, self.file_size, self.pool, self.floor)
                    cq.load()
                self._add(topic, queue_id, cq)

    @property
    def loaded_count(self) -> int:
        """Queues whose files have been loaded (the rest open nothing until their first use); O(queues)."""
        return sum(1 for cq in list(self.queues.values()) if cq.loaded)

    def _add(self, topic: str, queue_id: int, cq: ConsumeQueue) -> None:
        self.queues[(topic, queue_id)] = cq
        ids = self._topic_ids.get(topic)
        if ids is None:
            ids = self._topic_ids[topic] = {}
        ids[queue_id] = None

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.root_dir, topic, queue_id, self.file_size, self.pool, self.floor)
            self._add(topic, queue_id, cq)
        return cq

    def prepare_unit(self, topic: str, queue_id: int, queue_offset: int) -> None:
        """``ConsumeQueue.prepare_unit`` for the queue (created if new): its next unit can be written, or a
        StoreError (StoreDiskFullError, StoreOpenFilesError, ...) says why not."""
        cq = self.queues.get((topic, queue_id)) or self.get_or_create(topic, queue_id)
        cq.prepare_unit(queue_offset)

    def file_to_make(self, topic: str, queue_id: int, queue_offset: int) -> str | None:
        """The path of the consume queue file ``prepare_unit`` would have to create for the unit at
        ``queue_offset`` of a queue this table does not hold yet (its first file), or None (the queue exists:
        its files are its own business). Asks nothing of the file system."""
        if (topic, queue_id) in self.queues or not topic_dir_name_ok(topic):
            return None
        return queue_file_path(self.root_dir, topic, queue_id, queue_offset * CQ_STORE_UNIT_SIZE, self.file_size)

    def mark_dirty(self, cq: ConsumeQueue) -> None:
        if cq not in self._dirty:
            with self._dirty_lock:
                self._dirty.add(cq)

    def flush(self) -> dict[QueueKey, QueueMark]:
        """Flush queues written since the last flush (safe from a second thread); returns, for each queue
        flushed, its ``queueoffsets`` line taken before its flush (all the units it counts are on disk now).
        ``CQ_SYNCFS_MIN_QUEUES`` or more of them are persisted with one ``syncfs`` instead of one ``fdatasync``
        each (store/syncfs.py)."""
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        if len(dirty) >= CQ_SYNCFS_MIN_QUEUES and self._syncfs.available:
            return self._flush_all_at_once(dirty)
        failed: list[ConsumeQueue] = []
        error: BaseException | None = None
        flushed: dict[QueueKey, QueueMark] = {}
        for cq in dirty:
            mark = cq.mark()
            try:
                cq.flush()
            except (OSError, StoreError) as exc:  # e.g. no descriptor for a released file: next time
                failed.append(cq)
                error = exc
                continue
            flushed[(cq.topic, cq.queue_id)] = mark
        if failed:
            with self._dirty_lock:
                self._dirty.update(failed)
            raise StoreError(f"{len(failed)} consume queue(s) not flushed: {error}") from error
        return flushed

    def _flush_all_at_once(self, dirty: set[ConsumeQueue]) -> dict[QueueKey, QueueMark]:
        """``flush`` of many queues: their marks and unflushed positions first, then one ``syncfs`` (which
        persists everything written before it started), then the positions recorded as flushed."""
        taken = [(cq, cq.mark(), cq.unflushed()) for cq in dirty]
        try:
            self._syncfs.sync()
        except OSError as exc:
            with self._dirty_lock:
                self._dirty.update(dirty)
            raise StoreError(f"{len(dirty)} consume queue(s) not flushed: {exc}") from exc
        flushed: dict[QueueKey, QueueMark] = {}
        for cq, mark, synced in taken:
            cq.note_flushed(synced)
            flushed[(cq.topic, cq.queue_id)] = mark
        return flushed

    @property
    def syncfs_flushes_total(self) -> int:
        """Flushes of many queues at once done (each one ``syncfs``)."""
        return self._syncfs.calls_total

    def max_phy_end(self) -> int:
        return max((cq.max_phy_end for cq in self.queues.values()), default=0)

    def truncate_dirty(self, phy_offset: int) -> list[ConsumeQueue]:
        """Drop units pointing at or beyond ``phy_offset``; returns the queues that lost units. A queue not loaded
        yet is loaded only if its newest unit (as the snapshot says) reaches that far; the units any other queue
        holds beyond its snapshot line (written before a crash, after its last flush) are dropped when it is
        loaded (``LogFloor.valid_end``)."""
        floor = self.floor
        floor.valid_end = phy_offset if floor.valid_end < 0 else min(floor.valid_end, phy_offset)
        cut: list[ConsumeQueue] = []
        for cq in self.queues.values():
            if cq.max_phy_end > phy_offset:
                cq.truncate_dirty(phy_offset)
                cut.append(cq)
        return cut

    def correct_min_offsets(self, min_phy_offset: int) -> None:
        """The commit log now starts at ``min_phy_offset``: O(1), each queue corrects its min offset on its next
        use (``ConsumeQueue.min_logic_offset``)."""
        self.floor.phy_offset = min_phy_offset

    def delete_expired(self, min_phy_offset: int) -> int:
        """Every queue's expired files at once (O(queues): for tests and small stores; the store runs
        ``start_expire`` + ``expire_step``)."""
        self.correct_min_offsets(min_phy_offset)
        return sum(cq.delete_expired(min_phy_offset) for cq in list(self.queues.values()))

    def start_expire(self, min_phy_offset: int) -> None:
        """Begin (or restart) a round deleting the files of every queue whose units all point below
        ``min_phy_offset``, run by ``expire_step`` a bounded slice at a time. Min offsets follow at once."""
        self.correct_min_offsets(min_phy_offset)
        self._expire_floor = min_phy_offset
        self._expire_keys = list(self.queues)  # one C-level copy of the keys; visited from the end

    @property
    def expire_pending(self) -> bool:
        return bool(self._expire_keys)

    def expire_step(self, budget_s: float | None = None) -> int:
        """Visit queues of the round in progress for about ``budget_s`` (``EXPIRE_STEP_BUDGET_S``) at most; the
        files deleted."""
        keys = self._expire_keys
        if not keys:
            return 0
        floor = self._expire_floor
        deadline = time.monotonic() + (EXPIRE_STEP_BUDGET_S if budget_s is None else budget_s)
        count = 0
        visited = 0
        queues = self.queues
        while keys:
            cq = queues.get(keys.pop())
            visited += 1
            if cq is not None and cq.may_have_expired_files():  # never a queue's last file: one, nothing to do
                try:
                    count += cq.delete_expired(floor)
                except (OSError, StoreError) as exc:  # no descriptor now: the next round sees it again
                    log.warning("consume queue %s/%d: expired files not deleted now: %s", cq.topic, cq.queue_id,
                                exc)
                visited = _EXPIRE_CLOCK_EVERY  # file work (maps, unlinks): look at the clock now
            if visited >= _EXPIRE_CLOCK_EVERY:
                visited = 0
                if time.monotonic() >= deadline:
                    break
        self.expired_files_total += count
        return count

    def queue_count(self, topic: str) -> int:
        """1 + the highest queue id this store holds a consume queue for in ``topic`` (0: none)."""
        ids = self._topic_ids.get(topic)
        return max(ids) + 1 if ids else 0

    def topic_queue_ids(self) -> dict[str, list[int]]:
        return {topic: sorted(ids) for topic, ids in list(self._topic_ids.items()) if ids}

    def delete_topic(self, topic: str) -> list[QueueKey]:
        keys = [(topic, queue_id) for queue_id in sorted(self._topic_ids.pop(topic, ()))]
        for key in keys:
            cq = self.queues.pop(key, None)
            if cq is None:
                continue
            with self._dirty_lock:
                self._dirty.discard(cq)
            cq.destroy()
        if topic_dir_name_ok(topic):
            shutil.rmtree(os.path.join(self.root_dir, topic), ignore_errors=True)
        return keys

    def close(self) -> None:
        self._syncfs.close()
        for cq in self.queues.values():
            cq.close()  # an unloaded queue holds nothing open
