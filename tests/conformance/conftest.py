"""Conformance suite fixtures: the in-process ``namesrv``/``broker`` of ``support.inproc`` with small
store files, and a raw remoting ``client`` of that broker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from conf_helpers import SMALL_STORE, Client


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    return dict(SMALL_STORE)


@pytest.fixture
async def client(broker: Any) -> AsyncIterator[Client]:
    c = await Client().open(broker.broker_addr)
    try:
        yield c
    finally:
        c.close()
