"""HA failover proofs with real processes (namesrv + SYNC_MASTER + SLAVE, ``ferry broker -c``), SIGKILL.

(d) master SIGKILLed mid-consumption: the Apache C++ PushConsumer (PyPI rocketmq 0.4.4, subprocess) and
    ferrymq's PushConsumer go on consuming the rest of the backlog from the slave and commit their offsets
    there (protocol §6.10: pulls and offsets go to the lowest id left in the route); every message is
    consumed at least once.
(c) slave SIGKILLed: the SYNC_MASTER answers SLAVE_NOT_AVAILABLE (11) or FLUSH_SLAVE_TIMEOUT (12) within
    slaveTimeout (= syncFlushTimeout here) + margin, and SLAVE_NOT_AVAILABLE at once after it dropped the HA
    connection (§6.5); the slave restarted on the same data dir catches up and sends are SEND_OK again.

Why (d) proves pulls from the slave: at the kill part of the backlog was never pulled from the master by either
consumer. For ferrymq: it holds at most ``pull_threshold_for_queue`` + one batch per queue, and had consumed few.
For C++: the master's ``getMessageTransferedMsgCount`` (messages served by pulls, both groups) read just before
the kill, minus what ferrymq had consumed, bounds what C++ got from the master; it is below the backlog. Receiving
every message afterwards therefore means pulling from the slave.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from ha_support import (
    HA_HOUSEKEEPING_INTERVAL_MS,
    SYNC_FLUSH_TIMEOUT_MS,
    PyPushConsumer,
    all_consumer_offsets,
    commit_log_max,
    consumer_offsets,
    ha_slave_count,
    pull_queue,
    queue_max_offsets,
    raw_send,
    route_broker_ids,
    runtime_info,
    send_backlog,
    spawn_cpp_consumer,
    start_failover_pair,
    wait_caught_up,
)
from procs import ProcessGroup, route, wait_for

from ferrymq.client import SendStatus
from ferrymq.remoting.codes import ResponseCode
from support.jsonl import read_jsonl

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(170)]

# ---- (d) ------------------------------------------------------------------------------------------
QUEUES_D = 2
TOTAL = 4000
#: pulls that may complete between reading the master's served-message counter and the kill:
#: one 32-message batch per queue per consumer
INFLIGHT_PULL_SLACK = 2 * QUEUES_D * 32
PY_PULL_THRESHOLD = 100
PY_PULL_BATCH = 32
#: both consumers must have consumed this many before the master is killed ("mid-consumption")
KILL_AFTER = 50
#: C++ refreshes routes every 30 s, then drains its cache and pulls the rest (5 ms per message, 2 threads)
CPP_FAILOVER_DEADLINE_S = 90.0
PY_FAILOVER_DEADLINE_S = 60.0
#: both clients persist offsets every 5 s (C++ also on shutdown)
OFFSET_COMMIT_DEADLINE_S = 20.0
NAMESRV_DROP_DEADLINE_S = 10.0

# ---- (c) ------------------------------------------------------------------------------------------
QUEUES_C = 4
#: scheduling/network slack on top of the documented waits
MARGIN_S = 2.0
#: "at once": no replica wait at all
IMMEDIATE_S = 1.0
RESTART_CATCH_UP_S = 45.0


def _cpp_summary(log_text: str) -> dict[str, Any] | None:
    for line in reversed(log_text.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"met"' in line:
            try:
                return dict(json.loads(line))
            except json.JSONDecodeError:
                return None
    return None


def _start_py_consumer(ns_addr: str, group: str, topic: str, **options: Any) -> PyPushConsumer:
    """ferrymq's PushConsumer with the pull limits the (d) proofs count on, consuming 10 ms per message."""
    return PyPushConsumer(
        ns_addr,
        group,
        topic,
        consume_delay_s=0.01,
        options={
            "pull_threshold_for_queue": PY_PULL_THRESHOLD,
            "pull_batch_size": PY_PULL_BATCH,
            "consume_concurrency": 2,
            **options,
        },
    ).start()


def _largest_gap_after(times: list[float], t0: float) -> float:
    """Longest stretch without a delivery from ``t0`` on (``t0`` counts as a delivery)."""
    ts = sorted([t0, *(t for t in times if t >= t0)])
    return max((b - a for a, b in zip(ts, ts[1:], strict=False)), default=0.0)


def test_d_master_killed_mid_consumption_consumers_continue_on_slave(
    procs: ProcessGroup, tmp_path: Path
) -> None:
    topic = "FailoverTopicD"
    cpp_group, py_group = "failover_cpp_group", "failover_py_group"
    pair = start_failover_pair(procs, topic, queues=QUEUES_D)
    results = send_backlog(pair.ns_addr, topic, TOTAL, prefix="fo")
    assert all(r.status is SendStatus.SEND_OK for r in results), {r.status for r in results}
    wait_caught_up(pair)
    master_max = queue_max_offsets(pair.master.addr, topic, QUEUES_D)
    assert sum(master_max) == TOTAL
    slave_max = wait_for(
        lambda: (
            (q := queue_max_offsets(pair.slave.addr, topic, QUEUES_D)) == master_max
            and q
        ),
        timeout_s=30,
        what="the slave's consume queues to match the master's",
        alive=pair.alive,
    )

    cpp_out = tmp_path / "cpp-deliveries.jsonl"
    cpp = spawn_cpp_consumer(
        procs,
        tmp_path,
        name="cpp-consumer",
        args={
            "namesrv": pair.ns_addr,
            "group": cpp_group,
            "topic": topic,
            "out": str(cpp_out),
            "expect_seqs": list(range(TOTAL)),
            "timeout_s": CPP_FAILOVER_DEADLINE_S + 30,
            "thread_count": 2,
            "delay_ms": 5,
        },
    )
    py = _start_py_consumer(pair.ns_addr, py_group, topic, persist_offset_interval_ms=1000)
    try:

        def cpp_seqs() -> set[int]:
            return {int(r["seq"]) for r in read_jsonl(cpp_out)}

        def py_seqs() -> set[int]:
            return {int(b.decode().rsplit("-", 1)[1]) for b in list(py.bodies)}

        wait_for(
            lambda: py.error is None and len(cpp_seqs()) >= KILL_AFTER and len(py_seqs()) >= KILL_AFTER,
            timeout_s=60,
            interval_s=0.1,
            what="both consumers to be under way",
            alive=[*pair.alive, cpp],
        )
        py_before = len(py_seqs())
        served_by_master = int(runtime_info(pair.master.addr)["getMessageTransferedMsgCount"])
        pair.master.kill()
        t_kill, kill_wall = time.monotonic(), time.time()
        cpp_at_kill, py_at_kill = len(cpp_seqs()), len(py_seqs())
        # enough left unpulled at the kill that the rest can only come from the slave:
        # ferrymq by its own pull threshold; C++ measured on the master (all pulls served to both groups, minus
        # what ferrymq consumed at least, plus pulls that may have completed between the reading and the kill)
        assert py_at_kill < TOTAL - QUEUES_D * (PY_PULL_THRESHOLD + PY_PULL_BATCH), py_at_kill
        cpp_pulled_from_master_max = served_by_master + INFLIGHT_PULL_SLACK - py_before
        assert cpp_pulled_from_master_max < TOTAL, (served_by_master, py_before)

        # the namesrv drops the dead master at once: the route lists only the slave
        wait_for(
            lambda: route_broker_ids(pair.ns_addr, topic) == {1: pair.slave.addr},
            timeout_s=NAMESRV_DROP_DEADLINE_S,
            what="route with only the slave",
            alive=[pair.namesrv.proc],
        )

        # ferrymq PushConsumer: everything, then its offsets land on the slave
        wait_for(
            lambda: py.error is None and len(py_seqs()) == TOTAL,
            timeout_s=PY_FAILOVER_DEADLINE_S,
            interval_s=0.1,
            what=f"ferrymq PushConsumer to consume all {TOTAL} (had {py_at_kill} at the kill)",
            alive=pair.alive,
        )
        py_done_s = time.monotonic() - t_kill
        wait_for(
            lambda: consumer_offsets(pair.slave.addr, py_group, topic, QUEUES_D) == slave_max,
            timeout_s=OFFSET_COMMIT_DEADLINE_S,
            what=f"{py_group} offsets {slave_max} on the slave",
        )

        # C++ PushConsumer: everything (after its 30 s route refresh), then offsets on the slave
        wait_for(
            lambda: len(cpp_seqs()) == TOTAL,
            timeout_s=max(5.0, CPP_FAILOVER_DEADLINE_S - py_done_s),
            interval_s=0.2,
            what=f"C++ PushConsumer to consume all {TOTAL} (had {cpp_at_kill} at the kill)",
            alive=pair.alive,
        )
        cpp_done_s = time.monotonic() - t_kill
        wait_for(lambda: cpp.exited, timeout_s=30, what="the C++ consumer script to shut down")
        summary = _cpp_summary(cpp.log_text())
        assert summary is not None and summary["met"] and summary["missing_count"] == 0, summary
        wait_for(
            lambda: consumer_offsets(pair.slave.addr, cpp_group, topic, QUEUES_D) == slave_max,
            timeout_s=OFFSET_COMMIT_DEADLINE_S,
            what=f"{cpp_group} offsets {slave_max} on the slave",
        )
        table = all_consumer_offsets(pair.slave.addr)
        for group in (py_group, cpp_group):
            got = {int(k): int(v) for k, v in (table.get(f"{topic}@{group}") or {}).items()}
            assert got == dict(enumerate(slave_max)), (group, got)
        py_gap_s = _largest_gap_after(py.times, t_kill)
        cpp_gap_s = _largest_gap_after(
            [t_kill + (r["recv_ms"] / 1000 - kill_wall) for r in read_jsonl(cpp_out)], t_kill
        )
        print(f"\n(d) largest delivery gap after the kill: ferrymq {py_gap_s:.1f} s, C++ {cpp_gap_s:.1f} s")
        print(
            f"(d) consumed at kill: C++ {cpp_at_kill}, ferrymq {py_at_kill}; all {TOTAL} consumed "
            f"{py_done_s:.1f} s (ferrymq) / {cpp_done_s:.1f} s (C++) after the kill"
        )
    finally:
        py.stop()
    assert py.error is None, py.error


def test_c_slave_killed_then_back(procs: ProcessGroup) -> None:
    topic = "FailoverTopicC"
    pair = start_failover_pair(procs, topic, queues=QUEUES_C)
    code, _, resp = raw_send(pair.master.addr, topic, 0, b"c-before")
    assert code == ResponseCode.SUCCESS, (code, resp.remark)
    wait_caught_up(pair)

    pair.slave.kill()
    # first send after the kill: 11 if the master already saw the connection drop, else 12 after slaveTimeout
    code, took_s, resp = raw_send(pair.master.addr, topic, 1, b"c-first-after-kill")
    assert code in (ResponseCode.SLAVE_NOT_AVAILABLE, ResponseCode.FLUSH_SLAVE_TIMEOUT), (code, resp.remark)
    assert took_s <= SYNC_FLUSH_TIMEOUT_MS / 1000 + MARGIN_S, took_s
    # the message is stored anyway: the success-like answer carries the SEND header fields
    assert {"msgId", "queueId", "queueOffset"} <= set(resp.ext_fields), resp.ext_fields

    # the master drops the HA link (EOF at once; housekeeping at the latest)
    wait_for(
        lambda: ha_slave_count(pair.master.addr) == 0,
        timeout_s=HA_HOUSEKEEPING_INTERVAL_MS / 1000 + MARGIN_S,
        what="the master to drop the dead slave's HA connection",
        alive=pair.alive,
    )
    for i in range(3):
        code, took_s, resp = raw_send(pair.master.addr, topic, i % QUEUES_C, f"c-down-{i}".encode())
        assert code == ResponseCode.SLAVE_NOT_AVAILABLE, (code, resp.remark)
        assert took_s < IMMEDIATE_S, took_s
        assert {"msgId", "queueId", "queueOffset"} <= set(resp.ext_fields), resp.ext_fields
    master_max_down = commit_log_max(pair.master.addr)

    # the slave comes back on the same data dir and fetches what it missed
    pair.slave.start()
    end = wait_caught_up(pair, timeout_s=RESTART_CATCH_UP_S)
    assert end >= master_max_down

    after_restart: list[int] = []

    def send_ok() -> bool:
        code, _, _ = raw_send(pair.master.addr, topic, 0, b"c-after-restart")
        after_restart.append(code)  # stored whatever the answer (11/12 are success-like)
        return code == ResponseCode.SUCCESS

    wait_for(
        send_ok,
        timeout_s=RESTART_CATCH_UP_S,
        interval_s=0.2,
        what="SEND_OK after the slave returned",
        alive=pair.alive,
    )
    wait_caught_up(pair)
    master_max = queue_max_offsets(pair.master.addr, topic, QUEUES_C)
    assert sum(master_max) == 1 + 1 + 3 + len(
        after_restart
    )  # before, first after the kill, while down, after
    assert set(after_restart[:-1]) <= {ResponseCode.SLAVE_NOT_AVAILABLE, ResponseCode.FLUSH_SLAVE_TIMEOUT}
    wait_for(
        lambda: queue_max_offsets(pair.slave.addr, topic, QUEUES_C) == master_max,
        timeout_s=30,
        what="the slave's consume queues to match the master's",
        alive=pair.alive,
    )


# ---- (d2) ------------------------------------------------------------------------------------------
TOTAL_D2 = 800
#: the name server is frozen this long around the master's death (scenario parameter, not a wait): the
#: client's immediate route refresh (triggered by the dropped connection) cannot see the master gone
NAMESRV_STALL_S = 5.0
#: ferrymq's client refreshes routes "at once after a connection drop"; a consumer should not need the
#: 30 s route poll to move to the slave once the name server knows the master is gone
PROMPT_FAILOVER_S = 10.0


def test_d2_ferrymq_consumer_fails_over_without_waiting_for_the_route_poll(procs: ProcessGroup) -> None:
    topic = "FailoverTopicD2"
    group = "failover_py_prompt_group"
    pair = start_failover_pair(procs, topic, queues=QUEUES_D)
    results = send_backlog(pair.ns_addr, topic, TOTAL_D2, prefix="fp")
    assert all(r.status is SendStatus.SEND_OK for r in results), {r.status for r in results}
    wait_caught_up(pair)
    py = _start_py_consumer(pair.ns_addr, group, topic)
    try:
        wait_for(
            lambda: py.error is None and len(py.bodies) >= KILL_AFTER,
            timeout_s=60,
            interval_s=0.05,
            what="the consumer to be under way",
            alive=pair.alive,
        )
        pair.namesrv.proc.signal(signal.SIGSTOP)
        try:
            pair.master.kill()
            t_kill = time.monotonic()
            at_kill = len(set(py.bodies))
            time.sleep(NAMESRV_STALL_S)
        finally:
            pair.namesrv.proc.signal(signal.SIGCONT)
        wait_for(
            lambda: route_broker_ids(pair.ns_addr, topic) == {1: pair.slave.addr},
            timeout_s=NAMESRV_DROP_DEADLINE_S,
            what="route with only the slave",
            alive=[pair.namesrv.proc],
        )
        t_route = time.monotonic()
        assert at_kill < TOTAL_D2 - QUEUES_D * (PY_PULL_THRESHOLD + PY_PULL_BATCH), at_kill
        wait_for(
            lambda: len(set(py.bodies)) == TOTAL_D2,
            timeout_s=PY_FAILOVER_DEADLINE_S,
            interval_s=0.1,
            what=f"ferrymq PushConsumer to consume all {TOTAL_D2}",
            alive=pair.alive,
        )
        resumed = [t for t in py.times if t >= t_route]
        first_after_route_s = (min(resumed) - t_route) if resumed else float("inf")
        gap_s = _largest_gap_after(py.times, t_kill)
        print(
            f"\n(d2) largest gap after the kill {gap_s:.1f} s; first delivery {first_after_route_s:.1f} s after "
            f"the route listed only the slave"
        )
        assert gap_s < NAMESRV_STALL_S + PROMPT_FAILOVER_S, (
            f"ferrymq PushConsumer stalled {gap_s:.1f} s after the master died (name server frozen "
            f"{NAMESRV_STALL_S:.0f} s): it kept pulling the dead master until its periodic route poll"
        )
    finally:
        py.stop()
    assert py.error is None, py.error


# ---- (h) a topic the slave has not synced yet ---------------------------------------------------------
TOTAL_H = 300
#: the slave's next SlaveSynchronize is this far away at the kill (slaveSyncInterval 10 s, synced before)
SLAVE_SYNC_INTERVAL_MS = 30_000


def test_h_topic_created_just_before_the_master_dies_is_readable_from_the_slave(
    procs: ProcessGroup, tmp_path: Path
) -> None:
    """A topic auto-created a moment before the master's SIGKILL (its config never synced to the slave) is
    served by the slave from the consume queues it built from the replicated log: the Apache C++ consumer
    and raw pulls read every acknowledged message (the slave used to answer TOPIC_NOT_EXIST)."""
    pair = start_failover_pair(procs, "FailoverWarmUpH", queues=1, slaveSyncInterval=SLAVE_SYNC_INTERVAL_MS)
    topic = f"FailoverFreshH{int(time.time() * 1000) % 100_000}"
    t_create = time.monotonic()
    results = send_backlog(pair.ns_addr, topic, TOTAL_H, prefix="h")
    assert all(r.status is SendStatus.SEND_OK for r in results), {r.status for r in results}
    pair.master.kill()
    assert time.monotonic() - t_create < SLAVE_SYNC_INTERVAL_MS / 1000, "the slave may have synced the topic"
    wait_for(
        lambda: route_broker_ids(pair.ns_addr, topic) == {1: pair.slave.addr},
        timeout_s=NAMESRV_DROP_DEADLINE_S,
        what="route with only the slave",
        alive=[pair.namesrv.proc],
    )
    routed = route(pair.ns_addr, topic)
    assert routed is not None
    queues = int(routed["queueDatas"][0]["readQueueNums"])
    seqs: set[int] = set()
    for queue_id, end in enumerate(queue_max_offsets(pair.slave.addr, topic, queues)):
        for msg in pull_queue(pair.slave.addr, topic, queue_id, 0, end):
            seqs.add(int(msg.body.decode().rsplit("-", 1)[1]))
    assert seqs == set(range(TOTAL_H))

    cpp_out = tmp_path / "cpp-h.jsonl"
    cpp = spawn_cpp_consumer(
        procs, tmp_path, name="cpp-consumer-h",
        args={"namesrv": pair.ns_addr, "group": "fresh_topic_cpp_group", "topic": topic, "out": str(cpp_out),
              "expect_seqs": list(range(TOTAL_H)), "timeout_s": CPP_FAILOVER_DEADLINE_S, "thread_count": 2},
    )
    wait_for(lambda: cpp.exited, timeout_s=CPP_FAILOVER_DEADLINE_S + 30, what="the C++ consumer to finish")
    summary = _cpp_summary(cpp.log_text())
    assert summary is not None and summary["met"] and summary["missing_count"] == 0, summary
    assert {int(r["seq"]) for r in read_jsonl(cpp_out)} == set(range(TOTAL_H))

