"""Consume queue files at estate scale: blocks reserved a chunk ahead of the writes (a queue with one message
costs one chunk, not a whole file), at most ``max_open_segment_files`` of them mapped at once (the least recently
used released and reopened on use), a put refused when its queue's file cannot be had (no descriptor, no room)
and a dispatch that stops short resumed by the next reput (store/consume_queue.py, store/mapped_file.py)."""

from __future__ import annotations

import errno
import mmap
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from store_helpers import assert_cqs_match_commit_log, inner

from ferrymq.store import MessageStore, PutMessageStatus
from ferrymq.store.consume_queue import CQ_RESERVE_CHUNK_BYTES
from ferrymq.store.mapped_file import MIN_POOLED_OPEN_FILES, MappedFile
from ferrymq.store.results import GetMessageStatus
from support.pagecache import resident_pages

Opener = Callable[..., MessageStore]
#: a consume queue file as large as RocketMQ's default (300,000 units): sparse, so cheap here too
BIG_CQ_FILE = 300_000 * 20


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _cq_file(root: Path, topic: str, queue_id: int) -> Path:
    (path,) = (root / "consumequeue" / topic / str(queue_id)).iterdir()
    return path


def _put(store: MessageStore, topic: str, queue_id: int = 0, **kw: object) -> None:
    assert store.prepare_put(topic, queue_id, 0) is None
    assert store.put_message(inner(topic=topic, queue_id=queue_id, **kw)).status is PutMessageStatus.PUT_OK  # type: ignore[arg-type]


def _read_all(store: MessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    got = store.get_message("g", topic, queue_id, 0, 1000, None)
    assert got.status is GetMessageStatus.FOUND, got.status
    return [bytes(b) for b in got.buffers]


def test_a_queue_with_one_message_costs_one_chunk_of_disk(open_store: Opener, tmp_path: Path) -> None:
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    for i in range(20):
        _put(store, f"T{i}")
    store.reput()
    store.flush_consume_queues()
    for i in range(20):
        path = _cq_file(tmp_path / "a", f"T{i}", 0)
        assert os.path.getsize(path) == BIG_CQ_FILE  # RocketMQ's layout: the full logical size
        assert 0 < _allocated(path) <= CQ_RESERVE_CHUNK_BYTES


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore(2) and MADV_RANDOM are Linux facts")
def test_a_new_queue_brings_no_read_around_into_the_page_cache(open_store: Opener, tmp_path: Path) -> None:
    """The first write into a new queue's file is a page fault; without MADV_RANDOM on the map, that fault read
    around it by the device's read-ahead window, zero-filling every hole page of it (with ``read_ahead_kb`` 8192:
    the whole 6 MB file, ~3.5 ms of memset per new queue on the event loop). Only the written page may come in (on
    a file system without read-ahead, e.g. tmpfs, the old code passes too)."""
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    for i in range(5):
        _put(store, f"R{i}")
    store.reput()
    for i in range(5):
        resident = resident_pages(_cq_file(tmp_path / "a", f"R{i}", 0))
        assert 1 <= resident <= CQ_RESERVE_CHUNK_BYTES // mmap.PAGESIZE, resident


def test_blocks_are_reserved_ahead_of_the_writes(open_store: Opener, tmp_path: Path) -> None:
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    units_per_chunk = CQ_RESERVE_CHUNK_BYTES // 20
    for _ in range(units_per_chunk + 10):  # past the first chunk
        _put(store, "Grow")
        store.reput()
    path = _cq_file(tmp_path / "a", "Grow", 0)
    cq = store.queues.find("Grow", 0)
    assert cq is not None
    last = cq.mfq.files[-1]
    assert last.reserved_position >= last.wrote_position
    assert last.reserved_position == 2 * CQ_RESERVE_CHUNK_BYTES
    assert CQ_RESERVE_CHUNK_BYTES < _allocated(path) <= 2 * CQ_RESERVE_CHUNK_BYTES
    assert len(_read_all(store, "Grow")) > 0
    assert_cqs_match_commit_log(store)


def test_a_reopened_store_reads_and_extends_partly_reserved_files(open_store: Opener, tmp_path: Path) -> None:
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    for i in range(5):
        _put(store, "Re", body=b"m%d" % i)
    store.reput()
    store.shutdown()
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    assert store.get_max_offset_in_queue("Re", 0) == 5
    _put(store, "Re", body=b"m5")
    store.reput()
    assert store.get_max_offset_in_queue("Re", 0) == 6
    assert_cqs_match_commit_log(store)
    assert _allocated(_cq_file(tmp_path / "a", "Re", 0)) <= 2 * CQ_RESERVE_CHUNK_BYTES


def test_at_most_max_open_files_are_mapped_and_released_ones_reopen(open_store: Opener) -> None:
    limit = MIN_POOLED_OPEN_FILES
    store = open_store(max_open_segment_files=limit)
    topics = [f"Q{i}" for i in range(6 * limit)]
    for round_ in range(3):
        for topic in topics:
            _put(store, topic, body=b"%s-%d" % (topic.encode(), round_))
        store.reput()
        assert store.queues.pool.mapped_files <= limit
    mapped = [mf for cq in store.queues.queues.values() for mf in cq.mfq.files if mf.is_mapped]
    assert len(mapped) <= limit
    for topic in topics:  # every queue is served, mapping and releasing files as it goes
        assert store.get_max_offset_in_queue(topic, 0) == 3
        assert len(_read_all(store, topic)) == 3
    assert store.queues.pool.mapped_files <= limit
    store.flush_consume_queues()  # released files are persisted through a transient descriptor
    assert_cqs_match_commit_log(store)


def test_a_restart_loads_queues_released_and_serves_them(open_store: Opener) -> None:
    limit = MIN_POOLED_OPEN_FILES
    store = open_store(max_open_segment_files=limit)
    topics = [f"R{i}" for i in range(5 * limit)]
    for topic in topics:
        _put(store, topic)
    store.reput()
    store.shutdown()
    store = open_store(max_open_segment_files=limit)
    assert store.queues.pool.mapped_files <= limit
    for topic in topics:
        assert store.get_max_offset_in_queue(topic, 0) == 1
        assert len(_read_all(store, topic)) == 1
    assert_cqs_match_commit_log(store)


def _no_descriptor_when(monkeypatch: pytest.MonkeyPatch, refuse: Callable[[str], bool]) -> None:
    """os.open fails with EMFILE for the paths ``refuse`` picks (as under a spent RLIMIT_NOFILE)."""
    real_open = os.open

    def fake_open(path: str, flags: int, mode: int = 0o777, **kw: object) -> int:
        if refuse(str(path)):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", fake_open)


def test_no_descriptor_releases_the_oldest_file_and_opens(open_store: Opener,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(max_open_segment_files=64)
    for topic in ("A", "B", "C"):
        _put(store, topic)
    store.reput()
    assert store.queues.pool.mapped_files == 3
    opened = [0]

    def refuse(path: str) -> bool:
        # the first open of a new consume queue file finds no descriptor: as if the process were at its limit
        if "/consumequeue/D/" in path and opened[0] == 0:
            opened[0] += 1
            return True
        return False

    _no_descriptor_when(monkeypatch, refuse)
    _put(store, "D")
    store.reput()
    assert store.queues.pool.released_total == 1  # "A", the least recently used, made room
    cq_a = store.queues.find("A", 0)
    assert cq_a is not None and not cq_a.mfq.files[0].is_mapped
    assert len(_read_all(store, "D")) == 1 and len(_read_all(store, "A")) == 1


def test_a_put_whose_queue_file_cannot_be_opened_is_refused_not_acknowledged(
        open_store: Opener, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store()
    _no_descriptor_when(monkeypatch, lambda path: "/consumequeue/" in path)
    assert store.prepare_put("New", 0, 0) is PutMessageStatus.OPEN_FILES_EXHAUSTED
    assert "too many open files" in caplog.text.lower() or "Too many open files" in caplog.text
    monkeypatch.undo()
    _put(store, "New")  # descriptors free again: accepted and served
    store.reput()
    assert len(_read_all(store, "New")) == 1


def test_a_put_whose_queue_has_no_room_on_disk_is_refused(open_store: Opener,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)

    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    assert store.prepare_put("Full", 0, 0) is PutMessageStatus.DISK_FULL


def test_a_dispatch_stopped_by_a_missing_descriptor_resumes_on_the_next_reput(
        open_store: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store()
    # the put got through (e.g. a batch beyond the prepared unit) but the dispatch cannot open the file
    assert store.put_message(inner(topic="Late")).status is PutMessageStatus.PUT_OK
    _no_descriptor_when(monkeypatch, lambda path: "/consumequeue/" in path)
    store.reput()
    assert store.dispatch_behind_bytes > 0 and store.dispatcher.stalled_reason
    monkeypatch.undo()
    store.reput()
    assert store.dispatch_behind_bytes == 0 and not store.dispatcher.stalled_reason
    assert len(_read_all(store, "Late")) == 1


def test_release_keeps_a_file_in_use(tmp_path: Path) -> None:
    mf = MappedFile(str(tmp_path / "seg"), 0, 4096)
    view = memoryview(mf.mm)
    assert mf.release() is False and mf.is_mapped
    view.release()
    assert mf.release() is True and not mf.is_mapped
    mf.mapped()[0:3] = b"abc"
    assert mf.is_mapped and mf.mm[0:3] == b"abc"
    mf.close()


def test_a_commit_log_segment_that_finds_no_descriptor_refuses_with_its_cause(
        open_store: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store()
    _no_descriptor_when(monkeypatch, lambda path: "/commitlog/" in path)
    assert store.put_message(inner(topic="T")).status is PutMessageStatus.OPEN_FILES_EXHAUSTED


def test_the_writer_retries_a_stalled_dispatch_by_itself(open_store: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dispatch that stops short (no descriptor for the queue's file) is retried on a timer until it
    succeeds: the message becomes readable with no further send, and the parked pulls are woken."""
    import asyncio  # noqa: PLC0415

    from ferrymq.broker.config import BrokerConfig  # noqa: PLC0415
    from ferrymq.broker.flush import FlushService  # noqa: PLC0415
    from ferrymq.broker.writer import MessageWriter  # noqa: PLC0415

    store = open_store()
    woken: list[object] = []
    writer = MessageWriter(store, BrokerConfig(store_path_root_dir=store.config.store_path_root_dir),
                           FlushService(store, sync_flush=False, interval_ms=500), woken.append)

    async def run() -> None:
        writer.bind(asyncio.get_running_loop())
        writer.put(inner(topic="Stall"))  # prepared and stored while descriptors are free
        _no_descriptor_when(monkeypatch, lambda path: "/consumequeue/" in path)
        store.queues.pool.release_oldest(None)  # its file is released: the dispatch must reopen it
        await asyncio.sleep(0)
        assert store.dispatch_behind_bytes > 0
        monkeypatch.undo()  # descriptors return; nothing is sent
        for _ in range(100):
            if store.dispatch_behind_bytes == 0:
                break
            await asyncio.sleep(0.05)
        assert store.dispatch_behind_bytes == 0 and None in woken
        assert len(_read_all(store, "Stall")) == 1

    asyncio.run(run())


@pytest.mark.skipif(not hasattr(os, "O_NOATIME"), reason="O_NOATIME is a Linux flag")
def test_reopening_a_released_queue_file_leaves_its_access_time(open_store: Opener, tmp_path: Path) -> None:
    """A released consume queue file mapped again (a pull of a cold queue at estate size) does not update its
    access time: with ``relatime`` the map of a file written since its last access did, one more dirty inode for
    the file system to write back per reopen."""
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    _put(store, "A")
    store.reput()
    path = _cq_file(tmp_path / "a", "A", 0)
    (cq,) = [q for key, q in store.queues.queues.items() if key == ("A", 0)]
    mf = cq.mfq.last()
    assert mf is not None and mf.release()
    st = os.stat(path)
    old_atime_ns = st.st_mtime_ns - 3_600 * 10**9  # an hour before the last write: relatime would move it
    os.utime(path, ns=(old_atime_ns, st.st_mtime_ns))
    assert _read_all(store, "A")  # maps the file again
    assert mf.is_mapped
    assert os.stat(path).st_atime_ns == old_atime_ns


def test_a_new_queue_file_made_ahead_on_a_thread_is_the_one_the_put_uses(open_store: Opener, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``consume_queue_file_to_make`` names the file a put to a new queue would create and
    ``make_consume_queue_file`` (thread-safe, file system only) makes it; the put then finds it made and uses it:
    the same layout, blocks and contents as a file the put made itself."""
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    path = store.consume_queue_file_to_make("N", 3)
    assert path == str(tmp_path / "a" / "consumequeue" / "N" / "3" / "00000000000000000000")
    made = threading.Thread(target=lambda: assert_made(store.make_consume_queue_file(path)))
    made.start()
    made.join()
    assert os.path.getsize(path) == BIG_CQ_FILE
    assert 0 < _allocated(Path(path)) <= CQ_RESERVE_CHUNK_BYTES
    assert store.make_consume_queue_file(path) is False  # made already: left alone
    assert store.queues.floor.premade == {path: CQ_RESERVE_CHUNK_BYTES}
    reserves: list[int] = []
    real_reserve = MappedFile.reserve
    monkeypatch.setattr(MappedFile, "reserve", lambda self, pos, length: reserves.append(pos) or
                        real_reserve(self, pos, length))
    _put(store, "N", 3, body=b"first")
    store.reput()
    assert reserves == []  # the blocks the thread reserved are not reserved again on the loop
    assert store.queues.floor.premade == {}
    assert store.consume_queue_file_to_make("N", 3) is None  # the queue exists now
    assert _cq_file(tmp_path / "a", "N", 3) == Path(path)
    assert _read_all(store, "N", 3)
    assert 0 < _allocated(Path(path)) <= CQ_RESERVE_CHUNK_BYTES
    assert_cqs_match_commit_log(store)


def assert_made(made: bool) -> None:
    assert made


def test_no_file_to_make_where_a_put_would_be_refused(open_store: Opener) -> None:
    store = open_store()
    assert store.consume_queue_file_to_make("bad/topic", 0) is None
    assert store.consume_queue_file_to_make("T", -1) is None
    store.disk_full = True
    assert store.consume_queue_file_to_make("T", 0) is None


def test_a_stale_premade_entry_is_not_trusted_for_a_sparse_file(open_store: Opener) -> None:
    """An entry left for a path (its file made ahead, then removed with its topic) does not stand for a file made
    later under that name without reserved blocks: the put reserves them itself."""
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    path = store.consume_queue_file_to_make("S", 0)
    assert path is not None
    store.queues.floor.premade[path] = CQ_RESERVE_CHUNK_BYTES  # as if made ahead; no file is there
    _put(store, "S", 0)
    store.reput()
    assert 0 < _allocated(Path(path)) <= CQ_RESERVE_CHUNK_BYTES
    (mf,) = store.queues.queues[("S", 0)].mfq.files
    assert mf.reserved_position == CQ_RESERVE_CHUNK_BYTES


def test_a_file_that_cannot_be_made_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ferrymq.store.queue_table import make_consume_queue_file

    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    path = tmp_path / "cq" / "T" / "0" / "00000000000000000000"
    assert make_consume_queue_file(str(path), BIG_CQ_FILE) == -1
    assert not path.exists()


@pytest.mark.parametrize("fails", [1, 10_000])
def test_a_queue_listed_when_no_descriptor_is_left_is_refused_or_served(open_store: Opener, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        fails: int) -> None:
    """A queue loaded on its first use lists its directory, which takes a descriptor: with none left, the pool
    releases its least recently used file and lists again (served), or the put is refused as OPEN_FILES_EXHAUSTED
    when nothing is left to release, never a raw OSError (answered SYSTEM_ERROR before)."""
    store = open_store(max_open_segment_files=MIN_POOLED_OPEN_FILES)
    for i in range(MIN_POOLED_OPEN_FILES):
        _put(store, f"Open{i}")  # files the pool can release
    store.reput()
    (tmp_path / "a" / "consumequeue" / "Listed" / "0").mkdir(parents=True)  # a queue directory, not loaded
    real_listdir = os.listdir
    left = [fails]

    def listdir(path: str) -> list[str]:
        if "Listed" in str(path) and left[0] > 0:
            left[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    status = store.prepare_put("Listed", 0, 0)
    if fails == 1:
        assert status is None
        assert store.put_message(inner(topic="Listed", queue_id=0)).status is PutMessageStatus.PUT_OK
    else:
        assert status is PutMessageStatus.OPEN_FILES_EXHAUSTED
