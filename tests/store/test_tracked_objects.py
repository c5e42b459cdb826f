"""What a consume queue costs the garbage collector: the objects of the store a full pass walks, per queue
(issue 24, docs/sizing.md "Objects the garbage collector walks"). A full pass walks every tracked object of the
process; at 100,000 queues each object per queue is 100,000 more for every pass. A queue holding one file
adds its ``ConsumeQueue``, ``MappedFileQueue`` and ``MappedFile`` (and the map while its file is mapped): no
list of files, no lock of its own."""

from __future__ import annotations

import gc
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from store_helpers import inner

from ferrymq.store import MessageStore, PutMessageStatus
from ferrymq.store.consume_queue import ConsumeQueue, LogFloor
from ferrymq.store.mapped_file import MappedFile, OpenFilePool

QUEUES = 400
#: tracked objects a first use anywhere in the process may add once (caches of isinstance checks: sets of weak
#: references), not per queue
NOISE_OBJECTS = 24
#: files mapped at once: far fewer than the queues, as at estate size
SMALL_POOL = 8


#: the types of tracked objects a consume queue could add (others, e.g. weak references of the test runner's own
#: work, are not counted)
STORE_TYPES = frozenset({"ConsumeQueue", "MappedFileQueue", "MappedFile", "mmap", "lock", "RLock", "list", "tuple",
                         "dict", "set", "deque", "OrderedDict"})


def _tracked_by_type() -> Counter[str]:
    gc.collect()
    return Counter(name for o in gc.get_objects() if (name := type(o).__name__) in STORE_TYPES)


def test_a_queue_with_one_file_adds_three_tracked_objects_and_its_map_while_mapped(tmp_path: Path) -> None:
    pool = OpenFilePool(SMALL_POOL)
    floor = LogFloor()
    warm = ConsumeQueue(str(tmp_path), "warm", 0, 4000, pool=pool, floor=floor)  # the modules' first-use caches
    warm.prepare_unit(0)
    warm.put_unit(0, 50, 0, 0)
    before = _tracked_by_type()
    queues: list[ConsumeQueue] = []
    for n in range(QUEUES):
        cq = ConsumeQueue(str(tmp_path), f"T{n // 8}", n % 8, 4000, pool=pool, floor=floor)
        cq.prepare_unit(0)
        cq.put_unit(100 * n, 50, 0, 0)
        queues.append(cq)
    added = _tracked_by_type() - before
    assert added["ConsumeQueue"] == added["MappedFileQueue"] == added["MappedFile"] == QUEUES
    assert added["mmap"] <= SMALL_POOL  # released files share one closed map
    assert added["lock"] == 0 and added["list"] <= 1  # the pool's lock; ``queues`` itself
    per_queue = (sum(added.values()) - added["list"]) / QUEUES
    assert per_queue <= 3 + (SMALL_POOL + NOISE_OBJECTS) / QUEUES, added.most_common(8)
    assert [cq.get_unit(0) for cq in queues] == [(100 * n, 50, 0) for n in range(QUEUES)]


def test_a_store_queue_with_one_message_adds_three_tracked_objects(
        open_store: Callable[..., MessageStore]) -> None:
    store = open_store(max_open_segment_files=SMALL_POOL)
    for n in range(8):  # the store's own first objects (the commit log's segment, the first topic's)
        assert store.put_message(inner(topic="warm", queue_id=n)).status == PutMessageStatus.PUT_OK
    store.reput()
    before = _tracked_by_type()
    for n in range(QUEUES):
        assert store.put_message(inner(topic=f"T{n // 8}", queue_id=n % 8)).status == PutMessageStatus.PUT_OK
    store.reput()
    added = _tracked_by_type() - before
    assert added["ConsumeQueue"] == QUEUES
    assert sum(added.values()) / QUEUES <= 3 + (SMALL_POOL + NOISE_OBJECTS) / QUEUES, added.most_common(8)


def test_the_files_of_a_queue_are_a_tuple_whether_one_or_many(tmp_path: Path) -> None:
    pool = OpenFilePool(SMALL_POOL)
    cq = ConsumeQueue(str(tmp_path), "T", 0, 200, pool=pool)  # 10 units per file
    for n in range(25):
        cq.put_unit(1000 + 10 * n, 10, 0, n)
    files = cq.mfq.files
    assert isinstance(files, tuple) and [f.file_from_offset for f in files] == [0, 200, 400]
    assert cq.mfq.first() is files[0] and cq.mfq.last() is files[-1]
    assert cq.mfq.find(399) is files[1] and cq.mfq.find(600) is None and cq.mfq.find(-1) is None
    cq.mfq.delete_first(2)
    one = cq.mfq.files
    assert isinstance(one, tuple) and len(one) == 1 and one[0] is files[2]
    assert cq.mfq.first() is cq.mfq.last() is files[2]
    assert cq.mfq.find(400) is files[2] and cq.mfq.find(399) is None and cq.mfq.find(600) is None
    assert cq.get_unit(24) == (1240, 10, 0) and cq.get_unit(19) is None
    cq.mfq.destroy()
    assert cq.mfq.files == () and cq.mfq.last() is None and cq.mfq.find(0) is None


def test_pooled_files_share_the_pools_lock_and_flush_outside_it(tmp_path: Path) -> None:
    """A flush of a pooled file syncs a duplicate of its descriptor: the pool's lock is free meanwhile (the
    writer's opens and releases of other files never wait for a disk sync)."""
    pool = OpenFilePool(SMALL_POOL)
    a = MappedFile(str(tmp_path), 0, 4096, pool=pool, named_by_offset=True)
    b = MappedFile(str(tmp_path), 4096, 4096, pool=pool, named_by_offset=True)
    assert a._lock is b._lock is pool.lock
    synced: list[bool] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(pool.lock.locked())
        real(fd)

    os.fdatasync = fdatasync  # type: ignore[assignment]
    try:
        a.mapped()
        a.append(b"x" * 100)
        assert a.flush() == 100
        b.mapped()
        b.append(b"y" * 10)
        assert b.release()
        assert b.flush() == 10  # released: a transient descriptor
    finally:
        os.fdatasync = real  # type: ignore[assignment]
    assert synced == [False, False]
    assert a.is_mapped and a.mapped()[:100] == b"x" * 100


def test_a_flush_of_a_released_file_removed_meanwhile_leaves_its_position(tmp_path: Path) -> None:
    pool = OpenFilePool(SMALL_POOL)
    mf = MappedFile(str(tmp_path), 0, 4096, pool=pool, named_by_offset=True)
    mf.append(b"z" * 40)
    assert mf.release()
    os.unlink(mf.path)
    assert mf.flush() == 0 and mf.flushed_position == 0
    mf.close()
    assert mf.flush() == 0
