"""Running ``ferry`` as an operator does, for the acceptance tests of the operations verbs: a subprocess per
call, ``--json`` output parsed, and client timers short enough for quick tests."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

from procs import ferry_argv

#: deadline of one ferry run
CLI_TIMEOUT_S = 30
#: client timers short enough for a quick test
FAST_CLIENT = {"rebalance_interval_ms": 500, "persist_offset_interval_ms": 200, "heartbeat_broker_interval_ms": 1000,
               "poll_name_server_interval_ms": 1000}


def ferry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ferry_argv(*args), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)


def ferry_json(*args: str) -> Any:
    cp = ferry(*args, "--json")
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


async def aferry_json(*args: str) -> Any:
    """``ferry_json`` off the event loop (the test's clients keep running meanwhile)."""
    return await asyncio.get_running_loop().run_in_executor(None, ferry_json, *args)
