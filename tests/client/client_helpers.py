"""Settings of the client tests: the in-process broker's config values and the suite's wait deadline."""

from __future__ import annotations

import functools
from typing import Any

from support import aio

#: the client suite's BrokerConfig values on top of ``support.inproc.broker_config``
CLIENT_BROKER_SETTINGS: dict[str, Any] = {
    "broker_name": "broker-a",
    "mapped_file_size_commit_log": 8 * 1024 * 1024,
    "mapped_file_size_consume_queue": 20 * 10_000,
    "message_delay_level": "1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
}
#: deadline of a condition wait in the client tests (push consumers rebalance, retry, commit offsets)
CLIENT_WAIT_S = 20.0

#: ``support.aio.wait_for`` with the client suite's deadline
wait_for = functools.partial(aio.wait_for, timeout_s=CLIENT_WAIT_S, interval_s=0.02)
