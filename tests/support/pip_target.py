"""Third-party client packages whose import names clash with installed ones (the 5.x Python SDK and the Apache C++
client 2.1 are both ``rocketmq``, like the C++ 1.x client the test environment installs): ``pip install --target``
into a cache directory of their own, once per requirement, then used through PYTHONPATH in subprocesses.

The directory is ``$XDG_CACHE_HOME/ferrymq-tests/<name>-<version>`` (``~/.cache`` without XDG_CACHE_HOME); it counts
as installed once it holds the ``.complete`` marker, written after pip succeeded into a temporary sibling that is
then renamed, so an interrupted install is never taken for a finished one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

#: file marking a finished install
COMPLETE_MARKER = ".complete"


class PipTargetError(RuntimeError):
    """pip could not install the requirement (no registry access, say)."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ferrymq-tests"


def pip_target_dir(requirement: str, *, timeout_s: float, no_deps: bool = False) -> Path:
    """Directory holding ``requirement`` ("name==version"), installed on the first call and reused afterwards."""
    target = cache_root() / requirement.replace("==", "-")
    if (target / COMPLETE_MARKER).exists():
        return target
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(tmp)]
    if no_deps:
        argv.append("--no-deps")
    proc = subprocess.run([*argv, requirement], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PipTargetError(f"cannot install {requirement}: {proc.stderr.strip()[-500:]}")
    (tmp / COMPLETE_MARKER).write_text(requirement)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target
