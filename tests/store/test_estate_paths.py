"""The store's whole-table paths stay bounded at estate size (issue 24): a move of the commit log start is O(1)
(each queue corrects its min offset on its next use), the expired consume queue files go in bounded steps run by
the disk check's timer, and a topic's queues are found without a walk of every queue."""

from __future__ import annotations

from collections.abc import Callable

from store_helpers import inner

from ferrymq.store import MessageStore, PutMessageStatus

Opener = Callable[..., MessageStore]
NOW_MS = 4_000_000_000_000  # every segment but the newest has expired


def _put(store: MessageStore, topic: str, queue_id: int, count: int) -> None:
    for _ in range(count):
        assert store.put_message(inner(topic=topic, queue_id=queue_id, body=b"x" * 200)).status \
            is PutMessageStatus.PUT_OK
    store.reput()


def test_expired_consume_queue_files_go_in_bounded_steps(open_store: Opener, monkeypatch) -> None:
    store = open_store()
    for q in range(8):
        _put(store, "TopicA", q, 150)  # two consume queue files per queue (100 units each), several segments
    assert len(store.commit_log.mfq.files) > 3
    files_before = sum(len(cq.mfq.files) for cq in store.queues.queues.values())
    visited: list[int] = []
    real_delete = type(store.queues.queues[("TopicA", 0)]).delete_expired

    def counting(cq, min_phy):  # type: ignore[no-untyped-def]
        visited.append(1)
        return real_delete(cq, min_phy)

    monkeypatch.setattr("ferrymq.store.consume_queue.ConsumeQueue.delete_expired", counting)
    # no time at all: a step stops at its first look at the clock, right after a queue with files to delete
    monkeypatch.setattr("ferrymq.store.queue_table.EXPIRE_STEP_BUDGET_S", 0.0)
    # the steps below are check_disk_space's; a disk this machine's other work has filled past
    # diskMaxUsedSpaceRatio would make it delete expired files (and visit queues) in the same call
    monkeypatch.setattr("ferrymq.store.message_store.disk_used_ratio", lambda st: 10.0)
    assert store.delete_expired_files(NOW_MS) > 0
    assert len(visited) == 1 and store.expire_pending()
    # min offsets follow the new log start at once, before their files go
    min_phy = store.min_phy_offset
    for q in range(8):
        first = store.get_min_offset_in_queue("TopicA", q)
        if first == store.get_max_offset_in_queue("TopicA", q):
            continue  # every message of the queue was in the deleted segments
        unit = store.queues.queues[("TopicA", q)].get_unit(first)
        assert unit is not None and unit[0] >= min_phy
    steps = 0
    while store.expire_pending():
        store.check_disk_space()  # the timer that runs the steps
        steps += 1
    assert steps == 7 and len(visited) == 8
    assert sum(len(cq.mfq.files) for cq in store.queues.queues.values()) < files_before


def test_log_start_move_maps_no_queue_file(open_store: Opener) -> None:
    store = open_store()
    for q in range(4):
        _put(store, "TopicA", q, 30)
    pool = store.queues.pool
    for cq in store.queues.queues.values():
        for mf in cq.mfq.files:
            mf.release()
    opened = pool.mapped_files
    store.queues.correct_min_offsets(store.min_phy_offset + 1)
    assert pool.mapped_files == opened  # O(1): nothing opened
    assert store.get_min_offset_in_queue("TopicA", 0) == 1  # corrected on use


def test_topic_queue_index(open_store: Opener) -> None:
    store = open_store()
    for q in (0, 3):
        _put(store, "TopicA", q, 1)
    _put(store, "TopicB", 1, 1)
    assert store.queue_count("TopicA") == 4 and store.queue_count("TopicB") == 2 and store.queue_count("X") == 0
    assert store.topic_queue_ids() == {"TopicA": [0, 3], "TopicB": [1]}
    store.delete_topic("TopicA")
    assert store.queue_count("TopicA") == 0 and store.topic_queue_ids() == {"TopicB": [1]}
    _put(store, "TopicA", 2, 1)  # created again
    assert store.queue_count("TopicA") == 3
    store.shutdown()
    store = open_store()
    assert store.topic_queue_ids() == {"TopicA": [2], "TopicB": [1]}
