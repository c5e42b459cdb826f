"""Name server at estate size: many brokers, many topics, routes answered in bounded time.

Starts one ``ferry namesrv`` process (or measures one given with ``--namesrv``) and drives it over raw
remoting frames, one connection per broker as real brokers do:

1. ``register``   every broker registers once (``--brokers`` names, each with ``--topics-per-broker`` topics
                  taken round-robin from ``--topics`` names, so each topic is served by several brokers);
2. ``big``        ``--big-brokers`` more brokers register the whole topic set each (one plain JSON body,
                  then compressed bodies, as RocketMQ 4.9 sends a large table);
3. ``heartbeat``  every broker registers again with the same dataVersion (the 30 s heartbeat);
4. ``changed``    every broker registers again with a new dataVersion (a topic changed on each broker);
5. ``routes``     GET_ROUTEINFO_BY_TOPIC of random topics, one at a time;
6. ``reads``      GET_ALL_TOPIC_LIST_FROM_NAMESERVER, GET_BROKER_CLUSTER_INFO, GET_TOPICS_BY_CLUSTER;
7. ``removal``    the big brokers' connections close (the name server drops their 10k routes each).

During every phase a probe connection sends GET_ROUTEINFO_BY_TOPIC every ``PROBE_INTERVAL_S``; its answer
times are route-query latency under load (they include waiting behind requests queued before it and the
benchmark process's own scheduling). The name server's longest event-loop stall per phase is measured
inside its process: the benchmark runs the name server itself (``--serve``, a ``NameServer`` of whatever
ferrymq is on the path, so an older tree is measured the same way) beside a task that sleeps 10 ms again
and again and records how late it wakes (as ``ferrymq_event_loop_lag_seconds`` does); the benchmark reads
and resets the maximum after each phase over a small HTTP endpoint, with the longest garbage-collector pause
of the phase (``gc.callbacks``) beside it, since a full collection over a grown heap is one of the causes.
With ``--namesrv`` (a name server not started here) the columns are "-".

Prints p50/p99/max per phase, the probe's p99/max per phase, and the name server's RSS after the estate is
built. ``measure(ns_addr, ...)`` is importable (e.g. by ``ferry bench --estate``) and returns the figures.

    python benchmarks/namesrv_scale.py                      # 1,000 brokers x 10,000 topics
    python benchmarks/namesrv_scale.py --brokers 100 --topics 1000
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.connection import Connection, connect

try:
    from ferrymq.common.register_body_codec import encode_compressed_register_body
except ImportError:  # older trees kept the codec in the name server
    from ferrymq.namesrv.register_body import RegisterBrokerBody, encode_register_body

    def encode_compressed_register_body(topic_configs: Any, filter_server_list: Any = (),
                                        data_version: Any = None) -> bytes:
        table = {tc.topic_name: tc for tc in topic_configs}
        return encode_register_body(RegisterBrokerBody(data_version or DataVersion(), table,
                                                       list(filter_server_list)), compressed=True)

PROBE_INTERVAL_S = 0.01
#: registrations in flight at once (brokers register independently; this bounds the benchmark's own load)
REGISTER_CONCURRENCY = 8
REQUEST_TIMEOUT_MS = 60_000
CLUSTER = "EstateCluster"
QUEUES = 8


@dataclass
class Phase:
    name: str
    latencies_ms: list[float] = field(default_factory=list)
    probe_ms: list[float] = field(default_factory=list)
    failures: int = 0
    wall_s: float = 0.0
    #: the longest event-loop stall and GC pause of the name server during the phase (None: not measured)
    max_stall_ms: float | None = None
    max_gc_ms: float | None = None

    def row(self) -> dict[str, Any]:
        return {"phase": self.name, "n": len(self.latencies_ms), "failures": self.failures,
                "wall_s": round(self.wall_s, 2), **_stats("", self.latencies_ms),
                **_stats("probe_", self.probe_ms), "max_stall_ms": self.max_stall_ms,
                "max_gc_ms": self.max_gc_ms}


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _stats(prefix: str, values: list[float]) -> dict[str, float]:
    return {f"{prefix}p50_ms": round(_pct(values, 0.5), 2), f"{prefix}p99_ms": round(_pct(values, 0.99), 2),
            f"{prefix}max_ms": round(max(values), 2) if values else float("nan")}


@dataclass
class Estate:
    brokers: int
    topics: int
    topics_per_broker: int
    big_brokers: int
    compressed: bool

    def topic_name(self, i: int) -> str:
        return f"estate-topic-{i:05d}"

    def broker_topics(self, b: int) -> list[TopicConfig]:
        start = (b * self.topics_per_broker) % self.topics
        return [TopicConfig(self.topic_name((start + k) % self.topics), QUEUES, QUEUES, 6)
                for k in range(self.topics_per_broker)]

    def all_topics(self) -> list[TopicConfig]:
        return [TopicConfig(self.topic_name(i), QUEUES, QUEUES, 6) for i in range(self.topics)]


def _body(topics: list[TopicConfig], version: DataVersion, compressed: bool) -> bytes:
    if compressed:
        return encode_compressed_register_body(topics, [], version)
    wrapper = {"dataVersion": version.to_json(), "topicConfigTable": {t.topic_name: t.to_json() for t in topics}}
    return jsonx.dumps({"filterServerList": [], "topicConfigSerializeWrapper": wrapper})


def _register_cmd(name: str, addr: str, body: bytes, compressed: bool) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, {
        "brokerName": name, "brokerAddr": addr, "clusterName": CLUSTER, "haServerAddr": "", "brokerId": 0,
        "compressed": compressed, "bodyCrc32": 0}, body)


class Probe:
    """GET_ROUTEINFO_BY_TOPIC every PROBE_INTERVAL_S; ``take()`` returns the answer times since the last take."""

    def __init__(self, conn: Connection, estate: Estate) -> None:
        self.conn = conn
        self.estate = estate
        self._samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def take(self) -> list[float]:
        out, self._samples = self._samples, []
        return out

    async def _run(self) -> None:
        rnd = random.Random(7)
        while True:
            topic = self.estate.topic_name(rnd.randrange(self.estate.topics))
            t0 = time.perf_counter()
            await self.conn.invoke(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
                                   REQUEST_TIMEOUT_MS)
            self._samples.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(PROBE_INTERVAL_S)


async def _timed(phase: Phase, make: Callable[[], Awaitable[RemotingCommand]]) -> None:
    t0 = time.perf_counter()
    try:
        resp = await make()
    except Exception:
        phase.failures += 1
        return
    phase.latencies_ms.append((time.perf_counter() - t0) * 1000)
    if resp.code not in (0, 17):
        phase.failures += 1


async def _bounded(jobs: list[Callable[[], Awaitable[None]]], limit: int) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[None]]) -> None:
        async with sem:
            await job()

    await asyncio.gather(*(one(j) for j in jobs))


def read_max_lag_ms(lag_addr: str | None) -> tuple[float | None, float | None]:
    """The longest loop stall and GC pause (ms) the ``--serve`` process saw since the last read (the read resets
    both)."""
    if lag_addr is None:
        return None, None
    try:
        with urllib.request.urlopen(f"http://{lag_addr}/max-lag", timeout=10) as resp:
            lag_s, gc_s = resp.read().decode().split()
            return round(float(lag_s) * 1000, 1), round(float(gc_s) * 1000, 1)
    except (OSError, ValueError):
        return None, None


async def measure(ns_addr: str, *, brokers: int = 1000, topics: int = 10_000, topics_per_broker: int = 100,
                  big_brokers: int = 1, route_queries: int = 5000, compressed: bool = False,
                  rss_of: Callable[[], int | None] | None = None, lag_addr: str | None = None,
                  report: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the estate on the name server at ``ns_addr`` and measure it; returns {"phases": [...], "rss_mb",
    "longest_probe_ms", "longest_stall_ms"}. ``lag_addr`` (the ``--serve`` process's endpoint) adds the
    loop-stall column."""
    estate = Estate(brokers, topics, topics_per_broker, big_brokers, compressed)
    phases: list[Phase] = []
    probe_conn = await connect(ns_addr)
    probe = Probe(probe_conn, estate)
    conns: list[Connection] = []
    big_conns: list[Connection] = []
    try:
        for _ in range(brokers):
            conns.append(await connect(ns_addr))
        for _ in range(big_brokers):
            big_conns.append(await connect(ns_addr))
        addrs = [f"127.0.0.2:{20000 + b}" for b in range(brokers)]
        names = [f"estate-broker-{b:04d}" for b in range(brokers)]
        probe.start()

        async def run_phase(name: str, jobs: list[Callable[[], Awaitable[None]]], phase: Phase,
                            limit: int = REGISTER_CONCURRENCY) -> None:
            probe.take()
            await asyncio.to_thread(read_max_lag_ms, lag_addr)
            t0 = time.perf_counter()
            await _bounded(jobs, limit)
            phase.wall_s = time.perf_counter() - t0
            phase.probe_ms = probe.take()
            await asyncio.sleep(2 * PROBE_INTERVAL_S)  # the lag probe's last sample of the phase is in
            phase.max_stall_ms, phase.max_gc_ms = await asyncio.to_thread(read_max_lag_ms, lag_addr)
            phases.append(phase)
            report(_format_row(phase.row()))

        for round_name, counter in (("register", 1), ("heartbeat", 1), ("changed", 2)):
            version = DataVersion(counter, 1_700_000_000_000 + counter)
            bodies = [_body(estate.broker_topics(b), version, compressed) for b in range(brokers)]
            phase = Phase(f"{round_name} ({brokers} x {topics_per_broker} topics"
                          f"{', compressed' if compressed else ''})")
            jobs = [(lambda p=phase, cmd=_register_cmd(names[b], addrs[b], bodies[b], compressed), c=conns[b]:
                     _timed(p, lambda: c.invoke(cmd, REQUEST_TIMEOUT_MS)))
                    for b in range(brokers)]
            await run_phase(round_name, jobs, phase)
            if round_name == "register":
                for big_round, big_counter in (("big", 1), ("big heartbeat", 1), ("big changed", 2)):
                    await _big_phase(big_round, big_counter, estate, big_conns, run_phase)

        rnd = random.Random(11)
        phase = Phase(f"GET_ROUTEINFO_BY_TOPIC x {route_queries}")
        topics_q = [estate.topic_name(rnd.randrange(topics)) for _ in range(route_queries)]
        route_conn = conns[0]
        jobs = [(lambda t=t: _timed(phase, lambda: route_conn.invoke(
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": t}), REQUEST_TIMEOUT_MS)))
            for t in topics_q]
        await run_phase("routes", jobs, phase, limit=1)

        for label, code, fields in (
            ("GET_ALL_TOPIC_LIST_FROM_NAMESERVER x 20", RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {}),
            ("GET_BROKER_CLUSTER_INFO x 20", RequestCode.GET_BROKER_CLUSTER_INFO, {}),
            ("GET_TOPICS_BY_CLUSTER x 20", RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": CLUSTER}),
        ):
            phase = Phase(label)
            jobs = [(lambda p=phase, c=code, f=fields: _timed(p, lambda: route_conn.invoke(
                RemotingCommand.request(c, f), REQUEST_TIMEOUT_MS))) for _ in range(20)]
            await run_phase(label, jobs, phase, limit=1)

        rss_mb = None
        if rss_of is not None:
            rss = rss_of()
            rss_mb = round(rss / 2**20, 1) if rss is not None else None
            report(f"name server RSS with the estate: {rss_mb} MiB")

        phase = Phase(f"removal of {big_brokers} big broker(s) by connection close")
        probe.take()
        await asyncio.to_thread(read_max_lag_ms, lag_addr)
        t0 = time.perf_counter()
        for c in big_conns:
            c.close()
        await _wait_gone(route_conn, [f"estate-big-{i}" for i in range(big_brokers)])
        phase.wall_s = time.perf_counter() - t0
        phase.latencies_ms.append(phase.wall_s * 1000)
        phase.probe_ms = probe.take()
        await asyncio.sleep(2 * PROBE_INTERVAL_S)
        phase.max_stall_ms, phase.max_gc_ms = await asyncio.to_thread(read_max_lag_ms, lag_addr)
        phases.append(phase)
        report(_format_row(phase.row()))
        stalls = [p.max_stall_ms for p in phases if p.max_stall_ms is not None]
        return {"phases": [p.row() for p in phases], "rss_mb": rss_mb,
                "longest_probe_ms": max((max(p.probe_ms) for p in phases if p.probe_ms), default=None),
                "longest_stall_ms": max(stalls, default=None)}
    finally:
        await probe.stop()
        for c in [probe_conn, *conns, *big_conns]:
            c.close()


async def _big_phase(name: str, counter: int, estate: Estate, big_conns: list[Connection],
                     run_phase: Callable[..., Awaitable[None]]) -> None:
    version = DataVersion(counter, 1_700_000_000_000 + counter)
    table = estate.all_topics()
    phase = Phase(f"{name} ({len(big_conns)} x {estate.topics} topics, JSON then compressed)")
    jobs = []
    for i, conn in enumerate(big_conns):
        for compressed in (False, True):
            body = _body(table, version, compressed)
            cmd = _register_cmd(f"estate-big-{i}", f"127.0.0.3:{30000 + i}", body, compressed)
            jobs.append(lambda conn=conn, cmd=cmd: _timed(phase, lambda: conn.invoke(cmd, REQUEST_TIMEOUT_MS)))
    await run_phase(name, jobs, phase, 1)


async def _wait_gone(conn: Connection, names: list[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        resp = await conn.invoke(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), REQUEST_TIMEOUT_MS)
        table = jsonx.loads(resp.body).get("brokerAddrTable", {})
        if not any(n in table for n in names):
            return
        await asyncio.sleep(0.005)
    raise TimeoutError(f"brokers {names} still listed 60 s after their connections closed")


def _format_row(row: dict[str, Any]) -> str:
    stall = "-" if row["max_stall_ms"] is None else f"{row['max_stall_ms']} (gc {row['max_gc_ms']})"
    return (f"| {row['phase']:<58} | {row['n']:>6} | {row['p50_ms']:>8} | {row['p99_ms']:>8} | "
            f"{row['max_ms']:>8} | {row['probe_p99_ms']:>8} | {row['probe_max_ms']:>8} | {stall:>18} | "
            f"{row['failures']} |")


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LAG_PROBE_INTERVAL_S = 0.010


async def _serve(port: int, lag_port: int) -> None:
    """The name server under test and, beside it on the same loop, the stall probe and its endpoint."""
    import gc

    from ferrymq.namesrv.app import NameServer

    loop = asyncio.get_running_loop()
    state = {"max_lag_s": 0.0, "max_gc_s": 0.0, "gc_start": 0.0}

    def gc_pause(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            state["gc_start"] = time.perf_counter()
        else:
            state["max_gc_s"] = max(state["max_gc_s"], time.perf_counter() - state["gc_start"])

    gc.callbacks.append(gc_pause)

    async def lag_probe() -> None:
        while True:
            before = loop.time()
            await asyncio.sleep(LAG_PROBE_INTERVAL_S)
            state["max_lag_s"] = max(state["max_lag_s"], loop.time() - before - LAG_PROBE_INTERVAL_S)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = f"{state['max_lag_s']:.6f} {state['max_gc_s']:.6f}".encode()
        state["max_lag_s"] = state["max_gc_s"] = 0.0
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = NameServer("127.0.0.1", port)
    await server.start()
    http = await asyncio.start_server(answer, "127.0.0.1", lag_port)
    probe = asyncio.ensure_future(lag_probe())
    try:
        await asyncio.Event().wait()
    finally:
        probe.cancel()
        http.close()
        await server.stop()


def start_namesrv(log_dir: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """This script's ``--serve`` process: (process, remoting host:port, lag endpoint host:port)."""
    port, lag_port = _free_port(), _free_port()
    log = open(log_dir / "namesrv.log", "ab")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(lag_port)],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            socket.create_connection(("127.0.0.1", lag_port), timeout=0.2).close()
            return proc, f"127.0.0.1:{port}", f"127.0.0.1:{lag_port}"
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"namesrv exited {proc.returncode}; see {log_dir / 'namesrv.log'}") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("namesrv did not open its ports within 30 s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", type=int, default=1000)
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--topics-per-broker", type=int, default=100)
    ap.add_argument("--big-brokers", type=int, default=1, help="brokers registering every topic")
    ap.add_argument("--route-queries", type=int, default=5000)
    ap.add_argument("--compressed", action="store_true", help="the small brokers register compressed too")
    ap.add_argument("--namesrv", help="measure this running name server (host:port) instead of starting one")
    ap.add_argument("--serve", nargs=2, type=int, metavar=("PORT", "LAG_PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(*args.serve))
        return 0
    with tempfile.TemporaryDirectory(prefix="ns-scale-") as tmp:
        proc = None
        if args.namesrv:
            ns_addr, rss_of, lag_addr = args.namesrv, None, None
        else:
            proc, ns_addr, lag_addr = start_namesrv(Path(tmp))
            pid = proc.pid
            base = rss_bytes(pid)
            print(f"name server pid {pid} on {ns_addr}, RSS at start {round((base or 0) / 2**20, 1)} MiB")

            def rss_of() -> int | None:
                return rss_bytes(pid)
        print("| phase                                                      |      n |  p50 ms  |  p99 ms  |"
              "  max ms  | probe p99 | probe max | longest loop stall ms (longest GC pause) | fail |")
        print("|" + "---|" * 9)
        try:
            out = asyncio.run(measure(ns_addr, brokers=args.brokers, topics=args.topics,
                                      topics_per_broker=args.topics_per_broker, big_brokers=args.big_brokers,
                                      route_queries=args.route_queries, compressed=args.compressed,
                                      rss_of=rss_of, lag_addr=lag_addr))
        finally:
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    print(f"longest loop stall: {out['longest_stall_ms']} ms; longest probe answer: {out['longest_probe_ms']} ms; "
          f"name server RSS {out['rss_mb']} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
