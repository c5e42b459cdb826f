"""Client CPU per ``await Producer.send(msg)`` against a real broker (private to the perf work).

    python benchmarks/client_send.py [--producers 1,16] [--sends 20000] [--reps 3] [--size 1024]
                                     [--trees before=/tmp/before/src,after=src] [--profile cprofile|pyspy]

Starts one name server + one ASYNC_MASTER/ASYNC_FLUSH broker as subprocesses (``hotpath.Cluster``; the
broker runs from ``--broker-tree``, default this tree), creates topic ``HotPath`` (16 queues), then for every
repeat and every client tree (interleaved) runs a child process (``PYTHONPATH=<tree>``) that starts N
``ferrymq.client.Producer``s (one instance and connection each, like ``ferry bench`` workload 1), warms them
up, and drives ``--sends`` sends of a ``--size`` body with ``tags="bench"`` split over the N producers, each
awaiting its own ``send()`` in a loop. Printed per run:

* ``client`` — CPU time of the client process (utime+stime, ``resource.getrusage``) per send, in µs;
* ``broker`` — CPU time of the broker process per send over the same window (``/proc/<pid>/stat``);
* ``wall`` — µs of wall time per send (for 1 producer: the round trip, latency), and sends/s;
* read-type and write-type syscalls per send of the client and of the broker (``/proc/<pid>/io`` syscr,
  syscw; the broker's include its other work, e.g. the flush thread's writes).

A tree given as ``name=<src>+shared`` runs its producers with one ``instance_name``, so they share one
ClientInstance and one connection to the broker (``--trees own=src,shared=src+shared``). ``name=echo`` runs the
``raw`` load against ``ferry bench``'s echo server (row 11a's ceiling; "broker" is then the echo server), so
the ratio to the ceiling is measured in the same run, interleaved.

The figure to trust on a shared machine is the client CPU per send; a summary prints the median per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _syscalls(pid: int | str = "self") -> tuple[int, int]:
    """(read-type, write-type) syscalls the process made so far (``/proc/<pid>/io`` syscr, syscw)."""
    with open(f"/proc/{pid}/io") as f:
        io = dict(line.split(": ") for line in f.read().splitlines())
    return int(io["syscr"]), int(io["syscw"])


def _sys_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------------------
# child: the client process
def child(a: argparse.Namespace) -> None:
    import asyncio

    import uvloop

    from ferrymq.client import Producer, new_message

    async def main() -> dict[str, Any]:
        producers = []
        for i in range(a.producers):
            # --shared: one instance name, so one ClientInstance (one connection per broker) for all producers
            p = Producer(f"127.0.0.1:{a.ns}", f"cs_{os.getpid()}_{i}", send_timeout_ms=10_000,
                         send_latency_fault_enable=False, instance_name=f"cs_{os.getpid()}" if a.shared else None)
            await p.start()
            producers.append(p)
        body = b"x" * a.size
        topic = a.topic

        async def run(p: Any, n: int) -> None:
            for _ in range(n):
                await p.send(new_message(topic, body, tags="bench"))

        await asyncio.gather(*(run(p, 200) for p in producers))  # warm-up: routes, connections
        per = a.sends // a.producers
        profiler: Any = None
        if a.profile == "cprofile":
            import cProfile
            profiler = cProfile.Profile()
            profiler.enable()
        b0 = _proc_cpu_s(a.broker_pid) if a.broker_pid else 0.0
        io0, bio0 = _syscalls(), _syscalls(a.broker_pid) if a.broker_pid else (0, 0)
        s0, c0, t0 = _sys_s(), _cpu_s(), time.perf_counter()
        await asyncio.gather(*(run(p, per) for p in producers))
        s1, c1, t1 = _sys_s(), _cpu_s(), time.perf_counter()
        io1, bio1 = _syscalls(), _syscalls(a.broker_pid) if a.broker_pid else (0, 0)
        b1 = _proc_cpu_s(a.broker_pid) if a.broker_pid else 0.0
        if profiler is not None:
            import pstats
            profiler.disable()
            st = pstats.Stats(profiler, stream=sys.stderr)
            st.sort_stats("tottime").print_stats(30)
        for p in producers:
            await p.close()
        n = per * a.producers
        return {"n": n, "client_us": (c1 - c0) / n * 1e6, "broker_us": (b1 - b0) / n * 1e6,
                "sys_us": (s1 - s0) / n * 1e6,
                "wall_us": (t1 - t0) / n * 1e6, "rate": n / (t1 - t0),
                "client_reads": (io1[0] - io0[0]) / n, "client_writes": (io1[1] - io0[1]) / n,
                "broker_reads": (bio1[0] - bio0[0]) / n, "broker_writes": (bio1[1] - bio0[1]) / n}

    print(json.dumps(uvloop.run(main())), flush=True)


def child_raw(a: argparse.Namespace) -> None:
    """The floor: raw uvloop Protocols writing pre-encoded SEND frames (``hotpath.Pipe``, one in flight per
    connection, answers only split by length), same CPU accounting as ``child``."""
    import asyncio

    import uvloop

    sys.path.insert(0, str(HERE))
    import hotpath

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        pipes = []
        for c in range(a.producers):
            frames = hotpath.send_frames(512, a.size, c % hotpath.QUEUES, c)
            _, p = await loop.create_connection(lambda f=frames: hotpath.Pipe(f, 1, 1, False),  # type: ignore[misc]
                                                "127.0.0.1", a.broker_port)
            pipes.append(p)
        await asyncio.sleep(0.5)
        n0 = sum(p.count for p in pipes)
        b0 = _proc_cpu_s(a.broker_pid)
        s0, c0, t0 = _sys_s(), _cpu_s(), time.perf_counter()
        while sum(p.count for p in pipes) - n0 < a.sends:
            await asyncio.sleep(0.01)
        s1, c1, t1 = _sys_s(), _cpu_s(), time.perf_counter()
        b1 = _proc_cpu_s(a.broker_pid)
        n = sum(p.count for p in pipes) - n0
        for p in pipes:
            p.running = False
            p.t.close()
        return {"n": n, "client_us": (c1 - c0) / n * 1e6, "broker_us": (b1 - b0) / n * 1e6,
                "sys_us": (s1 - s0) / n * 1e6, "wall_us": (t1 - t0) / n * 1e6, "rate": n / (t1 - t0)}

    print(json.dumps(uvloop.run(main())), flush=True)


# ---------------------------------------------------------------------------------------------------------
# parent: stack + interleaved runs
def _resolve_tree(spec: str) -> str:
    """A tree's absolute src path, keeping a '+shared' suffix."""
    path = spec.removesuffix("+shared")
    return str(Path(path).resolve()) + spec[len(path):]


def parent(a: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    import hotpath

    trees = dict(t.split("=", 1) for t in a.trees.split(",")) if a.trees else {"this": str(ROOT / "src")}
    trees = {k: v if v in ("raw", "echo") else _resolve_tree(v) for k, v in trees.items()}
    broker_tree = str(Path(a.broker_tree).resolve()) if a.broker_tree else str(ROOT / "src")
    os.environ["PYTHONPATH"] = broker_tree
    counts = [int(x) for x in a.producers.split(",")]
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="client-send-") as tmp:
        cl = hotpath.Cluster(Path(tmp))
        try:
            cl.namesrv()
            port = hotpath.free_port(2)
            cl.broker("master", port, "ASYNC_MASTER", cpu=a.pin)
            hotpath.create_topic(port)
            time.sleep(1.0)
            bpid = cl.procs["master"].pid
            eport, epid = 0, 0
            if "echo" in trees.values():  # the echo ceiling (ferry bench 11a's server), loaded like 'raw'
                eport = hotpath.free_port()
                elog = open(Path(tmp) / "echo.log", "ab")
                cl.procs["echo"] = subprocess.Popen(
                    [sys.executable, "-m", "ferrymq.cli.bench_impl.echo", "--port", str(eport), "--mode", "codec"],
                    stdout=elog, stderr=subprocess.STDOUT)
                hotpath.wait_port(eport)
                epid = cl.procs["echo"].pid
            for rep in range(a.reps):
                for n in counts:
                    for name, tree in trees.items():
                        env = dict(os.environ, PYTHONPATH=tree)
                        argv = [sys.executable, __file__, "--child", "--ns", str(cl.ns_port),
                                "--broker-pid", str(bpid), "--producers", str(n), "--sends", str(a.sends),
                                "--size", str(a.size), "--topic", hotpath.TOPIC, "--broker-port", str(port)]
                        if tree.endswith("+shared"):
                            argv.append("--shared")
                            env["PYTHONPATH"] = tree[:-len("+shared")]
                        if tree in ("raw", "echo"):
                            argv.append("--raw")
                            env["PYTHONPATH"] = broker_tree
                        if tree == "echo":
                            argv[argv.index("--broker-pid") + 1] = str(epid)
                            argv[argv.index("--broker-port") + 1] = str(eport)
                        if a.profile == "cprofile":
                            argv += ["--profile", "cprofile"]
                        if a.pin_client is not None:
                            argv = ["taskset", "-c", a.pin_client, *argv]
                        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE)
                        spy = None
                        if a.profile == "perf":
                            time.sleep(2.0)
                            spy = subprocess.Popen(
                                ["perf", "record", "-F", "999", "-g", "-o", f"/tmp/client-{name}-{n}.perf",
                                 "-p", str(proc.pid), "--", "sleep", "4"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        if a.profile == "pyspy":
                            time.sleep(2.0)
                            spy = subprocess.Popen(
                                ["py-spy", "record", "-o", f"/tmp/client-{name}-{n}.txt", "-f", "raw", "-r", "250",
                                 "--pid", str(proc.pid), "-d", "6", "--nonblocking"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        out, _ = proc.communicate()
                        if spy is not None:
                            spy.wait()
                        if proc.returncode:
                            raise SystemExit(f"client {name} failed ({proc.returncode})")
                        r = json.loads(out.decode().strip().splitlines()[-1])
                        results.setdefault((name, n), []).append(r)
                        print(f"rep {rep} {name:>8} producers={n:<3} client {r['client_us']:6.1f} us CPU/send "
                              f"({r['sys_us']:5.1f} sys)  "
                              f"broker {r['broker_us']:6.1f} us CPU/send  wall {r['wall_us']:6.1f} us/send  "
                              f"{r['rate']:8,.0f} sends/s" + (
                                  f"  reads/writes per send: client {r['client_reads']:.2f}/{r['client_writes']:.2f}"
                                  f" broker {r['broker_reads']:.2f}/{r['broker_writes']:.2f}"
                                  if "client_reads" in r else ""), flush=True)
        finally:
            cl.stop_all()
    print("median over repeats:")
    for (name, n), rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("client_us", "broker_us", "wall_us", "rate")}
        print(f"  {name:>8} producers={n:<3} client {med['client_us']:6.1f} us CPU/send  "
              f"broker {med['broker_us']:6.1f}  wall {med['wall_us']:6.1f} us/send  {med['rate']:8,.0f} sends/s  "
              f"(client runs {' / '.join(format(r['client_us'], '.1f') for r in rs)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ns", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--broker-pid", dest="broker_pid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--topic", default="HotPath", help=argparse.SUPPRESS)
    ap.add_argument("--broker-port", dest="broker_port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shared", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--producers", default="1,16", help="comma-separated producer counts")
    ap.add_argument("--sends", type=int, default=20_000, help="sends per run (split over the producers)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--trees", default="", help="name=src-dir,... client trees run interleaved (default: this); "
                    "a tree 'raw' runs the floor: raw Protocols writing pre-encoded frames, no client library; "
                    "'echo' runs the same load against ferry bench's echo server (the 11a ceiling); "
                    "a path ending in '+shared' runs the producers on one ClientInstance (one connection)")
    ap.add_argument("--broker-tree", dest="broker_tree", default="", help="src dir the broker runs from")
    ap.add_argument("--profile", choices=["cprofile", "pyspy", "perf"], default=None)
    ap.add_argument("--pin", default=None, help="taskset CPU list for the broker")
    ap.add_argument("--pin-client", dest="pin_client", default=None, help="taskset CPU list for the client")
    a = ap.parse_args()
    if a.child:
        a.producers = int(a.producers)
        if a.raw:
            child_raw(a)
        else:
            child(a)
    else:
        parent(a)


if __name__ == "__main__":
    main()
