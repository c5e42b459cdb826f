"""Syscalls and CPU per message of a broker under ``ferry bench``'s producer load (private perf driver).

    python benchmarks/syscalls_per_msg.py [--flush ASYNC_FLUSH|SYNC_FLUSH] [--producers 1] [--secs 5]
                                          [--strace] [--client-strace] [--repeats 1] [--settle-s 60]
                                          [--gc-stats] [--pyspy OUT [--pyspy-native]]
                                          [--server-pythonpath OTHER_CHECKOUT/src]

Starts a name server and one broker (``--flush``) as subprocesses, waits until the idle broker has settled
(``--settle-s``: start-up and the zero-fill of its next commit log segment done), then runs ``ferry bench``'s
produce worker (``ferrymq.client.Producer``, one connection per producer) in its own process. Prints, per repeat:
messages stored (the topic's max offsets before/after), the broker's CPU (utime+stime of all its threads, over
the whole worker run, so warm-up is included and divided by the messages of the whole run) per message, the
same for the main thread and the other live threads (user and system time apart) with their voluntary context
switches per message (a SYNC_FLUSH send's loop blocks in its ``fdatasync``, and once more when that commits
the file system's journal; the flush thread's count shows sends handed to it), and with ``--strace`` the
broker's syscalls per message by name (``strace -c -f -p``, attached for the whole worker run; strace slows the
broker, so rates with it are not rates). ``--client-strace`` counts the load process's syscalls instead;
``--gc-stats`` counts the broker's full garbage collections (FERRYMQ_GC_STATS=1) and the longest.
``--server-pythonpath`` runs the name server and broker from another checkout (before/after comparisons; copy
the built extensions next to its sources first).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

from ferrymq.cli.bench_impl.mpwork import run_workers
from ferrymq.cli.bench_impl.procs import Supervisor
from ferrymq.cli.bench_impl.stack import Stack, create_topic, max_offsets, wait_send_ok


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: an idle broker uses less than this share of a core (its timers only)
IDLE_CPU_SHARE = 0.05


def settle(pid: int, max_s: float) -> None:
    """Wait (up to ``max_s``) until the broker is idle: its start-up work and the segment warmer's zero-fill of
    the next commit log segment would otherwise be counted as CPU of the first messages."""
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        c0 = cpu_s(pid)
        time.sleep(0.5)
        if cpu_s(pid) - c0 < 0.5 * IDLE_CPU_SHARE:
            return
    print(f"broker not idle after {max_s:.0f} s; measuring anyway", flush=True)


def thread_cpu(pid: int) -> dict[str, tuple[float, float]]:
    """(user s, system s) of the main thread ("main") and of the other live threads ("others") of a process
    (Python threads carry no OS-level names; a thread that ended is in neither, only in ``cpu_s``)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, tuple[float, float]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                raw = fh.read()
        except OSError:
            continue
        name = "main" if int(tid) == pid else "others"
        fields = raw.rpartition(")")[2].split()
        u, s = out.get(name, (0.0, 0.0))
        out[name] = (u + int(fields[11]) / tick, s + int(fields[12]) / tick)
    return out


def voluntary_switches(pid: int) -> dict[str, int]:
    """Voluntary context switches (the thread blocked: a wait for the disk, a futex, an idle ``epoll_wait``) of the
    main thread ("main") and of the other live threads ("others") of a process."""
    out: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as fh:
                lines = fh.readlines()
        except OSError:
            continue
        name = "main" if int(tid) == pid else "others"
        for line in lines:
            if line.startswith("voluntary_ctxt_switches:"):
                out[name] = out.get(name, 0) + int(line.split()[1])
    return out


def full_collections(log_path: str) -> list[float]:
    """Pause (ms) of every full collection a server logged with FERRYMQ_GC_STATS=1, in order."""
    try:
        with open(log_path, errors="replace") as fh:
            lines = [line for line in fh if "full collection: " in line]
    except OSError:
        return []
    return [float(line.split("full collection: ", 1)[1].split(" ms", 1)[0]) for line in lines]


def parse_strace(path: str) -> dict[str, int]:
    calls: dict[str, int] = {}
    with open(path) as fh:
        for line in fh:
            parts = line.split()
            # % time, seconds, usecs/call, calls, [errors], syscall
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                try:
                    calls[parts[-1]] = int(parts[3])
                except ValueError:
                    continue
    return calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flush", default="ASYNC_FLUSH")
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--secs", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--client-strace", action="store_true")
    ap.add_argument("--server-pythonpath", default=None)
    ap.add_argument("--pyspy", default=None, metavar="OUT",
                    help="sample the broker with py-spy over the counted run (raw stacks to OUT, one file per repeat: "
                         "OUT.<repeat>)")
    ap.add_argument("--pyspy-native", action="store_true", help="with --pyspy: native frames too (uvloop, the kernel "
                                                                "entry points)")
    ap.add_argument("--gc-stats", action="store_true",
                    help="run the servers with FERRYMQ_GC_STATS=1 and print the broker's full collections per repeat")
    ap.add_argument("--settle-s", type=float, default=60.0,
                    help="wait up to this long for the idle broker to use < 5%% of a core before measuring "
                         "(a fresh store zero-fills its next 1 GiB segment on a thread after start)")
    a = ap.parse_args()
    if a.pyspy and (a.strace or a.client_strace):
        ap.error("--pyspy samples the broker while strace would slow it: use one or the other")
    if a.server_pythonpath:
        os.environ["PYTHONPATH"] = a.server_pythonpath  # the servers' environment; workers keep this sys.path
    if a.gc_stats:
        os.environ["FERRYMQ_GC_STATS"] = "1"  # each full collection logged (common/gc_policy.py)
    with Supervisor() as sup:
        stack = Stack(sup, "sys")
        try:
            stack.start_namesrv()
            master = stack.broker("bench-s", flush=a.flush)
            stack.start(master)
            topic = "BenchSys"
            asyncio.run(create_topic(stack.name_server, master, topic))
            asyncio.run(wait_send_ok(stack.name_server, topic))
            assert master.child is not None
            pid = master.child.pid
            settle(pid, a.settle_s)
            for rep in range(a.repeats):
                before = sum(asyncio.run(max_offsets(master.addr, topic)))
                gc_seen = len(full_collections(master.child.log_path)) if a.gc_stats else 0
                out = os.path.join(sup.base_dir or "/tmp", f"strace-{rep}.txt")
                tracer: subprocess.Popen[bytes] | None = None
                client_tracer: list[subprocess.Popen[bytes]] = []
                if a.strace:
                    tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", out],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(0.5)
                spec = {"name_server": stack.name_server, "topic": topic, "worker": rep, "producers": a.producers,
                        "body_bytes": a.size, "batch": 0, "warmup_s": 0.5, "duration_s": a.secs}
                if a.client_strace:
                    # attach to the worker process once it exists (the spawned worker, not the resource tracker)
                    known = set(_children())

                    def attach(known: set[int] = known, out: str = out,
                               tracers: list[subprocess.Popen[bytes]] = client_tracer) -> None:
                        deadline = time.monotonic() + 30
                        while time.monotonic() < deadline:
                            new = [p for p in _children() if p not in known and _is_worker(p)]
                            if new:
                                tracers.append(subprocess.Popen(
                                    ["strace", "-c", "-f", "-p", str(new[0]), "-o", out],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                                return
                            time.sleep(0.05)

                    threading.Thread(target=attach, daemon=True).start()
                if a.pyspy:
                    # attached after the worker's warm-up (the worker starts in well under its 0.5 s warm-up)
                    tracer = subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", str(int(a.secs)), "-r", "250",
                                               "-f", "raw", "-o", f"{a.pyspy}.{rep}"]
                                              + (["--native"] if a.pyspy_native else []),
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                c0 = cpu_s(pid)
                th0 = thread_cpu(pid)
                vs0 = voluntary_switches(pid)
                t0 = time.monotonic()
                res = run_workers("ferrymq.cli.bench_impl.workers:produce", [spec], run_s=a.secs + 0.5)[0]
                wall = time.monotonic() - t0
                c1 = cpu_s(pid)
                th1 = thread_cpu(pid)
                vs1 = voluntary_switches(pid)
                for tr in ([tracer] if tracer else []) + client_tracer:
                    if a.pyspy:
                        tr.wait(30)  # it stops after its duration and writes its file then
                        continue
                    tr.send_signal(signal.SIGINT)
                    tr.wait(30)
                after = sum(asyncio.run(max_offsets(master.addr, topic)))
                msgs = after - before
                rate = res["count"] / res["elapsed_s"]
                load = os.getloadavg()[0]
                label = "other" if a.server_pythonpath else "this"
                print(f"[{label}] {a.flush} producers={a.producers} rep={rep}: {rate:,.0f} msg/s (counted), {msgs} stored in "
                      f"{wall:.1f}s; broker CPU {(c1 - c0) / msgs * 1e6:.1f} us/msg; load {load:.2f}", flush=True)
                per_thread = []
                for name, (u1, s1) in sorted(th1.items()):
                    u0, s0 = th0.get(name, (0.0, 0.0))
                    if u1 - u0 + s1 - s0 > 0:
                        per_thread.append(f"{name} {(u1 - u0) / msgs * 1e6:.1f} user + {(s1 - s0) / msgs * 1e6:.1f} sys")
                print("  broker threads, us/msg: " + "; ".join(per_thread), flush=True)
                print("  broker threads, voluntary switches/msg: " + "; ".join(
                    f"{name} {(n - vs0.get(name, 0)) / msgs:.2f}" for name, n in sorted(vs1.items())), flush=True)
                if a.gc_stats:
                    passes = full_collections(master.child.log_path)[gc_seen:]
                    print(f"  broker full collections: {len(passes)}"
                          + (f", longest {max(passes):.1f} ms" if passes else ""), flush=True)
                if (tracer and not a.pyspy) or client_tracer:
                    calls = parse_strace(out)
                    total = sum(calls.values())
                    top = sorted(calls.items(), key=lambda kv: -kv[1])[:10]
                    who = "client" if client_tracer else "broker"
                    print(f"  {who} syscalls/msg {total / msgs:.2f}: "
                          + ", ".join(f"{k} {v / msgs:.2f}" for k, v in top), flush=True)
        finally:
            stack.close()


def _children() -> list[int]:
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    ppid = int(fh.read().rpartition(")")[2].split()[1])
            except OSError:
                continue
            if ppid == me:
                out.append(int(d))
    return out


def _is_worker(pid: int) -> bool:
    """A multiprocessing worker (not its resource tracker)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"spawn_main" in fh.read()
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
