"""The proxy's pop state when the broker behind a queue changes under it (sans-IO: the proxy's receive path
against a scripted queue instead of a broker; test_grpc_failover.py runs the real processes).

A master that dies may have let the proxy pull messages it had not replicated yet; the replica elected in
its place then ends the queue earlier and stores other messages at those queue offsets. The proxy must drop
what it holds from the lost history and read the new one, not skip the new messages because it holds (or
already pulled past) their offsets."""

from __future__ import annotations

from typing import Any

import pytest

from ferrymq.client.values import PullResult, PullStatus
from ferrymq.common.message import MessageExt, host_to_bytes
from ferrymq.common.route import MessageQueue
from ferrymq.proxy.config import ProxyConfig
from ferrymq.proxy.pop import PopQueue, SerialSource
from ferrymq.proxy.service import MessagingService

GROUP, TOPIC, BROKER = "g", "T", "broker-a"
KEY = (GROUP, TOPIC, BROKER, 0)


def stored(queue_offset: int, body: str) -> MessageExt:
    return MessageExt(topic=TOPIC, body=body.encode(), flag=0, properties={"UNIQ_KEY": body}, queue_id=0,
                      queue_offset=queue_offset, phy_offset=queue_offset * 100, store_size=100, body_crc=0,
                      sys_flag=0, born_timestamp=1, born_host=host_to_bytes("127.0.0.1", 1), store_timestamp=2,
                      store_host=host_to_bytes("127.0.0.1", 10911), reconsume_times=0,
                      prepared_transaction_offset=0)


class ScriptedQueue:
    """One queue as a broker answers PULL_MESSAGE for it (the broker's rules for an offset past the end:
    OFFSET_ILLEGAL, next offset the queue's start while it starts at 0, else its end)."""

    def __init__(self, bodies: list[str]) -> None:
        self.messages = [stored(i, b) for i, b in enumerate(bodies)]
        self.committed = -1

    async def pull(self, mq: MessageQueue, queue_offset: int, max_nums: int, **_: Any) -> PullResult:
        end = len(self.messages)
        if queue_offset > end:
            return PullResult(PullStatus.OFFSET_ILLEGAL, 0, 0, end)
        found = self.messages[queue_offset:queue_offset + max_nums]
        if not found:
            return PullResult(PullStatus.NO_NEW_MSG, queue_offset, 0, end)
        return PullResult(PullStatus.FOUND, queue_offset + len(found), 0, end, found)

    async def fetch_committed_offset(self, mq: MessageQueue) -> int:
        return self.committed

    async def query_offset(self, code: int, mq: MessageQueue, **_: Any) -> int:
        return 0

    async def commit_offset(self, mq: MessageQueue, queue_offset: int, **_: Any) -> None:
        self.committed = queue_offset


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> MessagingService:
    svc = MessagingService(ProxyConfig("127.0.0.1:9876"), clock_ms=lambda: 1_000)

    async def queue_ids(topic: str, broker_name: str) -> list[int]:
        return [0]

    monkeypatch.setattr(svc, "_readable_queue_ids", queue_ids)
    return svc


async def receive(service: MessagingService) -> list[str]:
    deliveries = await service._receive(GROUP, TOPIC, BROKER, 0, 32, 60_000, 0, ("*", "TAG"))
    return [d.entry.message.body.decode() for _, d in deliveries]


async def ack(service: MessagingService, bodies: list[str]) -> None:
    pq = service.pop_queues[KEY]
    for offset, entry in list(pq.entries.items()):
        if entry.message.body.decode() in bodies:
            assert pq.ack(offset, entry.serial)
    service._dirty.add(KEY)


async def test_messages_a_new_master_stores_at_offsets_of_lost_ones_are_delivered(
        service: MessagingService) -> None:
    old = ScriptedQueue([f"old-{i}" for i in range(6)])
    service._cores[GROUP] = old  # type: ignore[assignment]
    assert await receive(service) == [f"old-{i}" for i in range(6)]
    # the master dies before old-0..5 reached its replica; the new master stores four other messages
    new = ScriptedQueue([f"new-{i}" for i in range(4)])
    service._cores[GROUP] = new  # type: ignore[assignment]
    got = await receive(service)
    got += await receive(service)
    assert got == [f"new-{i}" for i in range(4)]
    # a handle of the lost history acknowledges nothing of the new one
    await ack(service, got)
    await service.commit_offsets()
    assert new.committed == 4


async def test_acknowledged_progress_below_the_new_end_is_kept(service: MessagingService) -> None:
    """Only what was not acknowledged is read again: acked messages below the first unacked one stay done."""
    old = ScriptedQueue([f"m-{i}" for i in range(6)])
    service._cores[GROUP] = old  # type: ignore[assignment]
    assert await receive(service) == [f"m-{i}" for i in range(6)]
    await ack(service, ["m-0", "m-1", "m-3"])
    # the new master has m-0..m-3 (replicated) and a new message at offset 4, not m-4 or m-5
    new = ScriptedQueue(["m-0", "m-1", "m-2", "m-3", "other-4"])
    service._cores[GROUP] = new  # type: ignore[assignment]
    got = await receive(service)
    got += await receive(service)
    assert "other-4" in got and "m-0" not in got and "m-1" not in got
    assert set(got) <= {"m-2", "m-3", "other-4"}  # m-3 again: acked above an unacked one (at least once)


def test_rewind_forgets_the_held_entries_and_restarts_at_the_first_unacked_one() -> None:
    pq, serials = PopQueue(0), SerialSource()
    pq.add_pulled([stored(i, f"b{i}") for i in range(6)], 6)
    taken, _ = pq.take(0, 10, 1000, 5, serials)
    pq.ack(0, taken[0].serial)
    pq.ack(2, taken[2].serial)
    pq.rewind(4)
    assert not pq.entries and pq.fresh == 0 and pq.pull_offset == 1 and pq.commit_offset() == 1
    pq.add_pulled([stored(0, "x")], 6)
    pq.rewind(0)  # the new queue ends before the first unacked offset: restart at its end
    assert pq.pull_offset == 0
