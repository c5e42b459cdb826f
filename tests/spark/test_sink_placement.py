"""The sink's queue placement without a broker: the per-topic fast spread equals the row-by-row choice."""

from __future__ import annotations

import asyncio

import pytest

from ferrymq.client.selectors import RoundRobin, select_by_hash
from ferrymq.common.route import MessageQueue
from ferrymq.spark.writer import QueuePlanner

pytestmark = pytest.mark.spark

QUEUES = sorted(MessageQueue("T", b, q) for b in ("broker-a", "broker-b") for q in range(3))


def test_round_robin_reserves_consecutive_picks() -> None:
    one, many = RoundRobin(0x7FFFFFFF - 3), RoundRobin(0x7FFFFFFF - 3)  # across the wrap-around too
    picks = [one.next_index() for _ in range(9)]
    first = many.next_indexes(9)
    assert picks == [(first + i) & 0x7FFFFFFF for i in range(9)] and one.next_index() == many.next_index()


@pytest.mark.parametrize("keys", [None, [None, "a", "", "order-7", "a", None, "zz", "order-7"] * 5])
def test_spread_matches_the_row_by_row_choice(keys: list[str | None] | None) -> None:
    n = 40
    fast, slow = QueuePlanner(None), QueuePlanner(None)  # type: ignore[arg-type]
    fast.round_robin, slow.round_robin = RoundRobin(11), RoundRobin(11)
    slow.cache["T"] = QUEUES
    spread = fast.spread(QUEUES, keys, n)

    async def one_by_one() -> dict[MessageQueue, list[int]]:
        result: dict[MessageQueue, list[int]] = {}
        for i in range(n):
            mq = await slow.target_of("T", keys[i] if keys else None, None, None)
            result.setdefault(mq, []).append(i)
        return result

    assert spread == asyncio.run(one_by_one())
    for mq, rows in spread.items():
        for i in rows:
            if keys and keys[i]:
                assert select_by_hash(QUEUES, None, keys[i]) == mq


def test_send_batches_respect_the_count_and_byte_caps() -> None:
    from ferrymq.spark.writer import SINK_BATCH_MAX_BYTES, SINK_BATCH_MAX_MESSAGES, _chunks

    assert _chunks([]) == []
    n = SINK_BATCH_MAX_MESSAGES
    assert _chunks([1] * (2 * n + 1)) == [(0, n), (n, 2 * n), (2 * n, 2 * n + 1)]
    half = SINK_BATCH_MAX_BYTES // 2
    assert _chunks([half, half, 1, SINK_BATCH_MAX_BYTES + 5, 3]) == [(0, 2), (2, 3), (3, 4), (4, 5)]
