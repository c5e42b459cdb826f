"""SQL92 selectors through our client: a push consumer and a pull consumer subscribe with
``MessageSelector.by_sql``; a bad selector fails the push consumer's start (CHECK_CLIENT_CONFIG)."""

from __future__ import annotations

from typing import Any

import pytest
from client_helpers import CLIENT_BROKER_SETTINGS, wait_for

from ferrymq.client import (
    Admin,
    ConsumeStatus,
    MessageExt,
    MessageSelector,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    new_message,
)
from ferrymq.errors import BrokerError
from support.inproc import needs_cluster

pytestmark = needs_cluster

FAST = {"rebalance_interval_ms": 500, "persist_offset_interval_ms": 200, "heartbeat_broker_interval_ms": 1000,
        "poll_name_server_interval_ms": 1000}
SELECTOR = MessageSelector.by_sql("price >= 10 AND region IN ('eu', 'us') AND TAGS <> 'skip'")


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    return dict(CLIENT_BROKER_SETTINGS, enable_property_filter=True)


def _wanted(i: int) -> bool:
    return i * 3 % 20 >= 10 and i % 3 != 2 and i % 5 != 0


async def _produce(ns: str, topic: str, n: int) -> None:
    async with Admin(ns) as admin:
        await admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
        await admin.wait_for_route(topic)
    async with Producer(ns, "sql-pg") as p:
        for i in range(n):
            region = ["eu", "us", "ap"][i % 3]
            await p.send(new_message(topic, f"m{i}", tags="skip" if i % 5 == 0 else "keep",
                                     properties={"price": str(i * 3 % 20), "region": region}))


async def test_push_and_pull_consumers_with_sql92(ns_addr: str) -> None:
    await _produce(ns_addr, "SqlT", 40)
    want = {f"m{i}".encode() for i in range(40) if _wanted(i)}
    assert want  # the data has matches and misses
    got: list[bytes] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(ns_addr, "sql-push", consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST)
    c.subscribe("SqlT", SELECTOR)
    c.register_message_listener(listener)
    await c.start()
    try:
        await wait_for(lambda: set(got) >= want)
    finally:
        await c.close()
    assert set(got) == want

    pulled: list[bytes] = []
    async with PullConsumer(ns_addr, "sql-pull") as pc:
        for mq in await pc.fetch_subscribe_message_queues("SqlT"):
            offset = 0
            while True:
                r = await pc.pull(mq, offset, 32, sub_expression=SELECTOR)
                pulled.extend(m.body for m in r.messages)
                if r.status not in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG):
                    break
                offset = r.next_begin_offset
    assert set(pulled) == want


async def test_bad_selector_fails_push_consumer_start(ns_addr: str) -> None:
    await _produce(ns_addr, "SqlBadT", 1)
    c = PushConsumer(ns_addr, "sql-bad", **FAST)
    c.subscribe("SqlBadT", MessageSelector.by_sql("price >> 3"))
    c.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    with pytest.raises(BrokerError) as info:
        await c.start()
    assert info.value.code == 23 and "line 1, column 8" in info.value.remark


async def test_example_script(ns_addr: str) -> None:
    from test_examples_cli import run

    await _produce(ns_addr, "ExSql", 0)
    code, out, err = await run("examples/sql_filter.py", ns_addr, "ExSql", "30")
    assert code == 0, err
    assert "matched 3" in out and "order 4'" not in out and "order 6'" not in out
