"""``ferry cluster list`` shows each broker's open store files and file descriptors against their limits (issue 24:
"a figure for open files vs the limit"), from the runtime info keys storeOpenFiles/storeOpenFilesLimit and
processOpenFds/processMaxFds."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from support.inproc import needs_cluster

pytestmark = needs_cluster

ROOT = Path(__file__).resolve().parents[2]
#: deadline of one CLI run
CLI_TIMEOUT_S = 60


async def test_runtime_info_and_cluster_list_show_open_files(ns_addr: str, broker: Any) -> None:
    info = broker.runtime_info()
    store_files, store_limit = int(info["storeOpenFiles"]), int(info["storeOpenFilesLimit"])
    open_fds, max_fds = int(info["processOpenFds"]), int(info["processMaxFds"])
    assert 0 <= store_files <= store_limit == broker.store.queues.pool.max_open
    assert 0 < open_fds < max_fds
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ferrymq.cli", "cluster", "list", "-n", ns_addr, cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert "storeFiles" in text and "fds" in text
    assert f"/{store_limit}" in text and f"/{max_fds}" in text
