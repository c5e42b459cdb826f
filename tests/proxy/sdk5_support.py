"""Running the 5.x SDK driver (``sdk5_driver.py``) in a subprocess, for tests whose servers run in other
processes (the in-process suite uses ``GrpcStack.sdk`` from conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

DRIVER = Path(__file__).resolve().parent / "sdk5_driver.py"
#: time an SDK process gets beyond its own deadline to shut down (start-up, settings wait, shutdown)
SDK_EXIT_GRACE_S = 40


def run_sdk_sync(sdk_path: Path, home: Path, endpoints: str, verb: str, *, timeout_s: float = 60,
                 env: dict[str, str] | None = None, check: bool = True, **args: Any) -> list[dict[str, Any]]:
    """Run one driver verb to its end; its JSON records (the last one is the ``done`` summary, asserted
    successful unless ``check`` is False). ``env``: more environment of the SDK process."""
    out = home / f"{verb}-{uuid.uuid4().hex[:8]}.jsonl"
    full = {"verb": verb, "endpoints": endpoints, "out": str(out), "timeout_s": timeout_s, **args}
    env = {**os.environ, "PYTHONPATH": str(sdk_path), "HOME": str(home), **(env or {})}
    proc = subprocess.run([sys.executable, str(DRIVER), json.dumps(full)], env=env, capture_output=True,
                          text=True, timeout=timeout_s + SDK_EXIT_GRACE_S)
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if not check:
        return records
    assert records and records[-1].get("done"), (
        f"SDK {verb} failed (exit {proc.returncode}): {records[-3:]} {proc.stderr[-2000:]}")
    return records
