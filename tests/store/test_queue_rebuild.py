"""A consume queue deleted or cut on disk is rebuilt from the commit log at the next start, clean or after a
crash, whatever the checkpoint says (recovery.rebuild_short_queues, the ``queueoffsets`` snapshot)."""

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
from ferrymq.store.checkpoint import read_queue_offsets

Opener = Callable[..., MessageStore]
PER_QUEUE = 200


def _fill(store: MessageStore) -> None:
    for i in range(PER_QUEUE):
        for queue_id in (0, 1):
            assert store.put_message(inner(queue_id=queue_id, body=b"m%d" % i, keys=f"k{queue_id}-{i}")).status \
                is PutMessageStatus.PUT_OK
    store.reput()


def _bodies(store: MessageStore, queue_id: int) -> list[bytes]:
    out: list[bytes] = []
    queue_offset = 0
    while True:
        result = store.get_message("g", "TopicA", queue_id, queue_offset, 32, None)
        if not result.message_count:
            return out
        out.extend(decode_record(b).body for b in result.buffers)
        queue_offset = result.next_begin_offset


def _max_offsets(store: MessageStore) -> list[int]:
    return [store.get_max_offset_in_queue("TopicA", q) for q in (0, 1)]


@pytest.mark.parametrize("crash", [False, True], ids=["clean-restart", "crash-restart"])
def test_deleted_consume_queue_is_rebuilt(open_store: Opener, tmp_path: Path, crash: bool, caplog,
                                          monkeypatch) -> None:
    store = open_store()
    _fill(store)
    if crash:
        store.flush()
        store.flush_consume_queues()  # the checkpoint covers everything: nothing left to re-dispatch
        store.close_abruptly()
    else:
        store.shutdown()
    shutil.rmtree(tmp_path / "a" / "consumequeue" / "TopicA" / "1")
    caplog.set_level(logging.WARNING)
    store = open_store()
    assert _max_offsets(store) == [PER_QUEUE, PER_QUEUE]
    assert store.get_min_offset_in_queue("TopicA", 1) == 0
    assert _bodies(store, 1) == [b"m%d" % i for i in range(PER_QUEUE)]
    assert any("rebuilding them from the commit log" in r.getMessage() for r in caplog.records)
    # a new message continues the queue, and a restart after a crash keeps it whole
    assert store.put_message(inner(queue_id=1, body=b"next")).status is PutMessageStatus.PUT_OK
    store.reput()
    store.flush()
    store.flush_consume_queues()
    store.close_abruptly()
    store = open_store()
    assert _bodies(store, 1)[-2:] == [b"m%d" % (PER_QUEUE - 1), b"next"]


def test_cut_consume_queue_is_rebuilt(open_store: Opener, tmp_path: Path) -> None:
    store = open_store()
    _fill(store)
    store.shutdown()
    queue_dir = tmp_path / "a" / "consumequeue" / "TopicA" / "0"
    files = sorted(queue_dir.iterdir())
    for extra in files[1:]:
        extra.unlink()
    with open(files[0], "r+b") as fh:  # keep 30 units of the first file, zero the rest
        fh.seek(30 * 20)
        fh.write(bytes(os.path.getsize(files[0]) - 30 * 20))
    store = open_store()
    assert _max_offsets(store) == [PER_QUEUE, PER_QUEUE]
    assert _bodies(store, 0) == [b"m%d" % i for i in range(PER_QUEUE)]


def test_deleted_topic_is_not_rebuilt_after_a_crash(open_store: Opener) -> None:
    store = open_store()
    _fill(store)
    store.flush()
    store.flush_consume_queues()
    store.delete_topic("TopicA")
    store.close_abruptly()
    store = open_store()
    assert _max_offsets(store) == [0, 0]


def test_intact_store_walks_nothing(open_store: Opener, tmp_path: Path, caplog) -> None:
    store = open_store()
    _fill(store)
    store.shutdown()
    assert read_queue_offsets(str(tmp_path / "a" / "queueoffsets")) == {("TopicA", 0): PER_QUEUE,
                                                                       ("TopicA", 1): PER_QUEUE}
    caplog.set_level(logging.WARNING)
    store = open_store()
    assert _max_offsets(store) == [PER_QUEUE, PER_QUEUE]
    assert not any("rebuild" in r.getMessage() for r in caplog.records)
