"""Controller-mode processes and the failover nemesis, shared by tests/acceptance/test_failover_controller.py and
benchmarks/failover_nemesis.py.

A ``NemesisGroup`` is one name server, one controller (``ferry controller -c``) and three brokers of one
broker group in controller mode with its defaults (SYNC, ``allAckInSyncStateSet=true``), real processes; a
second group can share its name server and controllers (``NemesisGroup.start(share=...)``). A
``ProducerLoop`` thread sends unique bodies continuously through ferrymq's Producer and records every SEND_OK
(its offset msgId says which broker stored it at which phy offset). ``NemesisGroup.round(action)`` injects one fault
(SIGKILL or SIGSTOP/SIGCONT of the master, SIGKILL of a slave or of the controller), restarts what it killed
and waits until the group is whole again. ``NemesisGroup.verify`` then checks the history:

* every SEND_OK body is in the master's log, and the record at the acknowledged phy offset is that body;
* per epoch (from the master's epoch file) one broker only acknowledged the sends that survived;
* per failover round, no SEND_OK of the old master arrived after the first SEND_OK of the new one (the two
  never acknowledged at the same time: this covers what ASYNC replication acknowledged and lost, whose
  offsets the new epoch reuses);
* every replica's commit log is byte-identical to the master's (all caught up once the producer stopped);
* duplicates (a body stored twice: a producer retry after an answer that was not SEND_OK) are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import struct
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ha_support import commit_log_bytes
from partition_support import LoopbackPartitions, Node
from procs import (
    CPP_SCRIPTS_DIR,
    LOOPBACK,
    NODE_DIR,
    Broker,
    ManagedProcess,
    Namesrv,
    ProcessGroup,
    broker_props,
    ferry_argv,
    json_body,
    port_answers,
    port_free,
    request,
    route,
    spawn_cpp_script,
    start_namesrv,
    wait_for,
    write_properties,
)

from ferrymq.common.message import decode_offset_msg_id
from ferrymq.common.message_codec import BLANK_MAGIC_CODE, decode_record
from ferrymq.ha.epoch import EPOCH_FILE_NAME, EpochFile
from ferrymq.remoting.codes import RequestCode, ResponseCode
from support.ports import free_port

if str(CPP_SCRIPTS_DIR) not in sys.path:
    sys.path.insert(0, str(CPP_SCRIPTS_DIR))
from _cpp_common import expected_message  # noqa: E402

TOPIC = "NemesisTopic"
BROKER_NAME = "broker-n"
REPLICA_IDS = (1, 2, 3)
#: the controller's default; elections happen this long after the master's last heartbeat
HEARTBEAT_TIMEOUT_MS = 3000
#: a group is whole again (a master, every replica alive and in the SyncStateSet) within this
HEAL_TIMEOUT_S = 60.0
START_TIMEOUT_S = 60.0
#: SIGSTOP lasts this long: well past an election
PAUSE_S = 6.0
ERRORS_KEPT = 200
ACTIONS = ("kill-master", "pause-master", "kill-slave", "kill-controller")
#: need NemesisGroup.start(partitions=True): the master and the Raft leader cut off together from the rest
#: (controllers=3), the master cut off from every controller (its replicas still reach it), one slave cut
#: off from everyone
PARTITION_ACTIONS = ("partition-master-leader", "partition-master", "partition-slave")
FAILOVER_ACTIONS = ("kill-master", "pause-master", "partition-master-leader", "partition-master")

#: no brokerRole and no allAckInSyncStateSet: the nemesis runs controller mode's defaults (SYNC, every
#: SyncStateSet member acknowledges)
BROKER_PROPS: dict[str, Any] = {
    "brokerName": BROKER_NAME,
    "enableControllerMode": True,
    "haMaxTimeSlaveNotCatchup": 3000,
    "controllerHeartbeatPeriodMs": 500,
    "controllerLeaseMs": 2000,
    "haSendHeartbeatInterval": 500,
    "haHousekeepingInterval": 5000,
    "mappedFileSizeCommitLog": 4 * 1024 * 1024,
    "syncFlushTimeout": 2000,
    "registerNameServerPeriod": 10_000,
    "defaultTopicQueueNums": 4,
}


@dataclass
class Controller:
    group: ProcessGroup
    conf_path: Path
    port: int
    proc: ManagedProcess | None = None
    starts: int = 0
    name: str = "controller"
    raft_port: int = 0
    #: partitions: the group id its process runs under (0: not partitionable)
    gid: int = 0
    #: argv prefix of its process (partitions: run under its own group id)
    argv_prefix: list[str] = field(default_factory=list)

    @property
    def addr(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> Controller:
        self.starts += 1
        name = self.name if self.starts == 1 else f"{self.name}-run{self.starts}"
        self.proc = self.group.spawn(name, [*self.argv_prefix, *ferry_argv("controller", "-c", str(self.conf_path))])
        wait_for(lambda: port_answers(self.port), timeout_s=START_TIMEOUT_S, what="the controller's port",
                 alive=[self.proc])
        return self


def start_controllers(group: ProcessGroup, count: int = 1, partitions: LoopbackPartitions | None = None,
                      **props: Any) -> list[Controller]:
    """``count`` controllers forming one Raft group (1: a single node); with ``partitions`` each runs under
    its own group id."""
    raft_ports = [free_port() for _ in range(count)]
    peers = ";".join(f"n{i}-{LOOPBACK}:{p}" for i, p in enumerate(raft_ports))
    out = []
    for i in range(count):
        port = free_port()
        store = group.base_dir / f"controller{i}-store"
        store.mkdir(parents=True, exist_ok=True)
        conf = write_properties(group.base_dir / f"controller{i}.conf", {
            "controllerPeers": peers, "controllerSelfId": f"n{i}", "controllerStorePath": str(store),
            "controllerListenPort": port, "listenHost": LOOPBACK, **props})
        gid = partitions.new_gid() if partitions is not None else 0
        prefix = partitions.wrap_argv(gid, []) if partitions is not None else []
        out.append(Controller(group, conf, port, name=f"controller{i}" if count > 1 else "controller",
                              raft_port=raft_ports[i], gid=gid, argv_prefix=prefix).start())
    return out


def start_controller(group: ProcessGroup, **props: Any) -> Controller:
    return start_controllers(group, 1, **props)[0]


def start_replica(group: ProcessGroup, ns: Namesrv, controllers: list[Controller], replica_id: int,
                  argv_prefix: Sequence[str] = (), **props: Any) -> Broker:
    """A controller-mode broker; ready once its port answers (its name-server slot depends on its role)."""
    broker_name = str(props.get("brokerName", BROKER_NAME))
    name = f"replica{replica_id}" if broker_name == BROKER_NAME else f"{broker_name}-replica{replica_id}"
    store_dir = group.base_dir / f"{name}-store"
    store_dir.mkdir(parents=True, exist_ok=True)
    port = free_port(broker=True)
    all_props = broker_props(namesrv_addrs=[ns.addr], store_dir=store_dir, port=port,
                             **{**BROKER_PROPS, "brokerId": replica_id, "controllerAddr": ";".join(c.addr for c in controllers),
                                "haListenPort": free_port(), "fastListenEnable": False, **props})
    if "brokerRole" not in props:
        del all_props["brokerRole"]  # broker_props writes one; a written ASYNC_MASTER would opt out of SYNC
    conf = write_properties(group.base_dir / f"{name}.conf", all_props)
    broker = Broker(group=group, name=name, conf_path=conf, props=all_props, namesrv_addrs=[ns.addr])
    start_replica_process(broker, argv_prefix)
    return broker


def start_replica_process(broker: Broker, argv_prefix: Sequence[str] = ()) -> None:
    broker.starts += 1
    proc_name = broker.name if broker.starts == 1 else f"{broker.name}-run{broker.starts}"
    broker.proc = broker.group.spawn(proc_name, [*argv_prefix, *ferry_argv("broker", "-c", str(broker.conf_path))])
    wait_for(lambda: port_answers(broker.port), timeout_s=START_TIMEOUT_S,
             what=f"{broker.name} to accept connections", alive=[broker.proc])


def group_state(controllers: list[Controller], broker_name: str = BROKER_NAME) -> dict[str, Any] | None:
    """The leading controller's GroupState of a nemesis group (CONTROLLER_GET_REPLICA_INFO), None if no
    controller answers it."""
    for controller in controllers:
        if controller.proc is None or controller.proc.exited:
            continue
        try:
            resp = request(controller.addr, RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": broker_name},
                           timeout_ms=1000)
        except Exception:
            continue
        if resp.code != ResponseCode.SUCCESS:
            continue
        body = json_body(resp)
        if isinstance(body, dict):
            return body
    return None


def leader_index(controllers: list[Controller]) -> int:
    """Index of the controller that answers as the Raft leader (CONTROLLER_GET_METADATA_INFO), -1 if none."""
    for i, controller in enumerate(controllers):
        if controller.proc is None or controller.proc.exited:
            continue
        try:
            resp = request(controller.addr, RequestCode.CONTROLLER_GET_METADATA_INFO, timeout_ms=1000)
        except Exception:
            continue
        body = json_body(resp) if resp.code == ResponseCode.SUCCESS else None
        if isinstance(body, dict) and body.get("isLeader"):
            return i
    return -1


# ---------------------------------------------------------------------------------------------
# the producer


@dataclass
class Ack:
    body: str
    host: str  # ip:port of the broker that stored it
    phy_offset: int
    at: float  # time.monotonic() when SEND_OK arrived


class ProducerLoop:
    """ferrymq's Producer in a thread with its own event loop: ``concurrency`` senders, unique bodies."""

    def __init__(self, ns_addr: str, run_id: str, *, concurrency: int = 4) -> None:
        self.ns_addr = ns_addr
        self.run_id = run_id
        self.concurrency = concurrency
        self.acks: list[Ack] = []
        self.failures = 0
        #: the last ERRORS_KEPT send failures: (time.monotonic(), what)
        self.errors: list[tuple[float, str]] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="nemesis-producer", daemon=True)
        self._seq = 0

    def start(self) -> ProducerLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def acks_after(self, t: float) -> list[Ack]:
        return [a for a in list(self.acks) if a.at > t]

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        from ferrymq.client import Producer, new_message
        from ferrymq.client.values import SendStatus

        async with Producer(self.ns_addr, f"nemesis-{self.run_id}", send_timeout_ms=2000,
                            retry_times_when_send_failed=1) as producer:

            async def sender() -> None:
                while not self._stop.is_set():
                    self._seq += 1
                    body = f"{self.run_id}-{self._seq:08d}"
                    self.sent += 1
                    try:
                        res = await producer.send(new_message(TOPIC, body))
                    except Exception as exc:
                        self.failures += 1
                        self.errors.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
                        del self.errors[:-ERRORS_KEPT]
                        await asyncio.sleep(0.05)
                        continue
                    if res.status is SendStatus.SEND_OK:
                        ip, port, phy = decode_offset_msg_id(res.offset_msg_id)
                        self.acks.append(Ack(body, f"{ip}:{port}", phy, time.monotonic()))
                    else:
                        self.failures += 1

            await asyncio.gather(*(sender() for _ in range(self.concurrency)))


class ForeignProducer:
    """An unchanged RocketMQ 4.x client sending in a subprocess until stopped: ``cpp`` (the Apache C++ client
    1.x through PyPI rocketmq 0.4.4, cpp_scripts/produce.py), ``cpp21`` (the Apache C++ client 2.1 through PyPI
    rocketmq-python-cvs, cpp21_scripts/send.py; installed on first use, cpp21_support.py) or ``alions`` (npm
    ali-ons, node/alions_produce_loop.js). Each writes one JSON line per send; ``resumed_s(fault_ms)`` reads
    them incrementally (the files grow large over many failovers)."""

    KINDS = ("cpp", "cpp21", "alions")

    def __init__(self, group: ProcessGroup, ns_addr: str, kind: str, work_dir: Path, *, topic: str = TOPIC) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"unknown client {kind!r} (one of {self.KINDS})")
        self.group, self.ns_addr, self.kind, self.topic = group, ns_addr, kind, topic
        self.work_dir = work_dir
        self.out = work_dir / f"{kind}-sends.jsonl"
        self.proc: ManagedProcess | None = None
        #: (send start ms, send end ms, body) of every SEND_OK read so far, wall clock
        self.oks: list[tuple[float, float, str]] = []
        self.failed = 0
        self._pos = 0

    def start(self, *, alive: Sequence[ManagedProcess] = ()) -> ForeignProducer:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.kind == "cpp":
            self.proc = spawn_cpp_script(self.group, self.work_dir, f"{self.kind}-producer", "produce", {
                "namesrv": self.ns_addr, "topic": self.topic, "group": "cpp-nemesis", "count": 100_000_000,
                "prefix": "cpp", "deadline_s": 24 * 3600, "timeout_ms": 2000, "out": str(self.out)})
        elif self.kind == "cpp21":
            from cpp21_support import cpp21_install_dir, spawn_cpp21_script

            self.proc = spawn_cpp21_script(self.group, self.work_dir, cpp21_install_dir(), f"{self.kind}-producer",
                                           "send", {"namesrv": self.ns_addr, "topic": self.topic,
                                                    "group": "cpp21-nemesis", "count": 100_000_000, "prefix": "cpp",
                                                    "deadline_s": 24 * 3600, "timeout_ms": 2000,
                                                    "out": str(self.out)})
        else:
            assert (NODE_DIR / "node_modules" / "ali-ons").is_dir(), "run `npm --prefix tests/acceptance/node ci`"
            seed = ProducerLoop(self.ns_addr, "seed").start()  # ali-ons needs the topic routed (no auto-creation)
            try:
                wait_for(lambda: route(self.ns_addr, self.topic) is not None, timeout_s=START_TIMEOUT_S,
                         what="the topic's route", alive=list(alive))
            finally:
                seed.stop()
            self.proc = self.group.spawn(f"{self.kind}-producer", ["node", str(NODE_DIR / "alions_produce_loop.js"),
                                         json.dumps({"namesrv": self.ns_addr, "topic": self.topic,
                                                     "producerGroup": "alions-nemesis", "prefix": "ons",
                                                     "out": str(self.out), "logDir": str(self.work_dir)})],
                                         cwd=NODE_DIR)
        wait_for(lambda: len(self.poll()) >= 20, timeout_s=START_TIMEOUT_S, what=f"{self.kind} sends acknowledged",
                 alive=[*alive, self.proc])
        return self

    def poll(self) -> list[tuple[float, float, str]]:
        """Read the lines written since the last call; every SEND_OK so far."""
        if not self.out.exists():
            return self.oks
        with open(self.out, "rb") as f:
            f.seek(self._pos)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._pos += end
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not rec.get("ok"):
                self.failed += 1
                continue
            if self.kind in ("cpp", "cpp21"):
                self.oks.append((rec["send_start_ms"], rec["send_end_ms"],
                                 expected_message("cpp", rec["seq"], ["TagA"])["body"]))
            else:
                self.oks.append((rec["startMs"], rec["endMs"], rec["body"]))
        return self.oks

    def resumed_s(self, fault_at_ms: float) -> float | None:
        """Seconds from the fault to the first SEND_OK of a send started after it, None before there is one."""
        first: float | None = None
        for start_ms, end_ms, _body in reversed(self.poll()):
            if start_ms <= fault_at_ms:
                break
            first = end_ms if first is None else min(first, end_ms)
        return (first - fault_at_ms) / 1000 if first is not None else None

    def acked_bodies(self) -> list[str]:
        return [body for _s, _e, body in self.poll()]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        self.poll()


# ---------------------------------------------------------------------------------------------
# the group and the nemesis


@dataclass
class RoundResult:
    action: str
    victim: str
    master_before: int
    master_after: int
    #: seconds from the fault to the first SEND_OK stored by another master (failover actions), or to the
    #: first SEND_OK after the fault (other actions); -1: none
    unavailable_s: float
    #: wall-clock ms when the fault was injected (to compare with other clients' logs)
    fault_at_ms: float = 0.0
    #: failover rounds: seconds from the fault to the old master's last SEND_OK / the new master's first
    #: (-1: none); the old master's last one must come first
    old_last_ack_s: float = -1.0
    new_first_ack_s: float = -1.0
    #: the longest time between two SEND_OKs (any broker) from a second before the fault to the round's end
    longest_gap_s: float = -1.0

    @property
    def overlap(self) -> bool:
        """Did the old master acknowledge after the new one had started to?"""
        return 0 <= self.new_first_ack_s < self.old_last_ack_s


@dataclass
class NemesisGroup:
    group: ProcessGroup
    ns: Namesrv
    controllers: list[Controller]
    replicas: dict[int, Broker]
    rounds: list[RoundResult] = field(default_factory=list)
    #: iptables partitions on loopback (partition_support.py), None when not asked for
    partitions: LoopbackPartitions | None = None
    replica_gids: dict[int, int] = field(default_factory=dict)
    broker_name: str = BROKER_NAME
    #: another group serves the producer's topic too: its writes go on there, so a failover round does not
    #: wait for a SEND_OK of this group's new master (its unavailability is to the first SEND_OK anywhere)
    topic_elsewhere: bool = False

    @classmethod
    def start(cls, group: ProcessGroup, *, controllers: int = 1, partitions: bool = False,
              broker_name: str = BROKER_NAME, share: NemesisGroup | None = None, **broker_props: Any) -> NemesisGroup:
        """With ``partitions`` (check ``partition_support.unavailable_reason()`` first) every controller and
        replica runs under its own group id and partition rounds are possible; call ``close()`` when done (it
        removes the iptables rules). ``share``: another group whose name server, controllers and partitions
        this one uses (``broker_name`` must differ)."""
        parts: LoopbackPartitions | None = share.partitions if share is not None else None
        gids: dict[int, int] = {}
        if partitions and share is None:
            parts = LoopbackPartitions()
            parts.install()
        try:
            ns = share.ns if share is not None else start_namesrv(group)
            ctls = share.controllers if share is not None else start_controllers(group, controllers, parts)
            if parts is not None:
                gids = {rid: parts.new_gid() for rid in REPLICA_IDS}
            props = {**broker_props, "brokerName": broker_name}
            replicas = {rid: start_replica(group, ns, ctls, rid, cls._prefix(parts, gids.get(rid, 0)), **props)
                        for rid in REPLICA_IDS}
            ng = cls(group, ns, ctls, replicas, partitions=parts, replica_gids=gids, broker_name=broker_name)
            ng.wait_whole()
        except BaseException:
            if parts is not None and share is None:
                parts.remove()
            raise
        return ng

    def master(self) -> Broker:
        return self.replicas[int(self.wait_whole()["masterId"])]

    @staticmethod
    def _prefix(parts: LoopbackPartitions | None, gid: int) -> list[str]:
        return parts.wrap_argv(gid, []) if parts is not None else []

    def close(self) -> None:
        """Remove the iptables rules (processes are stopped by their ProcessGroup)."""
        if self.partitions is not None:
            self.partitions.remove()

    def _replica_node(self, rid: int) -> Node:
        b = self.replicas[rid]
        return Node(self.replica_gids[rid], [b.port, int(b.props["haListenPort"])])

    def _controller_node(self, index: int) -> Node:
        c = self.controllers[index]
        return Node(c.gid, [c.port, c.raft_port])

    @property
    def alive(self) -> list[ManagedProcess]:
        return [p for p in (self.ns.proc,) if p is not None]

    def state(self) -> dict[str, Any] | None:
        return group_state(self.controllers, self.broker_name)

    def master_id(self) -> int:
        st = self.state()
        return int(st["masterId"]) if st else -1

    def wait_whole(self, timeout_s: float = HEAL_TIMEOUT_S) -> dict[str, Any]:
        """A master, every replica in the SyncStateSet, the name server routing the master as brokerId 0."""

        def whole() -> dict[str, Any] | None:
            st = self.state()
            if not st or int(st.get("masterId", -1)) < 0:
                return None
            if sorted(int(i) for i in st.get("syncStateSet") or ()) != list(REPLICA_IDS):
                return None
            master = self.replicas[int(st["masterId"])]
            resp = request(self.ns.addr, RequestCode.GET_BROKER_CLUSTER_INFO)
            entry = ((json_body(resp) or {}).get("brokerAddrTable") or {}).get(self.broker_name) or {}
            addrs = {str(k): v for k, v in (entry.get("brokerAddrs") or {}).items()}
            return st if addrs.get("0") == master.addr else None

        return wait_for(whole, timeout_s=timeout_s, what="the broker group to be whole (master + full "
                        "SyncStateSet + route)", alive=self.alive)

    def _restart(self, rid: int) -> None:
        broker = self.replicas[rid]
        wait_for(lambda: port_free(broker.port), timeout_s=START_TIMEOUT_S, what=f"port of {broker.name}")
        start_replica_process(broker, self._prefix(self.partitions, self.replica_gids.get(rid, 0)))

    def round(self, action: str, producer: ProducerLoop | None, rng: random.Random) -> RoundResult:
        before = self.wait_whole()
        if producer is not None:  # the producer sends to the current master before the fault
            acked = len(producer.acks)
            wait_for(lambda: len(producer.acks) > acked, timeout_s=HEAL_TIMEOUT_S, what="a SEND_OK before the fault",
                     alive=self.alive)
        master = int(before["masterId"])
        slaves = [rid for rid in REPLICA_IDS if rid != master]
        t0 = time.monotonic()
        fault_at_ms = time.time() * 1000
        victim: str
        if action == "kill-master":
            victim = self.replicas[master].name
            self.replicas[master].kill()
            self._wait_new_master(master)
            self._restart(master)
        elif action == "pause-master":
            victim = self.replicas[master].name
            proc = self.replicas[master].proc
            assert proc is not None
            proc.signal(signal.SIGSTOP)
            try:
                self._wait_new_master(master)
                pause_left = PAUSE_S - (time.monotonic() - t0)
                if pause_left > 0:
                    time.sleep(pause_left)  # the fault itself: the paused master sleeps through the election
            finally:
                proc.signal(signal.SIGCONT)
        elif action == "partition-master-leader":
            victim = self._partition_master_with_leader(master, t0)
        elif action == "partition-master":
            victim = self._partition_master(master, t0)
        elif action == "partition-slave":
            victim = self._partition_slave(rng.choice(slaves), t0)
        elif action == "kill-slave":
            rid = rng.choice(slaves)
            victim = self.replicas[rid].name
            self.replicas[rid].kill()
            self._restart(rid)
        elif action == "kill-controller":  # the Raft leader when there are several
            index = max(0, leader_index(self.controllers)) if len(self.controllers) > 1 else 0
            controller = self.controllers[index]
            victim = controller.name
            assert controller.proc is not None
            controller.proc.kill()
            wait_for(lambda: port_free(controller.port), timeout_s=START_TIMEOUT_S, what="controller port")
            controller.start()
        else:
            raise ValueError(f"unknown nemesis action {action!r}")
        after = self.wait_whole()
        unavailable = -1.0
        if producer is not None:
            new_master = self.replicas[int(after["masterId"])].addr
            wait_for(lambda: bool(producer.acks_after(t0)), timeout_s=HEAL_TIMEOUT_S,
                     what="a SEND_OK after the fault", alive=self.alive)
            later = producer.acks_after(t0)
            if action in FAILOVER_ACTIONS and not self.topic_elsewhere:
                with contextlib.suppress(Exception):
                    wait_for(lambda: any(a.host == new_master for a in producer.acks_after(t0)),
                             timeout_s=HEAL_TIMEOUT_S, what="a SEND_OK from the new master")
                later = [a for a in producer.acks_after(t0) if a.host == new_master]
            if later:
                unavailable = min(a.at for a in later) - t0
        result = RoundResult(action, victim, master, int(after["masterId"]), unavailable, fault_at_ms)
        if producer is not None and action in FAILOVER_ACTIONS:
            old_addr = self.replicas[master].addr
            new_addr = self.replicas[result.master_after].addr
            since = producer.acks_after(t0)
            result.old_last_ack_s = max((a.at - t0 for a in since if a.host == old_addr), default=-1.0)
            result.new_first_ack_s = min((a.at - t0 for a in since if a.host == new_addr), default=-1.0)
        if producer is not None:
            times = sorted(a.at for a in producer.acks_after(t0 - 1.0))
            result.longest_gap_s = max((b - a for a, b in zip(times, times[1:], strict=False)), default=-1.0)
        self.rounds.append(result)
        return result

    def _partition_master_with_leader(self, master: int, t0: float) -> str:
        """Cut the master and the Raft leader off from the other replicas and controllers (the producer and
        the name server still reach both sides) until the rest elected a new master and ``PAUSE_S`` passed;
        then heal. Returns the victims' names."""
        parts = self.partitions
        assert parts is not None and len(self.controllers) >= 3, "needs partitions=True and 3 controllers"
        leader = wait_for(lambda: leader_index(self.controllers) + 1, timeout_s=HEAL_TIMEOUT_S,
                          what="a Raft leader", alive=self.alive) - 1
        side_a = [self._replica_node(master), self._controller_node(leader)]
        side_b = [*(self._replica_node(rid) for rid in REPLICA_IDS if rid != master),
                  *(self._controller_node(i) for i in range(len(self.controllers)) if i != leader)]
        parts.cut(side_a, side_b)
        try:
            self._wait_new_master(master)
            hold_left = PAUSE_S - (time.monotonic() - t0)
            if hold_left > 0:
                time.sleep(hold_left)  # the fault itself: the old master keeps taking sends, cut off
        finally:
            parts.heal()
        return f"{self.replicas[master].name}+{self.controllers[leader].name}"

    def _partition_master(self, master: int, t0: float) -> str:
        """Cut the master off from every controller (its replicas, the producer and the name server still reach
        it) until another replica was elected and ``PAUSE_S`` passed; then heal."""
        parts = self.partitions
        assert parts is not None, "needs partitions=True"
        parts.cut([self._replica_node(master)], [self._controller_node(i) for i in range(len(self.controllers))])
        try:
            self._wait_new_master(master)
            hold_left = PAUSE_S - (time.monotonic() - t0)
            if hold_left > 0:
                time.sleep(hold_left)  # the fault itself
        finally:
            parts.heal()
        return f"{self.replicas[master].name} (from the controllers)"

    def _partition_slave(self, slave: int, t0: float) -> str:
        """Cut one slave off from the master, the other replicas and every controller for ``PAUSE_S``; then
        heal. The master goes on (without it in the SyncStateSet once ``haMaxTimeSlaveNotCatchup`` passed)."""
        parts = self.partitions
        assert parts is not None, "needs partitions=True"
        others = [self._replica_node(rid) for rid in REPLICA_IDS if rid != slave]
        parts.cut([self._replica_node(slave)], [*others, *(self._controller_node(i) for i in range(len(self.controllers)))])
        try:
            time.sleep(PAUSE_S)  # the fault itself: the master must drop the slave from its acks and go on
        finally:
            parts.heal()
        return f"{self.replicas[slave].name} (from everyone)"

    def _wait_new_master(self, old: int) -> None:
        def elected() -> bool:
            st = self.state()
            return bool(st) and int(st["masterId"]) not in (-1, old)  # type: ignore[index]

        wait_for(elected, timeout_s=HEAL_TIMEOUT_S, what=f"a master other than replica {old}", alive=self.alive)

    # ---- verification -----------------------------------------------------------------------
    def verify(self, producer: ProducerLoop, extra_bodies: list[str] = (),  # type: ignore[assignment]
               *, allow_loss: bool = False) -> dict[str, Any]:
        """Stop-the-world checks once ``producer`` stopped (and any other producer whose acknowledged bodies are
        ``extra_bodies``); raises AssertionError naming the violation. ``allow_loss`` (ASYNC replication):
        acknowledged messages missing are counted, not a violation; everything else still is."""
        st = self.wait_whole()
        master = self.replicas[int(st["masterId"])]

        def caught_up() -> int | None:
            ends = {rid: _max_phy(b) for rid, b in self.replicas.items()}
            values = set(ends.values())
            return values.pop() if len(values) == 1 and -1 not in ends.values() else None

        end = wait_for(caught_up, timeout_s=HEAL_TIMEOUT_S, what="every replica at the master's max phy offset",
                       alive=self.alive)
        master_log = commit_log_bytes(master.store_dir, end)
        for rid, broker in self.replicas.items():
            if broker is master:
                continue
            other = commit_log_bytes(broker.store_dir, end)
            assert other == master_log, f"replica {rid}'s commit log differs from the master's below {end}"
        records = read_records(master_log)
        mine = {b.addr for b in self.replicas.values()}
        acks = [a for a in producer.acks if a.host in mine]  # (a producer may also write to other groups)
        by_offset = {phy: body for phy, body in records}
        counts: dict[str, int] = {}
        for _phy, body in records:
            counts[body] = counts.get(body, 0) + 1
        lost = [a for a in acks if counts.get(a.body, 0) == 0]
        lost_extra = [b for b in extra_bodies if counts.get(b, 0) == 0]
        misplaced = [a for a in acks if counts.get(a.body) and by_offset.get(a.phy_offset) != a.body]
        entries = EpochFile(str(master.store_dir / EPOCH_FILE_NAME)).entries()
        ackers: dict[int, set[str]] = {}
        for a in acks:
            if by_offset.get(a.phy_offset) == a.body:  # a lost one's offset belongs to a later epoch
                ackers.setdefault(_epoch_at(entries, a.phy_offset), set()).add(a.host)
        split = {e: hosts for e, hosts in ackers.items() if len(hosts) > 1}
        overlaps = [r for r in self.rounds if r.overlap]
        duplicates = sum(c - 1 for body, c in counts.items() if c > 1 and body.startswith(producer.run_id))
        duplicates += sum(counts[b] - 1 for b in set(extra_bodies) if counts.get(b, 0) > 1)
        summary = {"send_ok": len(acks) + len(extra_bodies), "lost": len(lost) + len(lost_extra),
                   "misplaced": len(misplaced),
                   "duplicates": duplicates, "epochs": len(entries), "split_epochs": split,
                   "overlapping_rounds": len(overlaps), "log_end": end}
        margins = [r.new_first_ack_s - r.old_last_ack_s for r in self.rounds
                   if r.old_last_ack_s >= 0 and r.new_first_ack_s >= 0]
        if margins:  # seconds between the old master's last SEND_OK and the new master's first
            summary["ack_gap_min_s"] = round(min(margins), 3)
        if not allow_loss:
            assert not lost, f"{len(lost)} SEND_OK messages are not in the master's log, e.g. {lost[:3]}: {summary}"
            assert not lost_extra, f"{len(lost_extra)} acknowledged bodies are not in the log, e.g. {lost_extra[:3]}"
        assert not overlaps, f"the old master acknowledged after the new master had started to: {overlaps}"
        assert not misplaced, f"{len(misplaced)} SEND_OK offsets hold another record, e.g. {misplaced[:3]}"
        assert not split, f"two brokers acknowledged sends in one epoch: {split}"
        return summary


def verify_across(groups: Sequence[NemesisGroup], bodies: Sequence[str]) -> dict[str, Any]:
    """Several groups serving one topic: each group's own checks (replicas identical, one acknowledging broker
    per epoch), then every acknowledged body of ``bodies`` must be in one group's master log."""
    present: dict[str, int] = {}
    for g in groups:
        g.verify(ProducerLoop(g.ns.addr, "none"))
        master = g.master()
        for _phy, body in read_records(commit_log_bytes(master.store_dir, _max_phy(master))):
            present[body] = present.get(body, 0) + 1
    lost = [b for b in bodies if not present.get(b)]
    summary = {"send_ok": len(bodies), "lost": len(lost),
               "duplicates": sum(present[b] - 1 for b in set(bodies) if present.get(b, 0) > 1)}
    assert not lost, f"{len(lost)} acknowledged bodies are in no group's log, e.g. {lost[:3]}: {summary}"
    return summary


def longest_gap_s(oks: Sequence[tuple[float, float, str]], from_ms: float, to_ms: float) -> float:
    """The longest time between two consecutive SEND_OKs (end times, wall ms) within [from_ms, to_ms]."""
    ends = sorted(end for _start, end, _body in oks if from_ms <= end <= to_ms)
    if len(ends) < 2:
        return (to_ms - from_ms) / 1000
    return max(b - a for a, b in zip(ends, ends[1:], strict=False)) / 1000


def _max_phy(broker: Broker) -> int:
    try:
        resp = request(broker.addr, RequestCode.GET_BROKER_RUNTIME_INFO, timeout_ms=1000)
        table = (json_body(resp) or {}).get("table") or {}
        return int(table.get("commitLogMaxOffset", -1))
    except Exception:
        return -1


def _epoch_at(entries: list[Any], phy_offset: int) -> int:
    epoch = 0
    for e, start in entries:
        if start <= phy_offset:
            epoch = e
    return epoch


_HEAD = struct.Struct(">ii")


def read_records(log: bytes) -> list[tuple[int, str]]:
    """(phy offset, body) of every record of a commit log image starting at offset 0."""
    out = []
    pos = 0
    while pos + 8 <= len(log):
        size, magic = _HEAD.unpack_from(log, pos)
        if size <= 0:
            break
        if magic == BLANK_MAGIC_CODE:
            pos += size
            continue
        msg = decode_record(log, pos)
        out.append((pos, bytes(msg.body).decode(errors="replace")))
        pos += size
    return out
