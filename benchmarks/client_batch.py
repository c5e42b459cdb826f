"""Client CPU per batched message: ``await Producer.send_batch(msgs)`` (private to the perf work).

    python benchmarks/client_batch.py inproc [--producers 16] [--batches 600] [--batch 256] [--size 1024]
    python benchmarks/client_batch.py broker [--producers 8] [--batches 400] ...
    python benchmarks/client_batch.py {inproc,broker} --trees before=/tmp/before/src,after=src --reps 3

Both modes run N ``ferrymq.client.Producer``s (one instance and connection each, like ``ferry bench``
workload 2) on a uvloop loop, each awaiting its own ``send_batch([new_message(topic, body, tags="bench")
for _ in range(batch)])`` in a loop (the message list is built inside the measured loop, as the bench does).

* ``inproc``: no sockets — each producer's connection has a fake transport answering every request with a
  SEND_OK on the next loop iteration; the figure is the client's own Python per message.
* ``broker``: one name server + ASYNC_MASTER/ASYNC_FLUSH broker as subprocesses (``hotpath.Cluster``, as
  ``client_send.py`` does), topic ``HotPath`` (16 queues); also prints the broker's CPU per message and the
  wall MB/s of bodies (one client process: not the bench's figure, which uses two).

Printed: process CPU time (``time.process_time``) per message in µs. With ``--trees`` every repeat runs each
tree in its own child process (``PYTHONPATH=<tree>``), interleaved; medians at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(a: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    import uvloop
    from _fake_transport import TOPIC as topic
    from _fake_transport import close_fake_producer, start_fake_producer

    from ferrymq.client import Producer, new_message
    from ferrymq.client.values import SendStatus

    async def start_inproc(i: int) -> Any:
        return await start_fake_producer(f"cb_{i}", msgs_per_request=a.batch)

    async def main() -> dict[str, Any]:
        producers = []
        for i in range(a.producers):
            if a.ns:
                p = Producer(f"127.0.0.1:{a.ns}", f"cb_{os.getpid()}_{i}", send_timeout_ms=10_000,
                             send_latency_fault_enable=False)
                await p.start()
            else:
                p = await start_inproc(i)
            producers.append(p)
        body = b"x" * a.size
        bad = 0

        async def run(p: Any, n: int) -> None:
            nonlocal bad
            for _ in range(n):
                r = await p.send_batch([new_message(topic, body, tags="bench") for _ in range(a.batch)])
                if r.status is not SendStatus.SEND_OK:
                    bad += 1

        await asyncio.gather(*(run(p, 3) for p in producers))  # warm-up: routes, connections
        per = max(1, a.batches // a.producers)
        prof: Any = None
        if a.profile:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        b0 = _proc_cpu_s(a.broker_pid) if a.broker_pid else 0.0
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(run(p, per) for p in producers))
        c1, t1 = time.process_time(), time.perf_counter()
        b1 = _proc_cpu_s(a.broker_pid) if a.broker_pid else 0.0
        if prof is not None:
            import pstats
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats(a.profile).print_stats(30)
        if not a.ns:
            for p in producers:
                await close_fake_producer(p)
        else:
            for p in producers:
                await p.close()
        n = per * a.producers * a.batch
        return {"n": n, "us": (c1 - c0) / n * 1e6, "broker_us": (b1 - b0) / n * 1e6,
                "mbs": n * a.size / (t1 - t0) / 1e6, "bad": bad}

    return uvloop.run(main())


def parent(a: argparse.Namespace) -> None:
    trees = dict(t.split("=", 1) for t in a.trees.split(",")) if a.trees else {"this": str(ROOT / "src")}
    trees = {k: str(Path(v).resolve()) for k, v in trees.items()}
    res: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    with tempfile.TemporaryDirectory(prefix="client-batch-") as tmp:
        cl: Any = None
        extra: list[str] = []
        if a.mode == "broker":
            sys.path.insert(0, str(HERE))
            import hotpath

            os.environ["PYTHONPATH"] = str(ROOT / "src")
            cl = hotpath.Cluster(Path(tmp))
            cl.namesrv()
            port = hotpath.free_port(2)
            cl.broker("master", port, "ASYNC_MASTER")
            hotpath.create_topic(port)
            time.sleep(1.0)
            extra = ["--ns", str(cl.ns_port), "--broker-pid", str(cl.procs["master"].pid)]
        try:
            for rep in range(a.reps):
                for name, tree in trees.items():
                    argv = [sys.executable, __file__, a.mode, "--child", "--producers", str(a.producers),
                            "--batches", str(a.batches), "--batch", str(a.batch), "--size", str(a.size), *extra]
                    out = subprocess.run(argv, env=dict(os.environ, PYTHONPATH=tree), check=True,
                                         capture_output=True)
                    r = json.loads(out.stdout.decode().strip().splitlines()[-1])
                    res[name].append(r)
                    print(f"rep {rep} {name:>8}: client {r['us']:6.2f} us CPU/msg  broker {r['broker_us']:5.2f}  "
                          f"{r['mbs']:6.1f} MB/s wall (bad={r['bad']})", flush=True)
        finally:
            if cl is not None:
                cl.stop_all()
    for name, rs in res.items():
        print(f"median {name:>8}: client {statistics.median(r['us'] for r in rs):6.2f} us CPU/msg  "
              f"broker {statistics.median(r['broker_us'] for r in rs):5.2f}  "
              f"{statistics.median(r['mbs'] for r in rs):6.1f} MB/s  "
              f"(client runs {' / '.join(format(r['us'], '.2f') for r in rs)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["inproc", "broker"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ns", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--broker-pid", dest="broker_pid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--producers", type=int, default=16)
    ap.add_argument("--batches", type=int, default=600, help="batches per run (split over the producers)")
    ap.add_argument("--batch", type=int, default=256, help="messages per batch")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--trees", default="", help="name=src-dir,... client trees run interleaved (default: this)")
    ap.add_argument("--profile", default="", help="cProfile sort key (tottime, cumtime); in-process run only")
    a = ap.parse_args()
    if a.child or a.profile:
        r = child(a)
        print(json.dumps(r))
        return
    parent(a)


if __name__ == "__main__":
    main()
