"""The controller's state of every broker group, as a pure state machine (no I/O, no clock).

Raft replicates *commands* (plain dicts, below); every node applies them in log order with
``apply_command`` and so holds the same ``ControllerState``. Decisions that need the leader's
heartbeat view (elections) are made by ``choose_master`` on the leader and then written as an ``elect``
command that carries the epoch it was decided on (compare-and-set: a stale decision is fenced).

GroupState JSON (the answer body of 904/1001/1002/1004, element of 1006; ``group_to_wire``):

| field              | type             | meaning                                                     |
|--------------------|------------------|-------------------------------------------------------------|
| clusterName        | str              | cluster of the group                                        |
| brokerName         | str              | the group                                                   |
| masterId           | int              | replica id of the master, -1 = none                         |
| masterAddr         | str              | the master's remoting host:port, "" if none                 |
| masterHaAddr       | str              | the master's HA host:port, "" if none                       |
| masterEpoch        | int              | 0 before the first election; +1 on every election           |
| syncStateSet       | [int] (sorted)   | replicas in sync with the master (always holds the master)  |
| syncStateSetEpoch  | int              | +1 on every change of the set (elections too)               |
| replicas           | {"<id>": {...}}  | brokerAddr, haAddr (Raft state); alive, maxPhyOffset, epoch, confirmOffset, lastHeartbeatAgoMs (leader's heartbeat view) |

Replicated commands (``op`` -> fields):

| op                 | fields                                                                  | result status            |
|--------------------|-------------------------------------------------------------------------|--------------------------|
| upsertReplica      | clusterName, brokerName, brokerId, brokerAddr, haAddr                   | SUCCESS, INVALID_REQUEST |
| alterSyncStateSet  | brokerName, masterId, masterEpoch, syncStateSetEpoch, syncStateSet      | the checks of 1001       |
| elect              | brokerName, expectedMasterId, expectedMasterEpoch, newMasterId (-1 = none) | SUCCESS, METADATA_NOT_EXIST, FENCED_MASTER_EPOCH, INVALID_REPLICAS |
| setControllerAddr  | raftAddr, listenAddr                                                    | SUCCESS                  |
| noop               | (none)                                                                  | SUCCESS (a read barrier) |
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ferrymq.remoting.codes import ResponseCode

NO_MASTER = -1
#: replica ids start here (RocketMQ 5 controller mode: brokerId >= 1)
MIN_REPLICA_ID = 1
#: bound on the replicas of one group (a typo-loop of ids must not grow the state without limit)
MAX_REPLICAS_PER_GROUP = 64
#: bound on the groups one controller holds
MAX_GROUPS = 10_000


class Status(Enum):
    """Outcome of a command or a decision; ``STATUS_CODES`` maps it to the response code."""

    SUCCESS = "SUCCESS"
    FENCED_MASTER_EPOCH = "FENCED_MASTER_EPOCH"
    FENCED_SYNC_STATE_SET_EPOCH = "FENCED_SYNC_STATE_SET_EPOCH"
    INVALID_MASTER = "INVALID_MASTER"
    INVALID_REPLICAS = "INVALID_REPLICAS"
    MASTER_NOT_AVAILABLE = "MASTER_NOT_AVAILABLE"
    INVALID_REQUEST = "INVALID_REQUEST"
    BROKER_NOT_ALIVE = "BROKER_NOT_ALIVE"
    NOT_LEADER = "NOT_LEADER"
    METADATA_NOT_EXIST = "METADATA_NOT_EXIST"


#: the one table from outcome to wire code
STATUS_CODES: dict[Status, int] = {
    Status.SUCCESS: ResponseCode.SUCCESS,
    Status.FENCED_MASTER_EPOCH: ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
    Status.FENCED_SYNC_STATE_SET_EPOCH: ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
    Status.INVALID_MASTER: ResponseCode.CONTROLLER_INVALID_MASTER,
    Status.INVALID_REPLICAS: ResponseCode.CONTROLLER_INVALID_REPLICAS,
    Status.MASTER_NOT_AVAILABLE: ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
    Status.INVALID_REQUEST: ResponseCode.CONTROLLER_INVALID_REQUEST,
    Status.BROKER_NOT_ALIVE: ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
    Status.NOT_LEADER: ResponseCode.CONTROLLER_NOT_LEADER,
    Status.METADATA_NOT_EXIST: ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
}


@dataclass(slots=True)
class ReplicaInfo:
    broker_id: int
    broker_addr: str
    ha_addr: str

    def to_json(self) -> dict[str, Any]:
        return {"brokerId": self.broker_id, "brokerAddr": self.broker_addr, "haAddr": self.ha_addr}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ReplicaInfo:
        return cls(int(obj["brokerId"]), str(obj["brokerAddr"]), str(obj["haAddr"]))


@dataclass(slots=True)
class GroupState:
    cluster_name: str
    broker_name: str
    master_id: int = NO_MASTER
    master_epoch: int = 0
    sync_state_set: list[int] = field(default_factory=list)
    sync_state_set_epoch: int = 0
    replicas: dict[int, ReplicaInfo] = field(default_factory=dict)

    @property
    def master(self) -> ReplicaInfo | None:
        return self.replicas.get(self.master_id) if self.master_id != NO_MASTER else None

    def check(self) -> None:
        """Invariants every applied command keeps (AssertionError: a programming error)."""
        assert self.sync_state_set == sorted(set(self.sync_state_set)), self.sync_state_set
        assert set(self.sync_state_set) <= set(self.replicas), (self.sync_state_set, list(self.replicas))
        if self.master_id != NO_MASTER:
            assert self.master_id in self.replicas, self.master_id
            assert self.master_id in self.sync_state_set, (self.master_id, self.sync_state_set)
            assert self.master_epoch >= 1
        assert self.sync_state_set_epoch >= 0 and self.master_epoch >= 0

    def to_json(self) -> dict[str, Any]:
        """The Raft (persisted) form; see ``group_to_wire`` for the answer form."""
        return {
            "clusterName": self.cluster_name,
            "brokerName": self.broker_name,
            "masterId": self.master_id,
            "masterEpoch": self.master_epoch,
            "syncStateSet": list(self.sync_state_set),
            "syncStateSetEpoch": self.sync_state_set_epoch,
            "replicas": {str(k): v.to_json() for k, v in sorted(self.replicas.items())},
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> GroupState:
        group = cls(
            cluster_name=str(obj["clusterName"]),
            broker_name=str(obj["brokerName"]),
            master_id=int(obj["masterId"]),
            master_epoch=int(obj["masterEpoch"]),
            sync_state_set=sorted(int(i) for i in obj["syncStateSet"]),
            sync_state_set_epoch=int(obj["syncStateSetEpoch"]),
            replicas={int(k): ReplicaInfo.from_json(v) for k, v in obj["replicas"].items()},
        )
        group.check()
        return group


@dataclass(slots=True)
class ControllerState:
    """Everything Raft replicates: the groups, and each controller's remoting address by Raft address."""

    groups: dict[str, GroupState] = field(default_factory=dict)
    #: Raft "host:port" of a controller -> its controllerListen "host:port" (for 2007's leaderAddr)
    controller_addrs: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": {name: g.to_json() for name, g in sorted(self.groups.items())},
            "controllerAddrs": dict(sorted(self.controller_addrs.items())),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ControllerState:
        return cls(
            groups={str(k): GroupState.from_json(v) for k, v in obj.get("groups", {}).items()},
            controller_addrs={str(k): str(v) for k, v in obj.get("controllerAddrs", {}).items()},
        )

    def copy(self) -> ControllerState:
        return copy.deepcopy(self)


# ---- the leader's heartbeat view (not Raft state) ------------------------------------------------


@dataclass(slots=True, frozen=True)
class ReplicaView:
    """What the leader knows of one replica from its heartbeats."""

    alive: bool
    #: False while only the leadership grace vouches for it (no heartbeat received by this leader yet)
    heard: bool = True
    max_phy_offset: int = -1
    epoch: int = 0
    confirm_offset: int = -1
    last_heartbeat_ago_ms: int = -1


def group_to_wire(group: GroupState, views: Mapping[int, ReplicaView] | None = None) -> dict[str, Any]:
    views = views or {}
    master = group.master
    replicas: dict[str, Any] = {}
    for rid, info in sorted(group.replicas.items()):
        v = views.get(rid) or ReplicaView(alive=False)
        replicas[str(rid)] = {
            "brokerAddr": info.broker_addr,
            "haAddr": info.ha_addr,
            "alive": v.alive,
            "maxPhyOffset": v.max_phy_offset,
            "epoch": v.epoch,
            "confirmOffset": v.confirm_offset,
            "lastHeartbeatAgoMs": v.last_heartbeat_ago_ms,
        }
    return {
        "clusterName": group.cluster_name,
        "brokerName": group.broker_name,
        "masterId": group.master_id,
        "masterAddr": master.broker_addr if master else "",
        "masterHaAddr": master.ha_addr if master else "",
        "masterEpoch": group.master_epoch,
        "syncStateSet": list(group.sync_state_set),
        "syncStateSetEpoch": group.sync_state_set_epoch,
        "replicas": replicas,
    }


# ---- elections (decided on the leader, pure) -------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Election:
    status: Status
    #: the master after the election (NO_MASTER when none could be found)
    master_id: int
    #: False when the decision leaves the group as it is (no command to apply)
    changed: bool


def choose_master(
    group: GroupState,
    views: Mapping[int, ReplicaView],
    *,
    unclean: bool = False,
    designated: int | None = None,
) -> Election:
    """Who should be master of ``group`` now.

    Normal election: an alive master stays. Otherwise the candidates are the alive replicas (heard by this
    leader) in the SyncStateSet — or any alive replica while the group never had a SyncStateSet (a new
    group), or when ``unclean`` allows it; the highest maxPhyOffset wins, then the lowest id. No candidate:
    MASTER_NOT_AVAILABLE and no master. ``designated``: that replica, if known and alive (BROKER_NOT_ALIVE
    otherwise), whether in the SyncStateSet or not (an operator's switchover)."""
    current = group.master_id

    def alive(rid: int) -> bool:
        v = views.get(rid)
        return v is not None and v.alive

    if designated is not None:
        if designated not in group.replicas or not alive(designated):
            return Election(Status.BROKER_NOT_ALIVE, current, False)
        return Election(Status.SUCCESS, designated, designated != current)
    if current != NO_MASTER and alive(current):
        return Election(Status.SUCCESS, current, False)
    heard = {rid: v for rid, v in views.items() if rid in group.replicas and v.alive and v.heard}
    if group.sync_state_set:
        candidates = [rid for rid in group.sync_state_set if rid in heard and rid != current]
    else:
        candidates = list(heard)
    if not candidates and unclean:
        candidates = [rid for rid in heard if rid != current]
    if not candidates:
        return Election(Status.MASTER_NOT_AVAILABLE, NO_MASTER, current != NO_MASTER)
    winner = min(candidates, key=lambda rid: (-heard[rid].max_phy_offset, rid))
    return Election(Status.SUCCESS, winner, True)


# ---- commands (applied on every node, in log order) -------------------------------------------------


@dataclass(slots=True, frozen=True)
class CommandResult:
    status: Status
    #: the group after the command (None when there is none), Raft form
    group: dict[str, Any] | None = None
    remark: str = ""


def upsert_replica_cmd(cluster_name: str, broker_name: str, broker_id: int, broker_addr: str,
                       ha_addr: str) -> dict[str, Any]:
    return {"op": "upsertReplica", "clusterName": cluster_name, "brokerName": broker_name,
            "brokerId": broker_id, "brokerAddr": broker_addr, "haAddr": ha_addr}


def alter_sync_state_set_cmd(broker_name: str, master_id: int, master_epoch: int, sync_state_set_epoch: int,
                             sync_state_set: list[int]) -> dict[str, Any]:
    return {"op": "alterSyncStateSet", "brokerName": broker_name, "masterId": master_id,
            "masterEpoch": master_epoch, "syncStateSetEpoch": sync_state_set_epoch,
            "syncStateSet": sorted(set(sync_state_set))}


def elect_cmd(broker_name: str, expected_master_id: int, expected_master_epoch: int,
              new_master_id: int) -> dict[str, Any]:
    return {"op": "elect", "brokerName": broker_name, "expectedMasterId": expected_master_id,
            "expectedMasterEpoch": expected_master_epoch, "newMasterId": new_master_id}


def set_controller_addr_cmd(raft_addr: str, listen_addr: str) -> dict[str, Any]:
    return {"op": "setControllerAddr", "raftAddr": raft_addr, "listenAddr": listen_addr}


NOOP_CMD: dict[str, Any] = {"op": "noop"}


def _result(status: Status, group: GroupState | None, remark: str = "") -> CommandResult:
    return CommandResult(status, group.to_json() if group is not None else None, remark)


def _upsert_replica(state: ControllerState, cmd: Mapping[str, Any]) -> CommandResult:
    name, rid = str(cmd["brokerName"]), int(cmd["brokerId"])
    if rid < MIN_REPLICA_ID or not name:
        return _result(Status.INVALID_REQUEST, None, f"brokerId must be >= {MIN_REPLICA_ID}")
    group = state.groups.get(name)
    if group is None:
        if len(state.groups) >= MAX_GROUPS:
            return _result(Status.INVALID_REQUEST, None, f"more than {MAX_GROUPS} broker groups")
        group = state.groups[name] = GroupState(str(cmd["clusterName"]), name)
    if rid not in group.replicas and len(group.replicas) >= MAX_REPLICAS_PER_GROUP:
        return _result(Status.INVALID_REQUEST, group, f"more than {MAX_REPLICAS_PER_GROUP} replicas in {name}")
    group.replicas[rid] = ReplicaInfo(rid, str(cmd["brokerAddr"]), str(cmd["haAddr"]))
    return _result(Status.SUCCESS, group)


def check_alter_sync_state_set(group: GroupState | None, master_id: int, master_epoch: int,
                               sync_state_set_epoch: int, new_set: list[int]) -> tuple[Status, str]:
    """The checks of 1001, in the contract's order."""
    if group is None:
        return Status.METADATA_NOT_EXIST, "unknown broker group"
    if group.master_id == NO_MASTER or master_id != group.master_id:
        return Status.INVALID_MASTER, f"broker {master_id} is not the master (master is {group.master_id})"
    if master_epoch != group.master_epoch:
        return Status.FENCED_MASTER_EPOCH, f"masterEpoch {master_epoch} != {group.master_epoch}"
    if sync_state_set_epoch != group.sync_state_set_epoch:
        return (Status.FENCED_SYNC_STATE_SET_EPOCH,
                f"syncStateSetEpoch {sync_state_set_epoch} != {group.sync_state_set_epoch}")
    if group.master_id not in new_set:
        return Status.INVALID_REPLICAS, "the new SyncStateSet must contain the master"
    unknown = sorted(set(new_set) - set(group.replicas))
    if unknown:
        return Status.INVALID_REPLICAS, f"unknown replica ids {unknown}"
    return Status.SUCCESS, ""


def _alter_sync_state_set(state: ControllerState, cmd: Mapping[str, Any]) -> CommandResult:
    group = state.groups.get(str(cmd["brokerName"]))
    new_set = sorted({int(i) for i in cmd["syncStateSet"]})
    status, remark = check_alter_sync_state_set(group, int(cmd["masterId"]), int(cmd["masterEpoch"]),
                                                int(cmd["syncStateSetEpoch"]), new_set)
    if status is not Status.SUCCESS or group is None:
        return _result(status, group, remark)
    group.sync_state_set = new_set
    group.sync_state_set_epoch += 1
    return _result(Status.SUCCESS, group)


def _elect(state: ControllerState, cmd: Mapping[str, Any]) -> CommandResult:
    group = state.groups.get(str(cmd["brokerName"]))
    if group is None:
        return _result(Status.METADATA_NOT_EXIST, None, "unknown broker group")
    if group.master_id != int(cmd["expectedMasterId"]) or group.master_epoch != int(cmd["expectedMasterEpoch"]):
        return _result(Status.FENCED_MASTER_EPOCH, group, "the group changed since the election was decided")
    new_id = int(cmd["newMasterId"])
    if new_id == NO_MASTER:
        group.master_id = NO_MASTER
        return _result(Status.SUCCESS, group)
    if new_id not in group.replicas:
        return _result(Status.INVALID_REPLICAS, group, f"unknown replica id {new_id}")
    group.master_id = new_id
    group.master_epoch += 1
    group.sync_state_set = [new_id]
    group.sync_state_set_epoch += 1
    return _result(Status.SUCCESS, group)


def _set_controller_addr(state: ControllerState, cmd: Mapping[str, Any]) -> CommandResult:
    state.controller_addrs[str(cmd["raftAddr"])] = str(cmd["listenAddr"])
    return _result(Status.SUCCESS, None)


_APPLY = {
    "upsertReplica": _upsert_replica,
    "alterSyncStateSet": _alter_sync_state_set,
    "elect": _elect,
    "setControllerAddr": _set_controller_addr,
    "noop": lambda state, cmd: _result(Status.SUCCESS, None),
}


def apply_command(state: ControllerState, cmd: Mapping[str, Any]) -> CommandResult:
    """Apply one replicated command to ``state`` (in place). A malformed command (a bug, or a journal from
    another version) changes nothing and answers INVALID_REQUEST: every node decides the same."""
    handler = _APPLY.get(str(cmd.get("op")))
    if handler is None:
        return _result(Status.INVALID_REQUEST, None, f"unknown command {cmd.get('op')!r}")
    try:
        result = handler(state, cmd)
    except (KeyError, TypeError, ValueError) as exc:
        return _result(Status.INVALID_REQUEST, None, f"malformed {cmd.get('op')} command: {exc!r}")
    name = cmd.get("brokerName")
    if isinstance(name, str) and name in state.groups:
        state.groups[name].check()
    return result
