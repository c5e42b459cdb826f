"""The read path never serves a damaged record: magic, size, physical offset and BODYCRC are checked on
every record a pull, a look-up by offset or a key query returns (store/reader.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from store_helpers import flip_byte, inner

from ferrymq.common.message_codec import iter_records, verify_stored_record
from ferrymq.store import GetMessageStatus, MessageStore

Opener = Callable[..., MessageStore]
BODY = 500


def _fill(store: MessageStore, n: int) -> list[int]:
    offsets = []
    for i in range(n):
        r = store.put_message(inner(queue_id=0, body=bytes([i % 251]) * BODY, keys=f"k{i}"))
        assert r.append_result is not None
        offsets.append(r.append_result.wrote_offset)
    store.reput()
    return offsets


def _pull_all(store: MessageStore) -> tuple[list[int], list[GetMessageStatus]]:
    got: list[int] = []
    statuses = []
    offset = 0
    for _ in range(1000):
        res = store.get_message("g", "TopicA", 0, offset, 32, None)
        statuses.append(res.status)
        got.extend(m.queue_offset for m in iter_records(res.body()))
        for m in iter_records(res.body()):
            assert m.body == bytes([m.queue_offset % 251]) * BODY, f"damaged body served at {m.queue_offset}"
        if res.next_begin_offset == offset or res.next_begin_offset >= store.get_max_offset_in_queue("TopicA", 0):
            break
        offset = res.next_begin_offset
    return got, statuses


# body byte, BODYCRC, magic, TOTALSIZE, PHYSICALOFFSET
@pytest.mark.parametrize("rel", [88 + 17, 8, 4, 0, 30])
def test_damaged_record_in_an_old_segment_is_never_served(open_store: Opener, rel: int) -> None:
    store = open_store()
    offsets = _fill(store, 400)  # 4 segments of 64 KiB
    assert len(store.commit_log.mfq.files) >= 4
    victims = [3, 150, 151, 399]  # the first segment, two neighbours in the middle, the last record
    for q in victims:
        flip_byte(store, offsets[q], rel)
    got, _ = _pull_all(store)
    assert got == [q for q in range(400) if q not in victims]
    assert store.reader.corrupt_record_total >= len(victims)
    assert store.look_message_by_offset(offsets[150]) is None
    assert store.look_message_by_offset(offsets[152]) is not None
    assert store.query_message("TopicA", "k3", 10, 0, 1 << 62).buffers == []
    assert len(store.query_message("TopicA", "k4", 10, 0, 1 << 62).buffers) == 1


def test_a_pull_of_only_damaged_records_says_so_and_moves_on(open_store: Opener) -> None:
    store = open_store()
    offsets = _fill(store, 10)
    for q in range(5, 10):
        flip_byte(store, offsets[q], 88)
    res = store.get_message("g", "TopicA", 0, 0, 32, None)
    assert res.status is GetMessageStatus.FOUND and res.queue_offsets == [0, 1, 2, 3, 4]
    res = store.get_message("g", "TopicA", 0, 5, 32, None)
    assert res.status is GetMessageStatus.MESSAGE_CORRUPT
    assert res.message_count == 0 and res.next_begin_offset == 10


def test_consume_queue_pointing_into_zeros_is_not_served(open_store: Opener) -> None:
    """A consume-queue unit whose record was zeroed (a torn tail the queue outlived) serves nothing."""
    store = open_store()
    offsets = _fill(store, 20)
    mf = store.commit_log.mfq.find(offsets[15])
    assert mf is not None
    start = offsets[15] - mf.file_from_offset
    mf.write_at(start, bytes(mf.wrote_position - start))
    got, _ = _pull_all(store)
    assert got == list(range(15))


def test_verify_stored_record_accepts_every_intact_record(open_store: Opener, tmp_path: Path) -> None:
    store = open_store()
    offsets = _fill(store, 50)
    for phy in offsets:
        record = store.select_one_message_by_offset(phy)
        assert record is not None and verify_stored_record(record, phy)
        assert not verify_stored_record(record, phy + 1)
        assert not verify_stored_record(record[:-1], phy)
