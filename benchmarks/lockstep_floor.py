"""One client in lockstep over loopback TCP: the echo server of ``ferry bench`` row 11a beside a ferrymq broker,
with the server and the client on one vCPU, on two, or where the scheduler puts them (private perf driver).

    python benchmarks/lockstep_floor.py [--repeats 3] [--secs 5] [--size 1024] [--cpus 0,1]

Starts the echo server (``python -m ferrymq.cli.bench_impl.echo``) and a name server with one ASYNC_MASTER +
ASYNC_FLUSH broker, then runs, per repeat and in this order, for each placement (``same``: server and client
pinned to the first CPU of ``--cpus``; ``split``: server on the first, client on the second; ``free``: no
pinning, as ``ferry bench`` runs): the echo server answered by ``ferry bench``'s 13j worker
(``echo:lockstep``, one connection, one request in flight) and the broker answered by 13g's worker (one
``Producer`` awaiting each ``send()``). A server is pinned with all its threads (``taskset -a -p``), the client
by starting its worker process from a parent pinned for the moment.

Per run it prints the rate, the client's p50 round trip and the server's CPU per acknowledged request (utime
and stime of all its threads over the whole run, warm-up included, apart): the part of a request's cost that is
the kernel's and the machine's (waking a sleeping process on another vCPU) against the part that is the
server's own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from typing import Any

from ferrymq.cli.bench_impl.mpwork import run_workers
from ferrymq.cli.bench_impl.procs import Supervisor, cpu_times_s, free_port, python_argv
from ferrymq.cli.bench_impl.stack import Stack, create_topic, max_offsets, wait_send_ok
from ferrymq.cli.bench_impl.stats import latency_summary_us, median

PLACEMENTS = ("same", "split", "free")
TOPIC = "BenchFloor"
WARMUP_S = 1.0


def pin_all_threads(pid: int, cpus: str | None) -> None:
    """Pin every thread of ``pid`` to ``cpus`` (None: every CPU of this machine)."""
    spec = cpus if cpus is not None else f"0-{(os.cpu_count() or 1) - 1}"
    subprocess.run(["taskset", "-a", "-p", "-c", spec, str(pid)], stdout=subprocess.DEVNULL, check=True)


def run_pinned(cpu: str | None, fn: str, spec: dict[str, Any], run_s: float) -> dict[str, Any]:
    """Run one worker whose process starts pinned to ``cpu`` (it inherits this process's affinity)."""
    before = os.sched_getaffinity(0)
    if cpu is not None:
        os.sched_setaffinity(0, {int(cpu)})
    try:
        (res,) = run_workers(fn, [spec], run_s=run_s)
    finally:
        os.sched_setaffinity(0, before)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--secs", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--cpus", default="0,1", help="two CPUs: the server's and, for 'split', the client's")
    a = ap.parse_args()
    server_cpu, other_cpu = a.cpus.split(",")
    placement_cpus = {"same": (server_cpu, server_cpu), "split": (server_cpu, other_cpu), "free": (None, None)}
    figures: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
    with Supervisor() as sup:
        port = free_port()
        echo = sup.spawn("echo", python_argv("-m", "ferrymq.cli.bench_impl.echo", "--port", str(port)), port=port)
        sup.wait_port(echo)
        stack = Stack(sup, "floor")
        stack.start_namesrv()
        broker = stack.broker("bench-floor")
        stack.start(broker)
        asyncio.run(create_topic(stack.name_server, broker, TOPIC))
        asyncio.run(wait_send_ok(stack.name_server, TOPIC))
        assert broker.child is not None
        timing = {"warmup_s": WARMUP_S, "duration_s": a.secs, "body_bytes": a.size}
        run_s = WARMUP_S + a.secs
        for rep in range(a.repeats):
            for place in PLACEMENTS:
                srv_cpu, cli_cpu = placement_cpus[place]
                for name, pid in (("echo", echo.pid), ("broker", broker.child.pid)):
                    pin_all_threads(pid, srv_cpu)
                    u0, s0 = cpu_times_s(pid)
                    if name == "echo":
                        m = run_pinned(cli_cpu, "ferrymq.cli.bench_impl.echo:lockstep", {"port": port, **timing},
                                       run_s)
                        acked = m["acked"]
                    else:
                        before = sum(asyncio.run(max_offsets(broker.addr, TOPIC)))
                        spec = {"name_server": stack.name_server, "topic": TOPIC, "worker": rep, "producers": 1,
                                "batch": 0, **timing}
                        m = run_pinned(cli_cpu, "ferrymq.cli.bench_impl.workers:produce", spec, run_s)
                    u1, s1 = cpu_times_s(pid)
                    if name == "broker":
                        acked = sum(asyncio.run(max_offsets(broker.addr, TOPIC))) - before
                    rate = m["count"] / m["elapsed_s"]
                    p50 = latency_summary_us(m["lat_ns"])["p50_us"] or 0.0
                    user_us, sys_us = (u1 - u0) / acked * 1e6, (s1 - s0) / acked * 1e6
                    figures.setdefault((place, name), []).append((rate, p50, user_us, sys_us))
                    print(f"rep {rep + 1} {place:5} {name:6}: {rate:9,.0f} req/s  p50 {p50:6.1f} us  server "
                          f"{user_us:5.1f} user + {sys_us:5.1f} sys = {user_us + sys_us:5.1f} us/req  "
                          f"load {os.getloadavg()[0]:.2f}", flush=True)
        for name in ("echo", "broker"):
            pin_all_threads(echo.pid if name == "echo" else broker.child.pid, None)
    print("\nmedians (per placement):")
    for place in PLACEMENTS:
        for name in ("echo", "broker"):
            rows = figures.get((place, name), [])
            rate, p50, user_us, sys_us = (median([r[i] for r in rows]) or 0.0 for i in range(4))
            print(f"  {place:5} {name:6}: {rate:9,.0f} req/s  p50 {p50:6.1f} us  server {user_us:5.1f} user + "
                  f"{sys_us:5.1f} sys = {user_us + sys_us:5.1f} us/req", flush=True)


if __name__ == "__main__":
    sys.exit(main())
