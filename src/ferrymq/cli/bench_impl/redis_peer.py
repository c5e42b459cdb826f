"""Peer: Redis streams (Debian's redis-server). XADD from 16 clients (redis-benchmark, C), and XADD +
``WAIT 1 0`` from one Python client (redis-py) with one replica attached. No persistence (like
ASYNC_FLUSH); the replica only for the WAIT run.

``DurableRedis`` is a second server with the append-only file on: ``appendfsync always`` (Redis writes and
fsyncs the AOF on its event loop before it answers: the fsync-before-ack peer of SYNC_FLUSH) or ``everysec``
(written before the answer, fsynced once a second: the peer of ASYNC_FLUSH), switched with CONFIG SET
between runs."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time
from typing import Any

from ferrymq.cli.bench_impl.procs import HOST, Child, Supervisor, free_port

REPLICA_LINK_TIMEOUT_S = 30.0


def available() -> str | None:
    """None when usable, else the reason to skip."""
    if shutil.which("redis-server") is None:
        return "redis-server not installed (apt-get install -y redis-server failed or not run)"
    if shutil.which("redis-benchmark") is None:
        return "redis-benchmark not installed"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "PyPI package 'redis' not installed (pip install 'ferrymq[bench]')"
    return None


def try_install() -> str | None:
    """apt-get install redis-server if missing (as root); returns the skip reason if still missing."""
    if shutil.which("redis-server") is None and shutil.which("apt-get") is not None:
        subprocess.run(["apt-get", "install", "-y", "redis-server"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=600, check=False)
    return available()


def _server_argv(port: int, data_dir: str, replica_of: int | None = None) -> list[str]:
    argv = ["redis-server", "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
            "--dir", data_dir, "--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning"]
    if replica_of is not None:
        argv += ["--replicaof", HOST, str(replica_of)]
    return argv


def cli(port: int, *args: str) -> str:
    return subprocess.run(["redis-cli", "-h", HOST, "-p", str(port), *args], capture_output=True, text=True,
                          timeout=30, check=False).stdout


class RedisPair:
    def __init__(self, sup: Supervisor) -> None:
        import os

        self.sup = sup
        self.port = free_port()
        d = sup.path("redis", "master")
        os.makedirs(d, exist_ok=True)
        self.master = sup.spawn("redis-master", _server_argv(self.port, d), port=self.port)
        sup.wait_port(self.master)
        self.replica: Child | None = None
        self.replica_port = 0

    def attach_replica(self) -> None:
        import os

        self.replica_port = free_port()
        d = self.sup.path("redis", "replica")
        os.makedirs(d, exist_ok=True)
        replica = self.sup.spawn("redis-replica", _server_argv(self.replica_port, d, self.port),
                                 port=self.replica_port)
        self.replica = replica
        self.sup.wait_port(replica)
        deadline = time.monotonic() + REPLICA_LINK_TIMEOUT_S
        while "master_link_status:up" not in cli(self.replica_port, "info", "replication"):
            if time.monotonic() > deadline:
                raise TimeoutError("redis replica did not link up")
            time.sleep(0.05)

    def close(self) -> None:
        if self.replica is not None:
            self.sup.stop(self.replica)
        self.sup.stop(self.master)


def xadd_benchmark(port: int, clients: int, requests: int, body_bytes: int) -> dict[str, Any]:
    """redis-benchmark running ``XADD benchstream * f <value>``; returns rps and latency percentiles."""
    value = ("r" * body_bytes)
    cli(port, "del", "benchstream")
    out = subprocess.run(["redis-benchmark", "-h", HOST, "-p", str(port), "-c", str(clients), "-n", str(requests),
                          "--csv", "XADD", "benchstream", "*", "f", value],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    rows = list(csv.reader(io.StringIO(out)))
    header, data = rows[0], rows[-1]
    rec = dict(zip(header, data, strict=False))
    cli(port, "del", "benchstream")
    return {"rps": float(rec["rps"]), "p50_us": float(rec["p50_latency_ms"]) * 1000,
            "p99_us": float(rec["p99_latency_ms"]) * 1000, "count": requests}


class DurableRedis:
    """One redis-server with ``appendonly yes``; ``set_fsync("always" | "everysec")`` before each run."""

    def __init__(self, sup: Supervisor) -> None:
        import os

        self.sup = sup
        self.port = free_port()
        d = sup.path("redis", "durable")
        os.makedirs(d, exist_ok=True)
        argv = ["redis-server", "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "yes",
                "--appendfsync", "always", "--dir", d, "--protected-mode", "no", "--daemonize", "no",
                "--loglevel", "warning"]
        self.child = sup.spawn("redis-durable", argv, port=self.port)
        sup.wait_port(self.child)

    def set_fsync(self, mode: str) -> None:
        out = cli(self.port, "config", "set", "appendfsync", mode)
        if "OK" not in out:
            raise RuntimeError(f"redis CONFIG SET appendfsync {mode}: {out.strip()}")

    def close(self) -> None:
        self.sup.stop(self.child)
