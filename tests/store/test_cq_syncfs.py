"""A consume queue flush over many queues persists them with one ``syncfs`` of their file system (store/syncfs.py)
instead of one ``fdatasync`` each; fewer queues are flushed file by file; a failing ``syncfs`` keeps every queue
dirty for the next round (store/queue_table.py)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

import pytest
from store_helpers import assert_cqs_match_commit_log, inner

from ferrymq.store import MessageStore, PutMessageStatus
from ferrymq.store.errors import StoreError
from ferrymq.store.queue_table import CQ_SYNCFS_MIN_QUEUES
from ferrymq.store.syncfs import SyncFs

Opener = Callable[..., MessageStore]

needs_syncfs = pytest.mark.skipif(not SyncFs("/").available, reason="syncfs(2) is a Linux call")


def _write_queues(store: MessageStore, n: int, body: bytes = b"x") -> None:
    for i in range(n):
        topic = f"S{i // 8}"
        assert store.put_message(inner(topic=topic, queue_id=i % 8, body=body)).status is PutMessageStatus.PUT_OK
    store.reput()


def _fdatasyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    return calls


@needs_syncfs
def test_many_dirty_queues_are_flushed_with_one_syncfs(open_store: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store()
    n = CQ_SYNCFS_MIN_QUEUES * 3
    _write_queues(store, n)
    store.flush()
    table = store.queues
    calls = _fdatasyncs(monkeypatch)
    flushed = table.flush()
    assert table.syncfs_flushes_total == 1
    assert table._syncfs.calls_total == 1
    assert calls == []  # not one fdatasync per queue
    assert len(flushed) == n
    for (topic, queue_id), mark in flushed.items():
        assert mark[0] == 1, (topic, queue_id, mark)
        cq = table.queues[(topic, queue_id)]
        assert cq.mfq.flushed_where == cq.mfq.max_offset  # recorded as flushed
    assert table.flush() == {}  # nothing dirty is left


@needs_syncfs
def test_a_few_dirty_queues_are_flushed_file_by_file(open_store: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store()
    n = CQ_SYNCFS_MIN_QUEUES - 1
    _write_queues(store, n)
    calls = _fdatasyncs(monkeypatch)
    flushed = store.queues.flush()
    assert len(flushed) == n and len(calls) == n
    assert store.queues.syncfs_flushes_total == 0


@needs_syncfs
def test_a_failing_syncfs_keeps_every_queue_dirty_for_the_next_round(open_store: Opener,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store()
    n = CQ_SYNCFS_MIN_QUEUES * 2
    _write_queues(store, n)
    table = store.queues

    def failing(self: SyncFs) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(SyncFs, "sync", failing)
        with pytest.raises(StoreError, match=f"{n} consume queue"):
            table.flush()
    for cq in table.queues.values():
        assert cq.mfq.flushed_where < cq.mfq.max_offset  # not recorded as flushed
    flushed = table.flush()  # the next round takes them all
    assert len(flushed) == n and table.syncfs_flushes_total == 1


@needs_syncfs
def test_a_restart_after_a_syncfs_flush_serves_every_queue(open_store: Opener) -> None:
    """The checkpoint and the ``queueoffsets`` snapshot written after a syncfs round account for every queue: a
    crash right after it restarts with every unit in place and no queue rebuilt."""
    store = open_store()
    n = CQ_SYNCFS_MIN_QUEUES * 2
    _write_queues(store, n, body=b"kept")
    store.flush()
    store.flush_consume_queues()
    assert store.queues.syncfs_flushes_total == 1
    store.close_abruptly()
    store = open_store()
    assert store.last_start_was_abnormal
    for i in range(n):
        assert store.get_max_offset_in_queue(f"S{i // 8}", i % 8) == 1
    assert_cqs_match_commit_log(store)
