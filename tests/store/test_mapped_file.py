"""Segment creation: preallocated (fallocate) or sparse, and what a failed creation leaves behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from store_helpers import CL_SEGMENT, inner, make_config

from ferrymq.store import PutMessageStatus, StoreDirError
from ferrymq.store import mapped_file as mf_mod
from ferrymq.store.mapped_file import MappedFile

SIZE = 256 * 1024


def _allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _fallocate_works(directory: Path) -> bool:
    probe = directory / "probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, SIZE)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


def test_preallocated_segment_has_its_blocks_and_a_sparse_one_does_not(tmp_path: Path) -> None:
    reserved = MappedFile(str(tmp_path / "a"), 0, SIZE, preallocate=True)
    sparse = MappedFile(str(tmp_path / "b"), 0, SIZE)
    try:
        assert os.path.getsize(tmp_path / "a") == os.path.getsize(tmp_path / "b") == SIZE
        assert _allocated_bytes(tmp_path / "b") < SIZE // 2
        if _fallocate_works(tmp_path):
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


@pytest.mark.parametrize("preallocate", [True, False])
def test_commit_log_segments_follow_the_config(tmp_path: Path, preallocate: bool) -> None:
    from ferrymq.store import MessageStore

    store = MessageStore(make_config(tmp_path, preallocate_commit_log=preallocate))
    store.load()
    try:
        assert store.put_message(inner(body=b"x" * 100)).status is PutMessageStatus.PUT_OK
        (segment,) = sorted((tmp_path / "commitlog").iterdir())
        assert os.path.getsize(segment) == CL_SEGMENT
        if not preallocate:
            assert _allocated_bytes(segment) < CL_SEGMENT
        elif _fallocate_works(tmp_path):
            assert _allocated_bytes(segment) >= CL_SEGMENT
    finally:
        store.shutdown()


def test_full_disk_on_roll_answers_create_mapedfile_failed_then_recovers(tmp_path: Path, monkeypatch) -> None:
    """The next commit log segment cannot be reserved: the put is refused cleanly, no half-made file is
    left for recovery to mistake for a torn segment, and puts go on once space is back."""
    from ferrymq.store import MessageStore

    store = MessageStore(make_config(tmp_path))
    store.load()
    try:
        while store.max_phy_offset < CL_SEGMENT - 3000:
            assert store.put_message(inner(body=b"x" * 1000)).status is PutMessageStatus.PUT_OK
        real = os.posix_fallocate

        def no_space(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(mf_mod.os, "posix_fallocate", no_space)
        assert store.put_message(inner(body=b"y" * 4000)).status is PutMessageStatus.CREATE_MAPEDFILE_FAILED
        assert len(os.listdir(tmp_path / "commitlog")) == 1
        monkeypatch.setattr(mf_mod.os, "posix_fallocate", real)
        result = store.put_message(inner(body=b"y" * 4000))
        assert result.status is PutMessageStatus.PUT_OK
        assert result.append_result is not None and result.append_result.wrote_offset == CL_SEGMENT
    finally:
        store.shutdown()
