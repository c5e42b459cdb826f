"""Fixtures of the CLI tests: the in-process NameServer + BrokerController of ``support.inproc``, and the name
server address once the broker has registered. The verbs run as ``python -m ferrymq.cli`` subprocesses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from support.aio import wait_for

#: the CLI suite's BrokerConfig values on top of ``support.inproc.broker_config``
CLI_BROKER_SETTINGS: dict[str, Any] = {
    "broker_name": "broker-a",
    "mapped_file_size_commit_log": 4 * 1024 * 1024,
    "mapped_file_size_consume_queue": 20 * 1000,
}
#: deadline of the suite's condition waits
CLI_WAIT_S = 20.0


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    return dict(CLI_BROKER_SETTINGS)


@pytest.fixture
async def ns_addr(namesrv: Any, broker: Any) -> AsyncIterator[str]:
    """Name server address once the broker has registered."""
    from ferrymq.client import Admin

    async with Admin(namesrv.addr) as admin:
        async def registered() -> bool:
            return bool((await admin.cluster_info())["brokerAddrTable"])
        await wait_for(registered, timeout_s=CLI_WAIT_S, what="broker registered")
    yield namesrv.addr
