"""A full disk is an expected outcome, never a crash: files written through a memory map have their blocks
reserved first, and the store refuses puts past diskSpaceWarningLevelRatio (store/message_store.py)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from store_helpers import inner

import ferrymq.store.mapped_file as mf_mod
from ferrymq.store import MessageStore, PutMessageStatus

Opener = Callable[..., MessageStore]


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_consume_queue_files_have_their_blocks_reserved(open_store: Opener, tmp_path: Path) -> None:
    store = open_store()
    assert store.put_message(inner(queue_id=0)).status is PutMessageStatus.PUT_OK
    store.reput()
    (cq_file,) = (tmp_path / "a" / "consumequeue" / "TopicA" / "0").iterdir()
    assert _allocated(cq_file) >= os.path.getsize(cq_file), "a sparse consume queue file faults on a full disk"


def test_index_file_reserves_slots_and_entries_ahead(open_store: Opener, tmp_path: Path) -> None:
    store = open_store(index_hash_slot_num=50_000, index_max_num=400_000)
    assert store.put_message(inner(queue_id=0, keys="k1")).status is PutMessageStatus.PUT_OK
    store.reput()
    (index_file,) = (tmp_path / "a" / "index").iterdir()
    slots_end = 40 + 50_000 * 4
    assert _allocated(index_file) >= slots_end + 20 * 1000
    assert store.index is not None and store.index.files[-1].reserved_entries >= 2


def test_index_with_no_room_drops_entries_and_dispatch_goes_on(open_store: Opener, monkeypatch) -> None:
    monkeypatch.setattr("ferrymq.store.index.RESERVE_ENTRIES_CHUNK", 1)
    store = open_store(index_hash_slot_num=64, index_max_num=100_000)
    assert store.put_message(inner(queue_id=0, keys="k0")).status is PutMessageStatus.PUT_OK
    store.reput()  # the consume queue file and the index file exist now

    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mf_mod.os, "posix_fallocate", no_room)
    for i in range(1, 6):
        assert store.put_message(inner(queue_id=0, keys=f"k{i}")).status is PutMessageStatus.PUT_OK
    store.reput()
    assert store.get_max_offset_in_queue("TopicA", 0) == 6, "consume queue dispatch goes on"
    assert store.index is not None and store.index.dropped_entries_total >= 5
    assert len(store.query_message("TopicA", "k0", 10, 0, 1 << 62).buffers) == 1


def _fake_statvfs(used_pct: float) -> Callable[[str], SimpleNamespace]:
    total = 1_000_000
    return lambda path: SimpleNamespace(f_blocks=total, f_bavail=int(total * (1 - used_pct / 100)))


def test_puts_refused_past_the_warning_level_and_accepted_when_space_returns(open_store: Opener,
                                                                            monkeypatch) -> None:
    store = open_store()
    assert store.put_message(inner()).status is PutMessageStatus.PUT_OK
    monkeypatch.setattr("ferrymq.store.message_store.os.statvfs", _fake_statvfs(93))
    assert store.check_disk_space() == pytest.approx(93, abs=0.01)
    assert store.put_message(inner()).status is PutMessageStatus.DISK_FULL
    assert store.put_messages([inner(), inner()]).status is PutMessageStatus.DISK_FULL
    store.reput()
    assert store.get_message("g", "TopicA", 0, 0, 32, None).message_count == 1, "reads go on"
    monkeypatch.setattr("ferrymq.store.message_store.os.statvfs", _fake_statvfs(50))
    store.check_disk_space()
    assert store.put_message(inner()).status is PutMessageStatus.PUT_OK


def test_forced_cleanup_deletes_the_oldest_segment_before_it_expires(open_store: Opener, monkeypatch) -> None:
    store = open_store(disk_space_warning_level_ratio=95)
    for _ in range(300):  # several 64 KiB segments
        store.put_message(inner(body=b"x" * 600))
    store.reput()
    segments = len(store.commit_log.mfq.files)
    assert segments >= 3
    monkeypatch.setattr("ferrymq.store.message_store.os.statvfs", _fake_statvfs(88))
    store.check_disk_space()
    assert len(store.commit_log.mfq.files) == segments - 1
    assert store.put_message(inner()).status is PutMessageStatus.PUT_OK, "88% is under the warning level"
    store.config.clean_file_forcibly_enable = False
    store.check_disk_space()
    assert len(store.commit_log.mfq.files) == segments - 1
