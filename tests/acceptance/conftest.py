"""Fixtures for acceptance tests: real ferrymq processes, real third-party clients.

* ``procs``: a ProcessGroup under the test's tmp dir; every process it started is stopped at teardown,
  and all their logs are printed when the test failed (shown in pytest's failure report).
* ``cluster``: factory ``cluster(**broker_props) -> Cluster`` (one namesrv + one master broker;
  keyword arguments are broker.conf properties, e.g. ``flushDiskType="SYNC_FLUSH"``).
* ``run_script``: run a helper script (C++ client script or node script) in a subprocess with a
  timeout, its stderr kept in a log file that is dumped on failure, and its last stdout line parsed
  as JSON.
* ``cpp21_dir`` (session): the Apache C++ client 2.1 (PyPI rocketmq-python-cvs) installed into a cache
  directory of its own (cpp21_support.py); skipped when pip cannot install it, failed under CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = str(Path(__file__).resolve().parent)
# test modules here import the helpers as ``procs`` whatever pytest's import mode is
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from cpp21_support import CPP21_SCRIPTS_DIR, cpp21_env, cpp21_install_dir, cpp21_script_argv  # noqa: E402
from procs import (  # noqa: E402
    CPP_SCRIPTS_DIR,
    NODE_DIR,
    Cluster,
    ProcessGroup,
    cpp_env,
    cpp_script_argv,
    start_broker,
    start_namesrv,
)

from support.pip_target import PipTargetError  # noqa: E402


def _failed(request: pytest.FixtureRequest) -> bool:
    node = request.node
    return any(getattr(getattr(node, f"rep_{w}", None), "failed", False) for w in ("setup", "call"))


@pytest.fixture(scope="session")
def cpp21_dir() -> Path:
    try:
        return cpp21_install_dir()
    except PipTargetError as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path)
    # librocketmq's own logs of the C++ client scripts (HOME points into tmp_path, see cpp_env)
    group.extra_log_globs.append(str(tmp_path / "cpp-home" / "logs" / "rocketmq-cpp" / "*"))
    try:
        yield group
    finally:
        group.stop_all()
        if _failed(request):
            sys.stdout.write(f"\n===== process logs of {request.node.nodeid} =====\n{group.dump()}\n")


@pytest.fixture
def cluster(procs: ProcessGroup) -> Callable[..., Cluster]:
    """Factory: ``cluster(**broker_props)`` starts a namesrv and a master broker and waits until the
    namesrv lists the broker."""

    def make(**broker_props: Any) -> Cluster:
        ns = start_namesrv(procs)
        broker = start_broker(procs, [ns.addr], **broker_props)
        return Cluster(group=procs, namesrv=ns, broker=broker)

    return make


class ScriptError(AssertionError):
    pass


@pytest.fixture
def run_script(procs: ProcessGroup, tmp_path: Path, request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    """``run_script(kind, name, args, timeout_s)`` runs ``cpp_scripts/<name>.py`` (kind "cpp"),
    ``cpp21_scripts/<name>.py`` (kind "cpp21", the C++ 2.1 client) or ``node/<name>.js`` (kind "node") with ``args`` as one JSON argument and returns the parsed last
    stdout line. A crash, a non-zero exit or a timeout fails the test with the script's output."""
    counter = [0]

    def run(kind: str, name: str, args: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        counter[0] += 1
        log_path = tmp_path / "logs" / f"{name}-{counter[0]}.stderr.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        procs.extra_logs.append(log_path)
        if kind == "cpp":
            argv = cpp_script_argv(name, args)
            env = cpp_env(tmp_path)
            cwd = CPP_SCRIPTS_DIR
        elif kind == "cpp21":
            argv = cpp21_script_argv(name, args)
            env = cpp21_env(tmp_path, request.getfixturevalue("cpp21_dir"))
            cwd = CPP21_SCRIPTS_DIR
        elif kind == "node":
            argv = ["node", str(NODE_DIR / f"{name}.js"), json.dumps(args)]
            env = dict(os.environ)
            cwd = NODE_DIR
        else:
            raise ValueError(kind)
        with open(log_path, "wb") as err:
            try:
                cp = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=err, timeout=timeout_s, start_new_session=True)
            except subprocess.TimeoutExpired as exc:
                raise ScriptError(f"{name} did not finish within {timeout_s} s; stdout: {exc.stdout!r}") from None
        stdout = cp.stdout.decode(errors="replace").strip()
        if cp.returncode != 0 or not stdout:
            raise ScriptError(f"{name} exited with {cp.returncode}; stdout: {stdout[-4000:]!r}")
        return dict(json.loads(stdout.splitlines()[-1]))

    return run

