"""Helpers shared by the broker tests: config, a raw remoting client, request builders (``wait_for`` is
``support.aio.wait_for``, re-exported)."""

from __future__ import annotations

from typing import Any

from ferrymq.broker.config import BrokerConfig
from support.aio import wait_for as wait_for
from support.inproc import broker_config
from support.wire import Client as Client
from support.wire import pull as pull
from support.wire import records as records
from support.wire import send_v1 as send_v1

#: the broker suite's BrokerConfig values on top of ``support.inproc.broker_config`` (also the ``broker`` fixture's)
BROKER_SETTINGS: dict[str, Any] = {
    "broker_name": "broker-t",
    "mapped_file_size_commit_log": 4 * 1024 * 1024,
    "mapped_file_size_consume_queue": 20 * 1000,
}


def make_config(data_dir: str, namesrv: str | None = None, **overrides: Any) -> BrokerConfig:
    cfg: BrokerConfig = broker_config(data_dir, namesrv, **{**BROKER_SETTINGS, **overrides})
    return cfg



