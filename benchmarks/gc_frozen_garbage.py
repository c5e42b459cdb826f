"""Cyclic garbage left in the frozen generation by a broker whose estate is built and then churned (issue 24).

A frozen object that later becomes garbage in a reference cycle is never reclaimed (decision 0010). This
benchmark measures how much that is: it runs a ``BrokerController`` in its own process (so that it can unfreeze
at the end) on the event loop ``ferry broker`` uses (uvloop when installed; ``--asyncio-loop`` for asyncio's),
with ``gcFreezeEnable`` as given, and drives it from a client process over 127.0.0.1:

| phase  | requests (each from new connections)                                                                  |
|--------|-------------------------------------------------------------------------------------------------------|
| build  | ``--topics`` topics x 8 queues created, one 1 KiB message sent to each queue                          |
| churn  | rounds for ``--seconds``: ``ROUND_TOPICS`` new topics created and sent to, the round's topics of two |
|        | rounds ago deleted, a new client's heart beat with ``ROUND_GROUPS`` consumer groups, pulls and offset |
|        | commits on them, then its connections closed (its consumers leave)                                   |

Then, in the broker's process, with the broker still running and idle: one full collection (what was garbage
in the unfrozen generations goes), the frozen count (``gc.get_freeze_count``), ``gc.unfreeze()`` and one more
full collection: what that one collects was frozen garbage in cycles. It prints the freezes, the frozen count,
that garbage (objects, and share of the frozen count), the census by type of the garbage (``gc.DEBUG_SAVEALL``),
and the longest full pass of the run (wall and CPU).

    python benchmarks/gc_frozen_garbage.py                                  # 2,000 topics, 120 s of churn
    python benchmarks/gc_frozen_garbage.py --topics 500 --seconds 20        # quick
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gc_pauses import QUEUES, create_cmds, pipeline, send_cmds  # noqa: E402

from ferrymq.client import api  # noqa: E402
from ferrymq.common.route import MessageQueue  # noqa: E402
from ferrymq.remoting.codec import RemotingCommand  # noqa: E402
from ferrymq.remoting.codes import RequestCode  # noqa: E402
from ferrymq.remoting.connection import connect  # noqa: E402

HOST = "127.0.0.1"
#: topics created (and, two rounds later, deleted) and consumer groups of the new client, per churn round
ROUND_TOPICS = 50
ROUND_GROUPS = 20
#: connections per round (opened at its start, closed at its end)
ROUND_CONNECTIONS = 4
#: pulls per round (32 messages at most each)
ROUND_PULLS = 100
#: the census of the frozen garbage printed: its most common types
CENSUS_TYPES = 15


async def drive(addr: str, topics: int, seconds: float) -> None:
    """The client process: the build, then churn rounds until ``seconds`` have passed."""
    conns = [await connect(addr) for _ in range(ROUND_CONNECTIONS)]
    estate = [f"gcg-e{i:05d}" for i in range(topics)]
    await pipeline(conns, create_cmds(estate), "build: create")
    await pipeline(conns, send_cmds(estate, topics * QUEUES), "build: send")
    for c in conns:
        c.close()
    end = time.monotonic() + seconds
    rounds: list[list[str]] = []
    n = 0
    while time.monotonic() < end:
        conns = [await connect(addr) for _ in range(ROUND_CONNECTIONS)]
        new = [f"gcg-r{n:05d}-{i:03d}" for i in range(ROUND_TOPICS)]
        rounds.append(new)
        await pipeline(conns, create_cmds(new), "churn: create")
        await pipeline(conns, send_cmds(new, ROUND_TOPICS * QUEUES), "churn: send")
        groups = [f"gcg-g{n:05d}-{i:03d}" for i in range(ROUND_GROUPS)]
        consumers = [{"consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_ACTIVELY",
                      "groupName": g, "messageModel": "CLUSTERING", "unitMode": False,
                      "subscriptionDataSet": [api.subscription_data(new[k % ROUND_TOPICS], "*", 0)]}
                     for k, g in enumerate(groups)]
        await pipeline(conns[:1], [api.build_heartbeat(f"{HOST}@churn-{n}", [], consumers)], "churn: heartbeat")
        pulls = [api.build_pull(group=groups[k % ROUND_GROUPS], mq=MessageQueue(new[k % ROUND_GROUPS], "b",
                                                                                 (k // ROUND_GROUPS) % QUEUES),
                                queue_offset=0, max_nums=32, sys_flag=0, commit_offset=0, suspend_timeout_ms=0,
                                subscription="*", sub_version=0) for k in range(ROUND_PULLS)]
        await pipeline(conns, pulls, "churn: pull")
        commits = [api.build_update_consumer_offset(groups[k % ROUND_GROUPS],
                                                    MessageQueue(new[k % ROUND_GROUPS], "b", k % QUEUES), 1)
                   for k in range(ROUND_PULLS)]
        await pipeline(conns, commits, "churn: commit")
        if len(rounds) > 2:
            old = rounds.pop(0)
            await pipeline(conns, (RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": t})
                                   for t in old), "churn: delete")
        for c in conns:
            c.close()
        n += 1
    print(f"client: {n} churn rounds", flush=True)


async def serve_and_measure(args: argparse.Namespace) -> None:
    from ferrymq.broker.app import BrokerController
    from ferrymq.broker.config import BrokerConfig
    from ferrymq.common import gc_policy

    tmp = tempfile.mkdtemp(prefix="gc-frozen-garbage-")
    cfg = BrokerConfig(listen_port=0, listen_host=HOST, broker_ip1=HOST, store_path_root_dir=f"{tmp}/store",
                       namesrv_addr=[], fast_listen_enable=False, commit_log_preallocation="sparse")
    cfg.auto_create_topic_enable = False
    cfg.mapped_file_size_consume_queue = 4000
    cfg.gc_freeze_enable = args.freeze == "on"
    ctl = BrokerController(cfg)
    await ctl.start()
    try:
        client = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--drive", f"{HOST}:{ctl.port}", "--topics", str(args.topics),
            "--seconds", str(args.seconds))
        if await client.wait() != 0:
            raise RuntimeError(f"the client process exited {client.returncode}")
        mon = gc_policy.monitor()
        longest_s, longest_cpu_s = mon.max_pause_s, mon.max_pause_cpu_s
        gc.collect()
        frozen = gc.get_freeze_count()
        gc.set_debug(gc.DEBUG_SAVEALL)  # the garbage stays in gc.garbage, for its census
        try:
            gc.unfreeze()
            garbage = gc.collect()
            census = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        share = f"{garbage / frozen:.2%}" if frozen else "-"
        print(f"gcFreezeEnable={cfg.gc_freeze_enable}; loop {type(asyncio.get_running_loop()).__module__}; "
              f"python {sys.version.split()[0]}; load "
              f"{os.getloadavg()[0]:.2f}; {args.topics} topics x {QUEUES} queues, {args.seconds:.0f} s of churn")
        print(f"freezes {mon.freezes}; frozen at the end {frozen}; frozen garbage in cycles {garbage} ({share}); "
              f"longest full pass {longest_s * 1000:.1f} ms ({longest_cpu_s * 1000:.1f} ms CPU)")
        for name, count in census.most_common(CENSUS_TYPES):
            print(f"  {count:>8}  {name}")
    finally:
        await ctl.stop()
        subprocess.run(["rm", "-rf", tmp], check=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--freeze", choices=("on", "off"), default="on", help="gcFreezeEnable of the broker")
    ap.add_argument("--topics", type=int, default=2000, help="topics of the estate built first (x 8 queues)")
    ap.add_argument("--seconds", type=float, default=120.0, help="seconds of churn rounds")
    ap.add_argument("--asyncio-loop", action="store_true", help="asyncio's own event loop, not ferry broker's")
    ap.add_argument("--drive", metavar="ADDR", help=argparse.SUPPRESS)  # the client process
    args = ap.parse_args(argv)
    if args.drive:
        asyncio.run(drive(args.drive, args.topics, args.seconds))
        return 0
    from ferrymq.cli.broker import event_loop_factory

    factory = asyncio.new_event_loop if args.asyncio_loop else event_loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve_and_measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
