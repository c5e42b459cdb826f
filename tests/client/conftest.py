"""Fixtures: the in-process NameServer + BrokerController of ``support.inproc`` (client suite settings), and
the name server address once the broker has registered."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from client_helpers import CLIENT_BROKER_SETTINGS, wait_for  # noqa: E402


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    return dict(CLIENT_BROKER_SETTINGS)


@pytest.fixture
async def ns_addr(namesrv: Any, broker: Any) -> AsyncIterator[str]:
    """Name server address once the broker has registered."""
    from ferrymq.client import Admin

    async with Admin(namesrv.addr) as admin:
        async def registered() -> bool:
            return bool((await admin.cluster_info())["brokerAddrTable"])
        await wait_for(registered)
    yield namesrv.addr
