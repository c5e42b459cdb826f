"""A single-node controller over real TCP on 127.0.0.1: the requests of the contract, elections on
heartbeat timeout (manual clock), role-change notices, restart with the same store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ctl_support import (
    HEARTBEAT_TIMEOUT_MS,
    BrokerFactory,
    body,
    controller_config,
    start_controller,
)

from ferrymq.controller.server import ControllerServer
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import connect
from support.aio import wait_for
from support.clock import ManualClock

NAME = "broker-a"


async def request(addr: str, code: int, ext: dict[str, Any] | None = None, payload: Any = None) -> RemotingCommand:
    conn = await connect(addr)
    try:
        return await conn.invoke(RemotingCommand.request(code, ext or {}, jsonx.dumps(payload) if payload else b""))
    finally:
        conn.close()


async def test_first_heartbeat_elects_the_first_broker(controller: ControllerServer,
                                                       fake_broker: BrokerFactory) -> None:
    b1 = await fake_broker(NAME, 1)
    resp = await b1.heartbeat()
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    g = body(resp)
    assert (g["masterId"], g["masterEpoch"], g["syncStateSet"], g["syncStateSetEpoch"]) == (1, 1, [1], 1)
    assert g["masterAddr"] == "127.0.0.1:20001" and g["masterHaAddr"] == "127.0.0.1:30001"
    assert g["clusterName"] == "c1" and g["replicas"]["1"]["alive"] is True
    assert resp.ext_fields["masterEpoch"] == "1"
    b2 = await fake_broker(NAME, 2)
    g2 = body(await b2.heartbeat())
    assert g2["masterId"] == 1 and g2["masterEpoch"] == 1 and set(g2["replicas"]) == {"1", "2"}


@pytest.mark.parametrize("fields,missing", [
    ({"brokerName": None}, "brokerName"),
    ({"brokerId": None}, "brokerId"),
    ({"brokerId": "x"}, "brokerId"),
    ({"brokerId": 0}, "brokerId"),
    ({"brokerAddr": None}, "brokerAddr"),
])
async def test_malformed_heartbeat_is_invalid_request(controller: ControllerServer, fake_broker: BrokerFactory,
                                                      fields: dict[str, Any], missing: str) -> None:
    b = await fake_broker(NAME, 1)
    drop = [k for k, v in fields.items() if v is None]
    cmd_fields = {k: v for k, v in fields.items() if v is not None}
    full: dict[str, Any] = {"clusterName": "c1", "brokerName": NAME, "brokerId": 1, "brokerAddr": "h:1",
                            "haAddr": "h:2"}
    full.update(cmd_fields)
    for k in drop:
        full.pop(k)
    resp = await b.conn.invoke(RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, full))
    assert resp.code == ResponseCode.CONTROLLER_INVALID_REQUEST
    assert missing in (resp.remark or "")


async def test_alter_sync_state_set(controller: ControllerServer, fake_broker: BrokerFactory) -> None:
    b1, b2 = await fake_broker(NAME, 1), await fake_broker(NAME, 2)
    await b1.heartbeat()
    await b2.heartbeat()

    async def alter(name: str, master: int, epoch: int, ss_epoch: int, ids: Any) -> RemotingCommand:
        return await b1.conn.invoke(RemotingCommand.request(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
            "brokerName": name, "masterId": master, "masterEpoch": epoch, "syncStateSetEpoch": ss_epoch},
            jsonx.dumps({"syncStateSet": ids})))

    assert (await alter("nope", 1, 1, 1, [1])).code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST
    assert (await alter(NAME, 2, 1, 1, [1])).code == ResponseCode.CONTROLLER_INVALID_MASTER
    assert (await alter(NAME, 1, 0, 1, [1])).code == ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH
    assert (await alter(NAME, 1, 1, 7, [1])).code == ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    assert (await alter(NAME, 1, 1, 1, [2])).code == ResponseCode.CONTROLLER_INVALID_REPLICAS
    assert (await alter(NAME, 1, 1, 1, [1, 9])).code == ResponseCode.CONTROLLER_INVALID_REPLICAS
    assert (await alter(NAME, 1, 1, 1, "x")).code == ResponseCode.CONTROLLER_INVALID_REQUEST
    ok = await alter(NAME, 1, 1, 1, [2, 1])
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    g = body(ok)
    assert g["syncStateSet"] == [1, 2] and g["syncStateSetEpoch"] == 2 and g["masterEpoch"] == 1


async def test_dead_master_is_replaced_by_a_replica_in_the_set(controller: ControllerServer,
                                                               fake_broker: BrokerFactory,
                                                               clock: ManualClock) -> None:
    b1, b2, b3 = await fake_broker(NAME, 1), await fake_broker(NAME, 2), await fake_broker(NAME, 3)
    for b in (b1, b2, b3):
        await b.heartbeat()
    await b1.conn.invoke(RemotingCommand.request(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
        "brokerName": NAME, "masterId": 1, "masterEpoch": 1, "syncStateSetEpoch": 1},
        jsonx.dumps({"syncStateSet": [1, 2]})))
    clock.advance(HEARTBEAT_TIMEOUT_MS - 1)
    b3.max_phy_offset = 10_000  # more data, but not in the SyncStateSet
    await b2.heartbeat()
    await b3.heartbeat()
    await controller.core.scan_once()
    assert controller.raft.group(NAME).master_id == 1  # type: ignore[union-attr]
    clock.advance(1)
    await controller.core.scan_once()
    group = controller.raft.group(NAME)
    assert group is not None
    assert (group.master_id, group.master_epoch, group.sync_state_set, group.sync_state_set_epoch) == (2, 2, [2], 3)
    await wait_for(lambda: b2.notices and b3.notices, what="role-change notices")
    assert b2.notices[-1]["masterId"] == 2 and b2.notices[-1]["masterEpoch"] == 2
    # the old master comes back as a replica: the heartbeat answer names the new master
    g = body(await b1.heartbeat())
    assert g["masterId"] == 2 and g["masterAddr"] == "127.0.0.1:20002"


async def test_no_eligible_replica_leaves_the_group_without_master(controller: ControllerServer,
                                                                   fake_broker: BrokerFactory,
                                                                   clock: ManualClock) -> None:
    b1, b2 = await fake_broker(NAME, 1), await fake_broker(NAME, 2)
    await b1.heartbeat()
    await b2.heartbeat()
    clock.advance(HEARTBEAT_TIMEOUT_MS)
    g = body(await b2.heartbeat())  # 2 is alive but not in the SyncStateSet {1}
    assert g["masterId"] == -1 and g["masterAddr"] == "" and g["masterEpoch"] == 1
    resp = await request(controller.addr, RequestCode.CONTROLLER_ELECT_MASTER, {"brokerName": NAME})
    assert resp.code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE
    # the operator may still pick 2
    resp = await request(controller.addr, RequestCode.CONTROLLER_ELECT_MASTER, {"brokerName": NAME, "brokerId": 2})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert body(resp)["masterId"] == 2 and body(resp)["masterEpoch"] == 2


@pytest.mark.parametrize("controller_settings", [{"elect_unclean": True}])
async def test_unclean_election_when_enabled(controller: ControllerServer, fake_broker: BrokerFactory,
                                             clock: ManualClock) -> None:
    b1, b2 = await fake_broker(NAME, 1), await fake_broker(NAME, 2)
    await b1.heartbeat()
    await b2.heartbeat()
    clock.advance(HEARTBEAT_TIMEOUT_MS)
    g = body(await b2.heartbeat())
    assert g["masterId"] == 2 and g["masterEpoch"] == 2


async def test_manual_election(controller: ControllerServer, fake_broker: BrokerFactory) -> None:
    b1, b2 = await fake_broker(NAME, 1), await fake_broker(NAME, 2)
    await b1.heartbeat()
    await b2.heartbeat()
    addr = controller.addr
    code = RequestCode.CONTROLLER_ELECT_MASTER
    assert (await request(addr, code, {"brokerName": "zz"})).code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST
    assert (await request(addr, code, {"brokerName": NAME, "brokerId": 7})).code == \
        ResponseCode.CONTROLLER_BROKER_NOT_ALIVE
    assert (await request(addr, code, {})).code == ResponseCode.CONTROLLER_INVALID_REQUEST
    same = await request(addr, code, {"brokerName": NAME})  # the master is alive: stays
    assert same.code == ResponseCode.SUCCESS and body(same)["masterEpoch"] == 1
    switched = await request(addr, code, {"brokerName": NAME, "brokerId": 2})
    assert switched.code == ResponseCode.SUCCESS and body(switched)["masterId"] == 2
    await wait_for(lambda: b1.notices, what="notice to the old master")
    assert b1.notices[-1]["masterId"] == 2


async def test_reads(controller: ControllerServer, fake_broker: BrokerFactory) -> None:
    b1 = await fake_broker(NAME, 1)
    await b1.heartbeat()
    await (await fake_broker("broker-b", 1)).heartbeat()
    addr = controller.addr
    info = await request(addr, RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": NAME})
    assert info.code == ResponseCode.SUCCESS and body(info)["masterId"] == 1
    missing = await request(addr, RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": "zz"})
    assert missing.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST
    data = body(await request(addr, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA))
    assert [g["brokerName"] for g in data["groups"]] == [NAME, "broker-b"]
    one = body(await request(addr, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, {"brokerName": "broker-b"}))
    assert [g["brokerName"] for g in one["groups"]] == ["broker-b"]
    meta = await request(addr, RequestCode.CONTROLLER_GET_METADATA_INFO)
    m = body(meta)
    assert m["isLeader"] is True and m["leaderAddr"] == controller.addr and m["selfId"] == "n0"
    assert meta.ext_fields["isLeader"] == "true" and meta.ext_fields["controllerLeaderAddress"] == controller.addr


async def test_restart_keeps_the_state(tmp_path: Path, clock: ManualClock) -> None:
    cfg = controller_config(tmp_path / "ctl")
    server = await start_controller(cfg, clock)
    try:
        conn = await connect(server.addr)
        for rid in (1, 2):
            resp = await conn.invoke(RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, {
                "clusterName": "c1", "brokerName": NAME, "brokerId": rid, "brokerAddr": f"h:{rid}",
                "haAddr": f"h:{rid + 10}"}))
            assert resp.code == ResponseCode.SUCCESS
        resp = await conn.invoke(RemotingCommand.request(RequestCode.CONTROLLER_ELECT_MASTER,
                                                         {"brokerName": NAME, "brokerId": 2}))
        assert body(resp)["masterEpoch"] == 2
        conn.close()
    finally:
        await server.stop()
    again = await start_controller(controller_config(tmp_path / "ctl"), clock)
    try:
        group = again.raft.group(NAME)
        assert group is not None
        assert (group.master_id, group.master_epoch, sorted(group.replicas)) == (2, 2, [1, 2])
        # every replica gets a grace of one timeout on the new leader: no election right away
        await again.core.scan_once()
        assert again.raft.group(NAME).master_epoch == 2  # type: ignore[union-attr]
    finally:
        await again.stop()
