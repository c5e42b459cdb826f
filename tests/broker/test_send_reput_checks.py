"""The dispatch after a send (``MessageWriter._reput``): a reput that dispatched up to the end of the writer's last
put does not walk the log again to ask whether it is behind; one that stalled, or stopped before that end, still
asks and retries by itself (broker/writer.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_helpers import make_config, wait_for

from ferrymq.broker import writer as writer_module
from ferrymq.broker.app import store_config_of
from ferrymq.broker.writer import MessageWriter
from ferrymq.common.message import MessageExtBrokerInner
from ferrymq.store import MessageStore, PutMessageStatus
from ferrymq.store.errors import StoreOpenFilesError


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(store_config_of(make_config(str(tmp_path))))
    s.load()
    yield s
    s.shutdown()


def _inner(queue_id: int = 0) -> MessageExtBrokerInner:
    return MessageExtBrokerInner(topic="ReputT", queue_id=queue_id, body=b"x" * 100, born_host=b"\x7f\0\0\1\0\0\0\1",
                                 store_host=b"\x7f\0\0\1\0\0\0\2")


def _writer(store: MessageStore, tmp_path: Path, woken: list[Any]) -> MessageWriter:
    writer = MessageWriter(store, make_config(str(tmp_path)), None, woken.append)  # type: ignore[arg-type]
    writer.bind(asyncio.get_running_loop())
    return writer


def _count_behind_asks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    asked: list[int] = []
    real = MessageStore.dispatch_behind_bytes

    def counting(self: MessageStore) -> int:
        behind: int = real.fget(self)  # type: ignore[attr-defined]
        asked.append(behind)
        return behind

    monkeypatch.setattr(MessageStore, "dispatch_behind_bytes", property(counting))
    return asked


async def test_a_reput_that_reached_the_last_put_does_not_ask_whether_it_is_behind(
        store: MessageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    woken: list[Any] = []
    writer = _writer(store, tmp_path, woken)
    asked = _count_behind_asks(monkeypatch)
    for round_no in range(3):
        for queue_id in range(4):
            assert writer.put(_inner(queue_id)).status is PutMessageStatus.PUT_OK
        await wait_for(lambda n=round_no: len(woken) == n + 1)
    assert asked == []
    assert store.reput_phy_offset == store.max_phy_offset
    assert all(store.get_max_offset_in_queue("ReputT", q) == 3 for q in range(4))


async def test_a_stalled_dispatch_is_asked_about_and_retried_by_itself(
        store: MessageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "DISPATCH_RETRY_INTERVAL_MS", 5)
    woken: list[Any] = []
    writer = _writer(store, tmp_path, woken)
    asked = _count_behind_asks(monkeypatch)
    real_reput = store.dispatcher._reput
    stalls = [2]

    def stalling(max_records: int | None, budget_s: float | None = None) -> int:
        if stalls[0]:
            stalls[0] -= 1
            raise StoreOpenFilesError("no descriptor for the consume queue file")
        return real_reput(max_records, budget_s)

    monkeypatch.setattr(store.dispatcher, "_reput", stalling)
    assert writer.put(_inner()).status is PutMessageStatus.PUT_OK
    # no other send comes: the writer's own retries dispatch the record once the store can
    await wait_for(lambda: store.get_max_offset_in_queue("ReputT", 0) == 1)
    assert stalls == [0]
    assert asked[:2] == [asked[0]] * 2 and asked[0] > 0  # each stalled reput asked, and was behind


async def test_a_reput_stopped_before_the_last_put_asks_whether_it_is_behind(
        store: MessageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    woken: list[Any] = []
    writer = _writer(store, tmp_path, woken)
    first = writer.put(_inner())
    assert first.status is PutMessageStatus.PUT_OK
    bound = first.append_result.wrote_offset + first.append_result.wrote_bytes
    store.dispatcher.reput_end = lambda: bound  # e.g. a confirm offset: the second record waits for it
    asked = _count_behind_asks(monkeypatch)
    assert writer.put(_inner()).status is PutMessageStatus.PUT_OK
    await wait_for(lambda: store.get_max_offset_in_queue("ReputT", 0) == 1)
    await wait_for(lambda: len(asked) == 1)
    assert asked == [0]  # waiting for the bound is not behind: no retry timer
    assert writer._retry_handle is None
