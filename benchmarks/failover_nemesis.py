"""Controller-mode failover nemesis: ``python benchmarks/failover_nemesis.py [--rounds N] [--seed S]
[--controllers 3] [--partitions] [--groups 2] [--broker-prop KEY=VALUE ...]``.

Starts one name server, one controller (three with ``--controllers 3``) and a broker group of three replicas
in controller mode with its defaults (SYNC, allAckInSyncStateSet; real ``ferry`` processes under a tmp dir;
``--broker-prop brokerRole=ASYNC_MASTER`` shows what ASYNC loses), runs ferrymq's Producer sending unique
bodies, and injects ``--rounds`` faults chosen at random (seeded): SIGKILL of the master, SIGSTOP of the
master through an election then SIGCONT, SIGKILL of a slave, SIGKILL of the controller (the Raft leader), and
with ``--partitions`` (root and iptables; tests/acceptance/partition_support.py) partitions: the master
from every controller, one slave from everyone, and with ``--controllers 3`` the master together with the
Raft leader from the rest; every killed process is restarted, every partition healed, and each round waits
until the group is whole again. ``--groups 2``: a second group shares the name server and controllers and
serves the topic too; each fault hits one group drawn at random. At the end it checks every SEND_OK
(tests/acceptance/controller_support.py: in the log at its offset, one acknowledging broker per epoch, the
replicas' logs byte-identical) and prints one line per round and a summary table: rounds, failovers, SEND_OK,
lost, duplicates, write unavailability per failover (median, max; with two groups: to the first SEND_OK
anywhere) and the longest gap between two SEND_OKs around each failover. Exit code 1 on any violation.

``--client cpp|cpp21|alions|ferrymq --rounds N``: instead, N SIGKILLs of the master with that client as the only
producer (``cpp``: the Apache C++ client 1.x through PyPI rocketmq 0.4.4; ``cpp21``: the Apache C++ client 2.1
through PyPI rocketmq-python-cvs, pip-installed into a cache directory on first use; ``alions``: npm ali-ons; all
unchanged, in a subprocess) and one line per failover with the seconds from the kill to its first SEND_OK
on the new master; the table gives median, min and max, and the end checks every acknowledged body. Each
kill waits a random ``--phase-jitter`` seconds (30 by default for the foreign clients) after the group is whole, so
the kills fall at random points of the client's own 30 s route poll, as they would in production (back to
back they would all fall at the same point of it). With ``--groups 2`` the topic is on two groups and each kill
hits the master of one drawn at random. For a foreign client each line also gives the longest gap between two
of its SEND_OKs from a second before the kill until the group is whole again and the client has resumed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "acceptance"), str(ROOT / "tests")]

from controller_support import (  # noqa: E402
    ACTIONS,
    FAILOVER_ACTIONS,
    PARTITION_ACTIONS,
    TOPIC,
    ForeignProducer,
    NemesisGroup,
    ProducerLoop,
    longest_gap_s,
    verify_across,
)
from partition_support import unavailable_reason  # noqa: E402
from procs import ProcessGroup, create_topic, route, wait_for  # noqa: E402

#: a client's first SEND_OK after the kill must come within this (RocketMQ clients poll routes every 30 s)
CLIENT_RESUME_BOUND_S = 90.0

#: how often each action is drawn: failovers dominate
WEIGHTS = {"kill-master": 5, "pause-master": 3, "kill-slave": 1, "kill-controller": 1,
           "partition-master-leader": 4, "partition-master": 2, "partition-slave": 1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--controllers", type=int, default=1, choices=(1, 3),
                    help="controllers in the Raft group; with 3, kill-controller kills the leader")
    ap.add_argument("--partitions", action="store_true",
                    help="also cut the master off from the controllers, one slave off from everyone and (with "
                         "--controllers 3) the master and the Raft leader off from the rest (iptables)")
    ap.add_argument("--groups", type=int, default=1, choices=(1, 2),
                    help="broker groups serving the topic (each fault hits one of them)")
    ap.add_argument("--broker-prop", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker.conf key for every replica (repeatable), e.g. brokerRole=ASYNC_MASTER")
    ap.add_argument("--client", choices=("ferrymq", *ForeignProducer.KINDS),
                    help="only master SIGKILLs, this client producing: how long until its writes resume")
    ap.add_argument("--phase-jitter", type=float, default=None, metavar="S",
                    help="--client: wait a random 0..S s before each kill (default 30 for foreign clients, 0 for ferrymq)")
    ap.add_argument("--keep", action="store_true", help="keep the tmp dir (logs) after the run")
    args = ap.parse_args()
    if args.client:
        return client_failovers(args)
    actions = list(ACTIONS)
    if args.partitions:
        reason = unavailable_reason()
        if reason is not None:
            ap.error(f"--partitions: {reason}")
        actions += [a for a in PARTITION_ACTIONS if args.controllers == 3 or a != "partition-master-leader"]
    broker_props = dict(kv.split("=", 1) for kv in args.broker_prop)
    allow_loss = broker_props.get("brokerRole") == "ASYNC_MASTER"
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="failover-nemesis-"))
    group = ProcessGroup(tmp)
    t_start = time.monotonic()
    ok = True
    nemesis: NemesisGroup | None = None
    try:
        nemesis = NemesisGroup.start(group, controllers=args.controllers, partitions=args.partitions, **broker_props)
        groups = [nemesis]
        if args.groups == 2:
            groups.append(NemesisGroup.start(group, broker_name="broker-m", share=nemesis, **broker_props))
            for g in groups:  # the topic on both groups (a producer's retry moves to the other one)
                create_topic(g.master().addr, TOPIC)
                g.topic_elsewhere = True
        producer = ProducerLoop(nemesis.ns.addr, f"n{args.seed}").start()
        try:
            for i in range(args.rounds):
                action = rng.choices(actions, weights=[WEIGHTS[a] for a in actions])[0]
                target = rng.choice(groups) if action != "kill-controller" else nemesis
                r = target.round(action, producer, rng)
                for g in groups:
                    g.wait_whole()
                print(f"round {i + 1:3d} {target.broker_name} {r.action:23s} victim={r.victim:10s} master "
                      f"{r.master_before}->{r.master_after} write-unavailable={r.unavailable_s:6.2f}s "
                      f"longest-gap={r.longest_gap_s:5.2f}s acks={len(producer.acks)}", flush=True)
        finally:
            producer.stop()
        summary: dict[str, Any] = {"send_ok": 0, "lost": 0, "duplicates": 0}
        for g in groups:
            try:
                one = g.verify(producer, allow_loss=allow_loss)
                for key in summary:
                    summary[key] += one[key]
            except AssertionError as exc:
                print(f"VIOLATION ({g.broker_name}): {exc}")
                ok = False
                summary = {"send_ok": len(producer.acks), "lost": "?", "duplicates": "?"}
                break
        failovers = [r.unavailable_s for g in groups for r in g.rounds if r.action in FAILOVER_ACTIONS]
        gaps = [r.longest_gap_s for g in groups for r in g.rounds if r.action in FAILOVER_ACTIONS]
        print()
        print(f"controllers: {args.controllers}, groups {args.groups}, seed {args.seed}, partitions {args.partitions}, "
              f"broker props {broker_props or 'defaults'}")
        print("| rounds | failovers | SEND_OK | lost | duplicates | unavailability median (s) | max (s) | "
              "longest gap median (s) | max (s) | run (s) |")
        print("|-------:|----------:|--------:|-----:|-----------:|--------------------------:|--------:|"
              "-----------------------:|--------:|--------:|")
        med = statistics.median(failovers) if failovers else float("nan")
        worst = max(failovers) if failovers else float("nan")
        gap_med = statistics.median(gaps) if gaps else float("nan")
        gap_max = max(gaps) if gaps else float("nan")
        print(f"| {sum(len(g.rounds) for g in groups)} | {len(failovers)} | {summary['send_ok']} | {summary['lost']} | "
              f"{summary['duplicates']} | {med:.2f} | {worst:.2f} | {gap_med:.2f} | {gap_max:.2f} | "
              f"{time.monotonic() - t_start:.0f} |")
    finally:
        if nemesis is not None:
            nemesis.close()  # the iptables rules
        group.stop_all()
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs kept under {tmp}")
    return 0 if ok else 1


def client_failovers(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix=f"failover-{args.client}-"))
    group = ProcessGroup(tmp)
    rng = random.Random(args.seed)
    ok = True
    resumes: list[float] = []
    gaps: list[float] = []
    try:
        nemesis = NemesisGroup.start(group, controllers=args.controllers)
        groups = [nemesis]
        if args.groups == 2:
            groups.append(NemesisGroup.start(group, broker_name="broker-m", share=nemesis))
            for g in groups:  # the topic on both groups before the first send (a retry moves to the other one)
                create_topic(g.master().addr, TOPIC)
                g.topic_elsewhere = True
            wait_for(lambda: {b["brokerName"] for b in (route(nemesis.ns.addr, TOPIC) or {}).get("brokerDatas") or []}
                     >= {g.broker_name for g in groups}, timeout_s=60, what="the topic routed on both groups",
                     alive=nemesis.alive)
        ours: ProducerLoop | None = None
        foreign: ForeignProducer | None = None
        if args.client == "ferrymq":
            ours = ProducerLoop(nemesis.ns.addr, f"c{args.seed}", concurrency=1).start()
        else:
            foreign = ForeignProducer(group, nemesis.ns.addr, args.client, tmp / "client").start(alive=nemesis.alive)
        jitter_s = args.phase_jitter if args.phase_jitter is not None else (0.0 if ours is not None else 30.0)
        try:
            for i in range(args.rounds):
                for g in groups:
                    g.wait_whole()
                time.sleep(rng.uniform(0, jitter_s))  # a random point of the client's route poll
                target = rng.choice(groups)
                r = target.round("kill-master", ours, rng)
                gap = ""
                if foreign is not None:
                    fault_ms = r.fault_at_ms
                    resume = wait_for(lambda: foreign.resumed_s(fault_ms), timeout_s=CLIENT_RESUME_BOUND_S,  # noqa: B023
                                      what=f"a {args.client} SEND_OK after the kill", alive=nemesis.alive)
                    gaps.append(longest_gap_s(foreign.poll(), fault_ms - 1000, time.time() * 1000))
                    gap = f" longest-gap={gaps[-1]:6.2f}s"
                else:
                    resume = r.unavailable_s
                resumes.append(resume)
                print(f"round {i + 1:3d} kill-master {target.broker_name} master {r.master_before}->{r.master_after} "
                      f"{args.client} writes resumed after {resume:6.2f}s{gap}", flush=True)
        finally:
            if ours is not None:
                ours.stop()
            if foreign is not None:
                foreign.stop()
        try:
            if ours is not None and len(groups) == 1:
                summary = nemesis.verify(ours)
            elif ours is not None:
                summary = verify_across(groups, [ack.body for ack in ours.acks])
            elif len(groups) == 1:
                assert foreign is not None
                summary = nemesis.verify(ProducerLoop(nemesis.ns.addr, "none"), foreign.acked_bodies())
            else:
                assert foreign is not None
                summary = verify_across(groups, foreign.acked_bodies())
        except AssertionError as exc:
            print(f"VIOLATION: {exc}")
            ok = False
            summary = {"send_ok": "?", "lost": "?"}
        print()
        print(f"client {args.client}, controllers {args.controllers}, groups {args.groups}, seed {args.seed}")
        print("| client | groups | failovers | resume median (s) | min (s) | max (s) | longest gap max (s) | SEND_OK | "
              "lost |")
        print("|--------|-------:|----------:|------------------:|--------:|--------:|--------------------:|--------:|"
              "-----:|")
        gap_max = f"{max(gaps):.2f}" if gaps else "-"
        print(f"| {args.client} | {args.groups} | {len(resumes)} | {statistics.median(resumes):.2f} | "
              f"{min(resumes):.2f} | {max(resumes):.2f} | {gap_max} | {summary['send_ok']} | {summary['lost']} |")
        print(f"resumes (s): {[round(x, 2) for x in resumes]}")
        if gaps:
            print(f"longest gaps (s): {[round(x, 2) for x in gaps]}")
    finally:
        group.stop_all()
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs kept under {tmp}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
