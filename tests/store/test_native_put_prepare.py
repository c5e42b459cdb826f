"""``MessageStore.prepare_put`` on the send path: a queue whose consume queue file is ready (mapped, open, its
reserved blocks past the next unit) is not prepared again on every put, and everything that makes the file not
ready (a released or destroyed file, the end of the reserved chunk, the end of the file) takes the full
preparation again, with its refusals (store/message_store.py)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

import pytest
from store_helpers import assert_cqs_match_commit_log, inner

from ferrymq.store import MessageStore, PutMessageStatus
from ferrymq.store import message_store as message_store_mod
from ferrymq.store.consume_queue import CQ_RESERVE_CHUNK_BYTES
from ferrymq.store.mapped_file import MappedFile
from ferrymq.store.results import GetMessageStatus

Opener = Callable[..., MessageStore]
UNIT = 20
#: a consume queue file as large as RocketMQ's default (300,000 units): sparse, so cheap here too
BIG_CQ_FILE = 300_000 * UNIT


def _count_preparations(store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    calls: list[tuple[str, int, int]] = []
    real = store.queues.prepare_unit

    def spy(topic: str, queue_id: int, queue_offset: int) -> None:
        calls.append((topic, queue_id, queue_offset))
        real(topic, queue_id, queue_offset)

    monkeypatch.setattr(store.queues, "prepare_unit", spy)
    return calls


def _put(store: MessageStore, topic: str, queue_id: int = 0) -> Any:
    status = store.prepare_put(topic, queue_id, 0)
    if status is not None:
        return status
    result = store.put_message(inner(topic=topic, queue_id=queue_id))
    assert result.status is PutMessageStatus.PUT_OK
    store.reput()
    return None


def _count(store: MessageStore, topic: str, queue_id: int = 0) -> int:
    """Units dispatched to the queue; its first and last message read back."""
    n = store.get_max_offset_in_queue(topic, queue_id)
    for offset in {0, n - 1} if n else ():
        got = store.get_message("g", topic, queue_id, offset, 1, None)
        assert got.status is GetMessageStatus.FOUND, got.status
    return n


def test_a_ready_queue_is_not_prepared_again_on_every_put(open_store: Opener,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    calls = _count_preparations(store, monkeypatch)
    for _ in range(50):
        for queue_id in range(4):
            assert _put(store, "Hot", queue_id) is None
    assert calls == [("Hot", q, 0) for q in range(4)]  # once per queue: its first put
    assert all(_count(store, "Hot", q) == 50 for q in range(4))
    assert_cqs_match_commit_log(store)


def _released_cold_file(store: MessageStore) -> MappedFile:
    """A put to queue ("Cold", 0), then its file released, as the open-file pool does under pressure."""
    assert _put(store, "Cold") is None
    cq = store.queues.find("Cold", 0)
    assert cq is not None
    mf = cq.mfq.last()
    assert mf is not None and mf.release() and not mf.is_mapped
    return mf


def test_a_released_file_is_mapped_again_before_the_put(open_store: Opener,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    mf = _released_cold_file(store)
    calls = _count_preparations(store, monkeypatch)
    assert store.prepare_put("Cold", 0, 0) is None
    assert calls == [("Cold", 0, 1)] and mf.is_mapped


def test_a_released_file_that_cannot_be_reopened_refuses_the_put(open_store: Opener,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    _released_cold_file(store)
    real_open = os.open

    def no_descriptor(path: str, flags: int, mode: int = 0o777, **kw: object) -> int:
        if "/consumequeue/" in str(path):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", no_descriptor)
    assert store.prepare_put("Cold", 0, 0) is PutMessageStatus.OPEN_FILES_EXHAUSTED
    monkeypatch.undo()
    assert _put(store, "Cold") is None and _count(store, "Cold") == 2


def test_the_next_chunk_is_reserved_and_a_full_disk_refuses_it(open_store: Opener,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    units_per_chunk = CQ_RESERVE_CHUNK_BYTES // UNIT
    for _ in range(units_per_chunk):
        assert _put(store, "Grow") is None
    cq = store.queues.find("Grow", 0)
    assert cq is not None
    last = cq.mfq.last()
    assert last is not None and last.reserved_position == CQ_RESERVE_CHUNK_BYTES
    assert last.wrote_position + UNIT > last.reserved_position  # the next unit needs the next chunk

    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    assert store.prepare_put("Grow", 0, 0) is PutMessageStatus.DISK_FULL
    monkeypatch.undo()
    assert _put(store, "Grow") is None
    assert last.reserved_position == 2 * CQ_RESERVE_CHUNK_BYTES
    assert _count(store, "Grow") == units_per_chunk + 1


def test_a_full_file_is_followed_by_the_next_one(open_store: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    units_per_file = 8
    store = open_store(mapped_file_size_consume_queue=units_per_file * UNIT)
    calls = _count_preparations(store, monkeypatch)
    for _ in range(3 * units_per_file + 1):
        assert _put(store, "Roll") is None
    cq = store.queues.find("Roll", 0)
    assert cq is not None and len(cq.mfq.files) == 4
    assert [c[2] for c in calls] == [0, 8, 16, 24]  # the first put into each file
    assert_cqs_match_commit_log(store)


def test_a_deleted_and_recreated_queue_gets_a_new_file(open_store: Opener) -> None:
    store = open_store(mapped_file_size_consume_queue=BIG_CQ_FILE)
    for _ in range(3):
        assert _put(store, "Gone") is None
    old = store.queues.find("Gone", 0)
    assert old is not None
    old_file = old.mfq.last()
    store.delete_topic("Gone")
    assert old_file is not None and old_file.closed
    assert _put(store, "Gone") is None
    new = store.queues.find("Gone", 0)
    assert new is not None and new is not old and new.mfq.last() is not old_file
    assert _count(store, "Gone") == 1  # the queue starts again at 0 (the old records stay in the log, unlisted)


def test_the_remembered_files_stay_bounded(open_store: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(message_store_mod, "PREPARED_QUEUES_MAX", 8)
    store = open_store()
    for queue_id in range(30):
        assert _put(store, "Many", queue_id) is None
        assert len(store._prepared_files) <= 8
    assert all(_count(store, "Many", q) == 1 for q in range(30))
