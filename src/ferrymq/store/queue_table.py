"""All consume queues of a store, keyed by (topic, queue id); their files share one ``OpenFilePool``."""

from __future__ import annotations

import logging
import os
import resource
import shutil
import threading

from ferrymq.store.consume_queue import ConsumeQueue
from ferrymq.store.errors import StoreError
from ferrymq.store.mapped_file import OpenFilePool

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


def topic_dir_name_ok(topic: str) -> bool:
    return bool(topic) and "/" not in topic and "\x00" not in topic and topic not in (".", "..")


class ConsumeQueueTable:
    def __init__(self, root_dir: str, file_size: int, max_open_files: int = 0) -> None:
        """``max_open_files``: consume queue files mapped at once (0: ``default_max_open_segment_files()``)."""
        self.root_dir = root_dir
        self.file_size = file_size
        self.pool = OpenFilePool(max_open_files or default_max_open_segment_files())
        self.queues: dict[QueueKey, ConsumeQueue] = {}
        self._dirty: set[ConsumeQueue] = set()
        self._dirty_lock = threading.Lock()

    def load(self) -> None:
        if not os.path.isdir(self.root_dir):
            return
        for topic in sorted(os.listdir(self.root_dir)):
            topic_dir = os.path.join(self.root_dir, topic)
            if not os.path.isdir(topic_dir):
                continue
            for name in sorted(os.listdir(topic_dir)):
                if not name.isdigit() or not os.path.isdir(os.path.join(topic_dir, name)):
                    continue
                cq = ConsumeQueue(self.root_dir, topic, int(name), self.file_size, self.pool)
                cq.load()
                self.queues[(topic, int(name))] = cq

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.root_dir, topic, queue_id, self.file_size, self.pool)
            self.queues[key] = cq
        return cq

    def prepare_unit(self, topic: str, queue_id: int, queue_offset: int) -> None:
        """``ConsumeQueue.prepare_unit`` for the queue (created if new): its next unit can be written, or a
        StoreError (StoreDiskFullError, StoreOpenFilesError, ...) says why not."""
        cq = self.queues.get((topic, queue_id)) or self.get_or_create(topic, queue_id)
        cq.prepare_unit(queue_offset)

    def mark_dirty(self, cq: ConsumeQueue) -> None:
        if cq not in self._dirty:
            with self._dirty_lock:
                self._dirty.add(cq)

    def flush(self) -> None:
        """Flush queues written since the last flush (safe from a second thread)."""
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        failed: list[ConsumeQueue] = []
        error: BaseException | None = None
        for cq in dirty:
            try:
                cq.flush()
            except (OSError, StoreError) as exc:  # e.g. no descriptor for a released file: next time
                failed.append(cq)
                error = exc
        if failed:
            with self._dirty_lock:
                self._dirty.update(failed)
            raise StoreError(f"{len(failed)} consume queue(s) not flushed: {error}") from error

    def max_phy_end(self) -> int:
        return max((cq.max_phy_end for cq in self.queues.values()), default=0)

    def truncate_dirty(self, phy_offset: int) -> list[ConsumeQueue]:
        """Drop units pointing at or beyond ``phy_offset``; returns the queues that lost units."""
        cut: list[ConsumeQueue] = []
        for cq in self.queues.values():
            if cq.max_phy_end > phy_offset:
                cq.truncate_dirty(phy_offset)
                cut.append(cq)
        return cut

    def correct_min_offsets(self, min_phy_offset: int) -> None:
        for cq in self.queues.values():
            cq.correct_min_offset(min_phy_offset)

    def delete_expired(self, min_phy_offset: int) -> int:
        return sum(cq.delete_expired(min_phy_offset) for cq in list(self.queues.values()))

    def queue_count(self, topic: str) -> int:
        """1 + the highest queue id this store holds a consume queue for in ``topic`` (0: none)."""
        top = -1
        for name, queue_id in self.queues:
            if name == topic and queue_id > top:
                top = queue_id
        return top + 1

    def topic_queue_ids(self) -> dict[str, list[int]]:
        result: dict[str, list[int]] = {}
        for topic, queue_id in self.queues:
            result.setdefault(topic, []).append(queue_id)
        for ids in result.values():
            ids.sort()
        return result

    def delete_topic(self, topic: str) -> list[QueueKey]:
        keys = [k for k in self.queues if k[0] == topic]
        for key in keys:
            cq = self.queues.pop(key)
            with self._dirty_lock:
                self._dirty.discard(cq)
            cq.destroy()
        if topic_dir_name_ok(topic):
            shutil.rmtree(os.path.join(self.root_dir, topic), ignore_errors=True)
        return keys

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
