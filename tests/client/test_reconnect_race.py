"""Concurrent reconnects to one address after a failed attempt (issue: ``Producer.send`` raised a bare
``KeyError`` when two sends reconnected at once).

The scenario is made deterministic with real sockets: an address whose first connect fails (nothing
listens), then a server starts on that port; once the reconnect backoff has run out, two callers ask for
the connection in the same event-loop turn, so both see the backoff entry and both wait on the one
connect the pool shares between them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from client_helpers import wait_for

from ferrymq.client import Producer, new_message
from ferrymq.client.config import ClientConfig
from ferrymq.client.instance import ClientInstance
from ferrymq.common.route import BrokerData, QueueData, TopicRouteData
from ferrymq.errors import ConnectError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.connection import Connection, Dispatcher
from ferrymq.remoting.server import RemotingServer
from support.ports import LOOPBACK, free_port

#: callers that reconnect at once
CONCURRENT_CALLERS = 8


def _backoff_over(inst: ClientInstance, addr: str) -> bool:
    entry = inst._backoff.get(addr)
    return entry is not None and time.monotonic() >= entry[1]


class LateServer:
    """A RemotingServer started only when the test says so, on a port chosen up front."""

    def __init__(self) -> None:
        self.port = free_port()
        self.addr = f"{LOOPBACK}:{self.port}"
        self.dispatcher = Dispatcher()
        self.server: RemotingServer | None = None

    async def start(self) -> None:
        self.server = RemotingServer(self.dispatcher, LOOPBACK, self.port)
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()


@pytest.fixture
async def late() -> AsyncIterator[LateServer]:
    s = LateServer()
    try:
        yield s
    finally:
        await s.stop()


async def test_concurrent_reconnects_share_one_attempt(late: LateServer) -> None:
    late.dispatcher.register(900, lambda conn, cmd: cmd.response(0))
    inst = ClientInstance(ClientConfig([late.addr], reconnect_backoff_base_ms=20, reconnect_backoff_max_ms=40))
    try:
        with pytest.raises(ConnectError):
            await inst.connection(late.addr)
        await late.start()
        await wait_for(lambda: _backoff_over(inst, late.addr))
        results = await asyncio.gather(*(inst.connection(late.addr) for _ in range(CONCURRENT_CALLERS)),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors
        assert len({id(c) for c in results}) == 1  # one connection for all of them
        assert not inst.is_suspect(late.addr)
        resp = await inst.invoke(late.addr, RemotingCommand.request(900))
        assert resp.code == 0
    finally:
        await inst.close()


async def test_concurrent_failed_reconnects_count_one_failure(late: LateServer) -> None:
    inst = ClientInstance(ClientConfig([late.addr], reconnect_backoff_base_ms=20, reconnect_backoff_max_ms=10_000))
    try:
        with pytest.raises(ConnectError):
            await inst.connection(late.addr)
        await wait_for(lambda: _backoff_over(inst, late.addr))
        results = await asyncio.gather(*(inst.connection(late.addr) for _ in range(CONCURRENT_CALLERS)),
                                       return_exceptions=True)
        assert all(isinstance(r, ConnectError) for r in results), results
        # one refused connect is one failure: the backoff grew by one step, not by one per caller
        assert inst._backoff[late.addr][0].attempts == 2
    finally:
        await inst.close()


async def test_concurrent_sends_after_broker_comes_back(late: LateServer) -> None:
    """The shape of the field failure: a producer whose broker was unreachable sends twice at once when
    it is back; both sends succeed (no KeyError escapes)."""
    ns_dispatcher = Dispatcher()
    ns = RemotingServer(ns_dispatcher, LOOPBACK, 0)

    def route(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        rt = TopicRouteData([QueueData("b", 2, 2, 6)], [BrokerData("C", "b", {0: late.addr})])
        return cmd.response(0, body=jsonx.dumps(rt.to_json()))

    def send(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(0, {"msgId": "ID", "queueId": cmd.ext_fields["e"], "queueOffset": "1"})

    ns_dispatcher.register(105, route)
    late.dispatcher.register(310, send)
    await ns.start()
    try:
        async with Producer(ns.addr, "pg", retry_times_when_send_failed=0) as p:
            with pytest.raises(ConnectError):
                await p.send(new_message("T", b"down"))
            inst: Any = p.instance
            await late.start()
            await wait_for(lambda: _backoff_over(inst, late.addr))
            results = await asyncio.gather(*(p.send(new_message("T", b"x")) for _ in range(CONCURRENT_CALLERS)),
                                           return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            assert not errors, errors
    finally:
        await ns.stop()
