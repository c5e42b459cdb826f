from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from store_helpers import CL_SEGMENT, FakeClock, assert_cqs_match_commit_log, inner, segment_files

from ferrymq.common.message import (
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    java_string_hash,
)
from ferrymq.common.message_codec import decode_record
from ferrymq.store import GetMessageStatus, MessageStore
from ferrymq.store.index import index_file_size, key_hash

Opener = Callable[..., MessageStore]


def test_query_by_key_and_uniq_key(open_store: Opener) -> None:
    store = open_store()
    for i in range(30):
        store.put_message(inner(keys=f"order-{i} shared", uniq=f"UNIQ{i:04d}"))
    store.put_message(inner(topic="Other", keys="order-3"))
    store.reput()
    res = store.query_message("TopicA", "order-3", 32, 0, 1 << 62)
    assert [decode_record(b).keys for b in res.buffers] == [["order-3", "shared"]]
    uniq = store.query_message("TopicA", "UNIQ0007", 32, 0, 1 << 62)
    assert [decode_record(b).properties["UNIQ_KEY"] for b in uniq.buffers] == ["UNIQ0007"]
    shared = store.query_message("TopicA", "shared", 10, 0, 1 << 62)
    assert len(shared.buffers) == 10 and shared.buffer_total_size == sum(map(len, shared.buffers))
    assert res.index_last_update_phy_offset == store.max_phy_offset - len(store.read_from(
        res.index_last_update_phy_offset, 1 << 20))  # fmt: skip
    assert res.index_last_update_timestamp > 0
    assert store.query_message("TopicA", "missing", 32, 0, 1 << 62).buffers == []


def test_query_respects_time_range(open_store: Opener, clock: FakeClock) -> None:
    store = open_store()
    clock.step_ms = 700
    stamps = []
    for i in range(10):
        r = store.put_message(inner(keys="k"))
        assert r.append_result is not None
        stamps.append(r.append_result.store_timestamp)
        del i
    store.reput()
    res = store.query_message("TopicA", "k", 32, stamps[3], stamps[6])
    assert sorted(decode_record(b).store_timestamp for b in res.buffers) == stamps[3:7]


def test_index_rolls_to_new_files_and_survives_restart(open_store: Opener, tmp_path: Path) -> None:
    store = open_store(index_max_num=20)
    for i in range(100):
        store.put_message(inner(keys=f"key{i}"))
    store.reput()
    files = sorted((tmp_path / "a" / "index").iterdir())
    assert len(files) >= 5
    assert all(f.stat().st_size == index_file_size(64, 20) for f in files)
    assert len(store.query_message("TopicA", "key3", 5, 0, 1 << 62).buffers) == 1
    store.shutdown()
    again = open_store(index_max_num=20)
    assert len(again.query_message("TopicA", "key97", 5, 0, 1 << 62).buffers) == 1
    assert len(again.query_message("TopicA", "key0", 5, 0, 1 << 62).buffers) == 1


def test_key_hash_is_java_abs_hash() -> None:
    assert key_hash("TopicA#k") == abs(java_string_hash("TopicA#k"))
    assert key_hash("ü#ключ") == abs(java_string_hash("ü#ключ"))
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert key_hash("polygenelubricants") == 0


def test_offset_in_queue_by_time(open_store: Opener, clock: FakeClock) -> None:
    store = open_store()
    clock.step_ms = 10
    stamps = []
    for _ in range(250):  # spans several consume queue files
        r = store.put_message(inner(queue_id=0))
        assert r.append_result is not None
        stamps.append(r.append_result.store_timestamp)
    store.reput()
    assert store.get_offset_in_queue_by_time("TopicA", 0, 0) == 0
    assert store.get_offset_in_queue_by_time("TopicA", 0, stamps[123]) == 123
    assert store.get_offset_in_queue_by_time("TopicA", 0, stamps[123] - 5) == 123
    assert store.get_offset_in_queue_by_time("TopicA", 0, stamps[-1] + 1) == 250
    assert store.get_offset_in_queue_by_time("Nope", 0, 5) == 0
    assert store.get_earliest_message_time("TopicA", 0) == stamps[0]
    assert store.get_earliest_message_time("Nope", 0) == -1
    assert store.get_message_store_timestamp("TopicA", 0, 17) == stamps[17]
    assert store.get_message_store_timestamp("TopicA", 0, 250) == -1


def _age(path: Path, ms_ago: int, now_ms: int) -> None:
    t = (now_ms - ms_ago) / 1000
    os.utime(path, (t, t))


def test_delete_expired_files(open_store: Opener, tmp_path: Path, clock: FakeClock) -> None:
    store = open_store(file_reserved_time_hours=1)
    for i in range(500):
        store.put_message(inner(queue_id=i % 2, body=b"z" * 300, keys=f"k{i}"))
    store.reput()
    segments = segment_files(tmp_path / "a" / "commitlog")
    assert len(segments) >= 4
    now = clock.now_ms
    for seg in segments:
        _age(seg, 0, now)
    assert store.delete_expired_files(now_ms=now) == 0
    for seg in segments[:2]:
        _age(seg, 2 * 3_600_000, now)
    assert store.delete_expired_files(now_ms=now) == 2
    assert store.min_phy_offset == 2 * CL_SEGMENT
    assert segment_files(tmp_path / "a" / "commitlog") == segments[2:]
    low = store.get_min_offset_in_queue("TopicA", 0)
    assert low > 0
    cq_dir = tmp_path / "a" / "consumequeue" / "TopicA" / "0"
    assert int(sorted(cq_dir.iterdir())[0].name) // 20 <= low
    res = store.get_message("g", "TopicA", 0, low, 4, None)
    assert res.status is GetMessageStatus.FOUND and res.queue_offsets[0] == low
    assert store.get_message("g", "TopicA", 0, 0, 4, None).status is GetMessageStatus.OFFSET_TOO_SMALL
    assert_cqs_match_commit_log(store)
    # everything old: all but the newest segment go, never the newest
    for seg in segments[2:]:
        _age(seg, 5 * 3_600_000, now)
    store.delete_expired_files(now_ms=now)
    assert segment_files(tmp_path / "a" / "commitlog") == segments[-1:]
    store.shutdown()
    again = open_store(file_reserved_time_hours=1)
    assert again.min_phy_offset == int(segments[-1].name)
    assert_cqs_match_commit_log(again)


def test_undispatched_segments_are_kept(open_store: Opener, tmp_path: Path, clock: FakeClock) -> None:
    store = open_store(file_reserved_time_hours=1)
    for _ in range(400):
        store.put_message(inner(body=b"z" * 300))
    assert store.delete_expired_files(now_ms=clock.now_ms + 10 * 3_600_000) == 0  # nothing dispatched yet


def test_delay_and_transaction_dispatch(open_store: Opener) -> None:
    store = open_store()
    r = store.put_message(inner(topic="SCHEDULE_TOPIC_XXXX", queue_id=3, extra={"DELAY": "4"}))
    assert r.append_result is not None
    store.put_message(inner(topic="SCHEDULE_TOPIC_XXXX", queue_id=17, extra={"DELAY": "99"}))
    p = store.put_message(inner(topic="T", keys="half", sys_flag=SYSFLAG_TRANSACTION_PREPARED))
    rb = store.put_message(inner(topic="T", keys="rolled", sys_flag=SYSFLAG_TRANSACTION_ROLLBACK))
    c = store.put_message(inner(topic="T", tags="TagA"))
    assert p.append_result is not None and rb.append_result is not None and c.append_result is not None
    assert p.append_result.queue_offset == 0 and c.append_result.queue_offset == 0
    store.reput()
    units = store.get_consume_queue_units("SCHEDULE_TOPIC_XXXX", 3, 0, 10)
    assert units == [
        (r.append_result.wrote_offset, r.append_result.wrote_bytes, r.append_result.store_timestamp + 30_000)
    ]
    (_p, _s, two_hours) = store.get_consume_queue_units("SCHEDULE_TOPIC_XXXX", 17, 0, 1)[0]
    assert two_hours - store.get_message_store_timestamp("SCHEDULE_TOPIC_XXXX", 17, 0) == 7_200_000
    t_units = store.get_consume_queue_units("T", 0, 0, 10)
    assert t_units == [(c.append_result.wrote_offset, c.append_result.wrote_bytes, java_string_hash("TagA"))]
    assert len(store.query_message("T", "half", 5, 0, 1 << 62).buffers) == 1  # prepared: indexed
    assert store.query_message("T", "rolled", 5, 0, 1 << 62).buffers == []  # rollback: not indexed
    assert_cqs_match_commit_log(store)


def test_flush_thread_concurrent_with_puts(open_store: Opener) -> None:
    store = open_store()
    stop = threading.Event()
    flushed: list[int] = []

    def flusher() -> None:
        while not stop.is_set():
            flushed.append(store.flush())
            store.flush_consume_queues()

    t = threading.Thread(target=flusher)
    t.start()
    try:
        for i in range(3000):
            assert store.put_message(inner(queue_id=i % 4, body=b"p" * 100, keys=f"k{i}")).is_ok()
            if i % 100 == 0:
                store.reput()
    finally:
        stop.set()
        t.join()
    store.reput()
    assert flushed == sorted(flushed)
    assert store.flush() == store.max_phy_offset
    assert_cqs_match_commit_log(store)


def test_async_flush_least_pages(open_store: Opener) -> None:
    store = open_store()
    store.put_message(inner(body=b"x" * 100))
    assert store.flush(least_pages=4) == 0  # fewer than 4 dirty pages: nothing to do yet
    for _ in range(200):
        store.put_message(inner(body=b"x" * 100))
    assert store.flush(least_pages=4) == store.max_phy_offset
