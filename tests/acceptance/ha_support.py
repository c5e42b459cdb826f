"""HA acceptance helpers (test_ha.py, test_ha_failover.py): a namesrv + master + slave of real ``ferry``
processes, commit log and queue comparisons, raw pulls and sends, consumer offsets, and consumers (C++ script
subprocess, ferrymq PushConsumer thread).

Waits are condition polls with deadlines (procs.wait_for); every process goes through the test's ProcessGroup,
so it is stopped at teardown also on failure.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procs import (
    LOOPBACK,
    Broker,
    ManagedProcess,
    Namesrv,
    ProcessGroup,
    create_topic,
    json_body,
    max_offset,
    query_consumer_offset,
    request,
    route,
    spawn_cpp_script,
    start_broker,
    start_namesrv,
    wait_for,
    wait_route,
)

from ferrymq.common.message_codec import iter_records
from ferrymq.remoting.codes import RequestCode, ResponseCode

#: small segments: 10,000 messages cross several of them (start_ha_pair)
HA_SEGMENT_BYTES = 1024 * 1024
PULL_BATCH = 32

#: HA timing shortened through broker.conf (keys of ferrymq.broker.config), for start_failover_pair
HA_HEARTBEAT_INTERVAL_MS = 1000
HA_HOUSEKEEPING_INTERVAL_MS = 5000
#: registerNameServerPeriod is clamped to >= 10 s by the broker
REGISTER_PERIOD_MS = 10_000
#: SYNC_MASTER replica wait (slaveTimeout defaults to syncFlushTimeout)
SYNC_FLUSH_TIMEOUT_MS = 3000
#: first SlaveSynchronize run is 3 s after the slave starts; its period is 10 s
FIRST_SLAVE_SYNC_BOUND_S = 3.0 + 10.0 + 5.0
REPLICATION_TIMEOUT_S = 30.0
#: route of a freshly created topic (start_failover_pair)
ROUTE_TIMEOUT_S = 30.0

FAST_HA_PROPS: dict[str, Any] = {
    "haSendHeartbeatInterval": HA_HEARTBEAT_INTERVAL_MS,
    "haHousekeepingInterval": HA_HOUSEKEEPING_INTERVAL_MS,
    "registerNameServerPeriod": REGISTER_PERIOD_MS,
    "syncFlushTimeout": SYNC_FLUSH_TIMEOUT_MS,
}


# ---------------------------------------------------------------------------------------------
# the pair


@dataclass
class HAPair:
    group: ProcessGroup
    namesrv: Namesrv
    master: Broker
    slave: Broker

    @property
    def ns_addr(self) -> str:
        return self.namesrv.addr

    @property
    def alive(self) -> list[ManagedProcess]:
        out = [self.namesrv.proc]
        out += [b.proc for b in (self.master, self.slave) if b.proc is not None and not b.proc.exited]
        return out


def start_master_slave(procs: ProcessGroup, *, role: str,
                       before_slave: Callable[[Namesrv, Broker], None] | None = None, **props: Any) -> HAPair:
    """A namesrv, a master (``role``) and its slave (brokerId 1, haMasterAddress set), all with ``props``;
    ``before_slave(namesrv, master)`` runs before the slave starts."""
    ns = start_namesrv(procs)
    master = start_broker(procs, [ns.addr], name="master", brokerRole=role, **props)
    if before_slave is not None:
        before_slave(ns, master)
    slave = start_broker(
        procs,
        [ns.addr],
        name="slave",
        brokerId=1,
        brokerRole="SLAVE",
        haMasterAddress=f"{LOOPBACK}:{master.port + 1}",
        **props,
    )
    return HAPair(procs, ns, master, slave)


def start_ha_pair(procs: ProcessGroup, *, role: str = "SYNC_MASTER", **props: Any) -> HAPair:
    """start_master_slave with 1 MiB commit log segments (unless ``props`` say otherwise)."""
    props.setdefault("mappedFileSizeCommitLog", HA_SEGMENT_BYTES)
    return start_master_slave(procs, role=role, **props)


def start_failover_pair(procs: ProcessGroup, topic: str, *, queues: int = 4, **props: Any) -> HAPair:
    """namesrv, SYNC_MASTER with short HA intervals, ``topic`` on the master (routed), then the SLAVE started
    after the topic exists so its first SlaveSynchronize (3 s) copies it; returns once the slave knows the
    topic and has caught up."""

    def topic_first(ns: Namesrv, master: Broker) -> None:
        create_routed_topic(ns.addr, master, topic, queues=queues, timeout_s=ROUTE_TIMEOUT_S,
                            alive=[ns.proc, master.proc])

    pair = start_master_slave(procs, role="SYNC_MASTER", before_slave=topic_first, **{**FAST_HA_PROPS, **props})
    wait_for(
        lambda: slave_knows_topic(pair.slave.addr, topic),
        timeout_s=FIRST_SLAVE_SYNC_BOUND_S,
        what=f"topic {topic} on the slave",
        alive=pair.alive,
    )
    wait_for(
        lambda: ha_slave_count(pair.master.addr) >= 1,
        timeout_s=REPLICATION_TIMEOUT_S,
        what="the slave's HA connection on the master",
        alive=pair.alive,
    )
    wait_caught_up(pair)
    return pair


def create_routed_topic(ns_addr: str, master: Broker, topic: str, *, queues: int, timeout_s: float,
                        alive: list[Any]) -> None:
    """UPDATE_AND_CREATE_TOPIC on ``master``; wait until the namesrv routes ``topic`` to it."""
    create_topic(master.addr, topic, queues=queues)
    wait_route(ns_addr, topic, timeout_s=timeout_s, broker_name=master.broker_name, alive=alive)


# ---------------------------------------------------------------------------------------------
# broker state


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


def wait_caught_up(pair: HAPair, *, timeout_s: float = REPLICATION_TIMEOUT_S) -> int:
    """Wait until the slave's commit log max equals the master's; return that offset."""

    def same() -> tuple[int] | None:  # a tuple: offset 0 is a valid answer
        m = commit_log_max(pair.master.addr)
        return (m,) if m == commit_log_max(pair.slave.addr) else None

    return wait_for(
        same, timeout_s=timeout_s, what="slave commit log to reach the master's", alive=pair.alive
    )[0]


def commit_log_bytes(store_dir: Path, end: int) -> bytes:
    """Concatenated commit log segment files of ``store_dir`` from their first offset up to ``end``."""
    files = sorted((p for p in (store_dir / "commitlog").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    out = bytearray()
    for f in files:
        start = int(f.name)
        if start >= end:
            break
        data = f.read_bytes()
        out += data[: min(len(data), end - start)]
    return bytes(out)


def first_segment_offset(store_dir: Path) -> int:
    return min(int(p.name) for p in (store_dir / "commitlog").iterdir() if p.name.isdigit())


def queue_max_offsets(addr: str, topic: str, queues: int) -> list[int]:
    return [max_offset(addr, topic, q) for q in range(queues)]


def consumer_offsets(addr: str, group: str, topic: str, queues: int) -> list[int | None]:
    """QUERY_CONSUMER_OFFSET per queue on ``addr`` (None when the broker has none)."""
    return [query_consumer_offset(addr, group, topic, q) for q in range(queues)]


def all_consumer_offsets(addr: str) -> dict[str, Any]:
    resp = request(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
    if resp.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"GET_ALL_CONSUMER_OFFSET on {addr} -> {resp.code} {resp.remark}")
    return dict((json_body(resp) or {}).get("offsetTable") or {})


def route_broker_ids(ns_addr: str, topic: str) -> dict[int, str]:
    """brokerId -> address of every broker the namesrv routes ``topic`` to."""
    out: dict[int, str] = {}
    for bd in (route(ns_addr, topic) or {}).get("brokerDatas") or []:
        for k, v in (bd.get("brokerAddrs") or {}).items():
            out[int(k)] = str(v)
    return out


# ---------------------------------------------------------------------------------------------
# raw pulls and sends


async def _pull_all(addr: str, topic: str, queue_id: int, start: int, end: int) -> list[Any]:
    from ferrymq.remoting.codec import RemotingCommand
    from ferrymq.remoting.connection import connect

    conn = await connect(addr, timeout_ms=3000)
    msgs: list[Any] = []
    try:
        offset = start
        while offset < end:
            cmd = RemotingCommand.request(
                RequestCode.PULL_MESSAGE,
                {
                    "consumerGroup": "ha-acceptance",
                    "topic": topic,
                    "queueId": str(queue_id),
                    "queueOffset": str(offset),
                    "maxMsgNums": str(PULL_BATCH),
                    "sysFlag": "4",  # FLAG_SUBSCRIPTION only: no suspend, no commit
                    "commitOffset": "0",
                    "suspendTimeoutMillis": "0",
                    "subscription": "*",
                    "subVersion": "0",
                },
            )
            resp = await conn.invoke(cmd, 5000)
            if resp.code != ResponseCode.SUCCESS:
                raise AssertionError(
                    f"pull {topic}/{queue_id}@{offset} from {addr} -> {resp.code} {resp.remark}"
                )
            got = list(iter_records(resp.body or b""))
            assert got, f"empty FOUND pull at {offset}"
            msgs.extend(got)
            offset = msgs[-1].queue_offset + 1
    finally:
        conn.close()
    return msgs


def pull_queue(addr: str, topic: str, queue_id: int, start: int, end: int) -> list[Any]:
    """Every message of queue ``queue_id`` in [start, end) pulled from ``addr``, in order."""
    return asyncio.run(_pull_all(addr, topic, queue_id, start, end))


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


# ---------------------------------------------------------------------------------------------
# ferrymq's client: sending, consuming


async def _send_all(ns: str, group: str, messages: list[Any], concurrency: int) -> list[Any]:
    from ferrymq.client import Producer

    sem = asyncio.Semaphore(concurrency)
    async with Producer(ns, group) as producer:

        async def one(message: Any) -> Any:
            async with sem:
                return await producer.send(message)

        return list(await asyncio.gather(*(one(m) for m in messages)))


def send_messages(ns: str, group: str, messages: list[Any], *, concurrency: int = 64) -> list[Any]:
    """Send ``messages`` through ferrymq's Producer (``concurrency`` in flight); their SendResults in order."""
    return asyncio.run(_send_all(ns, group, messages, concurrency))


def send_backlog(ns: str, topic: str, n: int, *, prefix: str, concurrency: int = 64) -> list[Any]:
    """``n`` messages (body ``<prefix>-<seq:06d>``, property seq) through ferrymq's Producer."""
    from ferrymq.client import new_message

    messages = [new_message(topic, f"{prefix}-{i:06d}", properties={"seq": str(i)}) for i in range(n)]
    return send_messages(ns, "failover-backlog-producer", messages, concurrency=concurrency)


def spawn_cpp_consumer(
    procs: ProcessGroup, tmp_path: Path, *, name: str, args: dict[str, Any]
) -> ManagedProcess:
    """cpp_scripts/consume.py in the background (a ProcessGroup member: stopped at teardown)."""
    return spawn_cpp_script(procs, tmp_path, name, "consume", args)


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
                await asyncio.sleep(self.consume_delay_s)  # a slow consumer (scenario), not a wait
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
