"""Timer messages across a controller-mode failover, real processes: a name server, a controller and two
replicas of one broker group (SYNC). Timer messages are sent to the master, some due before the fault (delivered
there), the rest after it, one of these recalled; the master is SIGKILLed; the controller elects the slave, which
rebuilds the pending set from the timer checkpoint it copied and delivers every pending message: none lost, the
recalled one never, and the ones delivered before the fault not again (duplicates counted: the slave had copied
the checkpoint past them)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from controller_support import BROKER_NAME, group_state, start_controller, start_replica
from procs import ProcessGroup, json_body, request, start_namesrv, wait_for

from ferrymq.common.message_codec import iter_records
from ferrymq.remoting import jsonx
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from support.wire import pull, send_v1

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]

TOPIC = "TimerFailover"
#: messages due before the fault, and after it (sent together; the late ones are due LATE_MS after the send)
EARLY = 4
LATE = 12
EARLY_MS = 500
LATE_MS = 9_000
#: the checkpoint is saved (and copied by the slave) this often here
PERSIST_MS = 300
#: a message due after the election is delivered at most this late (a loaded machine's timer lateness)
ON_TIME_MS = 1_500


def _send_timer(addr: str, uniq: str, deliver_ms: int) -> dict[str, str]:
    props = f"UNIQ_KEY\x01{uniq}\x02TIMER_DELIVER_MS\x01{deliver_ms}\x02"
    resp = request(addr, int(RequestCode.SEND_MESSAGE), send_v1(TOPIC, 0, props), uniq.encode())
    assert resp.code == R.SUCCESS, (resp.code, resp.remark)
    return resp.ext_fields


def _delivered(addr: str) -> list[Any]:
    resp = request(addr, int(RequestCode.PULL_MESSAGE), pull(TOPIC, offset=0, sys_flag=4, suspend_ms=0,
                                                             max_msgs=64))
    return list(iter_records(resp.body)) if resp.code == R.SUCCESS else []


def _checkpoint_offset(addr: str) -> int:
    resp = request(addr, int(RequestCode.GET_TIMER_CHECK_POINT))
    return int(jsonx.loads(resp.body)["queueOffset"]) if resp.code == R.SUCCESS and resp.body else -1


def test_the_elected_slave_delivers_every_pending_timer_message_and_keeps_a_recall(procs: ProcessGroup) -> None:
    ns = start_namesrv(procs)
    controller = start_controller(procs)
    props = {"flushDelayOffsetInterval": PERSIST_MS, "slaveSyncInterval": PERSIST_MS}
    replicas = {rid: start_replica(procs, ns, [controller], rid, **props) for rid in (1, 2)}

    def routed_master() -> int | None:
        st = group_state([controller])
        if not st or int(st.get("masterId", -1)) < 0 or len(st.get("syncStateSet") or ()) != 2:
            return None
        master_id = int(st["masterId"])
        resp = request(ns.addr, RequestCode.GET_BROKER_CLUSTER_INFO)
        entry = ((json_body(resp) or {}).get("brokerAddrTable") or {}).get(BROKER_NAME) or {}
        addrs = {str(k): v for k, v in (entry.get("brokerAddrs") or {}).items()}
        return master_id if addrs.get("0") == replicas[master_id].addr else None

    alive = [p for p in (ns.proc, controller.proc) if p is not None]
    old_id = wait_for(routed_master, timeout_s=60, what="a master with both replicas in sync", alive=alive)
    old, new = replicas[old_id], replicas[3 - old_id]
    assert request(old.addr, int(RequestCode.SEND_MESSAGE), send_v1(TOPIC), b"plain").code == R.SUCCESS

    now_ms = int(time.time() * 1000)
    for i in range(EARLY):
        _send_timer(old.addr, f"early-{i}", now_ms + EARLY_MS)
    late_ms = now_ms + LATE_MS
    handles = [_send_timer(old.addr, f"late-{i}", late_ms + 100 * i)["recallHandle"] for i in range(LATE)]
    got = request(old.addr, int(RequestCode.RECALL_MESSAGE),
                  {"producerGroup": "pg", "topic": TOPIC, "recallHandle": handles[3]})
    assert got.code == R.SUCCESS, got.remark
    wait_for(lambda: len(_delivered(old.addr)) >= 1 + EARLY, timeout_s=15, what="the early messages delivered",
             alive=alive)
    # the slave copied a checkpoint past the early ones (units 0..EARLY-1): they are not delivered again
    wait_for(lambda: _checkpoint_offset(new.addr) >= EARLY, timeout_s=15, what="the slave's copy of the checkpoint",
             alive=alive)
    assert time.time() * 1000 < late_ms - 1_000, "too slow: the late messages were due before the fault"

    old.kill()
    elected_at_ms = wait_for(lambda: int(time.time() * 1000) if (group_state([controller]) or {}).get("masterId")
                             == 3 - old_id else None, timeout_s=30, what="the slave elected", alive=alive)

    def all_late() -> list[Any] | None:
        msgs = _delivered(new.addr)
        keys = {m.properties.get("UNIQ_KEY") for m in msgs}
        return msgs if all(f"late-{i}" in keys for i in range(LATE) if i != 3) else None

    msgs = wait_for(all_late, timeout_s=30, interval_s=0.05, what="every pending message on the new master",
                    alive=alive)
    counts = Counter(m.properties.get("UNIQ_KEY") for m in msgs if m.body != b"plain")
    duplicates = sum(n - 1 for n in counts.values())
    print(f"elected {elected_at_ms - now_ms} ms after the send; delivered {dict(counts)}; duplicates {duplicates}")
    assert "late-3" not in counts, "a recall made before the failover was lost"
    assert set(counts) == {f"early-{i}" for i in range(EARLY)} | {f"late-{i}" for i in range(LATE) if i != 3}
    assert duplicates == 0, counts
    for m in msgs:
        key = m.properties.get("UNIQ_KEY", "")
        if key.startswith("late-"):
            due_ms = late_ms + 100 * int(key.split("-")[1])
            assert m.store_timestamp >= due_ms, f"{key} delivered {due_ms - m.store_timestamp} ms early"
            assert m.store_timestamp - max(due_ms, elected_at_ms) < ON_TIME_MS, (key, m.store_timestamp - due_ms)
    # a recall after the failover is answered by the new master: the message is no longer pending there
    again = request(new.addr, int(RequestCode.RECALL_MESSAGE),
                    {"producerGroup": "pg", "topic": TOPIC, "recallHandle": handles[3]})
    assert again.code in (R.QUERY_NOT_FOUND, R.ILLEGAL_OPERATION), (again.code, again.remark)
