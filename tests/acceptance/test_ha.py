"""HA acceptance: real ``ferry namesrv`` / ``ferry broker -c`` processes (master + slave), SIGKILL.

(a) 10,000 messages: master and slave commit logs byte-identical, every message pullable from the slave
(b) SYNC_MASTER zero loss: master SIGKILLed at a random moment, every SEND_OK message is on the slave
(c) slave SIGKILLed: SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT within bounds; slave back: SEND_OK again
(e) slave restarted mid-stream: no gap, no duplicate, identical logs
(g) a topic and a consumer offset created on the master appear on the slave within one sync period
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from ha_support import (
    HAPair,
    commit_log_bytes,
    create_routed_topic,
    first_segment_offset,
    pull_queue,
    queue_max_offsets,
    runtime_info,
    send_messages,
    slave_knows_topic,
    start_ha_pair,
    wait_caught_up,
)
from procs import query_consumer_offset, request, wait_for

from ferrymq.client import Producer, SendStatus, new_message
from ferrymq.remoting.codes import RequestCode, ResponseCode

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(300)]

QUEUES = 4
#: SYNC_MASTER replica wait (slaveTimeout, 3 s) + network/scheduling slack
REPLICA_WAIT_BOUND_S = 3.0 + 4.0
#: SlaveSynchronize period (10 s) + its first delay/slack
SLAVE_SYNC_BOUND_S = 10.0 + 10.0
#: slave catch-up with the master's commit log
CATCH_UP_TIMEOUT_S = 60.0


def _topic(pair: HAPair, name: str, *, on_slave: bool = True) -> str:
    """Create ``name`` on the master; wait for its route and (``on_slave``) for SlaveSynchronize to copy it
    (a slave serves pulls only for topics it knows)."""
    create_routed_topic(pair.ns_addr, pair.master, name, queues=QUEUES, timeout_s=45, alive=pair.alive)
    if on_slave:
        wait_for(
            lambda: slave_knows_topic(pair.slave.addr, name),
            timeout_s=SLAVE_SYNC_BOUND_S,
            what=f"topic {name} on the slave",
            alive=pair.alive,
        )
    return name


def _send_many(ns: str, topic: str, start: int, n: int) -> list[Any]:
    messages = [new_message(topic, f"m-{i:07d}", keys=f"k{i}") for i in range(start, start + n)]
    return send_messages(ns, "ha-acceptance-producer", messages)


def _bodies_on(addr: str, topic: str) -> list[bytes]:
    bodies: list[bytes] = []
    for q, hi in enumerate(queue_max_offsets(addr, topic, QUEUES)):
        bodies.extend(m.body for m in pull_queue(addr, topic, q, 0, hi))
    return bodies


def _assert_logs_identical(pair: HAPair, end: int) -> None:
    start = first_segment_offset(pair.slave.store_dir)
    assert start == 0
    master = commit_log_bytes(pair.master.store_dir, end)
    slave = commit_log_bytes(pair.slave.store_dir, end)
    assert len(master) == end
    assert slave == master


def _wait_slave_dispatched(pair: HAPair) -> None:
    wait_for(
        lambda: runtime_info(pair.slave.addr).get("dispatchBehindBytes") == "0",
        timeout_s=30,
        what="slave reput to finish",
    )


def test_a_10k_messages_identical_logs_and_pullable_from_slave(procs: Any) -> None:
    pair = start_ha_pair(procs, role="SYNC_MASTER")
    topic = _topic(pair, "HaTopicA")
    n = 10_000
    results = _send_many(pair.ns_addr, topic, 0, n)
    assert all(r.status is SendStatus.SEND_OK for r in results), {r.status for r in results}
    end = wait_caught_up(pair, timeout_s=CATCH_UP_TIMEOUT_S)
    assert end > 1024 * 1024  # crosses a 1 MiB segment boundary
    _wait_slave_dispatched(pair)
    _assert_logs_identical(pair, end)
    bodies = _bodies_on(pair.slave.addr, topic)
    assert len(bodies) == n
    assert sorted(bodies) == sorted(f"m-{i:07d}".encode() for i in range(n))
    # the CLI sees the group with its slave and no lag
    cp = subprocess.run(
        [sys.executable, "-m", "ferrymq.cli", "ha", "status", "-n", pair.ns_addr, "--json"],
        capture_output=True,
        timeout=60,
    )
    assert cp.returncode == 0, cp.stderr.decode()
    (group,) = [g for g in json.loads(cp.stdout) if g["brokerName"] == pair.master.broker_name]
    assert group["master"]["addr"] == pair.master.addr
    assert group["master"]["haSlaveCount"] == 1
    assert [s["lagBytes"] for s in group["slaves"]] == [0]


class _Loop:
    """A producer sending sequentially numbered messages in a background thread until stopped."""

    def __init__(self, ns: str, topic: str, concurrency: int = 8) -> None:
        self.ns = ns
        self.topic = topic
        self.concurrency = concurrency
        self.ok: list[bytes] = []
        self.statuses: list[tuple[float, SendStatus | str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.counter = 0

    def start(self) -> _Loop:
        self.thread.start()
        return self

    async def _run(self) -> None:
        async with Producer(
            self.ns, "ha-loop-producer", send_timeout_ms=5000, retry_times_when_send_failed=0
        ) as producer:

            async def worker() -> None:
                while not self.stop.is_set():
                    self.counter += 1
                    body = f"z-{self.counter:08d}".encode()
                    try:
                        r = await producer.send(new_message(self.topic, body))
                    except Exception as exc:
                        self.statuses.append((time.monotonic(), type(exc).__name__))
                        await asyncio.sleep(0.05)
                        continue
                    self.statuses.append((time.monotonic(), r.status))
                    if r.status is SendStatus.SEND_OK:
                        self.ok.append(body)

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


def zero_loss_trial(procs: Any, seed: int) -> tuple[int, int]:
    """One trial of (b): returns (SEND_OK count, SEND_OK messages missing on the slave)."""
    rng = random.Random(seed)
    pair = start_ha_pair(procs, role="SYNC_MASTER")
    topic = _topic(pair, "HaZeroLoss")
    loop = _Loop(pair.ns_addr, topic).start()
    try:
        wait_for(lambda: len(loop.ok) >= 50, timeout_s=60, what="first SEND_OKs", alive=pair.alive)
        time.sleep(rng.uniform(0.0, 1.5))  # the random moment of the crash (not a wait on a condition)
        pair.master.kill()
        wait_for(lambda: not loop.thread.is_alive() or len(loop.statuses) > 0, timeout_s=5, what="producer")
    finally:
        loop.halt()
    ok = set(loop.ok)
    _wait_slave_dispatched(pair)
    on_slave = set(_bodies_on(pair.slave.addr, topic))
    return len(ok), len(ok - on_slave)


@pytest.mark.parametrize("seed", [0, 1])
def test_b_sync_master_zero_loss_on_master_sigkill(procs: Any, seed: int) -> None:
    sent, lost = zero_loss_trial(procs, seed)
    assert sent >= 50
    assert lost == 0, f"trial {seed}: {lost} of {sent} SEND_OK messages missing on the slave"


def test_c_slave_killed_then_back(procs: Any) -> None:
    pair = start_ha_pair(procs, role="SYNC_MASTER")
    topic = _topic(pair, "HaTopicC", on_slave=False)
    assert all(r.status is SendStatus.SEND_OK for r in _send_many(pair.ns_addr, topic, 0, 20))
    pair.slave.kill()

    async def send_one(i: int) -> tuple[SendStatus, float]:
        async with Producer(
            pair.ns_addr, "ha-c-producer", retry_times_when_send_failed=0, send_timeout_ms=10_000
        ) as p:
            t0 = time.monotonic()
            r = await p.send(new_message(topic, f"c-{i}"))
            return r.status, time.monotonic() - t0

    statuses = [asyncio.run(send_one(i)) for i in range(3)]
    for status, took_s in statuses:
        assert status in (SendStatus.SLAVE_NOT_AVAILABLE, SendStatus.FLUSH_SLAVE_TIMEOUT), status
        assert took_s < REPLICA_WAIT_BOUND_S
    pair.slave.start()

    def send_ok() -> bool:
        status, _ = asyncio.run(send_one(99))
        return status is SendStatus.SEND_OK

    wait_for(send_ok, timeout_s=60, what="SEND_OK after the slave returned", alive=pair.alive)
    end = wait_caught_up(pair, timeout_s=CATCH_UP_TIMEOUT_S)
    _assert_logs_identical(pair, end)


def test_e_slave_restarted_mid_stream(procs: Any) -> None:
    pair = start_ha_pair(procs, role="ASYNC_MASTER")
    topic = _topic(pair, "HaTopicE")
    loop = _Loop(pair.ns_addr, topic).start()
    try:
        wait_for(lambda: len(loop.ok) >= 300, timeout_s=60, what="traffic", alive=pair.alive)
        pair.slave.kill()
        n_at_kill = len(loop.ok)
        wait_for(
            lambda: len(loop.ok) >= n_at_kill + 300, timeout_s=60, what="traffic while the slave is down"
        )
        pair.slave.start()
        n_at_start = len(loop.ok)
        wait_for(lambda: len(loop.ok) >= n_at_start + 300, timeout_s=60, what="traffic after restart")
    finally:
        loop.halt()
    end = wait_caught_up(pair, timeout_s=CATCH_UP_TIMEOUT_S)
    _wait_slave_dispatched(pair)
    _assert_logs_identical(pair, end)
    master_max = queue_max_offsets(pair.master.addr, topic, QUEUES)
    assert queue_max_offsets(pair.slave.addr, topic, QUEUES) == master_max
    for q, hi in enumerate(master_max):
        offsets = [m.queue_offset for m in pull_queue(pair.slave.addr, topic, q, 0, hi)]
        assert offsets == list(range(hi)), f"queue {q}: gap or duplicate"
    bodies = _bodies_on(pair.slave.addr, topic)
    assert len(bodies) == len(set(bodies))
    assert set(loop.ok) <= set(bodies)


def test_g_metadata_reaches_the_slave_within_one_sync_period(procs: Any) -> None:
    pair = start_ha_pair(procs, role="ASYNC_MASTER")
    topic = _topic(pair, "HaTopicG", on_slave=False)
    resp = request(
        pair.master.addr,
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "ha-g-group", "topic": topic, "queueId": 2, "commitOffset": 77},
    )
    assert resp.code == ResponseCode.SUCCESS
    t0 = time.monotonic()
    wait_for(
        lambda: slave_knows_topic(pair.slave.addr, topic),
        timeout_s=SLAVE_SYNC_BOUND_S,
        what="topic on the slave",
        alive=pair.alive,
    )
    wait_for(
        lambda: query_consumer_offset(pair.slave.addr, "ha-g-group", topic, 2) == 77,
        timeout_s=max(1.0, SLAVE_SYNC_BOUND_S - (time.monotonic() - t0)),
        what="offset on the slave",
        alive=pair.alive,
    )


#: a metadata change on the master is on the slave within this (the slave polls every 500 ms)
METADATA_BOUND_S = 1.0
#: a consumer offset committed on the master is on the slave within this (copied every second)
OFFSET_BOUND_S = 1.5


def _slave_knows_group(slave_addr: str, group: str) -> bool:
    resp = request(slave_addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    return group in (json.loads(resp.body or b"{}").get("subscriptionGroupTable") or {})


def test_h_metadata_within_a_second_and_slave_offsets_survive_the_masters_return(procs: Any) -> None:
    """Five rounds: a topic, a subscription group and a consumer offset changed on the master reach the slave
    within a second (not one slaveSyncInterval later). Then the master is SIGKILLed, a consumer commits a
    larger offset on the slave, the master comes back: it takes the slave's offset (the consumer is not
    rewound) and the slave keeps it."""
    from procs import create_topic

    pair = start_ha_pair(procs, role="ASYNC_MASTER", slaveSyncInterval=60_000)
    wait_for(lambda: slave_knows_topic(pair.slave.addr, "TBW102"), timeout_s=10, what="slave up")
    for i in range(5):
        topic, group = f"HaMetaH{i}", f"ha-meta-group-{i}"
        assert create_topic(pair.master.addr, topic, queues=2).code == ResponseCode.SUCCESS
        t0 = time.monotonic()
        wait_for(lambda topic=topic: slave_knows_topic(pair.slave.addr, topic), timeout_s=METADATA_BOUND_S,
                 interval_s=0.05, what=f"topic {topic} on the slave within {METADATA_BOUND_S} s", alive=pair.alive)
        took_topic = time.monotonic() - t0
        resp = request(pair.master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                       body=json.dumps({"groupName": group, "retryMaxTimes": 3}).encode())
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        wait_for(lambda group=group: _slave_knows_group(pair.slave.addr, group), timeout_s=METADATA_BOUND_S,
                 interval_s=0.05, what=f"group {group} on the slave", alive=pair.alive)
        resp = request(pair.master.addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                       {"consumerGroup": group, "topic": topic, "queueId": 1, "commitOffset": 40 + i})
        assert resp.code == ResponseCode.SUCCESS
        wait_for(lambda group=group, topic=topic, i=i: query_consumer_offset(pair.slave.addr, group, topic, 1)
                 == 40 + i, timeout_s=OFFSET_BOUND_S, interval_s=0.05, what="offset on the slave", alive=pair.alive)
        print(f"(h) round {i}: topic on the slave after {took_topic * 1000:.0f} ms")

    topic, group = "HaMetaH0", "ha-meta-group-0"
    pair.master.kill()
    resp = request(pair.slave.addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                   {"consumerGroup": group, "topic": topic, "queueId": 1, "commitOffset": 500})
    assert resp.code == ResponseCode.SUCCESS
    pair.master.start()
    wait_for(lambda: query_consumer_offset(pair.master.addr, group, topic, 1) == 500, timeout_s=10,
             what="the slave's offset on the returned master", alive=pair.alive)
    wait_for(lambda: query_consumer_offset(pair.slave.addr, group, topic, 1) == 500, timeout_s=5,
             what="the slave keeps its offset", alive=pair.alive)


def test_i_impostor_on_the_ha_port_never_turns_slave_not_available_into_send_ok(procs: Any) -> None:
    """A SYNC_MASTER with haSecret and no real slave: a peer that connects to its HA port and acknowledges
    every transfer it gets (as a plain RocketMQ slave would) leaves every send SLAVE_NOT_AVAILABLE; a slave
    with the secret then joins and sends are SEND_OK. Ten impostor connections for the whole send loop."""
    import socket
    import struct

    from ha_support import raw_send
    from procs import LOOPBACK, start_broker, start_namesrv

    secret = "group-secret-i"
    ns = start_namesrv(procs)
    master = start_broker(procs, [ns.addr], name="master", brokerRole="SYNC_MASTER", haSecret=secret,
                          syncFlushTimeout=1000)
    stop = threading.Event()

    def recv_exactly(s: socket.socket, n: int) -> bytes:
        out = b""
        while len(out) < n and not stop.is_set():
            try:
                chunk = s.recv(n - len(out))
            except TimeoutError:
                continue
            if not chunk:
                raise OSError("closed")
            out += chunk
        return out

    def impostor() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection((LOOPBACK, master.port + 1), timeout=2) as s:
                    s.settimeout(0.2)
                    s.sendall(struct.pack(">q", 0))  # a fresh slave's first report
                    while not stop.is_set():
                        head = recv_exactly(s, 12)
                        if len(head) < 12:
                            break
                        phy, size = struct.unpack(">qi", head)
                        recv_exactly(s, size)
                        s.sendall(struct.pack(">q", phy + size))  # "acknowledged"
            except OSError:
                stop.wait(0.05)

    threads = [threading.Thread(target=impostor) for _ in range(10)]
    for t in threads:
        t.start()
    try:
        codes = [raw_send(master.addr, "HaAuthI", 0, b"x")[0] for _ in range(20)]
        assert set(codes) == {ResponseCode.SLAVE_NOT_AVAILABLE}, codes
    finally:
        stop.set()
        for t in threads:
            t.join()
    start_broker(procs, [ns.addr], name="slave", brokerId=1, brokerRole="SLAVE", haSecret=secret,
                 haMasterAddress=f"{LOOPBACK}:{master.port + 1}")
    wait_for(lambda: raw_send(master.addr, "HaAuthI", 0, b"y")[0] == ResponseCode.SUCCESS, timeout_s=30,
             what="SEND_OK once the slave with the secret is connected")
