"""The broker's side of controller mode (broker/controller_mode.py) against a scripted controller in the same
event loop: role changes, epoch entries, SyncStateSet changes, truncation of a deposed master's tail, the lease.
(The real controller and real processes: tests/controller/ and tests/acceptance/test_failover_controller.py.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from broker_helpers import Client, make_config, send_v1, wait_for
from test_metrics import scrape

from ferrymq.broker.app import BrokerController
from ferrymq.client import Admin, ops_admin
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher, connect
from ferrymq.remoting.server import RemotingServer

pytestmark = pytest.mark.asyncio


class ScriptedController:
    """Answers heartbeats with the state the test sets; records what brokers report; applies
    SyncStateSet changes with the controller's epoch checks. ``silent``: heartbeats get no answer."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"masterId": -1, "masterAddr": "", "masterHaAddr": "", "masterEpoch": 0,
                                      "syncStateSet": [], "syncStateSetEpoch": 0}
        self.reports: dict[int, dict[str, str]] = {}
        self.silent = False
        self.alters: list[list[int]] = []
        self.conns: dict[int, Connection] = {}
        d = Dispatcher()
        d.register(RequestCode.BROKER_HEARTBEAT, self._heartbeat)
        d.register(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, self._alter)
        self.server = RemotingServer(d, "127.0.0.1", 0)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def elect(self, replica_id: int) -> None:
        rep = self.reports[replica_id]
        self.state.update(masterId=replica_id, masterAddr=rep["brokerAddr"], masterHaAddr=rep["haAddr"],
                          masterEpoch=self.state["masterEpoch"] + 1, syncStateSet=[replica_id],
                          syncStateSetEpoch=self.state["syncStateSetEpoch"] + 1)
        for conn in self.conns.values():
            if not conn.closed:
                conn.invoke_oneway(RemotingCommand.request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, {}))

    def _answer(self, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=jsonx.dumps(self.state))

    async def _heartbeat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        if self.silent:
            await asyncio.sleep(3600)  # the broker's invoke times out
        rid = int(cmd.ext_fields["brokerId"])
        self.reports[rid] = dict(cmd.ext_fields)
        self.conns[rid] = conn
        return self._answer(cmd)

    def _alter(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        f = cmd.ext_fields
        if int(f["masterId"]) != self.state["masterId"]:
            return cmd.response(ResponseCode.CONTROLLER_INVALID_MASTER, remark="not master")
        if int(f["masterEpoch"]) != self.state["masterEpoch"]:
            return cmd.response(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH, remark="epoch")
        if int(f["syncStateSetEpoch"]) != self.state["syncStateSetEpoch"]:
            return cmd.response(ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH, remark="sss epoch")
        new = sorted(jsonx.loads(cmd.body)["syncStateSet"])
        self.alters.append(new)
        self.state.update(syncStateSet=new, syncStateSetEpoch=self.state["syncStateSetEpoch"] + 1)
        return self._answer(cmd)


def _broker(tmp_path: Path, name: str, replica_id: int, controller: str) -> BrokerController:
    cfg = make_config(str(tmp_path / name), None, enable_controller_mode=True, controller_addr=[controller],
                      metrics_port=0, listen_host="127.0.0.1",
                      broker_id=replica_id, listen_port=0, ha_listen_port=0, fast_listen_enable=False,
                      controller_heartbeat_period_ms=100, controller_lease_ms=600,
                      ha_max_time_slave_not_catchup_ms=1000, ha_send_heartbeat_interval_ms=200)
    return BrokerController(cfg)


async def _send(broker: BrokerController, body: bytes) -> RemotingCommand:
    client = await Client().open(broker.broker_addr)
    try:
        return await client.call(RequestCode.SEND_MESSAGE, send_v1("CtlTopic"), body)
    finally:
        client.close()


async def _log_prefix(broker: BrokerController, end: int) -> bytes:
    out = bytearray()
    while len(out) < end:
        chunk = broker.store.read_from(len(out), end - len(out))
        assert chunk, f"no bytes at {len(out)}"
        out += chunk
    return bytes(out)


async def test_roles_epochs_sync_state_set_and_switchover(tmp_path: Path) -> None:
    ctl = ScriptedController()
    await ctl.server.start()
    b1, b2 = _broker(tmp_path, "b1", 1, ctl.addr), _broker(tmp_path, "b2", 2, ctl.addr)
    try:
        await b1.start()
        await b2.start()
        await wait_for(lambda: 1 in ctl.reports and 2 in ctl.reports)
        # before any election nobody takes writes
        assert (await _send(b1, b"early")).code == ResponseCode.SERVICE_NOT_AVAILABLE
        ctl.elect(1)
        r1, r2 = b1.controller_role, b2.controller_role
        assert r1 is not None and r2 is not None
        await wait_for(lambda: r1.can_ack() and r2.ha_client.connected)
        assert r1.epoch_file.entries() == [(1, 0)]
        # the slave catches up and the master asks the controller to add it
        await wait_for(lambda: ctl.state["syncStateSet"] == [1, 2])
        await wait_for(lambda: r1.ha_master.sync_state_set == {1, 2})
        for i in range(20):
            resp = await _send(b1, b"m%d" % i)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert (await _send(b2, b"to-slave")).code == ResponseCode.SERVICE_NOT_AVAILABLE
        end1 = int(b1.store.max_phy_offset)
        await wait_for(lambda: b2.store.max_phy_offset == end1)
        assert b1.metrics_server is not None and b2.metrics_server is not None
        m1, m2 = await scrape(b1.metrics_server.port), await scrape(b2.metrics_server.port)
        assert m1[("ferrymq_controller_is_master", ())] == 1 and m2[("ferrymq_controller_is_master", ())] == 0
        assert m1[("ferrymq_controller_master_epoch", ())] == 1
        assert m1[("ferrymq_controller_sync_state_set_size", ())] == 2
        assert m1[("ferrymq_controller_lease_valid", ())] == 1
        await wait_for(lambda: r1.ha_master.slave_status()[0]["ackPhyOffset"] == end1)
        m1 = await scrape(b1.metrics_server.port)
        assert m1[("ferrymq_ha_slave_lag_bytes", (("slave", "replica-2"),))] == 0
        # the runtime info `ferry ha status` and `cluster list` read names the in-sync replica, as a classic master
        info = b1.runtime_info()
        assert info["haSlaveCount"] == "1"
        [link] = orjson.loads(info["haSlaves"])
        assert link["replicaId"] == 2 and link["ackOffset"] == end1 and link["lagBytes"] == 0
        assert link["inSyncStateSet"] is True

        # switchover: 2 becomes master of epoch 2, 1 follows it
        ctl.elect(2)
        await wait_for(lambda: r2.can_ack() and not r1.is_master and r1.ha_client.connected)
        assert (await _send(b1, b"old-master")).code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert r2.epoch_file.entries() == [(1, 0), (2, end1)]
        for i in range(5):
            assert (await _send(b2, b"n%d" % i)).code == ResponseCode.SUCCESS
        end2 = int(b2.store.max_phy_offset)
        await wait_for(lambda: b1.store.max_phy_offset == end2)
        assert r1.epoch_file.entries() == r2.epoch_file.entries()
        assert await _log_prefix(b1, end2) == await _log_prefix(b2, end2)
        # GET_BROKER_EPOCH_CACHE (mqadmin getBrokerEpoch): each epoch's commit-log range
        conn = await connect(b2.broker_addr, timeout_ms=3000)
        try:
            resp = await conn.invoke(RemotingCommand.request(RequestCode.GET_BROKER_EPOCH_CACHE), 3000)
        finally:
            conn.close()
        body = orjson.loads(resp.body)
        assert resp.code == ResponseCode.SUCCESS and body["brokerId"] == 2 and body["maxOffset"] == end2
        assert body["epochList"] == [{"epoch": 1, "startOffset": 0, "endOffset": end1},
                                     {"epoch": 2, "startOffset": end1, "endOffset": end2}]
        # ... as `ferry broker epoch` reads it from every replica the name server lists (here: both)
        async with Admin("127.0.0.1:1") as admin:
            async def both() -> dict[str, Any]:
                return {"brokerAddrTable": {"b": {"cluster": "c", "brokerAddrs": {0: b2.broker_addr,
                                                                                  1: b1.broker_addr}}}}
            admin.cluster_info = both  # type: ignore[method-assign]
            rows = await ops_admin.broker_epochs(admin, "b")
        assert [(r["replicaId"], r["epoch"], r["startOffset"], r["endOffset"]) for r in rows] == [
            (2, 1, 0, end1), (2, 2, end1, end2), (1, 1, 0, end1), (1, 2, end1, end2)]
        # both serve the topic: the new master adopted it from its own queues if the config had not synced
        assert b2.topics.get("CtlTopic") is not None and b2.topics.get("CtlTopic").perm == 6
        await wait_for(lambda: b1.topics.get("CtlTopic") is not None)
    finally:
        await b2.stop()
        await b1.stop()
        await ctl.server.stop()


async def test_deposed_master_tail_is_cut_and_lease_lapse_refuses_sends(tmp_path: Path) -> None:
    ctl = ScriptedController()
    await ctl.server.start()
    b1, b2 = _broker(tmp_path, "b1", 1, ctl.addr), _broker(tmp_path, "b2", 2, ctl.addr)
    try:
        await b1.start()
        await wait_for(lambda: 1 in ctl.reports)
        ctl.elect(1)
        r1 = b1.controller_role
        assert r1 is not None
        await wait_for(r1.can_ack)
        for i in range(10):
            assert (await _send(b1, b"a%d" % i)).code == ResponseCode.SUCCESS
        common = int(b1.store.max_phy_offset)
        await b2.start()
        r2 = b2.controller_role
        assert r2 is not None
        await wait_for(lambda: b2.store.max_phy_offset == common)
        await b2.stop()  # replica 2 is gone; the master writes a tail nobody else has
        for i in range(7):
            assert (await _send(b1, b"tail%d" % i)).code == ResponseCode.SUCCESS
        tail_end = int(b1.store.max_phy_offset)
        assert tail_end > common
        # the controller loses the master (no master for now: replica 1 steps down, keeping its tail), then
        # replica 2 comes back and is elected (as an unclean election would): it writes its own epoch
        ctl.state.update(masterId=-1, masterAddr="", masterHaAddr="")
        await wait_for(lambda: not r1.is_master)
        assert (await _send(b1, b"no-master")).code == ResponseCode.SERVICE_NOT_AVAILABLE
        b2 = _broker(tmp_path, "b2", 2, ctl.addr)
        await b2.start()
        r2 = b2.controller_role
        assert r2 is not None
        await wait_for(lambda: 2 in ctl.reports and int(ctl.reports[2]["maxPhyOffset"]) == common)
        ctl.elect(2)
        await wait_for(r2.can_ack)
        for i in range(3):
            assert (await _send(b2, b"b%d" % i)).code == ResponseCode.SUCCESS
        end = int(b2.store.max_phy_offset)
        # the old master steps down, its handshake cuts the tail at the common point and it copies epoch 2
        await wait_for(lambda: not r1.is_master and r1.ha_client.truncations == 1
                       and b1.store.max_phy_offset == end, what=f"old master rejoins: {r1.status()}")
        assert await _log_prefix(b1, end) == await _log_prefix(b2, end)
        assert r1.epoch_file.entries() == [(1, 0), (2, common)]
        # the name servers see the master as brokerId 0 and the slave under its own id
        assert b2.registrar is not None and b1.registrar is not None
        assert b2.registrar.current_broker_id == 0 and b1.registrar.current_broker_id == 1
        # lease: the controller stops answering; within the lease the master stops acknowledging
        ctl.silent = True
        started = time.monotonic()
        await wait_for(lambda: not r2.can_ack())
        assert time.monotonic() - started < 2.0
        resp = await _send(b2, b"late")
        assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE and "lease" in (resp.remark or "")
        # ... and no longer registers as the master: a paused old master that resumes never takes the route
        # back from a new one
        assert b2.registrar.current_broker_id == 2
    finally:
        await b2.stop()
        await b1.stop()
        await ctl.server.stop()


async def test_delayed_messages_are_delivered_by_the_new_master(tmp_path: Path) -> None:
    """Delayed delivery moves with the master: a message sent with delay level 2 (5 s) to master 1, which is
    deposed at once, is delivered to its topic by master 2."""
    ctl = ScriptedController()
    await ctl.server.start()
    b1, b2 = _broker(tmp_path, "b1", 1, ctl.addr), _broker(tmp_path, "b2", 2, ctl.addr)
    try:
        await b1.start()
        await b2.start()
        await wait_for(lambda: 1 in ctl.reports and 2 in ctl.reports)
        ctl.elect(1)
        r1, r2 = b1.controller_role, b2.controller_role
        assert r1 is not None and r2 is not None
        await wait_for(lambda: r1.can_ack() and ctl.state["syncStateSet"] == [1, 2])
        client = await Client().open(b1.broker_addr)
        try:
            resp = await client.call(RequestCode.SEND_MESSAGE, send_v1("DelayTopic", properties="DELAY\x012\x02"),
                                     b"later")
        finally:
            client.close()
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert b1.store.get_max_offset_in_queue("DelayTopic", 0) == 0  # not delivered yet
        await wait_for(lambda: b2.store.max_phy_offset == b1.store.max_phy_offset)
        ctl.elect(2)
        await wait_for(lambda: r2.can_ack() and not r1.is_master)
        await wait_for(lambda: b2.store.get_max_offset_in_queue("DelayTopic", 0) == 1, timeout_s=15,
                       what="the delayed message delivered by the new master")
    finally:
        await b2.stop()
        await b1.stop()
        await ctl.server.stop()


async def test_a_master_deposed_and_elected_again_keeps_what_it_wrote(tmp_path: Path) -> None:
    """A master that steps down, follows the new master without receiving anything (its log already ended
    where the new epoch starts) and is elected again before any transfer keeps every record it wrote as master:
    they are complete, not a half-copied tail (found by the nemesis: a replica re-elected this way cut 2.7 MB of
    acknowledged messages, and the other replicas cut them after it)."""
    ctl = ScriptedController()
    await ctl.server.start()
    b1, b2 = _broker(tmp_path, "b1", 1, ctl.addr), _broker(tmp_path, "b2", 2, ctl.addr)
    try:
        await b1.start()
        await b2.start()
        await wait_for(lambda: 1 in ctl.reports and 2 in ctl.reports)
        ctl.elect(1)
        r1, r2 = b1.controller_role, b2.controller_role
        assert r1 is not None and r2 is not None
        await wait_for(lambda: ctl.state["syncStateSet"] == [1, 2] and r1.ha_master.sync_state_set == {1, 2})
        for i in range(20):
            assert (await _send(b1, b"m%d" % i)).code == ResponseCode.SUCCESS
        end1 = int(b1.store.max_phy_offset)
        ctl.elect(2)  # 2 has everything: the epoch starts at end1, 1 follows without a cut and gets nothing
        await wait_for(lambda: r2.can_ack() and not r1.is_master and r1.ha_client.connected)
        assert int(b1.store.max_phy_offset) == end1
        ctl.state["syncStateSet"] = [1, 2]
        ctl.elect(1)  # elected again before anything was written in epoch 2
        await wait_for(lambda: r1.can_ack())
        assert int(b1.store.max_phy_offset) == end1, "the re-elected master cut records it wrote itself"
        assert (await _send(b1, b"after")).code == ResponseCode.SUCCESS
    finally:
        await b2.stop()
        await b1.stop()
        await ctl.server.stop()
