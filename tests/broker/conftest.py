"""Fixtures: an in-process NameServer + BrokerController on 127.0.0.1 free ports, tmp_path data."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from broker_helpers import Client, make_config

from ferrymq.broker.app import BrokerController
from ferrymq.namesrv.app import NameServer


@pytest.fixture
async def namesrv() -> AsyncIterator[NameServer]:
    ns = NameServer("127.0.0.1", 0)
    await ns.start()
    try:
        yield ns
    finally:
        await ns.stop()


@pytest.fixture
async def broker(tmp_path: Any, namesrv: NameServer) -> AsyncIterator[BrokerController]:
    ctl = BrokerController(make_config(str(tmp_path / "store"), namesrv.addr))
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()


@pytest.fixture
async def client(broker: BrokerController) -> AsyncIterator[Client]:
    c = await Client().open(broker.broker_addr)
    try:
        yield c
    finally:
        c.close()
