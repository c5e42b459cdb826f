"""Check-quorum: a Raft leader cut off from the majority of its controllers stops answering brokers (and so
renews no master's lease) within QUORUM_CONTACT_MS, long before pysyncobj makes it step down (half the
heartbeat timeout; here 10 s, to leave the window wide open). Three controllers over real TCP in-process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ctl_support import FakeBroker, controller_config

from ferrymq.controller.config import Peer
from ferrymq.controller.raft import QUORUM_CONTACT_MS
from ferrymq.controller.server import ControllerServer
from ferrymq.remoting.codes import ResponseCode
from ferrymq.remoting.connection import connect
from support.aio import wait_for
from support.ports import LOOPBACK, free_port

#: pysyncobj's own step-down comes after half of this: 10 s
SLOW_FALLBACK_HEARTBEAT_TIMEOUT_MS = 20_000
LEADER_WAIT_S = 15.0
#: the refusal must come within the quorum window plus this much (scheduling on a loaded machine)
REFUSAL_SLACK_S = 2.0


@pytest.fixture
async def three_controllers(tmp_path: Path) -> AsyncIterator[list[ControllerServer]]:
    peers = [Peer(f"n{i}", f"{LOOPBACK}:{free_port()}") for i in range(3)]
    servers = [ControllerServer(controller_config(tmp_path / f"n{i}", peers=peers, self_id=f"n{i}",
                                                  heartbeat_timeout_ms=SLOW_FALLBACK_HEARTBEAT_TIMEOUT_MS))
               for i in range(3)]
    try:
        for server in servers:
            await server.start()
        yield servers
    finally:
        for server in servers:
            await server.stop()


async def test_isolated_leader_stops_renewing_leases_before_pysyncobj_steps_down(
        three_controllers: list[ControllerServer]) -> None:
    def one_leader() -> ControllerServer | None:
        leaders = [s for s in three_controllers if s.raft.is_leader]
        return leaders[0] if len(leaders) == 1 else None

    leader: ControllerServer = await wait_for(one_leader, timeout_s=LEADER_WAIT_S, what="one leader")
    conn = await connect(leader.addr)
    try:
        broker = FakeBroker(conn, "broker-q", 1)
        resp = await wait_for(lambda: _ok(broker), timeout_s=LEADER_WAIT_S, what="a heartbeat answered by the leader")
        assert resp.code == ResponseCode.SUCCESS
        assert leader.raft.has_quorum_contact()
        for server in three_controllers:  # the majority goes away: the leader is alone
            if server is not leader:
                await server.stop()
        t_cut = time.monotonic()
        refused = await wait_for(lambda: _refused(broker), timeout_s=QUORUM_CONTACT_MS / 1000 + REFUSAL_SLACK_S,
                                 what="the isolated leader to refuse heartbeats")
        waited_s = time.monotonic() - t_cut
        assert leader.raft.is_leader, "pysyncobj stepped down first: the test proves nothing"
        assert refused.code == ResponseCode.CONTROLLER_NOT_LEADER
        assert not refused.ext_fields.get("leaderAddr"), "an isolated leader must not name itself"
        assert waited_s < QUORUM_CONTACT_MS / 1000 + REFUSAL_SLACK_S
        assert not leader.raft.has_quorum_contact()
        # and it keeps refusing while pysyncobj still calls it leader
        again = await broker.heartbeat()
        assert again.code == ResponseCode.CONTROLLER_NOT_LEADER or not leader.raft.is_leader
    finally:
        conn.close()


async def _ok(broker: FakeBroker):  # type: ignore[no-untyped-def]
    resp = await broker.heartbeat()
    return resp if resp.code == ResponseCode.SUCCESS else None


async def _refused(broker: FakeBroker):  # type: ignore[no-untyped-def]
    resp = await asyncio.wait_for(broker.heartbeat(), 5)
    return resp if resp.code != ResponseCode.SUCCESS else None
