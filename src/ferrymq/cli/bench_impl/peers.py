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

Ratios (median of the per-repeat ratios; each repeat's ratio in ``detail``): 13a against 13b (target
≥ 1.0), 13c and 13d (target ≥ 0.5 of the disk's rate); 13e against 13f (target ≥ 1.3); 13g against 13h and
13i. ferrymq rows also show the broker's CPU per message (utime + stime of the broker process over the
whole run, divided by the messages it stored; target ≤ 25 µs at 1 producer for 13g). A peer that is not
installed is skipped with the reason; its ratios are left out.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ferrymq.cli.bench_impl import limits, nats_peer, rabbit_peer, redis_peer
from ferrymq.cli.bench_impl.mpwork import run_workers
from ferrymq.cli.bench_impl.procs import Supervisor
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


@dataclass
class _Entry:
    row: Any
    run: Callable[[], dict[str, Any] | None]
    skip: str | None = None
    #: broker process whose CPU per message is measured (ferrymq rows)
    broker: Any = None
    topic: str = ""


@dataclass
class _Servers:
    redis_durable: Any = None
    redis_pair: Any = None
    nats: Any = None
    rabbit: Any = None
    closers: list[Callable[[], None]] = field(default_factory=list)


def steps(repeats: int) -> int:
    return 9 * repeats


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
    }
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
    stack.start(stack.broker("bench-pm", broker_id=1, master=sm_b))
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
            try:
                return _merge1(run_workers("ferrymq.cli.bench_impl.workers:redis_xadd", [spec], run_s=run_s))
            finally:
                redis_peer.cli(servers.redis_durable.port, "del", f"bench{mode}")
        return go

    def redis_wait() -> dict[str, Any]:
        spec = {"port": servers.redis_pair.port, **timing}
        try:
            return _merge1(run_workers("ferrymq.cli.bench_impl.workers:redis_wait", [spec], run_s=run_s))
        finally:
            redis_peer.cli(servers.redis_pair.port, "del", "benchwait")

    def nats() -> dict[str, Any]:
        spec = {"url": servers.nats.url, "stream": nats_peer.STREAM, "subject": nats_peer.SUBJECT, **timing}
        return _merge1(run_workers("ferrymq.cli.bench_impl.workers:nats_publish", [spec], run_s=run_s))

    def rabbit() -> dict[str, Any]:
        spec = {"url": servers.rabbit.url, "queue": rabbit_peer.QUEUE, **timing}
        return _merge1(run_workers("ferrymq.cli.bench_impl.workers:rabbit_publish", [spec], run_s=run_s))

    disk_dir = sup.path("peers", "disk")
    os.makedirs(disk_dir, exist_ok=True)

    def disk() -> None:
        r = limits.fsync_rate(disk_dir, DISK_PROBE_S)
        rows["13d"].values.append(r["per_s"])
        for k in ("p50_us", "p99_us", "p999_us"):
            rows["13d"].add_extra(k, r[k])
        return None

    plan = [
        _Entry(rows["13a"], ferry("13a"), broker=flush_b, topic=topics["13a"][0]),
        _Entry(rows["13b"], redis_durable("always"), skip=redis_reason),
        _Entry(rows["13c"], rabbit, skip=rabbit_reason),
        _Entry(rows["13d"], disk),
        _Entry(rows["13e"], ferry("13e"), broker=sm_b, topic=topics["13e"][0]),
        _Entry(rows["13f"], redis_wait, skip=redis_reason),
        _Entry(rows["13g"], ferry("13g"), broker=async_b, topic=topics["13g"][0]),
        _Entry(rows["13h"], redis_durable("everysec"), skip=redis_reason),
        _Entry(rows["13i"], nats, skip=nats_reason),
    ]
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
    bp = entry.broker
    if bp is None:
        m = entry.run()
        if m is not None:
            bench._record_produce(entry.row, m)
        return
    pid = bp.child.pid
    before = sum(asyncio.run(max_offsets(bp.addr, entry.topic)))
    c0 = _cpu_s(pid)
    m = entry.run()
    c1 = _cpu_s(pid)
    stored = sum(asyncio.run(max_offsets(bp.addr, entry.topic))) - before
    assert m is not None
    bench._record_produce(entry.row, m)
    if stored > 0:
        entry.row.add_extra("cpu_us_msg", (c1 - c0) / stored * 1e6)


def _cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
