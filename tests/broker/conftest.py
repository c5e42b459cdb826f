"""Fixtures: the in-process NameServer + BrokerController of ``support.inproc`` (broker suite settings), and a
raw remoting client of the broker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from broker_helpers import BROKER_SETTINGS, Client

from ferrymq.broker.app import BrokerController


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    return dict(BROKER_SETTINGS)


@pytest.fixture
async def client(broker: BrokerController) -> AsyncIterator[Client]:
    c = await Client().open(broker.broker_addr)
    try:
        yield c
    finally:
        c.close()
