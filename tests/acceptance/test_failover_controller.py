"""Controller mode under a nemesis (issue: failover with epoch fencing): one name server, one controller and a
broker group of three replicas (SYNC, allAckInSyncStateSet) as real processes, ferrymq's Producer sending
unique bodies all along, and twelve faults: the master SIGKILLed six times, SIGSTOPped through an election and
resumed four times, a slave SIGKILLed, the controller SIGKILLed. Every round waits until the group is whole
again (a master, all three replicas back in the SyncStateSet, the name server routing the master as brokerId
0): the old master has rejoined as a slave after truncation. The end checks every SEND_OK
(controller_support.NemesisGroup.verify): in the log at its acknowledged offset, one acknowledging broker per
epoch, the replicas' logs byte-identical. The longer run with a table: benchmarks/failover_nemesis.py."""

from __future__ import annotations

import random

from controller_support import FAILOVER_ACTIONS, NemesisGroup, ProducerLoop
from procs import ProcessGroup

PLAN = ("kill-master", "pause-master", "kill-master", "kill-slave", "pause-master", "kill-master",
        "kill-controller", "kill-master", "pause-master", "kill-master", "pause-master", "kill-master")


def test_failovers_lose_no_acknowledged_message_and_never_split_brain(procs: ProcessGroup) -> None:
    assert sum(a in FAILOVER_ACTIONS for a in PLAN) >= 10
    group = NemesisGroup.start(procs)
    producer = ProducerLoop(group.ns.addr, "ci").start()
    rng = random.Random(12)
    try:
        for action in PLAN:
            acks_before = len(producer.acks)
            result = group.round(action, producer, rng)
            if action in FAILOVER_ACTIONS:
                assert result.master_after != result.master_before, result
            assert len(producer.acks) > acks_before, f"no SEND_OK during or after {result}"
    finally:
        producer.stop()
    summary = group.verify(producer)
    unavailable = sorted(r.unavailable_s for r in group.rounds if r.action in FAILOVER_ACTIONS)
    print(f"nemesis: {summary}; write unavailability per failover (s): {[round(u, 2) for u in unavailable]}")
    assert summary["lost"] == 0 and summary["send_ok"] > 0
    assert all(u >= 0 for u in unavailable)
