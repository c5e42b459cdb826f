"""Consume queues are loaded on their first use after a restart (issue 24: a restart with 100,000 queues took
24 s, a crash restart 51.6 s): a clean restart opens no consume queue file, a crash restart opens only the queues
written after the last consume queue flush, and every recovery guarantee holds for the queues loaded later."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from store_helpers import assert_cqs_match_commit_log, inner, segment_files

from ferrymq.common.message_codec import decode_record
from ferrymq.store import MessageStore, PutMessageStatus
from ferrymq.store.checkpoint import read_queue_marks, write_queue_offsets
from ferrymq.store.mapped_file import MappedFile

Opener = Callable[..., MessageStore]
TOPICS = 40
QUEUES_PER_TOPIC = 4
#: consume queue files mapped at once: far fewer than the queues, as at estate size
SMALL_POOL = 8


@pytest.fixture
def cq_opens(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Paths of the consume queue files opened (and mapped) from now on."""
    opened: list[str] = []
    real_open = MappedFile._open

    def counting(self: MappedFile, **kwargs: bool) -> None:
        if "consumequeue" in self.path:
            opened.append(self.path)
        real_open(self, **kwargs)

    monkeypatch.setattr(MappedFile, "_open", counting)
    yield opened


def _estate(store: MessageStore) -> None:
    n = 0
    for t in range(TOPICS):
        for q in range(QUEUES_PER_TOPIC):
            assert store.put_message(inner(topic=f"T{t}", queue_id=q, body=b"b%d" % n)).status \
                is PutMessageStatus.PUT_OK
            n += 1
    store.reput()


def _body(store: MessageStore, topic: str, queue_id: int, queue_offset: int) -> bytes:
    result = store.get_message("g", topic, queue_id, queue_offset, 1, None)
    assert result.message_count == 1, (topic, queue_id, queue_offset, result.status)
    return decode_record(result.buffers[0]).body


def test_clean_restart_opens_no_consume_queue_file(open_store: Opener, cq_opens: list[str]) -> None:
    store = open_store(max_open_segment_files=SMALL_POOL)
    _estate(store)
    store.shutdown()
    cq_opens.clear()
    store = open_store(max_open_segment_files=SMALL_POOL)
    assert cq_opens == []
    assert store.queues.loaded_count == 0
    assert len(store.queues.queues) == TOPICS * QUEUES_PER_TOPIC
    # offsets answer from the snapshot; a read loads the one queue it needs
    assert store.get_max_offset_in_queue("T7", 2) == 1
    assert store.queue_count("T7") == QUEUES_PER_TOPIC
    assert _body(store, "T7", 2, 0) == b"b%d" % (7 * QUEUES_PER_TOPIC + 2)
    assert len(cq_opens) == 1 and store.queues.loaded_count == 1
    assert store.put_message(inner(topic="T9", queue_id=1, body=b"next")).status is PutMessageStatus.PUT_OK
    store.reput()
    assert _body(store, "T9", 1, 1) == b"next"
    assert_cqs_match_commit_log(store)


def test_crash_restart_opens_only_queues_written_after_the_last_flush(open_store: Opener,
                                                                      cq_opens: list[str]) -> None:
    """Regression: a crash restart loaded every queue and then reopened each one's first file to check its tail
    (min offsets corrected on first use), 2 opens per queue with a small pool; now the queues the checkpoint and the
    ``queueoffsets`` snapshot account for are not opened at all."""
    store = open_store(max_open_segment_files=SMALL_POOL)
    _estate(store)
    store.flush()
    store.flush_consume_queues()
    late = [("T3", 1), ("T20", 0), ("T39", 3)]
    for topic, queue_id in late:  # written after the last consume queue flush
        assert store.put_message(inner(topic=topic, queue_id=queue_id, body=b"late")).status \
            is PutMessageStatus.PUT_OK
    store.reput()
    store.flush()
    store.close_abruptly()
    cq_opens.clear()
    store = open_store(max_open_segment_files=SMALL_POOL)
    assert store.last_start_was_abnormal
    assert len(cq_opens) <= len(late), cq_opens
    for topic, queue_id in late:
        assert store.get_max_offset_in_queue(topic, queue_id) == 2
        assert _body(store, topic, queue_id, 1) == b"late"
    assert_cqs_match_commit_log(store)


def test_queue_zeroed_on_disk_is_rebuilt_on_its_first_use(open_store: Opener, tmp_path: Path, caplog) -> None:
    """A consume queue file zeroed in place while the store was down (its name and size intact, so the start does
    not see it): the queue holds fewer units than the snapshot says when it is loaded, and they are rebuilt from
    the commit log then, before anything is served from it."""
    store = open_store()
    for i in range(60):
        assert store.put_message(inner(queue_id=i % 2, body=b"m%d" % i)).status is PutMessageStatus.PUT_OK
    store.reput()
    store.shutdown()
    (cq_file,) = segment_files(tmp_path / "a" / "consumequeue" / "TopicA" / "1")
    with open(cq_file, "r+b") as fh:  # keep 10 of its 30 units
        fh.seek(10 * 20)
        fh.write(bytes(20 * 20))
    store = open_store()
    assert not store.queues.find("TopicA", 1).loaded
    bodies = [_body(store, "TopicA", 1, n) for n in range(30)]
    assert bodies == [b"m%d" % i for i in range(1, 60, 2)]
    assert any("rebuilding them from the commit log" in r.getMessage() for r in caplog.records)
    assert_cqs_match_commit_log(store)


def test_units_past_a_crash_cut_are_dropped_when_the_queue_is_loaded(open_store: Opener, tmp_path: Path) -> None:
    """A crash after a dispatch, then the record lost from the log (zeroed on disk): the queue's unit for it stays
    in its file, beyond what the snapshot says. The queue is not loaded at start; when it is, the unit goes, and the
    queue's next message takes its queue offset (no hole, nothing served from zeros)."""
    store = open_store()
    _estate(store)
    store.flush()
    store.flush_consume_queues()
    cut = store.max_phy_offset
    result = store.put_message(inner(topic="T5", queue_id=2, body=b"lost"))
    assert result.status is PutMessageStatus.PUT_OK
    store.reput()
    store.close_abruptly()
    segment = segment_files(tmp_path / "a" / "commitlog")[-1]
    with open(segment, "r+b") as fh:
        fh.seek(cut - int(segment.name))
        fh.write(bytes(store.max_phy_offset - cut))
    store = open_store()
    assert store.max_phy_offset == cut
    assert not store.queues.find("T5", 2).loaded
    assert store.get_max_offset_in_queue("T5", 2) == 1
    assert store.get_message("g", "T5", 2, 1, 1, None).message_count == 0
    assert store.put_message(inner(topic="T5", queue_id=2, body=b"again")).status is PutMessageStatus.PUT_OK
    store.reput()
    assert store.get_max_offset_in_queue("T5", 2) == 2
    assert _body(store, "T5", 2, 1) == b"again"
    assert_cqs_match_commit_log(store)


def test_queue_longer_than_its_snapshot_line_keeps_its_units(open_store: Opener, tmp_path: Path) -> None:
    """A snapshot line behind the queue on disk (not expected: the snapshot is written whole at every stop, and a
    crash re-dispatches what came after the last flush): the queue's first use (a put is prepared first) moves its
    next queue offset past the units it holds, so no acknowledged message is written over or left out."""
    store = open_store()
    for i in range(10):
        assert store.put_message(inner(queue_id=0, body=b"m%d" % i)).status is PutMessageStatus.PUT_OK
    store.reput()
    store.shutdown()
    path = tmp_path / "a" / "queueoffsets"
    marks = read_queue_marks(str(path))
    assert marks is not None
    marks[("TopicA", 0)] = (5, 0, 0)
    write_queue_offsets(str(path), marks)
    store = open_store()
    assert store.prepare_put("TopicA", 0, 0) is None
    assert store.put_message(inner(queue_id=0, body=b"new")).status is PutMessageStatus.PUT_OK
    store.reput()
    assert [_body(store, "TopicA", 0, n) for n in range(11)] == [b"m%d" % i for i in range(10)] + [b"new"]
    assert_cqs_match_commit_log(store)


def test_unconsumed_floor_of_queues_not_loaded(open_store: Opener) -> None:
    """The cleanup's look at where each group stands answers the same for a queue not loaded (from its snapshot
    line when the group stands at its newest message) as once it is loaded, and loads nothing for that."""
    store = open_store()
    _estate(store)
    assert store.put_message(inner(topic="T1", queue_id=0, body=b"second")).status is PutMessageStatus.PUT_OK
    store.reput()
    keys = [(f"T{t}", q) for t in range(TOPICS) for q in range(QUEUES_PER_TOPIC)]
    want = {(topic, q, n): store.unconsumed_phy_of(topic, q, n) for topic, q in keys for n in (0, 1, 2)}
    store.shutdown()
    store = open_store()
    got = {(topic, q, n): store.unconsumed_phy_of(topic, q, n) for topic, q in keys for n in (1, 2, 0)}
    assert got == want
    assert store.queues.loaded_count == 1  # T1/0 at offset 0: not its newest message
