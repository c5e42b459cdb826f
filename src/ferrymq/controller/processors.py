"""Controller request handlers (docs/controller.md), one per request code; all but 1005 answer only on the
Raft leader (2007 CONTROLLER_NOT_LEADER with ext ``leaderAddr`` elsewhere).

| code | request                         | handler          | ext fields in                                      | body in                 | answer body            |
|------|---------------------------------|------------------|----------------------------------------------------|-------------------------|------------------------|
| 904  | BROKER_HEARTBEAT                | heartbeat        | clusterName, brokerName, brokerId, brokerAddr, haAddr, epoch, maxPhyOffset, confirmOffset, leaseMs (optional) | | GroupState |
| 1001 | CONTROLLER_ALTER_SYNC_STATE_SET | alter_sync_state_set | brokerName, masterId, masterEpoch, syncStateSetEpoch | {"syncStateSet": [ids]} | GroupState     |
| 1002 | CONTROLLER_ELECT_MASTER         | elect_master     | brokerName, brokerId (optional, -1 = any)           |                         | GroupState             |
| 1004 | CONTROLLER_GET_REPLICA_INFO     | get_replica_info | brokerName                                          |                         | GroupState             |
| 1005 | CONTROLLER_GET_METADATA_INFO    | get_metadata     |                                                     |                         | Raft metadata (below)  |
| 1006 | CONTROLLER_GET_SYNC_STATE_DATA  | get_sync_state_data | brokerName (optional filter)                     | {"brokerNames": [..]} (optional) | {"groups": [GroupState]} |

904's ``leaseMs`` is the broker's ``controllerLeaseMs``: 1 .. controllerBrokerHeartbeatTimeoutMs - 1 (else 2005);
without it a master whose connection closed is dead only after the heartbeat timeout (decision 0009).

GroupState answers also carry ext fields masterId, masterAddr, masterEpoch, syncStateSetEpoch. A refused
request whose group exists carries the group's current GroupState as its body too.

1005 answer: ext controllerLeaderId, controllerLeaderAddress, isLeader; body {"selfId", "selfRaftAddr",
"selfListenAddr", "isLeader", "leaderId", "leaderRaftAddr", "leaderAddr", "term",
"peers": [{"id", "raftAddr", "listenAddr"}]}.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ferrymq.controller.core import ControllerCore
from ferrymq.controller.raft import NotLeaderError, RaftError
from ferrymq.controller.state import (
    MIN_REPLICA_ID,
    NO_MASTER,
    STATUS_CODES,
    GroupState,
    Status,
    alter_sync_state_set_cmd,
    check_alter_sync_state_set,
)
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher

log = logging.getLogger(__name__)

#: most ids a SyncStateSet request may carry
MAX_SYNC_STATE_SET_IDS = 64


class BadRequest(Exception):
    """A malformed request: answered CONTROLLER_INVALID_REQUEST with the message as remark."""


def _required(cmd: RemotingCommand, key: str) -> str:
    value = cmd.ext_fields.get(key)
    if value is None or value == "":
        raise BadRequest(f"the field <{key}> is missing")
    return value


def _int(cmd: RemotingCommand, key: str, default: int | None = None) -> int:
    value = cmd.ext_fields.get(key)
    if value is None or value == "":
        if default is None:
            raise BadRequest(f"the field <{key}> is missing")
        return default
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"the field <{key}> is not an integer: {value[:40]!r}") from None


def _body(cmd: RemotingCommand) -> dict[str, Any]:
    if not cmd.body:
        return {}
    try:
        obj = jsonx.loads(cmd.body)
    except ValueError as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequest("body must be a JSON object")
    return obj


Handler = Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand]]


class ControllerProcessors:
    def __init__(self, core: ControllerCore) -> None:
        self.core = core

    def register_all(self, dispatcher: Dispatcher) -> None:
        rc = RequestCode
        for code, handler in (
            (rc.BROKER_HEARTBEAT, self.heartbeat),
            (rc.CONTROLLER_ALTER_SYNC_STATE_SET, self.alter_sync_state_set),
            (rc.CONTROLLER_ELECT_MASTER, self.elect_master),
            (rc.CONTROLLER_GET_REPLICA_INFO, self.get_replica_info),
            (rc.CONTROLLER_GET_METADATA_INFO, self.get_metadata),
            (rc.CONTROLLER_GET_SYNC_STATE_DATA, self.get_sync_state_data),
        ):
            dispatcher.register(code, self._guarded(handler))

    def _guarded(self, handler: Handler) -> Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand]]:
        async def run(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
            try:
                return await handler(conn, cmd)
            except BadRequest as exc:
                return cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST, remark=str(exc))
            except NotLeaderError:
                return self.not_leader(cmd)
            except RaftError as exc:
                # a command that did not commit (leader lost mid-way, timeout): the client retries, perhaps
                # at another controller
                log.warning("code %d from %s: %s", cmd.code, conn.peer_addr, exc)
                if not self.core.raft.is_leader:
                    return self.not_leader(cmd)
                return cmd.response(ResponseCode.SYSTEM_BUSY, remark=str(exc))
        return run

    def not_leader(self, cmd: RemotingCommand) -> RemotingCommand:
        leader = self.core.leader_listen_addr()
        return cmd.response(ResponseCode.CONTROLLER_NOT_LEADER, {"leaderAddr": leader},
                            remark=f"not the controller leader (leader: {leader or 'unknown'})")

    def _group_answer(self, cmd: RemotingCommand, status: Status, group: GroupState | None,
                      remark: str = "") -> RemotingCommand:
        if group is None:
            return cmd.response(STATUS_CODES[status], remark=remark or status.value)
        wire = self.core.wire(group)
        ext = {"masterId": group.master_id, "masterAddr": wire["masterAddr"], "masterEpoch": group.master_epoch,
               "syncStateSetEpoch": group.sync_state_set_epoch}
        return cmd.response(STATUS_CODES[status], ext, body=jsonx.dumps(wire),
                            remark=(remark or status.value) if status is not Status.SUCCESS else None)

    # ---- handlers ------------------------------------------------------------------------------------
    async def heartbeat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        broker_id = _int(cmd, "brokerId")
        if broker_id < MIN_REPLICA_ID:
            raise BadRequest(f"brokerId must be >= {MIN_REPLICA_ID} in controller mode, got {broker_id}")
        lease_ms: int | None = None
        if cmd.ext_fields.get("leaseMs"):
            lease_ms = _int(cmd, "leaseMs")
            timeout_ms = self.core.cfg.heartbeat_timeout_ms
            if not 0 < lease_ms < timeout_ms:
                raise BadRequest(f"leaseMs (the broker's controllerLeaseMs) must be > 0 and below the controller's "
                                 f"controllerBrokerHeartbeatTimeoutMs ({timeout_ms}), got {lease_ms}: a master "
                                 "could acknowledge after another replica was elected")
        status, group, remark = await self.core.heartbeat(
            cluster_name=_required(cmd, "clusterName"),
            broker_name=_required(cmd, "brokerName"),
            broker_id=broker_id,
            broker_addr=_required(cmd, "brokerAddr"),
            ha_addr=cmd.ext_fields.get("haAddr", ""),
            epoch=_int(cmd, "epoch", 0),
            max_phy_offset=_int(cmd, "maxPhyOffset", -1),
            confirm_offset=_int(cmd, "confirmOffset", -1),
            channel=conn,
            lease_ms=lease_ms,
        )
        return self._group_answer(cmd, status, group, remark)

    async def alter_sync_state_set(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = _required(cmd, "brokerName")
        master_id, master_epoch = _int(cmd, "masterId"), _int(cmd, "masterEpoch")
        ss_epoch = _int(cmd, "syncStateSetEpoch")
        raw = _body(cmd).get("syncStateSet")
        if not isinstance(raw, list) or not raw or len(raw) > MAX_SYNC_STATE_SET_IDS:
            raise BadRequest(f"body needs syncStateSet: a list of 1..{MAX_SYNC_STATE_SET_IDS} replica ids")
        try:
            new_set = sorted({int(i) for i in raw})
        except (TypeError, ValueError):
            raise BadRequest("syncStateSet must hold integer replica ids") from None
        await self.core.ensure_leader()
        current = self.core.raft.group(name)
        status, remark = check_alter_sync_state_set(current, master_id, master_epoch, ss_epoch, new_set)
        if status is not Status.SUCCESS:  # refused without a Raft round trip (the apply checks again)
            return self._group_answer(cmd, status, current, remark)
        res = await self.core.apply(alter_sync_state_set_cmd(name, master_id, master_epoch, ss_epoch, new_set))
        group = GroupState.from_json(res.group) if res.group is not None else None
        if res.status is Status.SUCCESS:
            log.info("broker group %s: SyncStateSet %s, epoch %d (from master %d)", name, new_set,
                     group.sync_state_set_epoch if group else -1, master_id)
        return self._group_answer(cmd, res.status, group, res.remark)

    async def elect_master(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = _required(cmd, "brokerName")
        broker_id = _int(cmd, "brokerId", NO_MASTER)
        designated = None if broker_id == NO_MASTER else broker_id
        log.info("election of %s requested by %s (brokerId %s)", name, conn.peer_addr,
                 designated if designated is not None else "any")
        status, group, remark = await self.core.elect(name, designated, reason=f"requested by {conn.peer_addr}")
        return self._group_answer(cmd, status, group, remark)

    async def get_replica_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = _required(cmd, "brokerName")
        await self.core.ensure_leader()
        group = self.core.raft.group(name)
        if group is None:
            return cmd.response(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                                remark=f"unknown broker group {name!r}")
        return self._group_answer(cmd, Status.SUCCESS, group)

    async def get_sync_state_data(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        names = _body(cmd).get("brokerNames")
        one = cmd.ext_fields.get("brokerName")
        await self.core.ensure_leader()
        wanted = self.core.raft.group_names() if not names and not one else sorted(
            {str(n) for n in (names or [])} | ({one} if one else set()))
        groups = []
        for name in wanted:
            group = self.core.raft.group(name)
            if group is not None:
                groups.append(self.core.wire(group))
        return cmd.response(ResponseCode.SUCCESS, body=jsonx.dumps({"groups": groups}))

    async def get_metadata(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        core, cfg, raft = self.core, self.core.cfg, self.core.raft
        leader_raft = raft.leader_addr
        leader_id = (cfg.peer_id(leader_raft) or leader_raft) if leader_raft else None
        if leader_raft == raft.self_addr:
            leader_id = cfg.self_id
        leader_addr = core.leader_listen_addr()
        peers = [{"id": p.node_id, "raftAddr": p.raft_addr,
                  "listenAddr": (core.listen_addr if p.node_id == cfg.self_id else raft.controller_addr(p.raft_addr))
                  or ""} for p in cfg.peers] or [{"id": cfg.self_id, "raftAddr": raft.self_addr,
                                                  "listenAddr": core.listen_addr}]
        body = {"selfId": cfg.self_id, "selfRaftAddr": raft.self_addr, "selfListenAddr": core.listen_addr,
                "isLeader": raft.is_leader, "leaderId": leader_id or "", "leaderRaftAddr": leader_raft or "",
                "leaderAddr": leader_addr or "", "term": raft.term, "peers": peers}
        return cmd.response(ResponseCode.SUCCESS, {"controllerLeaderId": leader_id or "",
                                                   "controllerLeaderAddress": leader_addr or "",
                                                   "isLeader": raft.is_leader}, body=jsonx.dumps(body))
