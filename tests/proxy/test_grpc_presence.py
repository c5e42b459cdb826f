"""5.x clients appear to the brokers as clients of their own: ``ferry consumer connection`` and ``ferry
producer connection`` (client/ops.py, what those verbs print) list each real 5.x SDK client with its client
id and language while it runs, and no longer once it shut down."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from ferrymq.client.admin import Admin
from ferrymq.client.ops import consumer_connections, producer_connections
from ferrymq.errors import ClientError
from ferrymq.proxy.config import DEFAULT_PRODUCER_GROUP
from support.aio import wait_for

pytestmark = pytest.mark.acceptance


async def sdk_clients(grpc_stack: Any, group: str, *, producer: bool = False) -> list[dict[str, Any]]:
    proxy_id = grpc_stack.proxy.service.instance.client_id
    async with Admin(grpc_stack.namesrv.addr) as admin:
        try:
            if producer:
                rows = await producer_connections(admin, group)
            else:
                rows = (await consumer_connections(admin, group))["connections"]
        except ClientError:  # the group is online nowhere
            return []
    return [r for r in rows if r["clientId"] != proxy_id]


async def test_sdk_consumer_and_producer_are_listed_while_they_run(grpc_stack: Any) -> None:
    topic, group = f"TV_{uuid.uuid4().hex[:8]}", f"gv_{uuid.uuid4().hex[:8]}"
    await grpc_stack.create_topic(topic)
    # a push consumer that never gets its count runs until its timeout: long enough to be looked at
    consumer = asyncio.create_task(grpc_stack.sdk("push", topic=topic, group=group, expect=1_000_000, timeout_s=25,
                                                  check=False))
    try:
        await wait_for(lambda: _one(sdk_clients(grpc_stack, group)), timeout_s=20, what="5.x consumer listed")
        rows = await sdk_clients(grpc_stack, group)
        assert len(rows) == 1 and rows[0]["language"] == "PYTHON", rows
        assert rows[0]["clientId"] != grpc_stack.proxy.service.instance.client_id
        async with Admin(grpc_stack.namesrv.addr) as admin:
            info = await consumer_connections(admin, group)
        assert topic in info["subscriptions"]
        producer = asyncio.create_task(grpc_stack.sdk("produce", topic=topic, count=40, prefix="v", timeout_s=25))
        try:
            await wait_for(lambda: _one(sdk_clients(grpc_stack, DEFAULT_PRODUCER_GROUP, producer=True)),
                           timeout_s=20, what="5.x producer listed")
        finally:
            await producer
    finally:
        await consumer
    # the SDK told the proxy it ended: the brokers drop it at once, not after the channel expiry
    await wait_for(lambda: _none(sdk_clients(grpc_stack, group)), timeout_s=10, what="5.x consumer gone")


async def _one(rows: Any) -> bool:
    return len(await rows) == 1


async def _none(rows: Any) -> bool:
    return not await rows
