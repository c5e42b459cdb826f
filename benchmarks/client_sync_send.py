"""Round trip and CPU of a blocking ``SyncProducer.send`` beside ``await Producer.send`` (private to the perf
work).

    python benchmarks/client_sync_send.py [--sends 10000] [--reps 3] [--trees before=/tmp/before/src,after=src]

Starts one name server and one ASYNC_MASTER broker as subprocesses (``hotpath.Cluster``, from this tree), then
for every repeat and every client tree (interleaved) runs a child process (``PYTHONPATH=<tree>``) that sends
``--sends`` 1 KiB messages one at a time, first with ``await Producer.send`` on uvloop, then with a
``SyncProducer`` (its private loop on a background thread). Printed per run: wall time per send and process
CPU per send (``getrusage``: both threads of the facade).
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def child(ns: str, topic: str, sends: int) -> dict[str, float]:
    import uvloop

    from ferrymq.client import Producer, new_message
    from ferrymq.client.sync import SyncProducer

    body = b"x" * 1024
    out: dict[str, float] = {}

    async def async_run() -> tuple[float, float]:
        async with Producer(ns, f"ss_async_{os.getpid()}", send_latency_fault_enable=False) as p:
            for _ in range(300):
                await p.send(new_message(topic, body, tags="bench"))
            c0, t0 = _cpu_s(), time.perf_counter()
            for _ in range(sends):
                await p.send(new_message(topic, body, tags="bench"))
            return (time.perf_counter() - t0) / sends * 1e6, (_cpu_s() - c0) / sends * 1e6

    out["async_wall_us"], out["async_cpu_us"] = uvloop.run(async_run())
    with SyncProducer(ns, f"ss_sync_{os.getpid()}", send_latency_fault_enable=False) as sp:
        for _ in range(300):
            sp.send(new_message(topic, body, tags="bench"))
        c0, t0 = _cpu_s(), time.perf_counter()
        for _ in range(sends):
            sp.send(new_message(topic, body, tags="bench"))
        out["sync_wall_us"] = (time.perf_counter() - t0) / sends * 1e6
        out["sync_cpu_us"] = (_cpu_s() - c0) / sends * 1e6
    return out


def parent(a: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    import hotpath

    trees = dict(t.split("=", 1) for t in a.trees.split(",")) if a.trees else {"this": str(ROOT / "src")}
    trees = {k: str(Path(v).resolve()) for k, v in trees.items()}
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="client-sync-send-") as tmp:
        cl = hotpath.Cluster(Path(tmp))
        try:
            cl.namesrv()
            port = hotpath.free_port(2)
            cl.broker("master", port, "ASYNC_MASTER")
            hotpath.create_topic(port)
            time.sleep(1.0)
            for rep in range(a.reps):
                for name, tree in trees.items():
                    argv = [sys.executable, __file__, "--child", "--ns", f"127.0.0.1:{cl.ns_port}",
                            "--topic", hotpath.TOPIC, "--sends", str(a.sends)]
                    out = subprocess.run(argv, env=dict(os.environ, PYTHONPATH=tree), stdout=subprocess.PIPE,
                                         check=True).stdout
                    r = json.loads(out.decode().strip().splitlines()[-1])
                    results.setdefault(name, []).append(r)
                    print(f"rep {rep} {name:>8}  await Producer.send {r['async_wall_us']:6.1f} us wall "
                          f"{r['async_cpu_us']:6.1f} us CPU   SyncProducer.send {r['sync_wall_us']:6.1f} us wall "
                          f"{r['sync_cpu_us']:6.1f} us CPU  (load {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            cl.stop_all()
    print("median over repeats:")
    for name, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"  {name:>8}  await Producer.send {med['async_wall_us']:6.1f} us wall {med['async_cpu_us']:6.1f} us CPU"
              f"   SyncProducer.send {med['sync_wall_us']:6.1f} us wall {med['sync_cpu_us']:6.1f} us CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ns", default="", help=argparse.SUPPRESS)
    ap.add_argument("--topic", default="HotPath", help=argparse.SUPPRESS)
    ap.add_argument("--sends", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--trees", default="", help="name=src-dir,... client trees run interleaved (default: this)")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.ns, a.topic, a.sends)), flush=True)
    else:
        parent(a)


if __name__ == "__main__":
    main()
