"""Workload 13 of ``ferry bench``: ferrymq beside the brokers its users would pick instead, one client each,
interleaved, with every ratio computed per repeat.

Everything is started once (one name server with three brokers: SYNC_FLUSH, SYNC_MASTER + slave, ASYNC;
Redis with the append-only file, a Redis master + replica, NATS JetStream, RabbitMQ) and each repeat runs
the rows below **in this order**, so a ratio compares two runs seconds apart (this machine's speed drifts
within minutes, and other jobs come and go):

| row | what | durability before the answer |
|-----|------|------------------------------|
| 13a | ferrymq SYNC_FLUSH, 1 client | ``fdatasync`` of the commit log |
| 13b | Redis XADD, ``appendfsync always``, 1 client | AOF write + fsync |
| 13c | RabbitMQ publish with confirms, 1 client | message store write + fsync (durable queue, persistent) |
| 13d | limit: 4 KiB ``pwrite`` + ``fdatasync`` per second on the stores' disk | the disk itself |
| 13e | ferrymq SYNC_MASTER + 1 slave, ASYNC_FLUSH, 1 client | in the slave's memory (no fsync) |
| 13f | Redis XADD + ``WAIT 1 0``, 1 replica, 1 client | in the replica's memory (no fsync) |
| 13g | ferrymq ASYNC_MASTER + ASYNC_FLUSH, 1 client | page cache (flushed every ``flushIntervalCommitLog``) |
| 13h | Redis XADD, ``appendfsync everysec``, 1 client | AOF write, fsync once a second |
| 13i | NATS JetStream publish, file storage, 1 client | file store write, fsync every 2 min |
| 13j | limit: the echo server of row 11a, 1 client in lockstep | none (a send-like reply, nothing stored) |

Ratios (median of the per-repeat ratios; each repeat's ratio in ``detail``): 13a against 13b (target
≥ 1.0), 13c and 13d (target ≥ 0.5 of the disk's rate); 13e against 13f (target ≥ 1.3); 13g against 13h and
13i.

CPU per message, every row with a server: utime + stime of the server's processes over the whole run
(warm-up included) divided by the messages the server acknowledged in it, counted on the server:

| row | processes | acknowledged messages |
|-----|-----------|-----------------------|
| 13a, 13g | the broker (``broker CPU``) | growth of the topic's max offsets |
| 13e | the master (``broker CPU``); master + slave (``server CPU``) | growth of the topic's max offsets |
| 13b, 13h | the AOF Redis | ``XLEN`` of the run's stream |
| 13f | Redis master + replica | ``XLEN`` of the run's stream |
| 13c | RabbitMQ's start script and every process under it (``beam.smp``) | the queue's depth, purged after |
| 13i | ``nats-server`` | growth of JetStream's message count (``/jsz``) |
| 13j | the echo server | replies the client received |

13g's target is broker CPU ≤ 25 µs at 1 producer. The floors are printed beside the targets (``detail``):
13g's broker CPU against the echo server's CPU per request (13j) and Redis's and NATS's per operation
(13h, 13i), 13e's round trip (p50) against two echo round trips (13j: client → master → slave is two
request/reply hops), and 13a's against the disk's ``fdatasync`` (13d) plus one echo round trip, each per
repeat. A peer that is not installed is skipped with the reason; its ratios are left out.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ferrymq.cli.bench_impl import limits, nats_peer, rabbit_peer, redis_peer
from ferrymq.cli.bench_impl.mpwork import run_workers
from ferrymq.cli.bench_impl.procs import Supervisor, cpu_times_s, free_port, python_argv
from ferrymq.cli.bench_impl.stack import Stack, create_topic, max_offsets, wait_send_ok
from ferrymq.cli.bench_impl.stats import median
from ferrymq.cli.bench_impl.units import fmt_size

#: targets of issue 29 (ratios in the same run)
TARGET_SYNC_FLUSH_VS_REDIS_ALWAYS = 1.0
TARGET_SYNC_FLUSH_VS_DISK = 0.5
TARGET_SYNC_MASTER_VS_REDIS_WAIT = 1.3
TARGET_BROKER_CPU_US_PER_MSG = 25.0
#: seconds of the per-repeat disk measurement (13d)
DISK_PROBE_S = 2.0
#: request/reply hops of one SYNC_MASTER send (client -> master, master -> slave)
SYNC_MASTER_HOPS = 2
#: the stream of the Redis WAIT row (13f)
REDIS_WAIT_STREAM = "benchwait"
#: the rows, in the order every repeat runs them
ROW_ORDER = ("13a", "13b", "13c", "13d", "13e", "13f", "13g", "13h", "13i", "13j")


@dataclass
class _Entry:
    row: Any
    run: Callable[[], dict[str, Any] | None]
    skip: str | None = None
    #: the server's processes whose CPU per message is measured (read at the start of each repeat)
    pids: Callable[[], list[int]] | None = None
    #: the broker among them (ferrymq rows): its own CPU is ``broker CPU``
    broker_pid: Callable[[], int] | None = None
    #: messages the server has acknowledged so far, read before and after the run; None = the run's ``acked``
    acked: Callable[[], int] | None = None
    #: run after the CPU sample (emptying a peer's stream or queue is not part of its cost per message)
    cleanup: Callable[[], None] | None = None


@dataclass
class _Servers:
    redis_durable: Any = None
    redis_pair: Any = None
    nats: Any = None
    rabbit: Any = None
    echo_port: int = 0
    echo_pid: int = 0
    closers: list[Callable[[], None]] = field(default_factory=list)


def steps(repeats: int) -> int:
    return len(ROW_ORDER) * repeats


def run(bench: Any, sup: Supervisor) -> None:
    o = bench.o
    size = o.sizes[0]
    name = f"{fmt_size(size)}"
    rows = {
        "13a": bench.row("13a", "ferrymq SYNC_FLUSH, 1 client (fdatasync before ack)", size, "msgs/s", "msgs/s"),
        "13b": bench.row("13b", "Redis appendfsync always, 1 client (AOF fsync before reply)", size, "ops/s",
                         "ops/s"),
        "13c": bench.row("13c", f"RabbitMQ confirms, 1 client ({rabbit_peer.DURABILITY})", size, "msgs/s",
                         "msgs/s"),
        "13d": bench.row("13d", "limit: 4 KiB pwrite + fdatasync, per repeat", None, "fsync/s", "/s"),
        "13e": bench.row("13e", "ferrymq SYNC_MASTER + 1 slave, 1 client (in slave memory, no fsync)", size,
                         "msgs/s", "msgs/s"),
        "13f": bench.row("13f", "Redis XADD + WAIT 1 0, 1 replica, 1 client (in replica memory)", size, "ops/s",
                         "ops/s"),
        "13g": bench.row("13g", "ferrymq ASYNC_FLUSH, 1 client (page cache, periodic flush)", size, "msgs/s",
                         "msgs/s"),
        "13h": bench.row("13h", "Redis appendfsync everysec, 1 client (AOF write, fsync each second)", size,
                         "ops/s", "ops/s"),
        "13i": bench.row("13i", f"NATS JetStream, 1 client ({nats_peer.DURABILITY})", size, "msgs/s", "msgs/s"),
        "13j": bench.row("13j", "limit: echo server of 11a, 1 client in lockstep (request/reply floor)", size,
                         "req/s", "req/s"),
    }
    assert tuple(rows) == ROW_ORDER
    stack = Stack(sup, "peers", common_conf=o.broker_conf)
    servers = _Servers()
    try:
        _run(bench, sup, stack, servers, rows, size, name)
    except Exception as exc:  # noqa: BLE001 - a set-up failure fails the rows not measured, with its cause
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        bench.log(f"13 failed: {msg}")
        for r in rows.values():
            if not r.error and not [v for v in r.values if v is not None]:
                r.error = msg
    finally:
        for close in reversed(servers.closers):
            try:
                close()
            except Exception:  # noqa: BLE001 - stopping anyway
                pass
        stack.close()
    _evaluate(rows)


def _run(bench: Any, sup: Supervisor, stack: Stack, servers: _Servers, rows: dict[str, Any], size: int,
         name: str) -> None:
    o = bench.o
    bench.step("13 starting ferrymq brokers and peers")
    stack.start_namesrv()
    flush_b = stack.broker("bench-pf", flush="SYNC_FLUSH")
    sm_b = stack.broker("bench-pm", role="SYNC_MASTER")
    async_b = stack.broker("bench-pa")
    for bp in (flush_b, sm_b, async_b):
        stack.start(bp)
    slave_b = stack.broker("bench-pm", broker_id=1, master=sm_b)
    stack.start(slave_b)
    topics = {"13a": ("BenchPeerFlush", flush_b), "13e": ("BenchPeerSync", sm_b), "13g": ("BenchPeerAsync", async_b)}
    for topic, bp in topics.values():
        asyncio.run(create_topic(stack.name_server, bp, topic))
    for topic, _bp in topics.values():
        asyncio.run(wait_send_ok(stack.name_server, topic))

    redis_reason = redis_peer.try_install()
    if redis_reason is None:
        servers.redis_durable = redis_peer.DurableRedis(sup)
        servers.closers.append(servers.redis_durable.close)
        servers.redis_pair = redis_peer.RedisPair(sup)
        servers.closers.append(servers.redis_pair.close)
        servers.redis_pair.attach_replica()
    nats_reason = nats_peer.available()
    if nats_reason is None:
        try:
            servers.nats = nats_peer.NatsServer(sup)
            servers.closers.append(servers.nats.close)
        except Exception as exc:  # noqa: BLE001 - the row says why
            nats_reason = f"nats-server did not start: {exc}".splitlines()[0][:200]
    rabbit_reason = rabbit_peer.available()
    if rabbit_reason is None:
        try:
            bench.step("13 starting RabbitMQ")
            servers.rabbit = rabbit_peer.RabbitServer(sup)
            servers.closers.append(servers.rabbit.close)
        except Exception as exc:  # noqa: BLE001 - the row says why
            rabbit_reason = f"rabbitmq-server did not start: {exc}".splitlines()[0][:200]

    servers.echo_port = free_port()
    echo = sup.spawn("echo-floor", python_argv("-m", "ferrymq.cli.bench_impl.echo", "--port",
                                               str(servers.echo_port), "--mode", "codec"), port=servers.echo_port)
    servers.closers.append(lambda: sup.stop(echo))
    sup.wait_port(echo)
    servers.echo_pid = echo.pid

    timing = {"warmup_s": o.warmup_s, "duration_s": o.duration_s, "body_bytes": size}
    run_s = o.warmup_s + o.duration_s

    def ferry(key: str) -> Callable[[], dict[str, Any]]:
        topic, _bp = topics[key]
        spec = {"name_server": stack.name_server, "topic": topic, "worker": 0, "producers": 1, "batch": 0, **timing}
        return lambda: _merge1(run_workers("ferrymq.cli.bench_impl.workers:produce", [spec], run_s=run_s))

    def redis_durable(mode: str) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            servers.redis_durable.set_fsync(mode)
            spec = {"port": servers.redis_durable.port, "stream": f"bench{mode}", **timing}
            return _merge1(run_workers("ferrymq.cli.bench_impl.workers:redis_xadd", [spec], run_s=run_s))
        return go

    def redis_wait() -> dict[str, Any]:
        spec = {"port": servers.redis_pair.port, "stream": REDIS_WAIT_STREAM, **timing}
        return _merge1(run_workers("ferrymq.cli.bench_impl.workers:redis_wait", [spec], run_s=run_s))

    def nats() -> dict[str, Any]:
        spec = {"url": servers.nats.url, "stream": nats_peer.STREAM, "subject": nats_peer.SUBJECT, **timing}
        return _merge1(run_workers("ferrymq.cli.bench_impl.workers:nats_publish", [spec], run_s=run_s))

    def rabbit() -> dict[str, Any]:
        spec = {"url": servers.rabbit.url, "queue": rabbit_peer.QUEUE, "purge": False, **timing}
        return _merge1(run_workers("ferrymq.cli.bench_impl.workers:rabbit_publish", [spec], run_s=run_s))

    def echo_floor() -> dict[str, Any]:
        spec = {"port": servers.echo_port, **timing}
        return _merge1(run_workers("ferrymq.cli.bench_impl.echo:lockstep", [spec], run_s=run_s))

    disk_dir = sup.path("peers", "disk")
    os.makedirs(disk_dir, exist_ok=True)

    def disk() -> None:
        r = limits.fsync_rate(disk_dir, DISK_PROBE_S)
        rows["13d"].values.append(r["per_s"])
        for k in ("p50_us", "p99_us", "p999_us"):
            rows["13d"].add_extra(k, r[k])
        return None

    def ferry_entry(key: str, *more: Any) -> _Entry:
        topic, bp = topics[key]
        return _Entry(rows[key], ferry(key), pids=lambda: [_pid(bp), *(_pid(m) for m in more)],
                      broker_pid=lambda: _pid(bp),
                      acked=lambda: sum(asyncio.run(max_offsets(bp.addr, topic))))

    def redis_entry(mode: str) -> _Entry:
        stream = f"bench{mode}"
        return _Entry(rows["13b" if mode == "always" else "13h"], redis_durable(mode), skip=redis_reason,
                      pids=lambda: [servers.redis_durable.child.pid],
                      acked=lambda: _xlen(servers.redis_durable.port, stream),
                      cleanup=lambda: _del(servers.redis_durable.port, stream))

    plan = [
        ferry_entry("13a"),
        redis_entry("always"),
        _Entry(rows["13c"], rabbit, skip=rabbit_reason, pids=lambda: process_tree(servers.rabbit.child.pid),
               acked=lambda: servers.rabbit.queue_depth(), cleanup=lambda: servers.rabbit.purge()),
        _Entry(rows["13d"], disk),
        ferry_entry("13e", slave_b),
        _Entry(rows["13f"], redis_wait, skip=redis_reason,
               pids=lambda: [servers.redis_pair.master.pid, *_opt_pid(servers.redis_pair.replica)],
               acked=lambda: _xlen(servers.redis_pair.port, REDIS_WAIT_STREAM),
               cleanup=lambda: _del(servers.redis_pair.port, REDIS_WAIT_STREAM)),
        ferry_entry("13g"),
        redis_entry("everysec"),
        _Entry(rows["13i"], nats, skip=nats_reason, pids=lambda: [servers.nats.child.pid],
               acked=lambda: servers.nats.stored_messages()),
        _Entry(rows["13j"], echo_floor, pids=lambda: [servers.echo_pid]),
    ]
    assert tuple(e.row.wid for e in plan) == ROW_ORDER
    for entry in plan:
        if entry.skip:
            entry.row.error = f"SKIPPED: {entry.skip}"
    for rep in range(o.repeats):
        for entry in plan:
            if entry.skip:
                bench.advance()
                continue
            bench.step(f"{entry.row.wid} {entry.row.name} {name} #{rep + 1}")
            try:
                _one(bench, stack, entry)
            except Exception as exc:  # noqa: BLE001 - the row shows it; the others go on
                entry.row.values.append(None)  # keeps the repeats aligned for the per-repeat ratios
                entry.row.note = f"repeat {rep + 1}: {type(exc).__name__}: {exc}".splitlines()[0][:200]
                bench.log(f"13 {entry.row.wid} failed: {exc}")
            bench.advance()
    for entry in plan:
        if not entry.skip and not [v for v in entry.row.values if v is not None]:
            entry.row.error = entry.row.note or "failed"


def _one(bench: Any, stack: Stack, entry: _Entry) -> None:
    if entry.pids is None:
        m = entry.run()
        if m is not None:
            bench._record_produce(entry.row, m)
        return
    pids = entry.pids()
    broker = entry.broker_pid() if entry.broker_pid is not None else None
    before = entry.acked() if entry.acked is not None else 0
    c0 = {pid: _cpu_s(pid) for pid in pids}
    try:
        m = entry.run()
        c1 = {pid: _cpu_s(pid) for pid in pids}
        assert m is not None
        acked = entry.acked() - before if entry.acked is not None else int(m.get("acked", 0))
    finally:  # a failed run's stream or queue is emptied too
        if entry.cleanup is not None:
            entry.cleanup()
    bench._record_produce(entry.row, m)
    for key, cpu_us in cpu_per_message(c0, c1, acked, broker).items():
        entry.row.add_extra(key, cpu_us)


def cpu_per_message(c0: dict[int, float], c1: dict[int, float], acked: int,
                    broker: int | None = None) -> dict[str, float]:
    """CPU per acknowledged message in microseconds from the CPU seconds of each process before and after a
    run: ``cpu_us_msg`` of the broker (when one is named), ``server_cpu_us_msg`` of all the processes (left
    out when the broker is the only one: it would repeat ``cpu_us_msg``). Empty when nothing was acknowledged."""
    if acked <= 0:
        return {}
    used = {pid: c1[pid] - c0[pid] for pid in c0 if pid in c1}
    out = {}
    if broker is not None and broker in used:
        out["cpu_us_msg"] = used[broker] / acked * 1e6
    if broker is None or len(used) > 1:
        out["server_cpu_us_msg"] = sum(used.values()) / acked * 1e6
    return out


def _cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds; 0 for a process that is gone."""
    return sum(cpu_times_s(pid))


def process_tree(root: int, proc_dir: str = "/proc") -> list[int]:
    """``root`` and every process under it (RabbitMQ's start script execs the Erlang VM, which starts child processes)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir(proc_dir):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc_dir, name, "stat")) as fh:
                ppid = int(fh.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _xlen(port: int, stream: str) -> int:
    text = redis_peer.cli(port, "xlen", stream).strip()
    return int(text) if text.isdigit() else 0


def _del(port: int, stream: str) -> None:
    redis_peer.cli(port, "del", stream)


def _pid(bp: Any) -> int:
    """The running broker process of a stack's broker."""
    if bp.child is None:
        raise RuntimeError(f"broker {bp.name} is not running")
    return int(bp.child.pid)


def _opt_pid(child: Any) -> list[int]:
    return [child.pid] if child is not None else []


def _merge1(results: list[dict[str, Any]]) -> dict[str, Any]:
    (r,) = results
    return r


def _paired(row: Any, ref: Any) -> list[float]:
    """Per-repeat ratios row/ref over the repeats where both were measured."""
    return [a / b for a, b in zip(row.values, ref.values, strict=False) if a is not None and b]


def _evaluate(rows: dict[str, Any]) -> None:
    """Ratios, targets and PASS/MISS of the 13 rows (a failed repeat stays a None in ``values``, which the
    medians skip, so the repeats stay aligned)."""

    def judge(key: str, refs: list[tuple[str, float | None]]) -> None:
        row = rows[key]
        if row.error:
            return
        texts, ratios, targets, ok = [], [], [], True
        for ref_key, target in refs:
            ref = rows[ref_key]
            if ref.error:
                continue
            paired = _paired(row, ref)
            if not paired:
                continue
            med = median(paired)
            assert med is not None
            ratios.append(f"{med:.2f}x of ({ref_key})")
            texts.append(f"/{ref_key} per repeat " + "/".join(f"{x:.2f}" for x in paired))
            if target is not None:
                targets.append(f">= {target:.1f}x ({ref_key})")
                ok = ok and med >= target
        row.ratio = ", ".join(ratios)
        if targets:
            row.target = ", ".join(targets)
            row.status = "PASS" if ok else "MISS"
        if texts:
            row.note = "; ".join(x for x in (row.note, *texts) if x)

    judge("13a", [("13b", TARGET_SYNC_FLUSH_VS_REDIS_ALWAYS), ("13d", TARGET_SYNC_FLUSH_VS_DISK), ("13c", None)])
    judge("13b", [("13d", None)])
    judge("13e", [("13f", TARGET_SYNC_MASTER_VS_REDIS_WAIT)])
    judge("13g", [("13h", None), ("13i", None)])
    g = rows["13g"]
    cpu = g.x("cpu_us_msg")
    if not g.error and cpu is not None:
        g.target = f"broker CPU <= {TARGET_BROKER_CPU_US_PER_MSG:.0f} us/msg"
        g.status = "PASS" if cpu <= TARGET_BROKER_CPU_US_PER_MSG else "MISS"
    _floors(rows)


def _per_repeat(xs: list[float], ys: list[float], fn: Callable[[float, float], float]) -> list[float]:
    return [fn(x, y) for x, y in zip(xs, ys, strict=False) if y]


def _add_note(row: Any, text: str) -> None:
    row.note = "; ".join(x for x in (row.note, text) if x)


def _floors(rows: dict[str, Any]) -> None:
    """The floors beside the targets, in ``detail``, per repeat: 13g's broker CPU against the echo server's CPU
    per request (13j) with Redis's and NATS's per operation beside it; 13e's round trip against two echo round
    trips; 13a's against the disk's fdatasync plus one echo round trip."""
    echo = rows["13j"]
    if echo.error:
        return

    def xs(key: str, name: str) -> list[float]:
        row = rows[key]
        return [] if row.error else list(row.extra.get(name, []))

    echo_cpu, echo_p50 = xs("13j", "server_cpu_us_msg"), xs("13j", "p50_us")
    g_cpu = xs("13g", "cpu_us_msg")
    if g_cpu and echo_cpu:
        beside = [f"{key} {rows[key].x('server_cpu_us_msg'):.1f}" for key in ("13h", "13i")
                  if xs(key, "server_cpu_us_msg")]
        per = _per_repeat(g_cpu, echo_cpu, lambda a, b: a / b)
        _add_note(rows["13g"], f"floor: echo server CPU (13j) {rows['13j'].x('server_cpu_us_msg'):.1f} us/req"
                  + (f", server CPU {', '.join(beside)} us/op" if beside else "")
                  + "; broker/echo CPU per repeat " + "/".join(f"{x:.2f}" for x in per))
    e_p50 = xs("13e", "p50_us")
    if e_p50 and echo_p50:
        floor = [SYNC_MASTER_HOPS * y for y in echo_p50]
        per = _per_repeat(e_p50, floor, lambda a, b: a / b)
        _add_note(rows["13e"], f"floor: {SYNC_MASTER_HOPS} echo round trips (13j) p50 "
                  + "/".join(f"{y:.0f}" for y in floor) + " us; p50/floor per repeat "
                  + "/".join(f"{x:.2f}" for x in per))
    a_p50, d_p50 = xs("13a", "p50_us"), xs("13d", "p50_us")
    if a_p50 and d_p50:
        floor = [d + y for d, y in zip(d_p50, echo_p50, strict=False)]
        per = _per_repeat(a_p50, floor, lambda a, b: a / b)
        if per:
            _add_note(rows["13a"], "floor: fdatasync (13d) + echo round trip (13j) p50 "
                      + "/".join(f"{y:.0f}" for y in floor) + " us; p50/floor per repeat "
                      + "/".join(f"{x:.2f}" for x in per))
