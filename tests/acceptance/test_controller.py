"""Controller mode with real ``ferry controller`` processes (Raft over 127.0.0.1) and a fake broker that
speaks plain remoting frames (BROKER_HEARTBEAT every 300 ms, following 2007 redirects to the leader).

(a) three controllers: a leader is elected, the first replica becomes master of epoch 1; a follower answers
    2007 with the leader's listen address, and ``ferry controller status`` through a follower shows the
    group; the Raft leader SIGKILLed: another controller leads with the same state; the master's heartbeats
    stop: the other replica of the SyncStateSet is elected (epoch 2); ``ferry ha elect`` switches back.
(b) one controller SIGKILLed and restarted on its store keeps the state.
(c) ``ferry namesrv -c namesrv.conf`` with enableControllerInNamesrv=true serves both ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from procs import (
    LOOPBACK,
    ManagedProcess,
    ProcessGroup,
    cluster_info,
    ferry_argv,
    free_port,
    json_body,
    port_answers,
    request,
    wait_for,
    write_properties,
)

from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection, connect

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(150)]

NAME = "broker-a"
#: controllers' broker heartbeat timeout (the default)
HEARTBEAT_TIMEOUT_MS = 3000
HEARTBEAT_PERIOD_S = 0.3
START_TIMEOUT_S = 30.0
#: a new leader after a SIGKILL: Raft election (< 2 s) + redirect map
FAILOVER_TIMEOUT_S = 20.0
#: a dead master replaced: leader grace + heartbeat timeout + scan, with margin
ELECTION_TIMEOUT_S = 25.0
CLI_TIMEOUT_S = 30.0


class FakeBroker:
    """Heartbeats for replicas of one group from a thread with its own event loop."""

    def __init__(self, controllers: list[str]) -> None:
        self.controllers = list(controllers)
        self.active: set[int] = set()
        self.offsets: dict[int, int] = {}
        self.last: dict[int, dict[str, Any]] = {}
        self.leader: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._conns: dict[str, Connection] = {}

    def start(self) -> FakeBroker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    async def _conn(self, addr: str) -> Connection:
        conn = self._conns.get(addr)
        if conn is None or conn.closed:
            conn = self._conns[addr] = await connect(addr, timeout_ms=500)
        return conn

    async def _beat(self, rid: int) -> None:
        order = ([self.leader] if self.leader else []) + [a for a in self.controllers if a != self.leader]
        for addr in order:
            try:
                conn = await self._conn(addr)
                resp = await conn.invoke(RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, {
                    "clusterName": "c1", "brokerName": NAME, "brokerId": rid,
                    "brokerAddr": f"{LOOPBACK}:{20000 + rid}", "haAddr": f"{LOOPBACK}:{30000 + rid}",
                    "epoch": 0, "maxPhyOffset": self.offsets.get(rid, 0), "confirmOffset": 0}), 1000)
            except Exception:
                continue
            if resp.code == ResponseCode.SUCCESS:
                self.leader = addr
                self.last[rid] = jsonx.loads(resp.body)
                return
            if resp.code == ResponseCode.CONTROLLER_NOT_LEADER and resp.ext_fields.get("leaderAddr"):
                self.leader = resp.ext_fields["leaderAddr"]

    async def _run(self) -> None:
        while not self._stop.is_set():
            await asyncio.gather(*(self._beat(rid) for rid in sorted(self.active)))
            await asyncio.sleep(HEARTBEAT_PERIOD_S)
        for conn in self._conns.values():
            conn.close()


@contextlib.contextmanager
def fake_broker(controllers: list[str]) -> Any:
    broker = FakeBroker(controllers).start()
    try:
        yield broker
    finally:
        broker.stop()


def start_controller(procs: ProcessGroup, tmp_path: Path, name: str, props: dict[str, Any]) -> ManagedProcess:
    conf = write_properties(tmp_path / f"{name}.conf", props)
    proc = procs.spawn(name, ferry_argv("controller", "-c", str(conf)))
    port = int(props["controllerListenPort"])
    wait_for(lambda: port_answers(port), timeout_s=START_TIMEOUT_S, what=f"{name} to listen", alive=[proc])
    return proc


def metadata(addr: str) -> dict[str, Any] | None:
    try:
        resp = request(addr, RequestCode.CONTROLLER_GET_METADATA_INFO, timeout_ms=1000)
    except Exception:
        return None
    return json_body(resp) if resp.code == ResponseCode.SUCCESS else None


def replica_info(addr: str) -> RemotingCommand:
    return request(addr, RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": NAME}, timeout_ms=1000)


def leader_state(addrs: list[str]) -> tuple[str, dict[str, Any]] | None:
    """(leader listen addr, GroupState) from whichever controller answers SUCCESS."""
    for addr in addrs:
        try:
            resp = replica_info(addr)
        except Exception:
            continue
        if resp.code == ResponseCode.SUCCESS:
            return addr, json_body(resp)
    return None


def ferry(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")  # the rich table is not cut
    return subprocess.run(ferry_argv(*args), capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env)


def test_three_controllers_failover(procs: ProcessGroup, tmp_path: Path) -> None:
    raft_ports = [free_port() for _ in range(3)]
    listen_ports = [free_port() for _ in range(3)]
    peers = ";".join(f"n{i}-{LOOPBACK}:{p}" for i, p in enumerate(raft_ports))
    addrs = [f"{LOOPBACK}:{p}" for p in listen_ports]
    ctl: dict[str, ManagedProcess] = {}
    for i in range(3):
        ctl[addrs[i]] = start_controller(procs, tmp_path, f"controller-n{i}", {
            "controllerPeers": peers, "controllerSelfId": f"n{i}", "controllerStorePath": tmp_path / f"store-n{i}",
            "controllerListenPort": listen_ports[i], "listenHost": LOOPBACK,
            "controllerBrokerHeartbeatTimeoutMs": HEARTBEAT_TIMEOUT_MS})

    def all_agree() -> str | None:
        metas = [metadata(a) for a in addrs]
        leaders = {m["leaderAddr"] for m in metas if m}
        if None in metas or len(leaders) != 1 or "" in leaders:
            return None
        return leaders.pop()

    leader = wait_for(all_agree, timeout_s=START_TIMEOUT_S, what="three controllers agreeing on a leader",
                      alive=ctl.values())
    followers = [a for a in addrs if a != leader]

    with fake_broker(addrs) as broker:
        broker.offsets = {1: 1000, 2: 900}
        broker.active = {1}
        wait_for(lambda: broker.last.get(1, {}).get("masterId") == 1, timeout_s=START_TIMEOUT_S,
                 what="replica 1 master")
        broker.active = {1, 2}
        wait_for(lambda: "2" in broker.last.get(2, {}).get("replicas", {}), timeout_s=START_TIMEOUT_S,
                 what="replica 2 known")
        # the master takes 2 into its SyncStateSet
        resp = request(leader, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
            "brokerName": NAME, "masterId": 1, "masterEpoch": 1, "syncStateSetEpoch": 1},
            jsonx.dumps({"syncStateSet": [1, 2]}))
        assert resp.code == ResponseCode.SUCCESS, resp.remark

        # a follower redirects to the leader
        redirect = replica_info(followers[0])
        assert redirect.code == ResponseCode.CONTROLLER_NOT_LEADER
        assert redirect.ext_fields.get("leaderAddr") == leader
        out = ferry("controller", "status", "--controller", followers[1], "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        [group] = report["groups"]
        assert (group["masterId"], group["masterEpoch"], group["syncStateSet"]) == (1, 1, [1, 2])
        assert group["replicas"]["2"]["alive"] is True and group["replicas"]["2"]["maxPhyOffset"] == 900
        assert report["controller"]["leaderAddr"] == leader
        table = ferry("controller", "status", "--controller", ";".join(addrs))
        assert table.returncode == 0 and NAME in table.stdout and "master" in table.stdout, table.stderr
        # mqadmin getSyncStateSet / getControllerMetaData
        one = ferry("controller", "sync-state-set", "--controller", followers[0], "-b", NAME, "--json")
        assert one.returncode == 0, one.stderr
        assert json.loads(one.stdout)["syncStateSet"] == [1, 2]
        missing = ferry("controller", "sync-state-set", "--controller", followers[0], "-b", "no-such-group")
        assert missing.returncode == 1 and "no-such-group" in missing.stderr
        meta = ferry("controller", "metadata", "--controller", followers[0], "--json")
        assert meta.returncode == 0 and json.loads(meta.stdout)["leaderAddr"] == leader, meta.stderr

        # SIGKILL the Raft leader: another controller leads with the same state
        ctl[leader].kill()
        survivors = followers

        def new_leader() -> tuple[str, dict[str, Any]] | None:
            found = leader_state(survivors)
            return found if found and found[1]["masterEpoch"] >= 1 else None

        leader2, state2 = wait_for(new_leader, timeout_s=FAILOVER_TIMEOUT_S, what="a new controller leader")
        assert (state2["masterId"], state2["masterEpoch"], state2["syncStateSet"], state2["syncStateSetEpoch"]) \
            == (1, 1, [1, 2], 2)
        other = [a for a in survivors if a != leader2][0]
        wait_for(lambda: replica_info(other).ext_fields.get("leaderAddr") == leader2,
                 timeout_s=FAILOVER_TIMEOUT_S, what="the follower to redirect to the new leader")

        # the master's heartbeats stop: replica 2 (in the SyncStateSet) is elected on the new leader
        broker.active = {2}

        def elected() -> dict[str, Any] | None:
            found = leader_state(survivors)
            return found[1] if found and found[1]["masterId"] == 2 else None

        g = wait_for(elected, timeout_s=ELECTION_TIMEOUT_S, what="replica 2 elected after the timeout")
        assert (g["masterEpoch"], g["syncStateSet"]) == (2, [2])
        assert g["masterAddr"] == f"{LOOPBACK}:20002"
        wait_for(lambda: broker.last.get(2, {}).get("masterEpoch") == 2, timeout_s=5, what="heartbeat answer")

        # manual switchover back to 1 (dead: refused; alive again: done)
        refused = ferry("ha", "elect", "--controller", ";".join(survivors), "--broker-name", NAME, "--broker-id", "1")
        assert refused.returncode == 1 and "2006" in refused.stderr, refused.stderr
        broker.active = {1, 2}
        wait_for(lambda: 1 in broker.last and broker.last[1].get("masterEpoch") == 2, timeout_s=5,
                 what="replica 1 heard again")

        def switched() -> dict[str, Any] | None:
            res = ferry("ha", "elect", "--controller", other, "--broker-name", NAME, "--broker-id", "1", "--json")
            return json.loads(res.stdout) if res.returncode == 0 else None

        g3 = wait_for(switched, timeout_s=ELECTION_TIMEOUT_S, what="ferry ha elect -i 1")
        assert (g3["masterId"], g3["masterEpoch"], g3["syncStateSet"]) == (1, 3, [1])


def test_single_controller_restart_keeps_state(procs: ProcessGroup, tmp_path: Path) -> None:
    port = free_port()
    addr = f"{LOOPBACK}:{port}"
    props = {"controllerStorePath": tmp_path / "store", "controllerListenPort": port, "listenHost": LOOPBACK}
    proc = start_controller(procs, tmp_path, "controller", props)
    with fake_broker([addr]) as broker:
        broker.active = {1, 2}
        wait_for(lambda: len(broker.last.get(2, {}).get("replicas", {})) == 2, timeout_s=START_TIMEOUT_S,
                 what="both replicas known", alive=[proc])
        resp = request(addr, RequestCode.CONTROLLER_ELECT_MASTER, {"brokerName": NAME, "brokerId": 2})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        before = json_body(resp)
        assert (before["masterId"], before["masterEpoch"]) == (2, 2)
        broker.active = set()
    proc.kill()
    proc.start()  # same argv, same store

    def restored() -> dict[str, Any] | None:
        try:
            resp = replica_info(addr)
        except Exception:
            return None
        return json_body(resp) if resp.code == ResponseCode.SUCCESS else None

    after = wait_for(restored, timeout_s=START_TIMEOUT_S, what="the restarted controller answering", alive=[proc])
    assert (after["masterId"], after["masterEpoch"], after["syncStateSet"], after["syncStateSetEpoch"]) == \
        (before["masterId"], before["masterEpoch"], before["syncStateSet"], before["syncStateSetEpoch"])
    assert sorted(after["replicas"]) == ["1", "2"]
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(START_TIMEOUT_S) == 0


def test_controller_in_namesrv(procs: ProcessGroup, tmp_path: Path) -> None:
    ns_port, ctl_port = free_port(), free_port()
    conf = write_properties(tmp_path / "namesrv.conf", {
        "listenHost": LOOPBACK, "listenPort": ns_port, "enableControllerInNamesrv": True,
        "controllerListenPort": ctl_port, "controllerStorePath": tmp_path / "ctl"})
    proc = procs.spawn("namesrv", ferry_argv("namesrv", "-c", str(conf)))
    ns_addr, ctl_addr = f"{LOOPBACK}:{ns_port}", f"{LOOPBACK}:{ctl_port}"
    wait_for(lambda: port_answers(ns_port) and cluster_info(ns_addr) is not None, timeout_s=START_TIMEOUT_S,
             what="name server", alive=[proc])
    wait_for(lambda: (metadata(ctl_addr) or {}).get("isLeader"), timeout_s=START_TIMEOUT_S,
             what="embedded controller leading", alive=[proc])
    resp = request(ctl_addr, RequestCode.BROKER_HEARTBEAT, {
        "clusterName": "c1", "brokerName": NAME, "brokerId": 1, "brokerAddr": f"{LOOPBACK}:1", "haAddr": ""})
    assert resp.code == ResponseCode.SUCCESS and json_body(resp)["masterId"] == 1
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(START_TIMEOUT_S) == 0
