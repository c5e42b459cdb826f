"""Client CPU per ``await Producer.send(msg)`` without sockets (private to the perf work).

    PYTHONPATH=src python benchmarks/client_inproc.py [--producers 16] [--sends 50000] [--fault]
    python benchmarks/client_inproc.py --trees before=/tmp/before/src,after=src --reps 5

N ``ferrymq.client.Producer``s (one ``ClientInstance`` each, as in ``ferry bench`` workload 1) on a uvloop
loop, each awaiting its own ``send()`` of a ``--size`` body (``tags="bench"``) in a loop. Each producer's
instance gets a route (one broker, 16 write queues) and a ``Connection`` whose transport is a fake broker:
``write()`` reads the request's opaque and hands a pre-built SEND_OK answer (the broker's field set) to
``data_received`` on the next loop iteration. Prints process CPU time (``time.process_time``) per send: the
client's own Python per send, without the kernel and the broker. With ``--trees`` each tree runs in its
own child process (``PYTHONPATH=<tree>``), interleaved, and medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def child(a: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    import uvloop
    from _fake_transport import TOPIC as topic
    from _fake_transport import close_fake_producer, start_fake_producer

    from ferrymq.client import new_message
    from ferrymq.client.values import SendStatus

    async def main() -> dict[str, Any]:
        producers = []
        for i in range(a.producers):
            p = await start_fake_producer(f"inproc_{i}", fault=a.fault)
            producers.append(p)
        body = b"x" * a.size
        bad = 0

        async def run(p: Any, n: int) -> None:
            nonlocal bad
            for _ in range(n):
                r = await p.send(new_message(topic, body, tags="bench"))
                if r.status is not SendStatus.SEND_OK:
                    bad += 1

        await asyncio.gather(*(run(p, 200) for p in producers))
        per = a.sends // a.producers
        prof: Any = None
        if a.profile:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        c0 = time.process_time()
        await asyncio.gather(*(run(p, per) for p in producers))
        c1 = time.process_time()
        if prof is not None:
            import pstats
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats(a.profile).print_stats(35)
        for p in producers:
            await close_fake_producer(p)
        return {"us": (c1 - c0) / (per * a.producers) * 1e6, "bad": bad}

    return uvloop.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--producers", type=int, default=16)
    ap.add_argument("--sends", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--fault", action="store_true", help="latency fault tolerance on (the Producer default)")
    ap.add_argument("--profile", default="", help="cProfile sort key (tottime, cumtime)")
    ap.add_argument("--trees", default="", help="name=src-dir,... run interleaved in child processes")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.trees:
        r = child(a)
        print(json.dumps(r) if a.json else f"{r['us']:.2f} us CPU/send (producers={a.producers}, bad={r['bad']})")
        return
    trees = {k: str(Path(v).resolve()) for k, v in (t.split("=", 1) for t in a.trees.split(","))}
    res: dict[str, list[float]] = {k: [] for k in trees}
    for rep in range(a.reps):
        for name, tree in trees.items():
            argv = [sys.executable, __file__, "--json", "--producers", str(a.producers), "--sends", str(a.sends),
                    "--size", str(a.size), *(["--fault"] if a.fault else [])]
            out = subprocess.run(argv, env=dict(os.environ, PYTHONPATH=tree), check=True, capture_output=True)
            r = json.loads(out.stdout.decode().strip().splitlines()[-1])
            res[name].append(r["us"])
            print(f"rep {rep} {name:>8}: {r['us']:6.2f} us CPU/send (bad={r['bad']})", flush=True)
    for name, v in res.items():
        print(f"median {name:>8}: {statistics.median(v):6.2f} us CPU/send  (runs {' / '.join(f'{x:.2f}' for x in v)})")


if __name__ == "__main__":
    main()
