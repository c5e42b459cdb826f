"""Derived files deleted or cut on disk are rebuilt at the next start, whatever the checkpoint says: index files
from the ``indexfiles`` manifest (recovery.rebuild_missing_index), and consume queues that grew after the queue
offsets snapshot was last written whole (its lines are appended by every consume queue flush, before the
checkpoint, so the snapshot is never behind what the checkpoint claims)."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from store_helpers import inner

from ferrymq.common.message_codec import decode_record
from ferrymq.store import MessageStore, PutMessageStatus
from ferrymq.store.checkpoint import read_index_manifest, read_queue_offsets

Opener = Callable[..., MessageStore]
COUNT = 300  # two index entries each (UNIQ_KEY + KEYS): 600 entries, three files of 256 (make_config)


def _fill(store: MessageStore, first: int = 0, count: int = COUNT) -> None:
    for i in range(first, first + count):
        result = store.put_message(inner(queue_id=i % 2, body=b"m%d" % i, keys=f"k{i}", uniq=f"U{i:06d}"))
        assert result.status is PutMessageStatus.PUT_OK
    store.reput()


def _stop(store: MessageStore, crash: bool) -> None:
    if crash:
        store.flush()
        store.flush_consume_queues()  # the checkpoint covers everything: nothing is re-dispatched from it
        store.close_abruptly()
    else:
        store.shutdown()


def _assert_all_found(store: MessageStore, count: int = COUNT) -> None:
    begin, end = 0, 1 << 62
    missing = []
    for i in range(count):
        for key in (f"k{i}", f"U{i:06d}"):
            found = store.query_message("TopicA", key, 4, begin, end)
            if [decode_record(b).body for b in found.buffers] != [b"m%d" % i]:
                missing.append(key)
    assert not missing, f"{len(missing)} keys not found, e.g. {missing[:5]}"
    # by time: every message's store time finds it through the index's time range
    first = store.look_message_by_offset(store.min_phy_offset)
    assert first is not None
    window = store.query_message("TopicA", "k0", 4, first.store_timestamp, first.store_timestamp)
    assert [decode_record(b).body for b in window.buffers] == [b"m0"]
    # and through the consume queue
    assert store.get_offset_in_queue_by_time("TopicA", 0, first.store_timestamp) == 0


def _index_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "index").iterdir() if p.name.isdigit())


@pytest.mark.parametrize("crash", [False, True], ids=["clean-restart", "crash-restart"])
@pytest.mark.parametrize("damage", ["delete-middle", "delete-newest", "cut-oldest", "delete-all"])
def test_damaged_index_files_are_rebuilt(open_store: Opener, tmp_path: Path, crash: bool, damage: str,
                                         caplog) -> None:
    store = open_store()
    _fill(store)
    _stop(store, crash)
    root = tmp_path / "a"
    files = _index_files(root)
    assert len(files) >= 3
    assert [name for name, _ in read_index_manifest(str(root / "indexfiles"), 64, 256) or []] == \
        [f.name for f in files]
    if damage == "delete-middle":
        files[1].unlink()
    elif damage == "delete-newest":
        files[-1].unlink()
    elif damage == "cut-oldest":
        os.truncate(files[0], os.path.getsize(files[0]) // 2)
    else:
        shutil.rmtree(root / "index")
    caplog.set_level(logging.WARNING)
    store = open_store()
    assert any("rebuilt" in r.getMessage() for r in caplog.records)
    _assert_all_found(store)
    assert sorted(p.name for p in _index_files(root)) == [f.name for f in files]
    # the store goes on indexing, and the next restart (after a crash too) needs no rebuild
    _fill(store, COUNT, 20)
    _stop(store, crash)
    caplog.clear()
    store = open_store()
    assert not any("rebuilt" in r.getMessage() for r in caplog.records)
    _assert_all_found(store, COUNT + 20)


def test_intact_index_walks_nothing(open_store: Opener, caplog) -> None:
    store = open_store()
    _fill(store)
    store.shutdown()
    caplog.set_level(logging.WARNING)
    store = open_store()
    assert not any("rebuilt" in r.getMessage() for r in caplog.records)
    _assert_all_found(store)


def _max_offsets(store: MessageStore) -> list[int]:
    return [store.get_max_offset_in_queue("TopicA", q) for q in (0, 1)]


@pytest.mark.parametrize("damage", ["delete", "cut"])
def test_queue_grown_since_the_whole_snapshot_is_rebuilt_after_a_crash(open_store: Opener, tmp_path: Path,
                                                                       damage: str) -> None:
    """The queue offsets snapshot is written whole at start; a queue that grew (or was created) after it and whose
    file is then lost is still rebuilt: its lines were appended by the consume queue flush that preceded the
    checkpoint (before, the snapshot could be up to 60 s older than the checkpoint, and recovery re-dispatched
    only from the checkpoint, leaving such a queue short)."""
    store = open_store()
    _fill(store, 0, 20)
    store.flush()
    store.flush_consume_queues()
    _fill(store, 20, COUNT - 20)  # after the start's whole snapshot
    assert store.put_message(inner(topic="TopicB", body=b"b0")).status is PutMessageStatus.PUT_OK  # a new queue
    store.reput()
    store.flush()
    store.flush_consume_queues()
    store.close_abruptly()
    root = tmp_path / "a"
    assert read_queue_offsets(str(root / "queueoffsets"))[("TopicA", 1)] == COUNT // 2
    if damage == "delete":
        shutil.rmtree(root / "consumequeue" / "TopicA" / "1")
        shutil.rmtree(root / "consumequeue" / "TopicB")
    else:
        cq_file, *later = sorted(p for p in (root / "consumequeue" / "TopicA" / "1").iterdir() if p.name.isdigit())
        for extra in later:
            extra.unlink()
        with open(cq_file, "r+b") as fh:
            fh.seek(15 * 20)
            fh.write(bytes(os.path.getsize(cq_file) - 15 * 20))
    store = open_store()
    assert _max_offsets(store) == [COUNT // 2, COUNT // 2]
    result = store.get_message("g", "TopicA", 1, 0, 32, None)
    assert [decode_record(b).body for b in result.buffers][:3] == [b"m1", b"m3", b"m5"]
    if damage == "delete":
        assert store.get_max_offset_in_queue("TopicB", 0) == 1


def test_deleted_topic_lines_and_compaction(open_store: Opener, tmp_path: Path, monkeypatch) -> None:
    """A topic deletion appends its queues as gone (not rebuilt after a crash); once the appended lines outgrow the
    snapshot the flush rewrites it whole, keeping what every queue reached."""
    monkeypatch.setattr("ferrymq.store.message_store.QUEUE_OFFSETS_COMPACT_MIN_LINES", 4)
    store = open_store()
    path = str(tmp_path / "a" / "queueoffsets")
    for i in range(6):
        assert store.put_message(inner(topic=f"T{i}", body=b"x")).status is PutMessageStatus.PUT_OK
        store.reput()
        store.flush()
        store.flush_consume_queues()
    lines_before = len(open(path).read().splitlines())
    assert lines_before <= 1 + 6  # rewritten whole once the appended lines passed 4
    assert read_queue_offsets(path) == {(f"T{i}", 0): 1 for i in range(6)}
    store.delete_topic("T0")
    assert read_queue_offsets(path)[("T0", 0)] == 0
    store.close_abruptly()
    store = open_store()
    assert store.get_max_offset_in_queue("T0", 0) == 0
    assert store.get_max_offset_in_queue("T5", 0) == 1
    assert ("T0", 0) not in read_queue_offsets(path)
