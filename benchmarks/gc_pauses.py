"""Full garbage-collection pauses of a broker and a name server whose estate is built at runtime (issue 24).

Starts ``ferry namesrv`` and ``ferry broker`` as processes (127.0.0.1, free ports, a temporary directory) with
``gcFreezeEnable`` as given, ``FERRYMQ_GC_STATS=1`` (each full pass is logged with its duration) and their
metrics endpoints on, then builds the estate over the wire, phase by phase, on the running servers:

| phase      | server      | requests                                                                        |
|------------|-------------|---------------------------------------------------------------------------------|
| topics     | broker      | UPDATE_AND_CREATE_TOPIC of ``--topics`` topics x 8 queues (pipelined)             |
| groups     | broker      | HEART_BEATs declaring ``--groups`` consumer groups, ``HEARTBEAT_GROUPS`` each      |
| queues     | broker      | one 1 KiB SEND to each of ``--queues`` queues (``--queues`` / 8 topics, created)  |
| offsets    | broker      | UPDATE_CONSUMER_OFFSET of ``--offsets`` (group, queue) pairs                     |
| steady     | broker      | ``--steady`` more sends and commits on the built estate (the heap stops growing) |
| routes     | name server | benchmarks/namesrv_scale.py's phases: ``--brokers`` brokers x ``--ns-topics``     |

After each phase it reads, per server: full passes in the phase and the longest of them (the server's log),
the highest ``ferrymq_gc_pause_seconds`` and ``ferrymq_event_loop_lag_seconds`` buckets that gained a sample
in the phase (an upper bound of the longest pass and of the longest loop stall), ``ferrymq_gc_frozen_objects``
and RSS. Compare runs with ``--freeze on`` and ``--freeze off`` (the behaviour before the freeze policy for an
estate built after start).

    python benchmarks/gc_pauses.py --freeze off
    python benchmarks/gc_pauses.py --freeze on
    python benchmarks/gc_pauses.py --topics 1000 --groups 500 --queues 10000 --offsets 10000 --brokers 100 \\
        --ns-topics 1000                                                  # quick
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from namesrv_scale import measure as namesrv_measure  # noqa: E402
from namesrv_scale import rss_bytes  # noqa: E402

from ferrymq.client import api  # noqa: E402
from ferrymq.common.route import MessageQueue  # noqa: E402
from ferrymq.remoting.codec import RemotingCommand  # noqa: E402
from ferrymq.remoting.codes import ResponseCode  # noqa: E402
from ferrymq.remoting.connection import Connection, connect  # noqa: E402

HOST = "127.0.0.1"
QUEUES = 8
HEARTBEAT_GROUPS = 100
#: connections and requests in flight on each for the pipelined phases
BULK_CONNECTIONS = 4
BULK_DEPTH = 64
REQUEST_TIMEOUT_MS = 60_000
START_TIMEOUT_S = 60.0
BODY = b"x" * 1024
PASS_RE = re.compile(rb"full collection: ([0-9.]+) ms(?: \(([0-9.]+) ms CPU\))?")
BUCKET_RE = re.compile(r'^(ferrymq_gc_pause_seconds|ferrymq_event_loop_lag_seconds)_bucket\{.*le="([^"]+)".*\} (\S+)$')
FROZEN_RE = re.compile(r"^ferrymq_gc_frozen_objects(?:\{.*\})? (\S+)$")
FREEZE_RE = re.compile(rb"objects frozen out of the garbage collector")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class Server:
    """A server process with its log and metrics endpoint; ``phase()`` returns what happened since the last."""

    def __init__(self, name: str, argv: list[str], log_path: Path, port: int, metrics_port: int) -> None:
        env = {**os.environ, "FERRYMQ_GC_STATS": "1"}
        self.name, self.port, self.metrics_port, self.log_path = name, port, metrics_port, log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self._log_offset = 0
        self._buckets: dict[str, dict[float, float]] = {}

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}; see {self.log_path}")
            try:
                socket.create_connection((HOST, self.port), timeout=0.2).close()
                socket.create_connection((HOST, self.metrics_port), timeout=0.2).close()
                self.phase()  # the start's passes are not a phase's
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not open its ports within {START_TIMEOUT_S} s")

    def _scrape(self) -> tuple[dict[str, dict[float, float]], float]:
        with urllib.request.urlopen(f"http://{HOST}:{self.metrics_port}/metrics", timeout=30) as resp:
            text = resp.read().decode(errors="replace")
        buckets: dict[str, dict[float, float]] = {}
        frozen = 0.0
        for line in text.splitlines():
            m = BUCKET_RE.match(line)
            if m:
                buckets.setdefault(m.group(1), {})[float(m.group(2))] = float(m.group(3))
                continue
            f = FROZEN_RE.match(line)
            if f:
                frozen = float(f.group(1))
        return buckets, frozen

    def phase(self) -> dict[str, Any]:
        data = self.log_path.read_bytes()
        found = list(PASS_RE.finditer(data, self._log_offset))
        passes = [float(m.group(1)) for m in found]
        cpu = [float(m.group(2)) for m in found if m.group(2) is not None]
        freezes = len(FREEZE_RE.findall(data, self._log_offset))
        self._log_offset = len(data)
        buckets, frozen = self._scrape()
        out: dict[str, Any] = {"passes": len(passes), "longest_pass_ms": max(passes, default=0.0),
                               "longest_cpu_ms": max(cpu) if cpu else None, "freezes": freezes}
        for name, key in (("ferrymq_gc_pause_seconds", "pause_bucket_s"), ("ferrymq_event_loop_lag_seconds",
                                                                            "lag_bucket_s")):
            out[key] = _highest_gained(self._buckets.get(name, {}), buckets.get(name, {}))
        self._buckets = buckets
        out["frozen"] = int(frozen)
        rss = rss_bytes(self.proc.pid)
        out["rss_mib"] = round(rss / 2**20, 1) if rss else None
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _highest_gained(before: dict[float, float], after: dict[float, float]) -> float | None:
    """Upper bound of the lowest bucket holding every sample gained between two scrapes (0: none gained)."""
    if not after:
        return None
    bounds = sorted(after)
    total = after[bounds[-1]] - before.get(bounds[-1], 0.0)
    if total <= 0:
        return 0.0
    for le in bounds:
        if after[le] - before.get(le, 0.0) >= total:
            return le
    return None


async def pipeline(conns: list[Connection], cmds: Iterable[RemotingCommand], what: str) -> None:
    it = iter(cmds)
    failures: list[str] = []

    async def worker(conn: Connection) -> None:
        sem = asyncio.Semaphore(BULK_DEPTH)
        pending: set[asyncio.Future[Any]] = set()

        def done(fut: asyncio.Future[Any]) -> None:
            sem.release()
            pending.discard(fut)
            if fut.cancelled() or fut.exception() is not None:
                failures.append(repr(None if fut.cancelled() else fut.exception()))
            elif fut.result().code != ResponseCode.SUCCESS:
                failures.append(f"code {fut.result().code}: {fut.result().remark}")

        for cmd in it:
            await sem.acquire()
            fut = conn.request(cmd, REQUEST_TIMEOUT_MS)
            pending.add(fut)
            fut.add_done_callback(done)
        if pending:
            await asyncio.wait(set(pending))

    await asyncio.gather(*(worker(c) for c in conns))
    if failures:
        raise RuntimeError(f"{what}: {len(failures)} requests failed, first: {failures[0]}")


def create_cmds(names: Iterable[str]) -> Iterator[RemotingCommand]:
    for t in names:
        yield api.build_create_topic(t, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6, order=False)


def send_cmds(topics: list[str], count: int, start: int = 0) -> Iterator[RemotingCommand]:
    for n in range(start, start + count):
        yield api.build_send(producer_group="gc_producer", topic=topics[(n // QUEUES) % len(topics)],
                             queue_id=n % QUEUES, sys_flag=0, born_timestamp_ms=int(time.time() * 1000), flag=0,
                             properties="", body=BODY)


def commit_cmds(groups: list[str], topics: list[str], count: int, start: int = 0) -> Iterator[RemotingCommand]:
    for n in range(start, start + count):
        pair = n // QUEUES
        mq = MessageQueue(topics[pair % len(topics)], "gc-broker", n % QUEUES)
        yield api.build_update_consumer_offset(groups[pair % len(groups)], mq, n)


def heartbeat_cmds(groups: list[str], topics: list[str]) -> Iterator[RemotingCommand]:
    for i in range(0, len(groups), HEARTBEAT_GROUPS):
        consumers = [{"consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_ACTIVELY",
                      "groupName": g, "messageModel": "CLUSTERING", "unitMode": False,
                      "subscriptionDataSet": [api.subscription_data(topics[(i + k) % len(topics)], "*", 0)]}
                     for k, g in enumerate(groups[i:i + HEARTBEAT_GROUPS])]
        yield api.build_heartbeat(f"{HOST}@gc-{i}", [], consumers)


def row(server: str, phase: str, took_s: float, r: dict[str, Any]) -> str:
    cpu = "-" if r["longest_cpu_ms"] is None else f"{r['longest_cpu_ms']:.1f}"
    return (f"| {server:<7} | {phase:<34} | {took_s:7.1f} | {r['passes']:>6} | {r['longest_pass_ms']:>9.1f} | "
            f"{cpu:>9} | {r['pause_bucket_s']!s:>8} | {r['lag_bucket_s']!s:>8} | {r['freezes']:>7} | {r['frozen']:>9} | "
            f"{r['rss_mib']!s:>7} |")


HEADER = ("| server  | phase                              |  took s | passes | longest ms | longest CPU ms | gc le s |"
          " lag le s | freezes |    frozen | RSS MiB |\n|---|---|---|---|---|---|---|---|---|---|---|")


async def broker_phases(broker: Server, args: argparse.Namespace) -> None:
    addr = f"{HOST}:{broker.port}"
    conns = [await connect(addr) for _ in range(BULK_CONNECTIONS)]
    # the heart beats' own connection: the broker closes it when their client ids expire (120 s after the phase)
    hb_conn = await connect(addr)
    try:
        topics = [f"gc-t{i:05d}" for i in range(max(args.topics, args.queues // QUEUES))]
        groups = [f"gc-g{i:05d}" for i in range(args.groups)]
        phases: list[tuple[str, Iterable[RemotingCommand], list[Connection]]] = [
            (f"topics ({args.topics} x {QUEUES} queues)", create_cmds(topics[:args.topics]), conns),
            (f"groups ({args.groups}, by heart beats)", heartbeat_cmds(groups, topics), [hb_conn]),
            (f"queues ({args.queues}, one message each)",
             _chain(create_cmds(topics[args.topics:]), send_cmds(topics, args.queues)), conns),
            (f"offsets ({args.offsets} commits)", commit_cmds(groups, topics, args.offsets), conns),
            (f"steady ({args.steady} sends + commits)",
             _chain(send_cmds(topics, args.steady), commit_cmds(groups, topics, args.steady)), conns),
        ]
        for name, cmds, use in phases:
            t0 = time.perf_counter()
            await pipeline(use, cmds, name)
            took = time.perf_counter() - t0
            await asyncio.sleep(0.1)  # the loop-lag probe's last sample of the phase is in
            print(row("broker", name, took, await asyncio.to_thread(broker.phase)), flush=True)
    finally:
        for c in [*conns, hb_conn]:
            c.close()


def _chain(*its: Iterable[RemotingCommand]) -> Iterator[RemotingCommand]:
    for it in its:
        yield from it


async def namesrv_phases(ns: Server, args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    await namesrv_measure(f"{HOST}:{ns.port}", brokers=args.brokers, topics=args.ns_topics,
                          topics_per_broker=args.topics_per_broker, route_queries=1000, report=lambda _line: None)
    took = time.perf_counter() - t0
    await asyncio.sleep(0.1)
    print(row("namesrv", f"routes ({args.brokers} brokers x {args.ns_topics} topics)", took,
              await asyncio.to_thread(ns.phase)), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--freeze", choices=("on", "off"), default="on", help="gcFreezeEnable of both servers")
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--groups", type=int, default=5_000)
    ap.add_argument("--queues", type=int, default=100_000)
    ap.add_argument("--offsets", type=int, default=100_000)
    ap.add_argument("--steady", type=int, default=20_000)
    ap.add_argument("--brokers", type=int, default=1000)
    ap.add_argument("--ns-topics", type=int, default=10_000)
    ap.add_argument("--topics-per-broker", type=int, default=100)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, store)")
    args = ap.parse_args(argv)
    freeze = "true" if args.freeze == "on" else "false"
    tmp = Path(tempfile.mkdtemp(prefix="gc-pauses-"))
    servers: list[Server] = []
    try:
        ns_port, ns_metrics = free_port(), free_port()
        (tmp / "namesrv.conf").write_text(f"gcFreezeEnable={freeze}\n")
        ns = Server("namesrv", [sys.executable, "-m", "ferrymq.cli", "namesrv", "-c", str(tmp / "namesrv.conf"),
                                "--listen", f"{HOST}:{ns_port}", "--metrics-port", str(ns_metrics)],
                    tmp / "namesrv.log", ns_port, ns_metrics)
        servers.append(ns)
        ns.wait_ready()
        port, ha_port, metrics = free_port(), free_port(), free_port()
        conf = {"brokerName": "gc-broker", "namesrvAddr": f"{HOST}:{ns_port}", "listenHost": HOST,
                "listenPort": port, "haListenPort": ha_port, "brokerIP1": HOST, "fastListenEnable": "false",
                "storePathRootDir": str(tmp / "store"), "autoCreateTopicEnable": "false",
                "mappedFileSizeConsumeQueue": 4000, "metricsPort": metrics, "gcFreezeEnable": freeze}
        (tmp / "broker.conf").write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        broker = Server("broker", [sys.executable, "-m", "ferrymq.cli", "broker", "-c", str(tmp / "broker.conf")],
                        tmp / "broker.log", port, metrics)
        servers.append(broker)
        broker.wait_ready()
        print(f"gcFreezeEnable={freeze}; python {sys.version.split()[0]}; load {os.getloadavg()[0]:.2f}")
        print(HEADER)
        asyncio.run(broker_phases(broker, args))
        asyncio.run(namesrv_phases(ns, args))
    finally:
        for s in reversed(servers):
            s.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
