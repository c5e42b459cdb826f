"""Running ``ferry`` the way an operator does, for the CLI tests: ``python -m ferrymq.cli`` as a subprocess with
no NAMESRV_ADDR in its environment (every test names its name server), bounded in time, killed on failure."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: deadline of one ferry run
RUN_TIMEOUT_S = 60


async def ferry(*args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one ``ferry`` run."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ferrymq.cli", *args, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, "NAMESRV_ADDR": ""})
    try:
        out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


async def ferry_json(*args: str) -> Any:
    """The parsed ``--json`` output of a run that must succeed."""
    code, out, err = await ferry(*args, "--json")
    assert code == 0, err
    return json.loads(out)
