"""Fixtures of the controller tests (helpers in ctl_support.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from ctl_support import T0_MS, BrokerFactory, FakeBroker, controller_config, start_controller

from ferrymq.controller.server import ControllerServer
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.connection import Connection, Dispatcher, connect
from support.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0_MS)


@pytest.fixture
def controller_settings() -> dict[str, Any]:
    return {}


@pytest.fixture
async def controller(tmp_path: Path, clock: ManualClock,
                     controller_settings: dict[str, Any]) -> AsyncIterator[ControllerServer]:
    server = await start_controller(controller_config(tmp_path / "ctl", **controller_settings), clock)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def fake_broker(controller: ControllerServer) -> AsyncIterator[BrokerFactory]:
    conns: list[Connection] = []

    async def make(name: str, broker_id: int) -> FakeBroker:
        dispatcher = Dispatcher()
        conn = await connect(controller.addr, dispatcher)
        conns.append(conn)
        broker = FakeBroker(conn, name, broker_id)

        def on_notice(c: Connection, cmd: RemotingCommand) -> None:
            broker.notices.append(jsonx.loads(cmd.body))

        dispatcher.register(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, on_notice)
        return broker

    try:
        yield make
    finally:
        for conn in conns:
            conn.close()
