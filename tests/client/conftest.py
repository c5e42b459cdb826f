"""Fixtures: in-process NameServer + BrokerController on 127.0.0.1 (port 0), data in tmp_path."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _cluster_available() -> bool:
    try:
        import ferrymq.broker.app  # noqa: F401
        import ferrymq.namesrv.app  # noqa: F401
    except Exception:
        return False
    return True


needs_cluster = pytest.mark.skipif(not _cluster_available(), reason="broker/namesrv not importable")


@pytest.fixture
async def namesrv() -> AsyncIterator[Any]:
    from ferrymq.namesrv.app import NameServer

    ns = NameServer("127.0.0.1", 0)
    await ns.start()
    try:
        yield ns
    finally:
        await ns.stop()


@pytest.fixture
async def broker(tmp_path: Path, namesrv: Any) -> AsyncIterator[Any]:
    from ferrymq.broker.app import BrokerController
    from support import broker_config

    ctl = BrokerController(broker_config(str(tmp_path / "store"), namesrv.addr))
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()


@pytest.fixture
async def ns_addr(namesrv: Any, broker: Any) -> AsyncIterator[str]:
    """Name server address once the broker has registered."""
    from ferrymq.client import Admin
    from support import wait_for

    async with Admin(namesrv.addr) as admin:
        async def registered() -> bool:
            return bool((await admin.cluster_info())["brokerAddrTable"])
        await wait_for(registered)
    yield namesrv.addr
