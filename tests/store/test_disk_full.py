"""A full disk is an expected outcome, never a crash: files written through a memory map have their blocks
reserved first, and the store refuses puts past diskSpaceWarningLevelRatio (store/message_store.py)."""

from __future__ import annotations

import errno
import os
import time
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
    avail = int(total * (1 - used_pct / 100))
    return lambda path: SimpleNamespace(f_blocks=total, f_bfree=avail, f_bavail=avail, f_frsize=4096)


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
    store = open_store(disk_space_warning_level_ratio=95, clean_file_forcibly_enable=True)
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


def test_disk_ratio_is_what_df_shows_not_counting_root_reserved_blocks(open_store: Opener, monkeypatch) -> None:
    """df: used / (used + available); 1 - f_bavail/f_blocks counted the blocks reserved for root as used (85%
    where df showed 63%) and refused sends with plenty of room."""
    store = open_store(disk_space_warning_level_ratio=80)
    # 1000 blocks: 256 used, 150 available to users, 594 reserved for root
    reserved = SimpleNamespace(f_blocks=1000, f_bfree=744, f_bavail=150, f_frsize=4096)
    monkeypatch.setattr("ferrymq.store.message_store.os.statvfs", lambda path: reserved)
    assert store.check_disk_space() == pytest.approx(100 * 256 / 406)
    assert store.put_message(inner()).status is PutMessageStatus.PUT_OK


def _fill_segments(store: MessageStore, n: int = 300) -> int:
    for _ in range(n):  # several 64 KiB segments
        assert store.put_message(inner(body=b"x" * 600)).status is PutMessageStatus.PUT_OK
    store.reput()
    segments = len(store.commit_log.mfq.files)
    assert segments >= 3
    return segments


def test_forced_cleanup_never_deletes_young_unconsumed_segments_by_default(open_store: Opener, monkeypatch,
                                                                          caplog) -> None:
    store = open_store()
    assert not store.config.clean_file_forcibly_enable
    segments = _fill_segments(store)
    monkeypatch.setattr("ferrymq.store.message_store.os.statvfs", _fake_statvfs(88))
    for _ in range(3):
        store.check_disk_space()
    assert len(store.commit_log.mfq.files) == segments, "acknowledged, unconsumed messages were deleted"
    assert store.get_min_offset_in_queue("TopicA", 0) == 0
    assert sum("no commit log segment is both older" in r.getMessage() for r in caplog.records) == 1
    assert store.put_message(inner()).status is PutMessageStatus.PUT_OK, "88% is under the warning level"
    monkeypatch.setattr("ferrymq.store.message_store.os.statvfs", _fake_statvfs(93))
    store.check_disk_space()
    assert store.put_message(inner()).status is PutMessageStatus.DISK_FULL
    assert "93.0% used" in store.disk_full_detail()
    assert len(store.commit_log.mfq.files) == segments


def test_forced_cleanup_by_default_deletes_only_expired_segments_every_group_consumed(open_store: Opener) -> None:
    store = open_store()
    segments = _fill_segments(store)
    second = store.commit_log.mfq.files[1]
    floor = {"phy": second.file_from_offset + 100}  # a group stands inside the second segment
    store.unconsumed_phy_floor = lambda: floor["phy"]
    young = time.time_ns() // 1_000_000  # segment ages are their files' mtimes
    later = young + (store.config.file_reserved_time_hours + 1) * 3_600_000
    assert store.delete_expired_files(young, only_consumed=True) == 0, "younger than fileReservedTime"
    assert store.delete_expired_files(later, only_consumed=True) == 1, "the first segment is consumed and expired"
    assert store.min_phy_offset == second.file_from_offset
    floor["phy"] = store.max_phy_offset
    assert store.delete_expired_files(later, only_consumed=True) == segments - 2, "all consumed: all but the newest"


def test_unconsumed_phy_of_a_consume_queue_position(open_store: Opener) -> None:
    store = open_store()
    for _ in range(3):
        store.put_message(inner(queue_id=1))
    store.reput()
    units = store.get_consume_queue_units("TopicA", 1, 0, 3)
    assert store.unconsumed_phy_of("TopicA", 1, 0) == units[0][0]
    assert store.unconsumed_phy_of("TopicA", 1, 2) == units[2][0]
    assert store.unconsumed_phy_of("TopicA", 1, 3) is None, "consumed to the end"
    assert store.unconsumed_phy_of("TopicA", 7, 0) is None, "no such queue"
