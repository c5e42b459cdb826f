"""Subprocess supervision for the bench: free ports, temp dirs, start/wait/stop of name servers, brokers,
Redis and helper processes. Every process started here is stopped by ``Supervisor.close()`` (also on
Ctrl-C or failure: the runner uses it as a context manager). Children run in their own session so a
terminal Ctrl-C reaches only the bench, which then stops them in order (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

HOST = "127.0.0.1"
#: How long a child may take to open its port.
START_TIMEOUT_S = 60.0
#: Grace period between SIGTERM and SIGKILL when stopping a child.
STOP_GRACE_S = 5.0
PORT_POLL_INTERVAL_S = 0.02


def free_port(count: int = 1) -> int:
    """A base port such that ``base .. base+count-1`` were all free a moment ago (for listenPort/haPort)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((HOST, 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        ok = True
        for p in range(base + 1, base + count):
            with socket.socket() as s2:
                try:
                    s2.bind((HOST, p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range found")


def port_open(port: int, host: str = HOST, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log_path: str
    port: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n_bytes: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - n_bytes))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""


class ChildFailed(RuntimeError):
    pass


@dataclass
class Supervisor:
    """Owns a temp dir and all children started through it."""

    keep_dir: bool = False
    base_dir: str | None = None
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        # always a fresh directory of our own (inside the given parent), so cleanup never removes user files
        parent = self.base_dir
        if parent is not None:
            os.makedirs(parent, exist_ok=True)
        self.base_dir = tempfile.mkdtemp(prefix="ferrybench-", dir=parent)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path(self, *parts: str) -> str:
        assert self.base_dir is not None
        p = os.path.join(self.base_dir, *parts)
        return p

    def spawn(self, name: str, argv: Sequence[str], *, port: int | None = None, env: dict[str, str] | None = None,
              cwd: str | None = None) -> Child:
        log_path = self.path("logs", f"{name}.log")
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        full_env = dict(os.environ)
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        if env:
            full_env.update(env)
        try:
            proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=full_env, cwd=cwd, start_new_session=True)
        finally:
            log.close()
        child = Child(name, list(argv), proc, log_path, port)
        self.children.append(child)
        return child

    def wait_port(self, child: Child, port: int | None = None, timeout_s: float = START_TIMEOUT_S) -> float:
        """Wait until ``port`` accepts; returns seconds waited. Raises ChildFailed if the child died."""
        port = port if port is not None else child.port
        assert port is not None
        t0 = time.monotonic()
        while True:
            if port_open(port):
                return time.monotonic() - t0
            if not child.alive():
                raise ChildFailed(f"{child.name} exited with {child.proc.returncode}:\n{child.log_tail()}")
            if time.monotonic() - t0 > timeout_s:
                raise ChildFailed(f"{child.name} did not open port {port} in {timeout_s}s:\n{child.log_tail()}")
            time.sleep(PORT_POLL_INTERVAL_S)

    def kill(self, child: Child, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the child's process group and reap it (SIGKILL = crash simulation)."""
        if child.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=STOP_GRACE_S)
        if child in self.children and not child.alive():
            self.children.remove(child)

    def stop(self, child: Child, grace_s: float = STOP_GRACE_S) -> None:
        if child.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, signal.SIGTERM)
            try:
                child.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=grace_s)
        if child in self.children:
            self.children.remove(child)

    def close(self) -> None:
        # stop in reverse start order (slaves and brokers before the name server); ignore further Ctrl-C
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
        try:
            for child in reversed(list(self.children)):
                with contextlib.suppress(Exception):
                    self.stop(child)
            if not self.keep_dir and self.base_dir and os.path.isdir(self.base_dir):
                import shutil

                shutil.rmtree(self.base_dir, ignore_errors=True)
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def cpu_times_s(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process, all its threads, seconds; (0, 0) for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def python_argv(*args: str) -> list[str]:
    return [sys.executable, *args]


def ferry_argv(*args: str) -> list[str]:
    """``ferry <args>`` through the current interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "ferrymq.cli", *args]
