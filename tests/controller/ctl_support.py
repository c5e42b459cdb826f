"""Helpers of the controller tests: single-node controllers on 127.0.0.1 (port 0) with a manual clock, and a
fake broker speaking raw remoting frames."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ferrymq.controller.config import ControllerConfig
from ferrymq.controller.server import ControllerServer
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.connection import Connection
from support.aio import wait_for
from support.clock import ManualClock
from support.ports import LOOPBACK

T0_MS = 1_000_000
HEARTBEAT_TIMEOUT_MS = 3000
#: a single node elects itself within pysyncobj's election timeout (<= 1 s)
LEADER_WAIT_S = 10.0


def controller_config(store: Path, **kw: Any) -> ControllerConfig:
    cfg = ControllerConfig(store_path=str(store), listen_port=0, listen_host=LOOPBACK,
                           heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    for key, value in kw.items():
        setattr(cfg, key, value)
    cfg.validate()
    return cfg


async def start_controller(cfg: ControllerConfig, clock: ManualClock) -> ControllerServer:
    server = ControllerServer(cfg, clock_ms=clock)
    await server.start()
    try:
        await wait_for(lambda: server.raft.is_leader, timeout_s=LEADER_WAIT_S, what="single node is leader")
        await server.core.ensure_leader()
    except BaseException:
        await server.stop()
        raise
    return server


class FakeBroker:
    """One replica's connection to the controller: heartbeats, and the role-change notices it received."""

    def __init__(self, conn: Connection, name: str, broker_id: int, cluster: str = "c1") -> None:
        self.conn, self.name, self.broker_id, self.cluster = conn, name, broker_id, cluster
        self.notices: list[dict[str, Any]] = []
        self.max_phy_offset = 0

    async def heartbeat(self, **extra: Any) -> RemotingCommand:
        fields: dict[str, Any] = {
            "clusterName": self.cluster, "brokerName": self.name, "brokerId": self.broker_id,
            "brokerAddr": f"127.0.0.1:{20000 + self.broker_id}", "haAddr": f"127.0.0.1:{30000 + self.broker_id}",
            "epoch": 0, "maxPhyOffset": self.max_phy_offset, "confirmOffset": 0,
        }
        fields.update(extra)
        return await self.conn.invoke(RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, fields))


BrokerFactory = Callable[[str, int], Awaitable[FakeBroker]]


def body(resp: RemotingCommand) -> dict[str, Any]:
    obj = jsonx.loads(resp.body)
    assert isinstance(obj, dict)
    return obj
