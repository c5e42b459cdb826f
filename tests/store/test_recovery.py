from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from store_helpers import CL_SEGMENT, assert_cqs_match_commit_log, inner, scan_records, segment_files

from ferrymq.common.message_codec import iter_records
from ferrymq.store import GetMessageStatus, MessageStore, StoreCorruptError, StoreLockedError

Opener = Callable[..., MessageStore]


def _fill(store: MessageStore, n: int, start: int = 0, body_size: int = 500) -> list[int]:
    offsets = []
    for i in range(start, start + n):
        r = store.put_message(inner(queue_id=i % 3, body=bytes([i % 251]) * body_size, keys=f"k{i}"))
        assert r.append_result is not None
        offsets.append(r.append_result.wrote_offset)
    return offsets


def _last_segment(store_root: Path) -> Path:
    return segment_files(store_root / "commitlog")[-1]


def test_clean_shutdown_and_reload(open_store: Opener, tmp_path: Path) -> None:
    a = open_store()
    _fill(a, 300)
    a.reput()
    max_phy, table = a.max_phy_offset, dict(a.commit_log.topic_queue_table)
    a.shutdown()
    assert not (tmp_path / "a" / "abort").exists()
    b = open_store()
    assert not b.last_start_was_abnormal
    assert b.max_phy_offset == max_phy and b.reput_phy_offset == max_phy
    assert b.commit_log.topic_queue_table == table
    assert_cqs_match_commit_log(b)
    r = b.put_message(inner(queue_id=0))
    assert r.append_result is not None and r.append_result.queue_offset == table[("TopicA", 0)]
    assert r.append_result.wrote_offset == max_phy


def test_store_lock_and_bad_files(open_store: Opener, tmp_path: Path, clock: object) -> None:
    a = open_store()
    with pytest.raises(StoreLockedError):
        MessageStore(a.config).load()
    _fill(a, 200)
    a.shutdown()
    first = segment_files(tmp_path / "a" / "commitlog")[0]
    with open(first, "r+b") as f:
        f.truncate(1000)  # a short non-last segment is not repairable
    with pytest.raises(StoreCorruptError):
        MessageStore(a.config).load()


def _crash_then_reload(open_store: Opener, mutate: Callable[[MessageStore], int]) -> tuple[MessageStore, int]:
    a = open_store()
    _fill(a, 400)
    a.reput()
    a.flush()
    a.flush_consume_queues()
    _fill(a, 40, start=400)  # written after the last checkpoint
    a.reput()
    expected_end = mutate(a)
    a.close_abruptly()
    b = open_store()
    assert b.last_start_was_abnormal
    return b, expected_end


def _record_offsets(store: MessageStore) -> list[int]:
    return [r[0] for r in scan_records(store)]


@pytest.mark.parametrize("where", ["mid_record_zeroed", "file_truncated"])
def test_torn_tail(open_store: Opener, tmp_path: Path, where: str) -> None:
    def mutate(a: MessageStore) -> int:
        offsets = _record_offsets(a)
        cut_record = offsets[-5]
        mf = a.commit_log.mfq.find(cut_record)
        assert mf is not None
        cut_pos = cut_record - mf.file_from_offset + 37
        path = mf.path
        a.close_abruptly()
        if where == "file_truncated":
            os.truncate(path, cut_pos)
        else:
            with open(path, "r+b") as f:
                f.seek(cut_pos)
                f.write(bytes(CL_SEGMENT - cut_pos))
        return cut_record

    b, cut = _crash_then_reload(open_store, mutate)
    assert b.max_phy_offset == cut
    assert len(_record_offsets(b)) == 435
    assert_cqs_match_commit_log(b)
    assert b.reput_phy_offset == cut
    # the store continues from the cut with consistent queue offsets
    r = b.put_message(inner(queue_id=0))
    assert r.append_result is not None and r.append_result.wrote_offset == cut
    b.reput()
    assert_cqs_match_commit_log(b)


def test_garbage_after_last_record(open_store: Opener) -> None:
    def mutate(a: MessageStore) -> int:
        end = a.max_phy_offset
        mf = a.commit_log.mfq.find(end)
        assert mf is not None
        mf.write_at(end - mf.file_from_offset, b"\xde\xad\xbe\xef" * 100)
        return end

    b, end = _crash_then_reload(open_store, mutate)
    assert b.max_phy_offset == end
    mf = b.commit_log.mfq.find(end)
    assert mf is not None and mf.mm[end - mf.file_from_offset :][:400] == bytes(400)  # tail zeroed
    assert_cqs_match_commit_log(b)


def test_corrupt_crc_byte(open_store: Opener) -> None:
    """A bit flip in a body with intact records after it is bit rot, not a torn tail: recovery keeps the
    record and everything after it (acknowledged sends are not cut away); the read path never serves it."""
    victims: list[int] = []

    def mutate(a: MessageStore) -> int:
        offsets = _record_offsets(a)
        victim = offsets[-10]
        victims.append(victim)
        mf = a.commit_log.mfq.find(victim)
        assert mf is not None
        pos = victim - mf.file_from_offset + 88  # first body byte
        mf.write_at(pos, bytes([mf.mm[pos] ^ 0x55]))
        return a.max_phy_offset

    b, end = _crash_then_reload(open_store, mutate)
    assert b.max_phy_offset == end
    assert len(scan_records(b, check_crc=False)) == 440
    assert_cqs_match_commit_log(b, check_crc=False)
    assert b.look_message_by_offset(victims[0]) is None
    assert b.query_message("TopicA", "k430", 10, 0, 1 << 62).buffers == []  # the damaged one
    assert len(b.query_message("TopicA", "k435", 10, 0, 1 << 62).buffers) == 1
    assert len(b.query_message("TopicA", "k100", 10, 0, 1 << 62).buffers) == 1


def test_corrupt_crc_byte_on_clean_start_too(open_store: Opener, tmp_path: Path) -> None:
    a = open_store()
    _fill(a, 100)
    a.shutdown()
    seg = _last_segment(tmp_path / "a")
    data = bytearray(seg.read_bytes())
    # find the last record in this segment and flip a body byte
    pos, last = 0, 0
    while struct.unpack_from(">i", data, pos + 4)[0] == -626843481:
        last = pos
        pos += struct.unpack_from(">i", data, pos)[0]
    data[last + 90] ^= 1
    seg.write_bytes(bytes(data))
    b = open_store()
    assert not b.last_start_was_abnormal
    assert len(_record_offsets(b)) == 99
    assert_cqs_match_commit_log(b)


def test_crash_without_checkpoint_redispatches_everything(open_store: Opener, tmp_path: Path) -> None:
    a = open_store()
    _fill(a, 250)
    a.reput()
    a.close_abruptly()  # no flush_consume_queues ever happened
    # lose the consume queues and index entirely
    for sub in ("consumequeue", "index"):
        for root, _dirs, files in os.walk(tmp_path / "a" / sub):
            for name in files:
                os.unlink(os.path.join(root, name))
    b = open_store()
    assert b.reput_phy_offset == b.max_phy_offset
    assert_cqs_match_commit_log(b)
    assert len(b.query_message("TopicA", "k7", 5, 0, 1 << 62).buffers) == 1


def test_crash_with_partial_cq(open_store: Opener) -> None:
    """Units written after the checkpoint survive or not; either way the queues end up complete."""
    a = open_store()
    _fill(a, 100)
    a.reput()
    a.flush()
    a.flush_consume_queues()
    _fill(a, 100, start=100)
    a.reput()
    cq = a.queues.find("TopicA", 1)
    assert cq is not None
    last = cq.mfq.last()
    assert last is not None
    last.write_at(last.wrote_position - 40, bytes(40))  # the last two units never reached disk
    a.close_abruptly()
    b = open_store()
    assert_cqs_match_commit_log(b)
    assert b.get_max_offset_in_queue("TopicA", 1) == 67
    res = b.get_message("g", "TopicA", 1, 60, 32, None)
    assert [m.queue_offset for m in iter_records(res.body())] == list(range(60, 67))


def test_flushed_data_survives_crash(open_store: Opener) -> None:
    a = open_store()
    _fill(a, 120)
    flushed = a.flush()
    assert flushed == a.max_phy_offset == a.flushed_phy_offset
    a.close_abruptly()
    b = open_store()
    assert b.max_phy_offset == flushed
    assert b.get_message("g", "TopicA", 0, 0, 64, None).status is GetMessageStatus.FOUND
    assert_cqs_match_commit_log(b)


def test_empty_segment_after_roll(open_store: Opener, tmp_path: Path) -> None:
    a = open_store()
    while len(a.commit_log.mfq.files) < 2:
        _fill(a, 1)
    a.reput()
    a.shutdown()
    seg = _last_segment(tmp_path / "a")
    seg.write_bytes(b"")  # crashed right after creating the new segment
    (tmp_path / "a" / "abort").touch()
    b = open_store()
    assert b.max_phy_offset == CL_SEGMENT
    assert_cqs_match_commit_log(b)
    r = b.put_message(inner())
    assert r.append_result is not None and r.append_result.wrote_offset == CL_SEGMENT


def test_crash_then_zeroed_tail_below_the_checkpoint(open_store: Opener, tmp_path: Path) -> None:
    """SIGKILL, then the last records of the log lost on disk (zeroed), although the checkpoint says they
    were dispatched: recovery finds the real end, drops the consume-queue units pointing past it, and the
    next put lands right after the last intact record (no hole of zeros in the log)."""
    a = open_store()
    offsets = _fill(a, 300)
    a.reput()
    a.flush()
    a.flush_consume_queues()
    assert a.checkpoint.dispatched_phy_offset == a.max_phy_offset
    a.close_abruptly()
    seg = _last_segment(tmp_path / "a")
    seg_start = int(seg.name)
    cut = offsets[280]
    with open(seg, "r+b") as fh:
        fh.seek(cut - seg_start)
        fh.write(bytes(offsets[-1] + 600 - cut))
    b = open_store()
    assert b.last_start_was_abnormal
    assert b.max_phy_offset == cut
    assert len(_record_offsets(b)) == 280
    assert_cqs_match_commit_log(b)
    r = b.put_message(inner(queue_id=0))
    assert r.append_result is not None and r.append_result.wrote_offset == cut
