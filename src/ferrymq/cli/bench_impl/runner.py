"""``ferry bench`` orchestration: start what each workload needs, run it ``repeats`` times, stop it,
then print one table of medians with ratios and PASS/MISS against the targets (and optional JSON).

Workload ids (rows of the table):

| id  | workload                                                                 | stack            |
|-----|--------------------------------------------------------------------------|------------------|
| 1   | single sends, 16 concurrent producers, ASYNC_MASTER + ASYNC_FLUSH        | async            |
| 2   | batched sends (MB/s), same stack                                         | async            |
| 3a  | SYNC_MASTER + 1 slave, one client doing sync sends                       | sync_master      |
| 3b  | SYNC_MASTER + 1 slave, 16 concurrent producers                           | sync_master      |
| 12a | controller mode, SYNC + 1 slave (allAckInSyncStateSet), one client      | controller       |
| 12b | controller mode, SYNC + 1 slave, 16 concurrent producers                 | controller       |
| 4a  | SYNC_FLUSH, one client                                                   | sync_flush       |
| 4b  | SYNC_FLUSH, 16 concurrent producers                                      | sync_flush       |
| 5   | end-to-end latency send -> consumed at a fixed rate                      | async            |
| 6   | consume from a backlog with PullConsumer                                 | async            |
| 7   | slave catch-up: empty slave joins a master holding a backlog             | catchup          |
| 8   | restart after SIGKILL with a >= 1 GiB log: until a pull succeeds         | catchup          |
| 9   | C++ client (PyPI rocketmq 0.4.4) sync sends, one client                  | async            |
| 10a | peer Redis: XADD from 16 clients (redis-benchmark)                       | redis            |
| 10b | peer Redis: XADD + WAIT 1 0, one client, one replica                     | redis            |
| 11a | limit: Python uvloop echo server with RocketMQ framing, 16 connections   | echo subprocess  |
| 11b | limit: same, frames split by length only (no header codec)              | echo subprocess  |
| 11c | limit: loopback TCP, one stream (1 MiB and 1 KiB writes)                 | sink subprocess  |
| 11d | limit: sequential write MB/s on the store's disk                        | in process       |
| 11e | limit: 4 KiB write + fdatasync per second on the store's disk            | in process       |
| 13a-i | ferrymq beside Redis, RabbitMQ, NATS: one client each, interleaved per repeat (peers.py) | peers |

Every row shows the machine's 1-minute load average during its repeats (the highest), flagged when it was
above 1.0 per core (the figures of such a row are those of a shared, busy machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ferrymq.cli.bench_impl import peers, redis_peer
from ferrymq.cli.bench_impl.mpwork import run_workers
from ferrymq.cli.bench_impl.procs import Supervisor, free_port, python_argv
from ferrymq.cli.bench_impl.stack import (
    QUEUES,
    Stack,
    controller_master,
    create_topic,
    max_offsets,
    pull_once,
    runtime_info,
    wait_send_ok,
)
from ferrymq.cli.bench_impl.stats import latency_summary_us, median
from ferrymq.cli.bench_impl.units import fmt_size

ALL_WORKLOADS = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13")
TARGET_ASYNC_VS_ECHO = 0.8
TARGET_BATCH_MB_S = 300.0
TARGET_SYNC_MASTER_VS_ASYNC = 0.7
#: controller-mode SYNC sends against classic SYNC_MASTER (3a/3b) in the same run
TARGET_CONTROLLER_VS_SYNC_MASTER = 0.9
TARGET_CATCHUP_MB_S = 500.0
TARGET_RESTART_S = 5.0
#: Overall bound of one workload's worker run beyond its planned duration.
CONSUME_MAX_S = 300.0
CATCHUP_MAX_S = 1800.0
RESTART_MAX_S = 120.0
CATCHUP_POLL_S = 0.05
#: Workload 8 reuses the catch-up master unless its log is this much larger than --restart-bytes.
RESTART_REUSE_FACTOR = 1.25


#: Load-generator process counts the echo ceiling (11a/11b) is measured with, each repeat; the row keeps the
#: best. The ceiling is the server's, so the load side must not be what limits it: one process can fall short
#: of saturating the server, two can preempt it on a two-core machine. Taking the best of both keeps the
#: reference a ceiling whatever ``--client-procs`` the ferrymq workloads use.
ECHO_LOAD_PROCS = (1, 2)


@dataclass
class Options:
    repeats: int = 3
    duration_s: float = 5.0
    warmup_s: float = 1.0
    sizes: list[int] = field(default_factory=lambda: [1024])
    producers: int = 16
    #: one client process by default: on two cores, two busy client processes plus the broker are three
    #: runnable processes, and the scheduler then takes whole time slices from the broker while it holds
    #: requests of all 16 producers (benchmarks/RESULTS.md, "Run Z")
    client_procs: int = 1
    batch_bytes: int = 256 * 1024
    e2e_rate: int = 2000
    backlog_bytes: int = 256 * 1024 * 1024
    catchup_bytes: int = 2 * 1024**3
    restart_bytes: int = 1024**3
    disk_bytes: int = 1024**3
    only: list[str] = field(default_factory=lambda: list(ALL_WORKLOADS))
    keep_dir: bool = False
    base_dir: str | None = None
    #: broker.conf keys written for every broker of every stack (``--broker-conf KEY=VALUE``)
    broker_conf: dict[str, str] = field(default_factory=dict)


@dataclass
class Row:
    wid: str
    name: str
    size: int | None
    metric: str
    unit: str
    values: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""
    error: str | None = None
    target: str = ""
    status: str = ""
    ratio: str = ""
    #: measured repeat by repeat right before this workload's repeats (11a with 1), "" = on its own
    paired_with: str = ""

    @property
    def value(self) -> float | None:
        return median(self.values)

    def x(self, key: str) -> float | None:
        return median(self.extra.get(key, []))

    def add_extra(self, key: str, v: float | None) -> None:
        if v is not None:
            self.extra.setdefault(key, []).append(v)



@dataclass
class _SyncPlan:
    """One SYNC stack of workloads 3, 4 or 12 and its rows (one client / many producers, per size)."""

    stack: Stack
    label: str
    wid: str
    role: str
    flush: str
    slave: bool
    controller: bool
    one: list[Row]
    many: list[Row]
    topic: str = "BenchSync"
    ready: bool = False


def cpp_client_missing() -> str | None:
    """Why row 9 cannot run here (the C++ client of PyPI rocketmq==0.4.4 is not importable), or None."""
    try:
        import rocketmq.client  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as exc:
        return f"the C++ client (PyPI rocketmq==0.4.4) cannot be imported: {exc}"
    except OSError as exc:  # librocketmq present but not loadable
        return f"the C++ client's library cannot be loaded: {exc}"
    return None

class Bench:
    def __init__(self, opts: Options, progress: Any = None, log: Callable[[str], None] | None = None) -> None:
        self.o = opts
        self.rows: list[Row] = []
        self.progress = progress
        self.log = log or (lambda s: None)
        self._task: Any = None
        #: 11a rows measured inside workload 1 (one echo repeat right before each repeat of 1), by size
        self._paired_echo: dict[int | None, Row] = {}

    # ---- bookkeeping -------------------------------------------------------------------------------------
    def row(self, wid: str, name: str, size: int | None, metric: str, unit: str) -> Row:
        r = Row(wid, name, size, metric, unit)
        self.rows.append(r)
        return r

    def find(self, wid: str, size: int | None = None) -> Row | None:
        for r in self.rows:
            if r.wid == wid and (size is None or r.size == size) and r.error is None and r.values:
                return r
        return None

    def step(self, text: str) -> None:
        self.log(text)
        if self.progress is not None and self._task is not None:
            self.progress.update(self._task, description=text)
            if not self.progress.console.is_terminal:
                # no live bar off a terminal (CI logs, pipes): one plain line a step, so a long run is not silent
                done = int(self.progress.tasks[0].completed) if self.progress.tasks else 0
                print(f"bench [{done}/{self.total_steps()}] {text}", file=sys.stderr, flush=True)

    def advance(self) -> None:
        self.note_load()
        if self.progress is not None and self._task is not None:
            self.progress.advance(self._task)

    def note_load(self) -> None:
        """The 1-minute load average for every row that measured a repeat since the last note (each repeat
        ends with ``advance``)."""
        load1 = os.getloadavg()[0]
        for r in self.rows:
            loads = r.extra.setdefault("load1", [])
            while len(loads) < len(r.values):
                loads.append(load1)

    def wants(self, wid: str) -> bool:
        return wid in self.o.only

    def guarded(self, rows: list[Row], fn: Callable[[], None]) -> None:
        """Run ``fn``; on failure mark ``rows`` failed and keep going (Ctrl-C still propagates)."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            msg = f"{type(exc).__name__}: {exc}"
            self.log("FAILED: " + msg + "\n" + traceback.format_exc())
            for r in rows:
                if not r.values:
                    r.error = msg.splitlines()[0][:200] if msg else "failed"

    # ---- plan ----------------------------------------------------------------------------------------------
    def total_steps(self) -> int:
        n = 0
        per = self.o.repeats * len(self.o.sizes)
        if self.wants("11"):
            n += 2 * per + 2 * self.o.repeats + 2
        if self.wants("10"):
            n += 2 * per
        for w, k in (("1", per), ("2", per), ("5", per), ("6", per), ("9", per), ("3", 2 * per), ("4", 2 * per),
                     ("12", 2 * per)):
            if self.wants(w):
                n += k
        if self.wants("7"):
            n += self.o.repeats
        if self.wants("8"):
            n += self.o.repeats
        if self.wants("13"):
            n += peers.steps(self.o.repeats)
        return n

    def run(self) -> list[Row]:
        with Supervisor(keep_dir=self.o.keep_dir, base_dir=self.o.base_dir) as sup:
            if self.progress is not None:
                self._task = self.progress.add_task("starting", total=self.total_steps())
            if self.wants("11"):
                self.limits(sup)
            if self.wants("10"):
                self.redis(sup)
            if any(self.wants(w) for w in ("1", "2", "5", "6", "9")):
                self.async_stack(sup)
            if self.wants("3") or self.wants("12"):
                self.sync_master_and_controller(sup)
            if self.wants("4"):
                self.sync_flush(sup)
            if self.wants("7") or self.wants("8"):
                self.catchup_and_restart(sup)
            if self.wants("13"):
                self.guarded([], functools.partial(peers.run, self, sup))
        self.evaluate()
        return self.rows

    # ---- generic worker runs ------------------------------------------------------------------------------
    def _split(self, total: int, parts: int) -> list[int]:
        parts = max(1, min(parts, total))
        return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]

    def produce(self, stack: Stack, topic: str, size: int, producers: int, *, batch: int = 0,
                procs: int | None = None, total_bytes: int | None = None) -> dict[str, Any]:
        procs = procs if procs is not None else self.o.client_procs
        split = self._split(producers, procs)
        specs = []
        for i, n in enumerate(split):
            spec = {"name_server": stack.name_server, "topic": topic, "worker": i, "producers": n,
                    "body_bytes": size, "batch": batch, "warmup_s": self.o.warmup_s,
                    "duration_s": self.o.duration_s}
            if total_bytes:
                spec["total_bytes"] = total_bytes // len(split) + 1
            specs.append(spec)
        run_s = self.o.warmup_s + self.o.duration_s if not total_bytes else 3600
        res = run_workers("ferrymq.cli.bench_impl.workers:produce", specs, run_s=run_s)
        return _merge(res)

    def _record_produce(self, row: Row, m: dict[str, Any], *, mb: bool = False) -> None:
        if m["count"] == 0:
            raise RuntimeError(f"no successful send ({m['errors']} errors; first: {m['first_error']})")
        row.values.append(m["bytes"] / m["elapsed_s"] / 1e6 if mb else m["count"] / m["elapsed_s"])
        lat = latency_summary_us(m["lat_ns"])
        for k in ("p50_us", "p99_us", "p999_us"):
            row.add_extra(k, lat[k])
        if mb:
            row.add_extra("msgs_s", m["count"] / m["elapsed_s"])
        if m["errors"] or m["not_ok"]:
            row.note = f"errors={m['errors']} not_ok={m['not_ok']} {m['first_error'] or ''}".strip()

    # ---- echo ceiling (11a / 11b) -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _echo_server(self, sup: Supervisor, mode: str) -> Iterator[int]:
        port = free_port()
        child = sup.spawn(f"echo-{mode}", python_argv("-m", "ferrymq.cli.bench_impl.echo", "--port", str(port),
                                                      "--mode", mode), port=port)
        try:
            sup.wait_port(child)
            yield port
        finally:
            sup.stop(child)

    def _echo_repeat(self, port: int, row: Row) -> None:
        """One repeat of the echo ceiling: the load split over each of ECHO_LOAD_PROCS, the best kept."""
        load_procs = sorted({min(n, self.o.producers) for n in ECHO_LOAD_PROCS})
        best = 0.0
        for procs in load_procs:
            specs = [{"port": port, "connections": n, "body_bytes": row.size, "duration_s": self.o.duration_s,
                      "warmup_s": self.o.warmup_s} for n in self._split(self.o.producers, procs)]
            res = run_workers("ferrymq.cli.bench_impl.echo:load", specs, run_s=self.o.duration_s + self.o.warmup_s)
            rate = sum(r["count"] / r["elapsed_s"] for r in res)
            row.add_extra(f"load_procs_{procs}", rate)
            best = max(best, rate)
        row.values.append(best)
        row.note = "best of " + " / ".join(
            f"{p} load proc{'s' if p > 1 else ''} (median {row.x(f'load_procs_{p}') or 0:,.0f})" for p in load_procs)
        if row.paired_with:
            row.note += f"; each repeat run right before a repeat of ({row.paired_with}), so the ratio compares " \
                        "one host phase"

    # ---- 11: limits ------------------------------------------------------------------------------------------
    def limits(self, sup: Supervisor) -> None:
        from ferrymq.cli.bench_impl import limits

        for mode, wid, name in (("codec", "11a", "limit: echo, RocketMQ codec"),
                                ("raw", "11b", "limit: echo, length framing only")):
            rows = [self.row(wid, name, s, f"req/s ({self.o.producers} conns)", "req/s") for s in self.o.sizes]
            if mode == "codec" and self.wants("1"):
                # measured repeat by repeat right before workload 1's repeats (_w1): the same host phase
                self._paired_echo = {row.size: row for row in rows}
                continue

            def run(mode: str = mode, rows: list[Row] = rows) -> None:
                with self._echo_server(sup, mode) as port:
                    for row in rows:
                        for rep in range(self.o.repeats):
                            self.step(f"11 echo {mode} {fmt_size(row.size or 0)} #{rep + 1}")
                            self._echo_repeat(port, row)
                            self.advance()

            self.guarded(rows, run)

        tcp_rows = [self.row("11c", "limit: loopback TCP, 1 stream", None, "Gbit/s (1 MiB writes)", "Gbit/s"),
                    self.row("11c", "limit: loopback TCP, 1 stream", None, "Gbit/s (1 KiB writes)", "Gbit/s")]

        def tcp() -> None:
            port = free_port()
            child = sup.spawn("tcp-sink", python_argv("-m", "ferrymq.cli.bench_impl.limits", "sink", "--port",
                                                      str(port)), port=port)
            try:
                sup.wait_port(child)
                for row, chunk in zip(tcp_rows, (1024 * 1024, 1024), strict=True):
                    for rep in range(self.o.repeats):
                        self.step(f"11 loopback TCP {fmt_size(chunk)} writes #{rep + 1}")
                        res = run_workers("ferrymq.cli.bench_impl.limits:tcp_sender",
                                          [{"port": port, "chunk_bytes": chunk, "duration_s": self.o.duration_s}],
                                          run_s=self.o.duration_s)
                        row.values.append(res[0]["bytes"] * 8 / res[0]["elapsed_s"] / 1e9)
                        self.advance()
            finally:
                sup.stop(child)

        self.guarded(tcp_rows, tcp)

        disk_dir = sup.path("disk")
        os.makedirs(disk_dir, exist_ok=True)
        seq = self.row("11d", "limit: sequential write (1 MiB chunks + fsync)", None,
                       f"MB/s ({fmt_size(self.o.disk_bytes)})", "MB/s")

        def seq_run() -> None:
            self.step(f"11 sequential write {fmt_size(self.o.disk_bytes)}")
            seq.values.append(limits.seq_write(disk_dir, self.o.disk_bytes)["mb_s"])
            self.advance()

        self.guarded([seq], seq_run)
        fs = self.row("11e", "limit: 4 KiB pwrite + fdatasync", None, "fsync/s", "/s")

        def fs_run() -> None:
            self.step("11 fsync rate")
            r = limits.fsync_rate(disk_dir, min(self.o.duration_s, 3.0))
            fs.values.append(r["per_s"])
            fs.add_extra("p50_us", r["p50_us"])
            fs.add_extra("p99_us", r["p99_us"])
            fs.add_extra("p999_us", r["p999_us"])
            self.advance()

        self.guarded([fs], fs_run)

    # ---- 10: Redis peer -------------------------------------------------------------------------------------
    def redis(self, sup: Supervisor) -> None:
        xrows = [self.row("10a", "peer Redis: XADD, 16 clients (redis-benchmark)", s, "ops/s", "ops/s")
                 for s in self.o.sizes]
        wrows = [self.row("10b", "peer Redis: XADD + WAIT 1 0, 1 client, 1 replica", s, "ops/s", "ops/s")
                 for s in self.o.sizes]
        reason = redis_peer.try_install()
        if reason:
            for r in xrows + wrows:
                r.error = f"SKIPPED: {reason}"
            return

        def run() -> None:
            pair = redis_peer.RedisPair(sup)
            try:
                for row in xrows:
                    for rep in range(self.o.repeats):
                        self.step(f"10 Redis XADD x{self.o.producers} {fmt_size(row.size or 0)} #{rep + 1}")
                        # size the request count to roughly the planned duration at ~100k ops/s
                        n = max(2000, int(100_000 * self.o.duration_s))
                        r = redis_peer.xadd_benchmark(pair.port, self.o.producers, n, row.size or 0)
                        row.values.append(r["rps"])
                        row.add_extra("p50_us", r["p50_us"])
                        row.add_extra("p99_us", r["p99_us"])
                        self.advance()
                pair.attach_replica()
                for row in wrows:
                    for rep in range(self.o.repeats):
                        self.step(f"10 Redis XADD+WAIT {fmt_size(row.size or 0)} #{rep + 1}")
                        res = run_workers("ferrymq.cli.bench_impl.workers:redis_wait",
                                          [{"port": pair.port, "body_bytes": row.size, "warmup_s": self.o.warmup_s,
                                            "duration_s": self.o.duration_s}],
                                          run_s=self.o.warmup_s + self.o.duration_s)
                        self._record_produce(row, _merge(res))
                        redis_peer.cli(pair.port, "del", "benchwait")
                        self.advance()
            finally:
                pair.close()

        self.guarded(xrows + wrows, run)

    # ---- async master stack: 1, 2, 5, 6, 9 --------------------------------------------------------------
    def async_stack(self, sup: Supervisor) -> None:
        stack = Stack(sup, "async", common_conf=self.o.broker_conf)
        rows: dict[str, list[Row]] = {}
        n = self.o.producers
        if self.wants("1"):
            rows["1"] = [self.row("1", f"send, {n} producers, ASYNC_MASTER+ASYNC_FLUSH", s, "msgs/s", "msgs/s")
                         for s in self.o.sizes]
        if self.wants("2"):
            rows["2"] = [self.row("2", f"batched send ({fmt_size(self.o.batch_bytes)}/batch), {n} producers", s,
                                  "MB/s", "MB/s") for s in self.o.sizes]
        if self.wants("5"):
            rows["5"] = [self.row("5", f"end-to-end latency at {self.o.e2e_rate} msg/s", s, "p99 us", "us")
                         for s in self.o.sizes]
        if self.wants("6"):
            rows["6"] = [self.row("6", f"consume backlog ({fmt_size(self.o.backlog_bytes)}), PullConsumer", s,
                                  "msgs/s", "msgs/s") for s in self.o.sizes]
        if self.wants("9"):
            rows["9"] = [self.row("9", "C++ client (rocketmq 0.4.4) sync sends, 1 client", s, "msgs/s", "msgs/s")
                         for s in self.o.sizes]
        all_rows = [r for rs in rows.values() for r in rs]

        def run() -> None:
            self.step("starting ASYNC_MASTER stack")
            stack.start_namesrv()
            master = stack.broker("bench-a")
            stack.start(master)
            topics = {}
            for s in self.o.sizes:
                for kind in ("Send", "Batch", "E2E", "Backlog", "Cpp"):
                    t = f"Bench{kind}{s}"
                    topics[(kind, s)] = t
            for t in topics.values():
                asyncio.run(create_topic(stack.name_server, master, t))
            steps: list[tuple[str, Callable[[Stack, Any, dict[Any, str], Row], None]]] = [
                ("1", self._w1), ("2", self._w2), ("5", self._w5), ("6", self._w6), ("9", self._w9)]
            for wid, fn in steps:
                for row in rows.get(wid, []):
                    self.guarded([row], functools.partial(fn, stack, master, topics, row))

        try:
            self.guarded(all_rows, run)
        finally:
            stack.close()
            for echo in self._paired_echo.values():  # workload 1 never got to its repeats
                if not echo.values and not echo.error:
                    echo.error = "not measured: it runs paired with workload 1, which did not run"
            self._paired_echo = {}

    def _w1(self, stack: Stack, master: Any, topics: dict[Any, str], row: Row) -> None:
        echo = self._paired_echo.pop(row.size, None)
        with contextlib.ExitStack() as cleanup:
            port = 0
            if echo is not None:
                try:
                    port = cleanup.enter_context(self._echo_server(stack.sup, "codec"))
                    echo.paired_with = "1"
                except Exception as exc:  # noqa: BLE001 - the echo row fails, workload 1 still runs
                    echo.error = f"echo server: {type(exc).__name__}: {exc}".splitlines()[0][:200]
                    echo = None
            for rep in range(self.o.repeats):
                if echo is not None:
                    self.step(f"11 echo codec {fmt_size(row.size or 0)} #{rep + 1} (paired with 1)")
                    self.guarded([echo], functools.partial(self._echo_repeat, port, echo))
                    self.advance()
                self.step(f"1 send x{self.o.producers} {fmt_size(row.size or 0)} #{rep + 1}")
                self._record_produce(row, self.produce(stack, topics[("Send", row.size)], row.size or 0,
                                                       self.o.producers))
                self.advance()

    def _batch_n(self, size: int) -> int:
        return max(1, self.o.batch_bytes // max(1, size))

    def _w2(self, stack: Stack, master: Any, topics: dict[Any, str], row: Row) -> None:
        for rep in range(self.o.repeats):
            self.step(f"2 batch x{self.o.producers} {fmt_size(row.size or 0)} #{rep + 1}")
            self._record_produce(row, self.produce(stack, topics[("Batch", row.size)], row.size or 0,
                                                   self.o.producers, batch=self._batch_n(row.size or 0)), mb=True)
            self.advance()

    def _w5(self, stack: Stack, master: Any, topics: dict[Any, str], row: Row) -> None:
        for rep in range(self.o.repeats):
            self.step(f"5 end-to-end {self.o.e2e_rate}/s {fmt_size(row.size or 0)} #{rep + 1}")
            base = {"name_server": stack.name_server, "topic": topics[("E2E", row.size)], "body_bytes": row.size,
                    "warmup_s": self.o.warmup_s, "duration_s": self.o.duration_s, "worker": rep}
            res = run_workers("ferrymq.cli.bench_impl.workers:e2e",
                              [dict(base, role="consumer", group=f"bench_e2e_{rep}"),
                               dict(base, role="producer", rate=self.o.e2e_rate)],
                              run_s=self.o.warmup_s + self.o.duration_s + 5)
            cons, prod = res
            lat = latency_summary_us(cons["lat_ns"])
            if not cons["lat_ns"]:
                raise RuntimeError(f"consumer received nothing (producer sent {prod['sent']}, "
                                   f"errors {prod['errors']})")
            row.values.append(lat["p99_us"] or 0.0)
            row.add_extra("p50_us", lat["p50_us"])
            row.add_extra("p99_us", lat["p99_us"])
            row.add_extra("p999_us", lat["p999_us"])
            lost = prod["sent"] - cons["received"]
            if lost > 0 or prod["errors"]:
                row.note = f"sent={prod['sent']} received={cons['received']} send_errors={prod['errors']}"
            self.advance()

    def _w6(self, stack: Stack, master: Any, topics: dict[Any, str], row: Row) -> None:
        topic = topics[("Backlog", row.size)]
        self.step(f"6 filling backlog {fmt_size(self.o.backlog_bytes)} of {fmt_size(row.size or 0)}")
        self.produce(stack, topic, row.size or 0, self.o.producers, batch=self._batch_n(row.size or 0),
                     total_bytes=self.o.backlog_bytes)
        ends = asyncio.run(max_offsets(master.addr, topic))
        total = sum(ends)
        row.note = f"backlog {total} msgs"
        for rep in range(self.o.repeats):
            self.step(f"6 consume backlog {fmt_size(row.size or 0)} #{rep + 1}")
            assign: list[list[tuple[str, int, int, int]]] = [[] for _ in range(max(1, self.o.client_procs))]
            for q, end in enumerate(ends):
                assign[q % len(assign)].append((master.broker_name, q, 0, end))
            specs = [{"name_server": stack.name_server, "topic": topic, "group": f"bench_backlog_{rep}",
                      "queues": qs, "max_s": CONSUME_MAX_S} for qs in assign if qs]
            res = run_workers("ferrymq.cli.bench_impl.workers:consume", specs, run_s=CONSUME_MAX_S)
            count = sum(r["count"] for r in res)
            elapsed = max(r["elapsed_s"] for r in res)
            if count == 0:
                raise RuntimeError(f"nothing consumed ({res[0].get('first_error')})")
            row.values.append(count / elapsed)
            row.add_extra("MB_s", sum(r["bytes"] for r in res) / elapsed / 1e6)
            if count < total:
                row.note = f"consumed {count}/{total} within {CONSUME_MAX_S}s"
            self.advance()

    def _w9(self, stack: Stack, master: Any, topics: dict[Any, str], row: Row) -> None:
        reason = cpp_client_missing()
        if reason:
            row.error = f"SKIPPED: {reason}"
            for _ in range(self.o.repeats):
                self.advance()
            return
        for rep in range(self.o.repeats):
            self.step(f"9 C++ client sync sends {fmt_size(row.size or 0)} #{rep + 1}")
            res = run_workers("ferrymq.cli.bench_impl.workers:cpp_sync",
                              [{"name_server": stack.name_server, "topic": topics[("Cpp", row.size)], "worker": rep,
                                "body_bytes": row.size, "warmup_s": self.o.warmup_s,
                                "duration_s": self.o.duration_s}],
                              run_s=self.o.warmup_s + self.o.duration_s)
            self._record_produce(row, _merge(res))
            self.advance()

    # ---- 3: SYNC_MASTER + slave, 12: controller mode SYNC + slave, 4: SYNC_FLUSH --------------------------------
    def _sync_plan(self, sup: Supervisor, label: str, wid: str, title: str, *, role: str, flush: str,
                   slave: bool, controller: bool = False) -> _SyncPlan:
        n = self.o.producers
        one = [self.row(f"{wid}a", f"{title}, 1 client sync sends", s, "msgs/s", "msgs/s") for s in self.o.sizes]
        many = [self.row(f"{wid}b", f"{title}, {n} producers", s, "msgs/s", "msgs/s") for s in self.o.sizes]
        return _SyncPlan(Stack(sup, label, common_conf=self.o.broker_conf), label, wid, role, flush, slave,
                         controller, one, many)

    def _sync_setup(self, plan: _SyncPlan) -> None:
        stack = plan.stack
        self.step(f"starting {plan.label} stack")
        stack.start_namesrv()
        if plan.controller:
            ctl = stack.start_controller()
            extra = {"enableControllerMode": "true", "controllerAddr": ctl, "allAckInSyncStateSet": "true"}
            replicas = [stack.broker("bench-a", role=plan.role, flush=plan.flush, broker_id=i, extra=extra)
                        for i in (1, 2)]
            for bp in replicas:
                stack.start(bp)
            master = asyncio.run(controller_master(stack.name_server, ctl, replicas))
        else:
            master = stack.broker("bench-a", role=plan.role, flush=plan.flush)
            stack.start(master)
            if plan.slave:
                sl = stack.broker("bench-a", broker_id=1, flush=plan.flush, master=master)
                stack.start(sl)
        asyncio.run(create_topic(stack.name_server, master, plan.topic))
        asyncio.run(wait_send_ok(stack.name_server, plan.topic))
        plan.ready = True

    def _interleaved(self, plans: list[_SyncPlan]) -> None:
        """Start every plan's stack, then run repeat i of each plan's row right after repeat i of the previous
        plan's same row (this machine's speed drifts within minutes: paired repeats compare like with like)."""
        try:
            for plan in plans:
                self.guarded(plan.one + plan.many, functools.partial(self._sync_setup, plan))
            n = self.o.producers
            for i, size in enumerate(self.o.sizes):
                for kind in ("one", "many"):
                    for rep in range(self.o.repeats):
                        for plan in plans:
                            if not plan.ready:
                                continue
                            row = (plan.one if kind == "one" else plan.many)[i]
                            label = "1 client" if kind == "one" else f"x{n}"
                            self.step(f"{plan.wid} {plan.label} {label} {fmt_size(size)} #{rep + 1}")
                            producers, procs = (1, 1) if kind == "one" else (n, None)
                            self.guarded([row], functools.partial(self._sync_repeat, plan, row, size, producers,
                                                                  procs))
                            self.advance()
        finally:
            for plan in plans:
                plan.stack.close()
        if len(plans) > 1:
            for plan in plans[1:]:
                for mine, ref in ((plan.one, plans[0].one), (plan.many, plans[0].many)):
                    for r, ref_row in zip(mine, ref, strict=True):
                        r.paired_with = ref_row.wid

    def _sync_repeat(self, plan: _SyncPlan, row: Row, size: int, producers: int, procs: int | None) -> None:
        m = self.produce(plan.stack, plan.topic, size, producers, procs=procs)
        self._record_produce(row, m)

    def _one_and_many(self, sup: Supervisor, label: str, wid: str, title: str, *, role: str, flush: str,
                      slave: bool, controller: bool = False) -> None:
        self._interleaved([self._sync_plan(sup, label, wid, title, role=role, flush=flush, slave=slave,
                                           controller=controller)])

    def sync_master_and_controller(self, sup: Supervisor) -> None:
        """Workloads 3 and 12 interleaved repeat by repeat (12's ratio to 3 is a target)."""
        plans = []
        if self.wants("3"):
            plans.append(self._sync_plan(sup, "sync_master", "3", "SYNC_MASTER + 1 slave", role="SYNC_MASTER",
                                         flush="ASYNC_FLUSH", slave=True))
        if self.wants("12"):
            plans.append(self._sync_plan(sup, "controller", "12", "controller mode SYNC + 1 slave",
                                         role="SYNC_MASTER", flush="ASYNC_FLUSH", slave=True, controller=True))
        self._interleaved(plans)

    def sync_flush(self, sup: Supervisor) -> None:
        self._one_and_many(sup, "sync_flush", "4", "SYNC_FLUSH", role="ASYNC_MASTER", flush="SYNC_FLUSH",
                           slave=False)

    # ---- 7: slave catch-up, 8: restart after SIGKILL ------------------------------------------------------
    def catchup_and_restart(self, sup: Supervisor) -> None:
        stack = Stack(sup, "catchup", common_conf=self.o.broker_conf)
        size = 1024
        r7 = self.row("7", f"slave catch-up from {fmt_size(self.o.catchup_bytes)} backlog", None,
                      "MB/s", "MB/s") if self.wants("7") else None
        r8 = self.row("8", f"restart after SIGKILL, {fmt_size(self.o.restart_bytes)} log", None,
                      "s to first pull", "s") if self.wants("8") else None
        rows = [r for r in (r7, r8) if r is not None]
        topic = "BenchCatchup"

        def run() -> None:
            self.step("starting catch-up master")
            stack.start_namesrv()
            master = stack.broker("bench-c", extra={"mappedFileSizeCommitLog": self._catchup_segment_bytes()})
            stack.start(master)
            asyncio.run(create_topic(stack.name_server, master, topic))
            filled = 0
            if r7 is not None:
                self.step(f"7 filling master with {fmt_size(self.o.catchup_bytes)}")
                self.produce(stack, topic, size, self.o.producers, batch=self._batch_n(size),
                             total_bytes=self.o.catchup_bytes)
                filled = self.o.catchup_bytes
                self.guarded([r7], lambda: self._w7(stack, master, topic, r7))
            if r8 is not None:
                if filled > self.o.restart_bytes * RESTART_REUSE_FACTOR:
                    # the catch-up log is much larger than asked for: restart a master of the requested size
                    stack.close()
                    self.guarded([r8], lambda: self._restart_own_master(sup, r8))
                    return
                if filled < self.o.restart_bytes:
                    self.step(f"8 filling master up to {fmt_size(self.o.restart_bytes)}")
                    self.produce(stack, topic, size, self.o.producers, batch=self._batch_n(size),
                                 total_bytes=self.o.restart_bytes - filled)
                self.guarded([r8], lambda: self._w8(stack, master, topic, r8))

        try:
            self.guarded(rows, run)
        finally:
            stack.close()

    def _restart_own_master(self, sup: Supervisor, row: Row) -> None:
        stack = Stack(sup, "restart", common_conf=self.o.broker_conf)
        topic = "BenchRestart"
        try:
            self.step("starting restart master")
            stack.start_namesrv()
            master = stack.broker("bench-r")
            stack.start(master)
            asyncio.run(create_topic(stack.name_server, master, topic))
            self.step(f"8 filling master with {fmt_size(self.o.restart_bytes)}")
            self.produce(stack, topic, 1024, self.o.producers, batch=self._batch_n(1024),
                         total_bytes=self.o.restart_bytes)
            self._w8(stack, master, topic, row)
        finally:
            stack.close()

    def _catchup_segment_bytes(self) -> int:
        """Commit-log segment size for the catch-up stack: large enough that the whole backlog is one
        segment, because a fresh slave (request offset 0) starts at the master's *last* segment
        (RocketMQ behaviour), which would otherwise skip most of the backlog."""
        need = int(max(self.o.catchup_bytes, self.o.restart_bytes) * 1.4) + 64 * 1024**2
        gib = 1024**3
        return max(gib, -(-need // gib) * gib)

    def _w7(self, stack: Stack, master: Any, topic: str, row: Row) -> None:
        target = asyncio.run(max_offsets(master.addr, topic))
        info = asyncio.run(runtime_info(master.addr))
        log_bytes = _int_or_none(info.get("commitLogMaxOffset"))
        if not log_bytes:
            log_bytes = sum(target) * (1024 + 150)  # body + typical record/properties overhead
            row.note = "commit-log size estimated (no commitLogMaxOffset in runtime info)"
        row.add_extra("log_MiB", log_bytes / 1024**2)
        for rep in range(self.o.repeats):
            self.step(f"7 slave catch-up {fmt_size(log_bytes)} #{rep + 1}")
            slave = stack.broker("bench-c", broker_id=1, master=master, tag=f"-r{rep}",
                                 extra={"mappedFileSizeCommitLog": self._catchup_segment_bytes()})
            t0 = time.monotonic()
            stack.start(slave, wait=False)
            try:
                elapsed = asyncio.run(_wait_caught_up(stack, slave, topic, target, t0))
                sinfo = asyncio.run(runtime_info(slave.addr))
            finally:
                stack.stop_broker(slave)
                stack.wipe(slave)
            # bytes the slave actually copied (a fresh slave starts at the master's last segment, §6.3)
            s_max = _int_or_none(sinfo.get("commitLogMaxOffset"))
            s_min = _int_or_none(sinfo.get("commitLogMinOffset")) or 0
            copied = (s_max - s_min) if s_max else log_bytes
            row.add_extra("copied_MiB", copied / 1024**2)
            row.values.append(copied / elapsed / 1e6)
            row.add_extra("seconds", elapsed)
            self.advance()

    def _w8(self, stack: Stack, master: Any, topic: str, row: Row) -> None:
        for bp in stack.brokers:
            if bp is not master:
                stack.stop_broker(bp)
        info = asyncio.run(runtime_info(master.addr))
        log_bytes = _int_or_none(info.get("commitLogMaxOffset"))
        if log_bytes:
            row.add_extra("log_MiB", log_bytes / 1024**2)
        for rep in range(self.o.repeats):
            self.step(f"8 SIGKILL + restart #{rep + 1}")
            stack.kill(master)
            t0 = time.monotonic()
            stack.start(master, wait=False)
            assert master.child is not None
            stack.sup.wait_port(master.child, timeout_s=RESTART_MAX_S)
            t_port = time.monotonic() - t0
            t_pull = asyncio.run(_wait_pull(master.addr, topic, t0))
            row.values.append(t_pull)
            row.add_extra("port_s", t_port)
            self.advance()

    # ---- targets ---------------------------------------------------------------------------------------------
    def evaluate(self) -> None:
        for r in self.rows:
            if r.error:
                r.status = "SKIP" if r.error.startswith("SKIPPED") else "FAIL"
                continue
            v = r.value
            if v is None:
                continue
            ref: Row | None = None
            if r.wid == "1":
                ref = self.find("11a", r.size)
                self._judge(r, v, ref, TARGET_ASYNC_VS_ECHO, f">= {TARGET_ASYNC_VS_ECHO:.0%} of echo (11a)")
                if ref is not None and ref.paired_with == "1" and len(ref.values) == len(r.values):
                    paired = "/".join(f"{a / b:.2f}" for a, b in zip(r.values, ref.values, strict=True) if b)
                    r.note = "; ".join(x for x in (r.note, f"repeat/paired echo {paired}") if x)
            elif r.wid == "2":
                r.target = f">= {TARGET_BATCH_MB_S:.0f} MB/s"
                r.status = _pf(v >= TARGET_BATCH_MB_S)
            elif r.wid == "3a":
                self._judge(r, v, self.find("10b", r.size), 1.0, ">= Redis XADD+WAIT (10b)")
            elif r.wid == "3b":
                self._judge(r, v, self.find("1", r.size), TARGET_SYNC_MASTER_VS_ASYNC,
                            f">= {TARGET_SYNC_MASTER_VS_ASYNC:.0%} of (1)")
            elif r.wid in ("12a", "12b"):
                ref_id = "3a" if r.wid == "12a" else "3b"
                ref = self.find(ref_id, r.size)
                self._judge(r, v, ref, TARGET_CONTROLLER_VS_SYNC_MASTER,
                            f">= {TARGET_CONTROLLER_VS_SYNC_MASTER:.0%} of classic SYNC_MASTER ({ref_id})")
                if ref is not None and r.paired_with == ref_id and len(ref.values) == len(r.values):
                    ratios = [a / b for a, b in zip(r.values, ref.values, strict=True) if b]
                    if ratios:  # each repeat of 12 ran right after the same repeat of 3: judged on those pairs
                        pair_median = median(ratios)
                        assert pair_median is not None
                        text = "/".join(f"{q:.2f}" for q in ratios)
                        r.note = "; ".join(x for x in (r.note, f"repeat/paired {text} (median of the pairs; "
                                                       f"ratio of the medians {r.ratio.split('x')[0]})") if x)
                        r.ratio = f"{pair_median:.2f}x of ({ref_id})"
                        r.status = _pf(pair_median >= TARGET_CONTROLLER_VS_SYNC_MASTER)
            elif r.wid == "6":
                self._judge(r, v, self.find("1", r.size), 1.0, ">= (1)")
            elif r.wid == "7":
                r.target = f">= {TARGET_CATCHUP_MB_S:.0f} MB/s"
                r.status = _pf(v >= TARGET_CATCHUP_MB_S)
            elif r.wid == "8":
                r.target = f"<= {TARGET_RESTART_S:.0f} s"
                r.status = _pf(v <= TARGET_RESTART_S)
            elif r.wid in ("4a", "4b", "9", "10a"):
                # informative ratios against the closest reference
                ref = {"4a": self.find("3a", r.size), "4b": self.find("1", r.size), "9": self.find("3a", r.size),
                       "10a": self.find("1", r.size)}[r.wid]
                if ref is not None and ref.value:
                    label = {"4a": "3a", "4b": "1", "9": "3a", "10a": "1"}[r.wid]
                    r.ratio = f"{v / ref.value:.2f}x of ({label})"

    def _judge(self, r: Row, v: float, ref: Row | None, factor: float, text: str) -> None:
        r.target = text
        if ref is None or not ref.value:
            r.status = "n/a"
            return
        r.ratio = f"{v / ref.value:.2f}x of ({ref.wid})"
        r.status = _pf(v >= factor * ref.value)

    # ---- output ------------------------------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        return {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                "repeats": self.o.repeats, "duration_s": self.o.duration_s, "warmup_s": self.o.warmup_s,
                "producers": self.o.producers, "client_procs": self.o.client_procs,
                "sizes": [fmt_size(s) for s in self.o.sizes], "batch_bytes": self.o.batch_bytes,
                "catchup_bytes": self.o.catchup_bytes, "restart_bytes": self.o.restart_bytes,
                "backlog_bytes": self.o.backlog_bytes, "e2e_rate": self.o.e2e_rate,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    def to_json(self) -> dict[str, Any]:
        rows = []
        for r in self.rows:
            d = asdict(r)
            d["median"] = r.value
            d["extra_median"] = {k: r.x(k) for k in r.extra}
            d["size"] = fmt_size(r.size) if r.size else None
            rows.append(d)
        return {"machine": self.header(), "rows": rows}


def _pf(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _int_or_none(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum counts over workers, rate-preserving elapsed (max), concatenated latency samples."""
    out: dict[str, Any] = {"count": 0, "bytes": 0, "errors": 0, "not_ok": 0, "first_error": None, "lat_ns": []}
    rate = 0.0
    brate = 0.0
    for r in results:
        out["count"] += r["count"]
        out["bytes"] += r["bytes"]
        out["errors"] += r.get("errors", 0)
        out["not_ok"] += r.get("not_ok", 0)
        out["first_error"] = out["first_error"] or r.get("first_error")
        out["lat_ns"].extend(r.get("lat_ns", []))
        if r["elapsed_s"] > 0:
            rate += r["count"] / r["elapsed_s"]
            brate += r["bytes"] / r["elapsed_s"]
    # express the summed per-worker rates through one elapsed so count/elapsed == sum of rates
    out["elapsed_s"] = out["count"] / rate if rate else max((r["elapsed_s"] for r in results), default=1.0)
    if out["count"] and out["bytes"] and brate:
        out["bytes"] = brate * out["elapsed_s"]
    return out


async def _wait_caught_up(stack: Stack, slave: Any, topic: str, target: list[int], t0: float) -> float:
    """Seconds from ``t0`` until every queue's max offset on the slave equals the master's."""
    from ferrymq.remoting.pool import ConnectionPool

    deadline = t0 + CATCHUP_MAX_S
    pool: ConnectionPool | None = None
    try:
        while True:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"slave not caught up after {CATCHUP_MAX_S}s")
            if slave.child is not None and not slave.child.alive():
                raise RuntimeError(f"slave exited:\n{slave.child.log_tail()}")
            try:
                if pool is None:
                    pool = ConnectionPool()
                got = await max_offsets(slave.addr, topic, len(target), pool)
                if got == target:
                    return time.monotonic() - t0
            except Exception:  # noqa: BLE001 - not up yet
                if pool is not None:
                    await pool.close()
                    pool = None
            await asyncio.sleep(CATCHUP_POLL_S)
    finally:
        if pool is not None:
            await pool.close()


async def _wait_pull(addr: str, topic: str, t0: float) -> float:
    from ferrymq.remoting.pool import ConnectionPool

    deadline = t0 + RESTART_MAX_S
    last: Any = None
    while time.monotonic() < deadline:
        pool = ConnectionPool()
        try:
            code = await pull_once(addr, topic, 0, pool)
            if code == 0:
                return time.monotonic() - t0
            last = f"code {code}"
        except Exception as exc:  # noqa: BLE001
            last = exc
        finally:
            await pool.close()
        await asyncio.sleep(0.01)
    raise TimeoutError(f"no successful pull after {RESTART_MAX_S}s (last: {last})")


__all__ = ["ALL_WORKLOADS", "QUEUES", "Bench", "Options", "Row"]
