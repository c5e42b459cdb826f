"""What both quickstarts use (``ferry quickstart`` and ``ferry quickstart --failover``): free 127.0.0.1 ports,
child processes started in their own session and stopped on every exit path, raw remoting requests and the
polling wait of each start-up step. The two commands are siblings that import this module, never each
other."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click

T = TypeVar("T")

LOOPBACK = "127.0.0.1"
CLUSTER_NAME = "DefaultCluster"
#: limits of the start-up steps both quickstarts share
NAMESRV_START_TIMEOUT_S = 30.0
BROKER_START_TIMEOUT_S = 60.0
#: polling period of every start-up wait and of the child watch while serving
POLL_INTERVAL_S = 0.1
#: one raw request from the quickstart
REQUEST_TIMEOUT_MS = 3000
#: SIGTERM → SIGKILL grace per child
CHILD_STOP_GRACE_S = 10.0
#: attempts at finding a free port
FREE_PORT_ATTEMPTS = 200
#: bytes of a failed child's log shown on stderr
LOG_TAIL_BYTES = 4000
#: prctl option number (linux/prctl.h)
PR_SET_PDEATHSIG = 1


class QuickstartError(Exception):
    """A start-up step failed (its message says which and why)."""


# ---------------------------------------------------------------------------------------------------
# ports


def port_free(port: int) -> bool:
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_port(taken: set[int], *, with_next: bool = False) -> int:
    """A free 127.0.0.1 port not in ``taken`` (with ``with_next`` also port+1, a broker's HA port)."""
    for _ in range(FREE_PORT_ATTEMPTS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, 0))
            port = int(s.getsockname()[1])
        group = [port, port + 1] if with_next else [port]
        if any(p in taken for p in group) or not all(port_free(p) for p in group):
            continue
        taken.update(group)
        return port
    raise QuickstartError("no free port found on 127.0.0.1")


# ---------------------------------------------------------------------------------------------------
# child processes


def die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:
        pass


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-LOG_TAIL_BYTES:].decode(errors="replace")

    async def stop(self) -> int | None:
        """SIGTERM, wait up to CHILD_STOP_GRACE_S, then SIGKILL; always reaped."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + CHILD_STOP_GRACE_S
            while self.popen.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(POLL_INTERVAL_S)
            if self.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.popen.kill()
        return self.popen.wait()


@dataclass
class Stack:
    data_dir: Path
    namesrv_port: int = 0
    master_port: int = 0
    slave_port: int = 0
    #: Prometheus ports of the name server, master and slave, and the console's port
    namesrv_metrics_port: int = 0
    master_metrics_port: int = 0
    slave_metrics_port: int = 0
    console_port: int = 0
    children: list[Child] = field(default_factory=list)

    @property
    def namesrv_addr(self) -> str:
        return f"{LOOPBACK}:{self.namesrv_port}"

    @property
    def master_addr(self) -> str:
        return f"{LOOPBACK}:{self.master_port}"

    @property
    def slave_addr(self) -> str:
        return f"{LOOPBACK}:{self.slave_port}"

    @property
    def master_ha_addr(self) -> str:
        return f"{LOOPBACK}:{self.master_port + 1}"

    def spawn(self, name: str, *args: str) -> Child:
        child = Child(
            name, [sys.executable, "-m", "ferrymq.cli", *args], self.data_dir / "logs" / f"{name}.log"
        )
        self.children.append(child)
        child.start()
        click.echo(f"started {name:<8} pid {child.pid:<7} log {child.log_path}")
        return child

    def check_alive(self) -> None:
        for child in self.children:
            code = child.exit_code
            if code is not None:
                raise QuickstartError(
                    f"{child.name} (pid {child.pid}) exited with code {code}; "
                    f"last log lines:\n{child.log_tail()}"
                )

    def newly_dead(self, reported: set[str]) -> list[Child]:
        """Children that exited since the last call (names in ``reported`` are skipped and then added)."""
        dead = [c for c in self.children if c.name not in reported and c.exit_code is not None]
        reported.update(c.name for c in dead)
        return dead

    async def stop_all(self) -> None:
        for child in reversed(self.children):
            code = await child.stop()
            if code is not None:
                click.echo(f"stopped {child.name} (pid {child.pid}, exit code {code})")


def write_conf(path: Path, props: dict[str, str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


# ---------------------------------------------------------------------------------------------------
# raw remoting requests


async def request(addr: str, code: int, ext_fields: dict[str, Any] | None = None, body: bytes = b"") -> Any:
    from ferrymq.remoting.codec import RemotingCommand
    from ferrymq.remoting.connection import connect

    conn = await connect(addr, timeout_ms=REQUEST_TIMEOUT_MS)
    try:
        return await conn.invoke(
            RemotingCommand.request(code, dict(ext_fields or {}), body), REQUEST_TIMEOUT_MS
        )
    finally:
        conn.close()


def json_body(resp: Any) -> Any:
    from ferrymq.remoting import jsonx

    return jsonx.loads(resp.body) if resp.body else None


async def wait_until(
    stack: Stack, condition: Callable[[], Awaitable[T]], *, timeout_s: float, what: str
) -> T:
    """Poll ``condition`` until truthy; a child dying or the deadline passing fails the step."""
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while True:
        stack.check_alive()
        try:
            value = await condition()
        except Exception as exc:  # connection refused, timeouts, ferrymq errors while a peer is starting
            value, last_exc = None, exc  # type: ignore[assignment]
        if value:
            return value
        if time.monotonic() >= deadline:
            hint = f" (last error: {last_exc})" if last_exc else ""
            raise QuickstartError(f"timed out after {timeout_s:.0f} s waiting for {what}{hint}")
        await asyncio.sleep(POLL_INTERVAL_S)
