"""Helpers of test_ha_failover.py: a namesrv + SYNC_MASTER + SLAVE of real ``ferry`` processes with short HA
intervals, raw sends, consumer offsets, and consumers (C++ script subprocess, ferrymq PushConsumer thread).

Waits are condition polls with deadlines (procs.wait_for); every process goes through the test's
ProcessGroup, so it is stopped at teardown also on failure.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procs import (
    CPP_SCRIPTS_DIR,
    LOOPBACK,
    Broker,
    ManagedProcess,
    Namesrv,
    ProcessGroup,
    create_topic,
    json_body,
    request,
    start_broker,
    start_namesrv,
    wait_for,
    wait_route,
)

from ferrymq.remoting.codes import RequestCode, ResponseCode

#: HA timing shortened through broker.conf (keys of ferrymq.broker.config)
HA_HEARTBEAT_INTERVAL_MS = 1000
HA_HOUSEKEEPING_INTERVAL_MS = 5000
#: registerNameServerPeriod is clamped to >= 10 s by the broker
REGISTER_PERIOD_MS = 10_000
#: SYNC_MASTER replica wait (slaveTimeout defaults to syncFlushTimeout)
SYNC_FLUSH_TIMEOUT_MS = 3000
#: first SlaveSynchronize run is 3 s after the slave starts; its period is 10 s
SLAVE_SYNC_BOUND_S = 3.0 + 10.0 + 5.0
REPLICATION_TIMEOUT_S = 30.0

FAST_HA_PROPS: dict[str, Any] = {
    "haSendHeartbeatInterval": HA_HEARTBEAT_INTERVAL_MS,
    "haHousekeepingInterval": HA_HOUSEKEEPING_INTERVAL_MS,
    "registerNameServerPeriod": REGISTER_PERIOD_MS,
    "syncFlushTimeout": SYNC_FLUSH_TIMEOUT_MS,
}


@dataclass
class FailoverPair:
    group: ProcessGroup
    namesrv: Namesrv
    master: Broker
    slave: Broker
    topic: str
    queues: int

    @property
    def ns_addr(self) -> str:
        return self.namesrv.addr

    @property
    def alive(self) -> list[ManagedProcess]:
        out = [self.namesrv.proc]
        out += [b.proc for b in (self.master, self.slave) if b.proc is not None and not b.proc.exited]
        return out


def runtime_info(addr: str) -> dict[str, str]:
    resp = request(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
    if resp.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"GET_BROKER_RUNTIME_INFO on {addr} -> {resp.code} {resp.remark}")
    return {str(k): str(v) for k, v in ((json_body(resp) or {}).get("table") or {}).items()}


def commit_log_max(addr: str) -> int:
    return int(runtime_info(addr)["commitLogMaxOffset"])


def ha_slave_count(master_addr: str) -> int:
    return int(runtime_info(master_addr).get("haSlaveCount", "0") or 0)


def slave_knows_topic(slave_addr: str, topic: str) -> bool:
    resp = request(slave_addr, RequestCode.GET_ALL_TOPIC_CONFIG)
    return topic in ((json_body(resp) or {}).get("topicConfigTable") or {})


def wait_caught_up(pair: FailoverPair, *, timeout_s: float = REPLICATION_TIMEOUT_S) -> int:
    def same() -> tuple[int] | None:  # a tuple: offset 0 is a valid answer
        m = commit_log_max(pair.master.addr)
        return (m,) if m == commit_log_max(pair.slave.addr) else None

    return wait_for(
        same, timeout_s=timeout_s, what="slave commit log to reach the master's", alive=pair.alive
    )[0]


def start_failover_pair(procs: ProcessGroup, topic: str, *, queues: int = 4, **props: Any) -> FailoverPair:
    """namesrv, SYNC_MASTER, ``topic`` on the master (routed), then the SLAVE (id 1, haMasterAddress) started
    after the topic exists so its first SlaveSynchronize (3 s) copies it; returns once the slave knows the
    topic and has caught up."""
    merged = {**FAST_HA_PROPS, **props}
    ns = start_namesrv(procs)
    master = start_broker(procs, [ns.addr], name="master", brokerRole="SYNC_MASTER", **merged)
    create_topic(master.addr, topic, queues=queues)
    wait_route(ns.addr, topic, timeout_s=30, broker_name=master.broker_name, alive=[ns.proc, master.proc])
    slave = start_broker(
        procs,
        [ns.addr],
        name="slave",
        brokerId=1,
        brokerRole="SLAVE",
        haMasterAddress=f"{LOOPBACK}:{master.port + 1}",
        **merged,
    )
    pair = FailoverPair(procs, ns, master, slave, topic, queues)
    wait_for(
        lambda: slave_knows_topic(slave.addr, topic),
        timeout_s=SLAVE_SYNC_BOUND_S,
        what=f"topic {topic} on the slave",
        alive=pair.alive,
    )
    wait_for(
        lambda: ha_slave_count(master.addr) >= 1,
        timeout_s=REPLICATION_TIMEOUT_S,
        what="the slave's HA connection on the master",
        alive=pair.alive,
    )
    wait_caught_up(pair)
    return pair


def route_broker_ids(ns_addr: str, topic: str) -> dict[int, str]:
    resp = request(ns_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if resp.code != ResponseCode.SUCCESS:
        return {}
    out: dict[int, str] = {}
    for bd in (json_body(resp) or {}).get("brokerDatas") or []:
        for k, v in (bd.get("brokerAddrs") or {}).items():
            out[int(k)] = str(v)
    return out


def raw_send(
    broker_addr: str, topic: str, queue_id: int, body: bytes, *, timeout_ms: int = 15_000
) -> tuple[int, float, Any]:
    """One SEND_MESSAGE straight to a broker: (response code, seconds taken, response)."""
    t0 = time.monotonic()
    resp = request(
        broker_addr,
        RequestCode.SEND_MESSAGE,
        {
            "producerGroup": "failover-raw-producer",
            "topic": topic,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4,
            "queueId": queue_id,
            "sysFlag": 0,
            "bornTimestamp": int(time.time() * 1000),
            "flag": 0,
            "properties": "TAGS\x01raw\x02",
        },
        body,
        timeout_ms=timeout_ms,
    )
    return resp.code, time.monotonic() - t0, resp


def queue_offsets(addr: str, code: int, topic: str, queues: int) -> list[int]:
    out = []
    for q in range(queues):
        resp = request(addr, code, {"topic": topic, "queueId": q})
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"code {code} for {topic}/{q} on {addr} -> {resp.code} {resp.remark}")
        out.append(int(resp.ext_fields["offset"]))
    return out


def consumer_offsets(addr: str, group: str, topic: str, queues: int) -> list[int | None]:
    """QUERY_CONSUMER_OFFSET per queue on ``addr`` (None when the broker has none)."""
    out: list[int | None] = []
    for q in range(queues):
        resp = request(
            addr, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": q}
        )
        out.append(int(resp.ext_fields["offset"]) if resp.code == ResponseCode.SUCCESS else None)
    return out


def all_consumer_offsets(addr: str) -> dict[str, Any]:
    resp = request(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
    if resp.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"GET_ALL_CONSUMER_OFFSET on {addr} -> {resp.code} {resp.remark}")
    return dict((json_body(resp) or {}).get("offsetTable") or {})


async def _send_backlog(ns: str, topic: str, n: int, prefix: str, concurrency: int) -> list[Any]:
    from ferrymq.client import Producer, new_message

    sem = asyncio.Semaphore(concurrency)
    async with Producer(ns, "failover-backlog-producer") as producer:

        async def one(i: int) -> Any:
            async with sem:
                return await producer.send(
                    new_message(topic, f"{prefix}-{i:06d}", properties={"seq": str(i)})
                )

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def send_backlog(ns: str, topic: str, n: int, *, prefix: str, concurrency: int = 64) -> list[Any]:
    """``n`` messages (body ``<prefix>-<seq:06d>``, property seq) through ferrymq's Producer."""
    return asyncio.run(_send_backlog(ns, topic, n, prefix, concurrency))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short
                continue
    return out


def spawn_cpp_consumer(
    procs: ProcessGroup, tmp_path: Path, *, name: str, args: dict[str, Any]
) -> ManagedProcess:
    """cpp_scripts/consume.py in the background (a ProcessGroup member: stopped at teardown)."""
    home = tmp_path / "cpp-home"
    home.mkdir(exist_ok=True)
    return procs.spawn(
        name,
        [sys.executable, str(CPP_SCRIPTS_DIR / "consume.py"), json.dumps(args)],
        cwd=CPP_SCRIPTS_DIR,
        env={"HOME": str(home)},
    )


@dataclass
class PyPushConsumer:
    """ferrymq.client.PushConsumer running on its own event loop in a daemon thread."""

    ns: str
    group: str
    topic: str
    consume_delay_s: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)
    bodies: list[bytes] = field(default_factory=list)
    #: monotonic receive time per delivery (parallel to ``bodies``)
    times: list[float] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _started: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> PyPushConsumer:
        self._thread = threading.Thread(target=self._main, name=f"py-consumer-{self.group}", daemon=True)
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported to the test
            self.error = exc

    async def _run(self) -> None:
        from ferrymq.client import ConsumeStatus, PushConsumer

        async def listener(msgs: list[Any]) -> ConsumeStatus:
            if self.consume_delay_s:
                await asyncio.sleep(self.consume_delay_s)
            now = time.monotonic()
            for m in msgs:
                self.times.append(now)
                self.bodies.append(m.body)
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(
            self.ns,
            self.group,
            consume_from_where="CONSUME_FROM_FIRST_OFFSET",
            listener=listener,
            **self.options,
        )
        consumer.subscribe(self.topic, "*")
        await consumer.start()
        self._started.set()
        try:
            while not self._stop.is_set():
                await asyncio.sleep(0.05)
        finally:
            await consumer.close()

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            assert not self._thread.is_alive(), (
                f"PushConsumer {self.group} did not close within {timeout_s} s"
            )
