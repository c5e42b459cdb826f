from __future__ import annotations

from collections.abc import Callable

import pytest
from store_helpers import CL_SEGMENT, assert_cqs_match_commit_log, inner

from ferrymq.common.message import encode_offset_msg_id_raw
from ferrymq.common.message_codec import decode_record, encode_batch_body, iter_records
from ferrymq.store import GetMessageStatus, MessageStore, PutMessageStatus, TagFilter

Opener = Callable[..., MessageStore]


def _fill(store: MessageStore, n: int, queues: int = 2, body_size: int = 300) -> None:
    for i in range(n):
        tags = "TagA" if i % 3 == 0 else "TagB"
        r = store.put_message(
            inner(queue_id=i % queues, body=bytes([i % 256]) * body_size, tags=tags, keys=f"k{i}")
        )
        assert r.status is PutMessageStatus.PUT_OK
    store.reput()


def test_put_assigns_offsets_and_ids(open_store: Opener) -> None:
    store = open_store()
    r0 = store.put_message(inner(queue_id=1))
    r1 = store.put_message(inner(queue_id=1))
    r2 = store.put_message(inner(queue_id=2))
    assert r0.is_ok() and r0.append_result is not None and r1.append_result is not None
    assert r2.append_result is not None
    assert (r0.append_result.queue_offset, r1.append_result.queue_offset, r2.append_result.queue_offset) == (
        0,
        1,
        0,
    )
    assert r0.append_result.wrote_offset == 0
    assert r1.append_result.wrote_offset == r0.append_result.wrote_bytes
    host = inner().store_host
    assert r1.append_result.msg_id == encode_offset_msg_id_raw(host, r1.append_result.wrote_offset)
    assert store.max_phy_offset == sum(r.append_result.wrote_bytes for r in (r0, r1, r2) if r.append_result)
    assert store.reput_phy_offset == 0  # puts do no consume queue work
    assert store.get_max_offset_in_queue("TopicA", 1) == 0
    assert store.reput() == 3
    assert store.get_max_offset_in_queue("TopicA", 1) == 2
    ext = store.look_message_by_offset(r1.append_result.wrote_offset)
    assert ext is not None and ext.queue_offset == 1 and ext.queue_id == 1 and ext.body == b"hello"
    assert ext.store_timestamp == r1.append_result.store_timestamp
    assert store.select_one_message_by_offset(r1.append_result.wrote_offset + 1) is None


def test_put_get_across_segment_rolls(open_store: Opener) -> None:
    store = open_store()
    _fill(store, 900)
    assert len(store.commit_log.mfq.files) > 3  # rolled several times
    assert_cqs_match_commit_log(store)
    # every full segment ends with a BLANK filler; no record spans segments
    seen = 0
    offset = 0
    while True:
        res = store.get_message("g", "TopicA", 0, offset, 32, None)
        if res.status is not GetMessageStatus.FOUND:
            assert res.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
            break
        msgs = list(iter_records(res.body()))
        assert [m.queue_offset for m in msgs] == res.queue_offsets
        assert res.queue_offsets == list(range(offset, offset + len(msgs)))
        for m in msgs:
            assert m.phy_offset // CL_SEGMENT == (m.phy_offset + m.store_size - 1) // CL_SEGMENT
        seen += len(msgs)
        offset = res.next_begin_offset
    assert seen == 450


def test_batch_put_is_one_contiguous_write(open_store: Opener) -> None:
    store = open_store()
    store.put_message(inner(queue_id=0))
    batch = [inner(queue_id=0, body=f"m{i}".encode(), uniq=f"U{i}") for i in range(5)]
    r = store.put_messages(batch)
    assert r.status is PutMessageStatus.PUT_OK and r.append_result is not None
    ar = r.append_result
    assert ar.queue_offset == 1 and ar.msg_num == 5
    assert len(ar.msg_ids) == 5 and ar.msg_id == ",".join(ar.msg_ids)
    assert ar.record_offsets[0] == ar.wrote_offset
    assert store.max_phy_offset == ar.wrote_offset + ar.wrote_bytes
    store.reput()
    res = store.get_message("g", "TopicA", 0, 1, 32, None)
    assert [m.body for m in iter_records(res.body())] == [f"m{i}".encode() for i in range(5)]
    assert [m.phy_offset for m in iter_records(res.body())] == list(ar.record_offsets)
    # mixed queues are illegal
    bad = store.put_messages([inner(queue_id=0), inner(queue_id=1)])
    assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL


def test_batch_rolls_as_a_whole(open_store: Opener) -> None:
    store = open_store()
    while store.max_phy_offset < CL_SEGMENT - 3000:
        store.put_message(inner(body=b"x" * 1000))
    r = store.put_messages([inner(body=b"y" * 1000) for _ in range(5)])
    assert r.append_result is not None and r.append_result.wrote_offset == CL_SEGMENT
    store.reput()
    assert_cqs_match_commit_log(store)


def test_illegal_messages(open_store: Opener) -> None:
    store = open_store(max_message_size=1000)
    assert store.put_message(inner(body=b"x" * 1001)).status is PutMessageStatus.MESSAGE_ILLEGAL
    assert store.put_message(inner(topic="T" * 128)).status is PutMessageStatus.MESSAGE_ILLEGAL
    assert store.put_message(inner(topic="a/b")).status is PutMessageStatus.MESSAGE_ILLEGAL
    big_props = inner(extra={"P": "v" * 33000})
    assert store.put_message(big_props).status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    assert store.max_phy_offset == 0
    assert store.put_message(inner(body=b"x" * 1000)).status is PutMessageStatus.PUT_OK


def test_slave_refuses_puts(open_store: Opener) -> None:
    store = open_store(broker_role="SLAVE")
    assert store.put_message(inner()).status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def test_tag_filter(open_store: Opener) -> None:
    store = open_store()
    _fill(store, 60, queues=1, body_size=10)
    res = store.get_message("g", "TopicA", 0, 0, 32, TagFilter("TagA"))
    msgs = list(iter_records(res.body()))
    assert res.status is GetMessageStatus.FOUND
    assert all(m.tags == "TagA" for m in msgs)
    assert [m.queue_offset for m in msgs] == list(range(0, 60, 3))
    assert res.next_begin_offset == 60  # skipped non-matching entries count
    both = store.get_message("g", "TopicA", 0, 0, 100, TagFilter(" TagA || TagB "))
    assert both.message_count == 32  # in-memory count cap
    assert both.next_begin_offset == 32
    none = store.get_message("g", "TopicA", 0, 0, 32, TagFilter("TagC"))
    assert none.status is GetMessageStatus.NO_MATCHED_MESSAGE and none.next_begin_offset == 60
    for sub in ("*", "", None):
        assert store.get_message("g", "TopicA", 0, 0, 5, TagFilter(sub)).message_count == 5


class _CollidingFilter(TagFilter):
    """Matches every CQ code (as a hash collision would); the commit log check must still filter."""

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        return True


def test_tag_filter_checks_record_tags(open_store: Opener) -> None:
    store = open_store()
    _fill(store, 9, queues=1, body_size=10)
    res = store.get_message("g", "TopicA", 0, 0, 32, _CollidingFilter("TagA"))
    assert [decode_record(b).tags for b in res.buffers] == ["TagA"] * 3


def test_offset_statuses(open_store: Opener) -> None:
    store = open_store()
    res = store.get_message("g", "TopicA", 0, 5, 32, None)
    assert res.status is GetMessageStatus.NO_MESSAGE_IN_QUEUE and res.next_begin_offset == 0
    _fill(store, 10, queues=1, body_size=10)
    assert store.get_message("g", "TopicA", 0, 10, 32, None).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    bad = store.get_message("g", "TopicA", 0, 11, 32, None)
    assert bad.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY and bad.next_begin_offset == 0  # min is 0
    assert (bad.min_offset, bad.max_offset) == (0, 10)
    ok = store.get_message("g", "TopicA", 0, 3, 4, None)
    assert ok.status is GetMessageStatus.FOUND and ok.message_count == 4 and ok.next_begin_offset == 7


def test_offset_too_small_and_removing(open_store: Opener, clock: object) -> None:
    store = open_store()
    _fill(store, 600, queues=1, body_size=300)
    assert len(store.commit_log.mfq.files) >= 3
    # drop the oldest segment by hand (as retention would) without trimming the consume queue
    store.commit_log.mfq.delete_first(1)
    res = store.get_message("g", "TopicA", 0, 0, 8, None)
    assert res.status is GetMessageStatus.MESSAGE_WAS_REMOVING
    store.queues.delete_expired(store.min_phy_offset)
    low = store.get_min_offset_in_queue("TopicA", 0)
    assert low > 0
    small = store.get_message("g", "TopicA", 0, 0, 8, None)
    assert small.status is GetMessageStatus.OFFSET_TOO_SMALL and small.next_begin_offset == low
    over = store.get_message("g", "TopicA", 0, 10_000, 8, None)
    assert over.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY and over.next_begin_offset == 600


def test_slave_keeps_request_offset(open_store: Opener) -> None:
    store = open_store(broker_role="SLAVE")
    res = store.get_message("g", "TopicA", 0, 5, 32, None)
    assert res.status is GetMessageStatus.NO_MESSAGE_IN_QUEUE and res.next_begin_offset == 5


def test_in_disk_limits(open_store: Opener) -> None:
    store = open_store(total_memory_bytes=100, access_message_in_memory_max_ratio=40)
    _fill(store, 40, queues=1, body_size=10_000)
    res = store.get_message("g", "TopicA", 0, 0, 32, None)
    # "in disk": at most 8 messages and 64 KiB
    assert res.message_count == 6 and res.buffer_total_size <= 64 * 1024
    assert res.suggest_pulling_from_slave


def test_cq_scan_cap(open_store: Opener) -> None:
    store = open_store(mapped_file_size_consume_queue=20 * 5000)
    for _ in range(1000):
        store.put_message(inner(queue_id=0, body=b"x", tags="nope"))
    store.reput()
    res = store.get_message("g", "TopicA", 0, 0, 1, TagFilter("other"))
    assert res.status is GetMessageStatus.NO_MATCHED_MESSAGE
    assert res.next_begin_offset == 800  # 16000 bytes of units scanned
    res = store.get_message("g", "TopicA", 0, 0, 1000, TagFilter("other"))
    assert res.next_begin_offset == 1000


def test_offset_found_null(open_store: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store()
    _fill(store, 10, queues=1, body_size=10)
    cq = store.queues.find("TopicA", 0)
    assert cq is not None
    # unit file unreadable (patched on the class: consume queues have __slots__)
    monkeypatch.setattr(type(cq), "get_units_buffer", lambda self, offset, max_bytes: None)
    res = store.get_message("g", "TopicA", 0, 3, 32, None)
    assert res.status is GetMessageStatus.OFFSET_FOUND_NULL
    assert res.next_begin_offset == 100  # start of the next consume queue file (100 units per file)


def test_topic_queue_ids_and_delete_topic(open_store: Opener) -> None:
    store = open_store()
    store.put_message(inner(topic="A", queue_id=0))
    store.put_message(inner(topic="A", queue_id=3))
    store.put_message(inner(topic="B", queue_id=1))
    store.reput()
    assert store.topic_queue_ids() == {"A": [0, 3], "B": [1]}
    store.delete_topic("A")
    assert store.topic_queue_ids() == {"B": [1]}
    r = store.put_message(inner(topic="A", queue_id=0))
    assert r.append_result is not None and r.append_result.queue_offset == 0


def test_runtime_info(open_store: Opener) -> None:
    store = open_store()
    _fill(store, 5, queues=1)
    info = store.runtime_info()
    assert info["commitLogMaxOffset"] == str(store.max_phy_offset)
    assert info["commitLogMinOffset"] == "0"
    assert info["dispatchBehindBytes"] == "0"
    assert info["putMessageTotal"] == "5"


def test_segment_creation_failure_answers_create_mapedfile_failed(open_store: Opener, monkeypatch) -> None:
    """A full segment whose successor cannot be created: every put kind answers CREATE_MAPEDFILE_FAILED and
    stores no record (the old segment ends with its BLANK filler; native and pure paths alike)."""
    store = open_store()
    while store.max_phy_offset < CL_SEGMENT - 3000:
        store.put_message(inner(body=b"x" * 1000))
    log_files = store.commit_log.mfq
    real_create = type(log_files).create_file

    def no_file(self: object, *args: object) -> object:
        if self is log_files:  # the commit log's segments only (MappedFileQueue has __slots__: patched on the class)
            raise OSError("disk full")
        return real_create(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(type(log_files), "create_file", no_file)
    failed = PutMessageStatus.CREATE_MAPEDFILE_FAILED
    assert store.put_message(inner(body=b"y" * 4000)).status is failed
    assert store.put_messages([inner(body=b"y" * 1000) for _ in range(4)]).status is failed
    log = store.commit_log
    if log.native is not None:
        host = bytes([127, 0, 0, 1, 0, 0, 0x2A, 0x9F])
        one = store.put_one_raw("TopicA", 0, b"y" * 4000, b"TAGS\x01t", b"C", 0, 0, 1, host, host, 0)
        assert one is not None and one[0].status is failed and one[1] is True
        batch = encode_batch_body([(0, b"y" * 1000, "TAGS\x01t")] * 4)
        raw = store.put_batch_raw("TopicA", 0, batch, b"", b"C", 0, 1, host, host, 0)
        assert raw is not None and raw.status is failed
    assert store.max_phy_offset == CL_SEGMENT and len(log.mfq.files) == 1
