"""Segment creation: preallocated (fallocate) or sparse, and what a failed creation leaves behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from store_helpers import CL_SEGMENT, inner, make_config

from ferrymq.store import PutMessageStatus, StoreDirError
from ferrymq.store import mapped_file as mf_mod
from ferrymq.store.mapped_file import MappedFile
from support.fiemap import fallocate_works, unwritten_ranges

SIZE = 256 * 1024


def _allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512




def test_preallocated_segment_has_its_blocks_and_a_sparse_one_does_not(tmp_path: Path) -> None:
    reserved = MappedFile(str(tmp_path / "a"), 0, SIZE, preallocate=True)
    sparse = MappedFile(str(tmp_path / "b"), 0, SIZE)
    try:
        assert os.path.getsize(tmp_path / "a") == os.path.getsize(tmp_path / "b") == SIZE
        assert _allocated_bytes(tmp_path / "b") < SIZE // 2
        if fallocate_works(tmp_path, SIZE):
            assert _allocated_bytes(tmp_path / "a") >= SIZE
        reserved.append(b"abc")
        assert reserved.read(0, 3) == b"abc"
    finally:
        reserved.close()
        sparse.close()


def test_file_system_without_fallocate_gets_a_sparse_segment(tmp_path: Path, monkeypatch) -> None:
    calls: list[int] = []

    def unsupported(fd: int, offset: int, length: int) -> None:
        calls.append(length)
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(mf_mod.os, "posix_fallocate", unsupported)
    seg = MappedFile(str(tmp_path / "s"), 0, SIZE, preallocate=True)
    try:
        assert calls == [SIZE]
        assert os.path.getsize(tmp_path / "s") == SIZE
        seg.append(b"x" * 5000)
        assert seg.read(4990, 10) == b"x" * 10
    finally:
        seg.close()


def test_full_disk_is_a_store_error_and_leaves_no_file(tmp_path: Path, monkeypatch) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mf_mod.os, "posix_fallocate", no_space)
    with pytest.raises(StoreDirError, match="No space left"):
        MappedFile(str(tmp_path / "full"), 0, SIZE, preallocate=True)
    assert not (tmp_path / "full").exists()


def test_existing_segment_is_never_removed_on_a_failed_open(tmp_path: Path) -> None:
    path = tmp_path / "old"
    path.write_bytes(b"\x01" * 100)  # the wrong size: refused, but it is somebody's data
    with pytest.raises(Exception, match="expected"):
        MappedFile(str(path), 0, SIZE, preallocate=True)
    assert path.read_bytes() == b"\x01" * 100


@pytest.mark.parametrize("mode", ["fallocate", "sparse"])
def test_commit_log_segments_follow_the_config(tmp_path: Path, mode: str) -> None:
    from ferrymq.store import MessageStore

    store = MessageStore(make_config(tmp_path, commit_log_preallocation=mode))
    store.load()
    try:
        assert store.put_message(inner(body=b"x" * 100)).status is PutMessageStatus.PUT_OK
        (segment,) = sorted((tmp_path / "commitlog").iterdir())
        assert os.path.getsize(segment) == CL_SEGMENT
        if mode == "sparse":
            assert _allocated_bytes(segment) < CL_SEGMENT
        elif fallocate_works(tmp_path, SIZE):
            assert _allocated_bytes(segment) >= CL_SEGMENT
    finally:
        store.shutdown()


def _wait_prepared(store: object, offset: int) -> None:
    """Wait (on the condition, not a sleep) for the warmer of the segment at ``offset`` to finish."""
    warmer = store.commit_log.mfq._warmer  # type: ignore[attr-defined]
    assert warmer is not None and warmer.file_from_offset == offset
    warmer._thread.join(10)
    assert not warmer._thread.is_alive()


def test_warm_mode_zero_fills_the_next_segment_ahead_and_rolls_into_it(tmp_path: Path) -> None:
    from ferrymq.store import MessageStore

    store = MessageStore(make_config(tmp_path))  # "warm" is the default
    store.load()
    log_dir = tmp_path / "commitlog"
    try:
        _wait_prepared(store, 0)  # an empty store prepares its first segment at load
        assert sorted(p.name for p in log_dir.iterdir()) == [f"{0:020d}.prep"]
        assert store.put_message(inner(body=b"x" * 100)).status is PutMessageStatus.PUT_OK
        first = log_dir / f"{0:020d}"
        assert _allocated_bytes(first) >= CL_SEGMENT  # written zeros: every block is there
        _wait_prepared(store, CL_SEGMENT)  # and the next one is on its way
        nxt = log_dir / f"{CL_SEGMENT:020d}.prep"
        assert nxt.stat().st_size == CL_SEGMENT and _allocated_bytes(nxt) >= CL_SEGMENT
        while store.max_phy_offset < CL_SEGMENT:  # roll into the prepared segment
            assert store.put_message(inner(body=b"y" * 1000)).status is PutMessageStatus.PUT_OK
        names = sorted(p.name for p in log_dir.iterdir())
        assert names[:2] == [f"{0:020d}", f"{CL_SEGMENT:020d}"]
        store.reput()
        n = 0
        while True:  # every record, across the roll, reads back
            got = store.get_message("g", "TopicA", 0, n, 32, None)
            if got.status.name != "FOUND":
                break
            n += got.message_count
        assert n == store.queues.queues[("TopicA", 0)].max_offset_in_queue > 60
    finally:
        store.shutdown()
    assert not any(p.name.endswith(".prep") for p in log_dir.iterdir())  # shutdown cancels and removes it


def test_stray_prepared_segment_is_removed_at_load_and_never_read_as_log(tmp_path: Path) -> None:
    from ferrymq.store import MessageStore

    store = MessageStore(make_config(tmp_path))
    store.load()
    try:
        for _ in range(5):
            assert store.put_message(inner(body=b"z" * 500)).status is PutMessageStatus.PUT_OK
        end = store.max_phy_offset
        _wait_prepared(store, CL_SEGMENT)
    finally:
        store.close_abruptly()  # a crash: the prepared file may stay behind
    stray = tmp_path / "commitlog" / f"{CL_SEGMENT:020d}.prep"
    stray.write_bytes(b"\xff" * 100)  # whatever a crash left there
    again = MessageStore(make_config(tmp_path))
    again.load()
    try:
        assert again.max_phy_offset == end
        assert not stray.exists() or stray.stat().st_size == CL_SEGMENT  # removed, or re-prepared as zeros
        assert again.put_message(inner(body=b"z" * 500)).status is PutMessageStatus.PUT_OK
    finally:
        again.shutdown()


def test_warmer_that_fails_leaves_the_segment_to_be_made_on_the_spot(tmp_path: Path, monkeypatch) -> None:
    from ferrymq.store import segment_warmer

    real_pwrite = os.pwrite

    def failing_pwrite(fd: int, data: object, pos: int) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(segment_warmer.os, "pwrite", failing_pwrite)
    warmer = segment_warmer.SegmentWarmer(str(tmp_path / "seg"), 0, SIZE)
    assert warmer.take() is False
    assert not (tmp_path / "seg").exists() and not (tmp_path / "seg.prep").exists()
    monkeypatch.setattr(segment_warmer.os, "pwrite", real_pwrite)
    ok = segment_warmer.SegmentWarmer(str(tmp_path / "seg"), 0, SIZE)
    assert ok.take() is True
    assert (tmp_path / "seg").read_bytes() == bytes(SIZE)


def test_unknown_preallocation_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="commit_log_preallocation"):
        make_config(tmp_path, commit_log_preallocation="eager")


def test_full_disk_on_roll_answers_disk_full_then_recovers(tmp_path: Path, monkeypatch) -> None:
    """The next commit log segment cannot be reserved: the put is refused cleanly (DISK_FULL, and so are the
    puts after it), no half-made file is left for recovery to mistake for a torn segment, and puts go on
    once the store's disk check sees space again."""
    from ferrymq.store import MessageStore

    store = MessageStore(make_config(tmp_path, commit_log_preallocation="fallocate"))
    store.load()
    try:
        while store.max_phy_offset < CL_SEGMENT - 3000:
            assert store.put_message(inner(body=b"x" * 1000)).status is PutMessageStatus.PUT_OK
        real = os.posix_fallocate

        def no_space(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(mf_mod.os, "posix_fallocate", no_space)
        assert store.put_message(inner(body=b"y" * 4000)).status is PutMessageStatus.DISK_FULL
        assert store.put_message(inner(body=b"z")).status is PutMessageStatus.DISK_FULL
        assert len(os.listdir(tmp_path / "commitlog")) == 1
        monkeypatch.setattr(mf_mod.os, "posix_fallocate", real)
        monkeypatch.setattr("ferrymq.store.message_store.os.statvfs",
                            lambda path: SimpleNamespace(f_blocks=1000, f_bfree=500, f_bavail=500, f_frsize=4096))
        store.check_disk_space()
        result = store.put_message(inner(body=b"y" * 4000))
        assert result.status is PutMessageStatus.PUT_OK
        assert result.append_result is not None and result.append_result.wrote_offset == CL_SEGMENT
    finally:
        store.shutdown()


def test_restart_and_slave_do_not_warm_until_needed(tmp_path: Path) -> None:
    """A reopened store warms its next segment from its next roll on (not during recovery); a slave (its
    catch-up would write every segment twice) and a SYNC_FLUSH store (its fsyncs would queue behind the
    zeros) reserve blocks instead of warming."""
    from ferrymq.store import MessageStore
    from ferrymq.store.config import BrokerRole, FlushDiskType

    store = MessageStore(make_config(tmp_path / "m"))
    store.load()
    assert store.put_message(inner(body=b"x" * 100)).status is PutMessageStatus.PUT_OK
    store.shutdown()
    again = MessageStore(make_config(tmp_path / "m"))
    again.load()
    try:
        assert again.commit_log.mfq._warmer is None
        while again.max_phy_offset < CL_SEGMENT:  # the roll makes the next segment and warms the one after
            assert again.put_message(inner(body=b"y" * 1000)).status is PutMessageStatus.PUT_OK
        _wait_prepared(again, 2 * CL_SEGMENT)
    finally:
        again.shutdown()
    for name, overrides in (("s", {"broker_role": BrokerRole.SLAVE}),
                            ("f", {"flush_disk_type": FlushDiskType.SYNC_FLUSH})):
        other = MessageStore(make_config(tmp_path / name, **overrides))
        other.load()
        try:
            assert other.commit_log.mfq.warm is False and other.commit_log.mfq.preallocate is True
            assert other.commit_log.mfq._warmer is None
        finally:
            other.shutdown()


def test_a_segment_still_being_zero_filled_is_not_waited_for(tmp_path: Path, monkeypatch) -> None:
    """The first put after a start took the segment the warmer was still zero-filling and joined its thread:
    on the broker's event loop, for as long as the rest of the zero-fill took (seconds for a 1 GiB segment on
    a busy disk). Now an unfinished warm-up is abandoned and the segment is made on the spot."""
    import threading

    from ferrymq.store import segment_warmer
    from ferrymq.store.mapped_file_queue import MappedFileQueue

    release = threading.Event()
    started = threading.Event()
    real_pwrite_all = segment_warmer.pwrite_all

    def slow_pwrite_all(fd: int, data: object, pos: int, path: str) -> None:
        started.set()
        release.wait(30)  # a disk that takes its time
        real_pwrite_all(fd, data, pos, path)

    monkeypatch.setattr(segment_warmer, "pwrite_all", slow_pwrite_all)
    queue = MappedFileQueue(str(tmp_path / "log"), SIZE, warm=True)
    queue.load()
    assert started.wait(10), "the warmer did not start on the first segment"
    made = threading.Event()
    maker = threading.Thread(target=lambda: (queue.create_file(0), made.set()), daemon=True)
    maker.start()
    try:
        assert made.wait(10), "create_file waited for the zero-fill"
    finally:
        release.set()
        maker.join(30)
    assert len(queue.files) == 1 and os.path.getsize(tmp_path / "log" / f"{0:020d}") == SIZE
    queue.close()
    prepared = tmp_path / "log" / f"{0:020d}.prep"
    gone = threading.Event()
    for _ in range(200):  # the abandoned thread removes its file once its current chunk is written
        if not prepared.exists():
            gone.set()
            break
        gone.wait(0.05)
    assert gone.is_set(), "the abandoned warm-up left its file behind"


def test_zero_ahead_writes_whole_pages_beyond_the_writes_over_reserved_blocks_only(tmp_path: Path) -> None:
    """SYNC_FLUSH writes the pages ahead of the commit log's writes (MappedFile.zero_ahead): never a written
    byte, whole pages from the boundary after the wrote position, bounded by the segment end and by the
    reserved blocks (a sparse file is left alone); after the flush the blocks written ahead are no longer
    unwritten extents (so flushes of appends into them commit no journal)."""
    page = mf_mod.OS_PAGE_SIZE
    mf = MappedFile(str(tmp_path / "a"), 0, SIZE, preallocate=True)
    sparse = MappedFile(str(tmp_path / "b"), 0, SIZE)
    try:
        mf.append(b"x" * 1000)
        to = mf.zero_ahead(0, 4 * page)
        assert to == page + 4 * page
        mf.append(b"y" * 5000)  # to 6000: the boundary is 2 pages
        assert mf.zero_ahead(to, 4 * page) == 2 * page + 4 * page  # topped up: only the page beyond `to`
        assert mf.zero_ahead(6 * page, 4 * page) == 6 * page  # nothing more to do
        assert mf.read(0, 6000) == b"x" * 1000 + b"y" * 5000
        mf.flush()
        ranges = unwritten_ranges(mf._fd, 0, SIZE)
        if ranges is not None and fallocate_works(tmp_path, SIZE):
            assert ranges == [(6 * page, SIZE)], ranges
        mf.wrote_position = SIZE - 5000  # near the end: bounded by it
        assert mf.zero_ahead(0, 4 * page) == SIZE
        sparse.append(b"z" * 10)
        assert sparse.zero_ahead(0, 4 * page) == 0
        assert _allocated_bytes(tmp_path / "b") <= page
    finally:
        mf.close()
        sparse.close()


def test_a_reopened_segment_whose_blocks_are_all_allocated_counts_as_reserved(tmp_path: Path) -> None:
    """After a restart a SYNC_FLUSH broker's open segment is written ahead too: a segment whose every block is
    allocated (st_blocks) is known reserved; a sparse one is not (writing ahead would allocate its blocks)."""
    MappedFile(str(tmp_path / "a"), 0, SIZE, preallocate=True).close()
    MappedFile(str(tmp_path / "b"), 0, SIZE).close()
    reserved = MappedFile(str(tmp_path / "a"), 0, SIZE)
    sparse = MappedFile(str(tmp_path / "b"), 0, SIZE)
    try:
        if fallocate_works(tmp_path, SIZE):
            assert reserved.reserved_position == SIZE
            assert reserved.zero_ahead(0, 4 * mf_mod.OS_PAGE_SIZE) == 4 * mf_mod.OS_PAGE_SIZE
        assert sparse.reserved_position == 0
        assert sparse.zero_ahead(0, 4 * mf_mod.OS_PAGE_SIZE) == 0
    finally:
        reserved.close()
        sparse.close()
