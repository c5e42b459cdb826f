"""Helpers of the conformance suite: a raw remoting client, request builders, a broker factory.

Everything speaks raw remoting (``ferrymq.remoting.connection.connect``) to in-process brokers built
with ``support.inproc.broker_config``; no ferrymq client code is involved.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from support.aio import wait_for as wait_for
from support.clock import ManualClock
from support.inproc import broker_config
from support.wire import Client as Client
from support.wire import pull as pull
from support.wire import records as records
from support.wire import send_v1 as send_v1

#: small files so every broker of the suite starts fast
SMALL_STORE: dict[str, Any] = {
    "broker_name": "broker-c",
    "mapped_file_size_commit_log": 4 * 1024 * 1024,
    "mapped_file_size_consume_queue": 20 * 1000,
}


#: the conformance tests' name for the shared manual clock
ManualMs = ManualClock


@asynccontextmanager
async def running_broker(data_dir: str, namesrv_addr: str | None = None, *, clock_ms: Any = None,
                         **settings: Any) -> AsyncIterator[Any]:
    """A started BrokerController (stopped on exit, also on failure)."""
    from ferrymq.broker.app import BrokerController

    cfg = broker_config(data_dir, namesrv_addr, **{**SMALL_STORE, **settings})
    ctl = BrokerController(cfg) if clock_ms is None else BrokerController(cfg, clock_ms=clock_ms)
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()


#: the declared PULL response header (§2.6), present for every outcome
PULL_HEADER_KEYS = {"suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"}
