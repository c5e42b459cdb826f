"""The Apache C++ client 2.1 (PyPI ``rocketmq-python-cvs``, librocketmq 2.1.0 bundled) for acceptance tests and
benchmarks: installed once into a cache directory of its own, run in subprocess scripts (cpp21_scripts/).

Its Python module is named ``rocketmq``, like the C++ 1.x client's (PyPI ``rocketmq==0.4.4``, installed in the
test environment), so it is installed with ``pip --target`` and the scripts run with PYTHONPATH naming that
directory first; every script checks that the library it loaded is the 2.1 one (``_cpp21.py``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from procs import ManagedProcess, ProcessGroup, cpp_env

from support.pip_target import pip_target_dir

CPP21_REQUIREMENT = "rocketmq-python-cvs==2.1.0.3"
CPP21_SCRIPTS_DIR = Path(__file__).resolve().parent / "cpp21_scripts"
#: pip's time to download and unpack the package (an sdist holding the 2.1 librocketmq.so)
CPP21_INSTALL_TIMEOUT_S = 600


def cpp21_install_dir() -> Path:
    """Directory holding the 2.1 client, installed on the first call and reused afterwards (also across runs:
    support/pip_target.py); raises PipTargetError when pip cannot install it."""
    return pip_target_dir(CPP21_REQUIREMENT, timeout_s=CPP21_INSTALL_TIMEOUT_S, no_deps=True)


def cpp21_env(tmp_path: Path, install_dir: Path) -> dict[str, str]:
    """``cpp_env`` (HOME in the tmp dir, so librocketmq's logs stay with the test) with the 2.1 client first on
    PYTHONPATH."""
    env = cpp_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(install_dir), *filter(None, [env.get("PYTHONPATH")])])
    return env


def cpp21_script_argv(name: str, args: Mapping[str, Any]) -> list[str]:
    """argv running ``cpp21_scripts/<name>.py`` with ``args`` as its one JSON argument."""
    return [sys.executable, str(CPP21_SCRIPTS_DIR / f"{name}.py"), json.dumps(dict(args))]


def spawn_cpp21_script(group: ProcessGroup, tmp_path: Path, install_dir: Path, proc_name: str, script: str,
                       args: Mapping[str, Any]) -> ManagedProcess:
    """``cpp21_scripts/<script>.py`` in the background, a member of ``group`` (stopped at teardown)."""
    return group.spawn(proc_name, cpp21_script_argv(script, args), cwd=CPP21_SCRIPTS_DIR,
                       env=cpp21_env(tmp_path, install_dir))
