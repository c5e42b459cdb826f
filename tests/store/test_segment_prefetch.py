"""A commit log segment made before its zero-fill ended ("cold": the first one right after a start, or a writer
faster than the zero-fill) is read into the page cache ahead of the writer on a thread
(store/segment_warmer.py, SegmentPrefetcher), so the writer's page faults do not zero-fill the read-ahead
window on the event loop thread; the reading never changes a byte the writer wrote."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ferrymq.store import segment_warmer
from ferrymq.store.mapped_file_queue import MappedFileQueue
from ferrymq.store.segment_warmer import SegmentPrefetcher, SegmentWarmer
from support.pagecache import resident_pages

SEGMENT = 16 << 20
JOIN_S = 30.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fadvise and mincore(2)")


@pytest.fixture
def never_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every zero-fill is still running when its segment is needed."""
    monkeypatch.setattr(SegmentWarmer, "ready", property(lambda self: False))


def _cold_queue(path: Path) -> MappedFileQueue:
    mfq = MappedFileQueue(str(path), SEGMENT, preallocate=True, warm=True)
    mfq.load()
    return mfq


def _eventually(cond: Callable[[], bool], timeout_s: float = JOIN_S) -> bool:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not cond():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.005)
    return True


def _prefetcher(mfq: MappedFileQueue) -> SegmentPrefetcher:
    prefetcher = mfq._prefetcher
    assert prefetcher is not None
    return prefetcher


def test_a_cold_segment_is_read_into_the_page_cache_ahead_of_the_writer(tmp_path: Path, never_ready: None) -> None:
    mfq = _cold_queue(tmp_path / "commitlog")
    try:
        mf = mfq.create_file(0)
        prefetcher = _prefetcher(mfq)
        prefetcher.join(JOIN_S)
        assert prefetcher.done
        pages = SEGMENT // os.sysconf("SC_PAGESIZE")
        # nothing was written: without the prefetch no page of the fallocated segment is in the page cache
        assert resident_pages(mf.path) >= pages * 9 // 10
    finally:
        mfq.destroy()


def test_the_prefetch_keeps_a_bounded_distance_ahead_of_the_writer(tmp_path: Path, never_ready: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle broker does not read its whole segment in: the prefetch waits for the writer to come nearer."""
    monkeypatch.setattr(segment_warmer, "PREFETCH_CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(segment_warmer, "PREFETCH_AHEAD_BYTES", 2 << 20)
    monkeypatch.setattr(segment_warmer, "PREFETCH_POLL_S", 0.005)
    page = os.sysconf("SC_PAGESIZE")
    mfq = _cold_queue(tmp_path / "commitlog")
    try:
        mf = mfq.create_file(0)
        assert _eventually(lambda: resident_pages(mf.path) >= (2 << 20) // page)
        assert not _prefetcher(mfq).done  # waiting, not finished
        assert resident_pages(mf.path) <= (4 << 20) // page
        mf.append(b"w" * (SEGMENT - (1 << 20)))  # the writer moves on: the prefetch follows it to the end
        _prefetcher(mfq).join(JOIN_S)
        assert _prefetcher(mfq).done
        assert resident_pages(mf.path) >= SEGMENT // page * 9 // 10
    finally:
        mfq.destroy()


def test_a_warm_segment_needs_no_prefetch(tmp_path: Path) -> None:
    mfq = _cold_queue(tmp_path / "commitlog")
    try:
        warmer = mfq._warmer
        assert warmer is not None
        warmer._thread.join(JOIN_S)  # the zero-fill of the first segment ends before it is needed
        mfq.create_file(0)
        assert mfq._prefetcher is None
    finally:
        mfq.destroy()


@pytest.mark.parametrize("seed", range(6))
def test_the_prefetch_never_changes_what_the_writer_wrote(tmp_path: Path, never_ready: None,
                                                          monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(segment_warmer, "PREFETCH_CHUNK_BYTES", 64 << 10)  # many steps, racing the writes
    rng = random.Random(seed)
    mfq = _cold_queue(tmp_path / f"commitlog-{seed}")
    try:
        mf = mfq.create_file(0)
        expected = bytearray(SEGMENT)
        pos = 0
        while pos < SEGMENT:
            chunk = rng.randbytes(min(rng.randrange(1, 300_000), SEGMENT - pos))
            mf.append(chunk)
            expected[pos:pos + len(chunk)] = chunk
            pos += len(chunk)
        _prefetcher(mfq).join(JOIN_S)
        mf.flush()
        with open(mf.path, "rb") as fh:
            assert fh.read() == bytes(expected)
    finally:
        mfq.destroy()


def test_the_next_segment_and_close_stop_the_prefetch(tmp_path: Path, never_ready: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segment_warmer, "PREFETCH_CHUNK_BYTES", 4096)  # slow enough to be stopped midway
    mfq = _cold_queue(tmp_path / "commitlog")
    mf = mfq.create_file(0)
    first = _prefetcher(mfq)
    mf.append(b"x" * 10)
    mf.wrote_position = SEGMENT  # full: the next put rolls
    mfq.create_file(SEGMENT)
    second = _prefetcher(mfq)
    assert second is not first
    first.join(JOIN_S)
    assert first.done
    mfq.close()
    second.join(JOIN_S)
    assert second.done and mfq._prefetcher is None
