"""Helpers of the client tests: in-process name server + broker, condition polling."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any


async def wait_for(cond: Callable[[], Any], timeout_s: float = 20.0, interval_s: float = 0.02) -> Any:
    """Poll until ``cond()`` (sync or async) is truthy; AssertionError after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = cond()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def broker_config(data_dir: str, namesrv: str, **overrides: Any) -> Any:
    from ferrymq.broker.config import BrokerConfig

    cfg = BrokerConfig(
        broker_name=overrides.pop("broker_name", "broker-a"),
        listen_port=0,
        listen_host="127.0.0.1",
        broker_ip1="127.0.0.1",
        store_path_root_dir=data_dir,
        namesrv_addr=[namesrv],
        mapped_file_size_commit_log=8 * 1024 * 1024,
        mapped_file_size_consume_queue=20 * 10_000,
        fast_listen_enable=False,
        message_delay_level="1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
    )
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg
