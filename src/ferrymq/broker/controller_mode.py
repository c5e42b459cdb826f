"""A broker's role in controller mode (``enableControllerMode=true``): heartbeats, role changes, the lease.

The controller (docs/controller.md) decides which replica of a broker group is master, in which epoch.
This module is the broker's side of that bargain:

* **Heartbeats** (BROKER_HEARTBEAT, 904) every ``controllerHeartbeatPeriodMs`` to the controller that leads
  (``controllerAddr`` lists them; CONTROLLER_NOT_LEADER answers name the leader, connection errors move on
  to the next address). Each heartbeat reports the replica id (``brokerId``), its addresses, the last epoch
  of its epoch file and its max phy offset; the answer is the group's state (``GroupState`` below). A
  NOTIFY_BROKER_ROLE_CHANGED (1008) from the controller makes the next heartbeat go at once.
* **Becoming master** of epoch E: the HA client stops (nothing more is copied), a half-copied record at the
  log's end is cut (bytes beyond the last record the replica checked; a master that steps down marks its own
  records checked, so a later re-election never cuts them), everything copied is dispatched, the epoch file gains <E, max phy offset>, the HA
  server starts accepting replicas, the broker registers with the name servers as brokerId 0, and delayed
  delivery starts. Sends are accepted from then on.
* **Becoming slave** of the master M of epoch E: sends are refused, the HA server drops its replicas, the
  HA client follows M's HA address with epoch E (its handshake truncates this log to the last common
  point, consume queues and index with it), metadata and offsets follow M (SlaveSynchronize), and the
  broker registers under its own id.
* **Replication**: SYNC while master (a send waits for every SyncStateSet member with the default
  ``allAckInSyncStateSet=true``), reported as ``brokerRole=SYNC_MASTER``; ASYNC only when broker.conf writes
  ``brokerRole=ASYNC_MASTER`` (``BrokerConfig.controller_sync_replication``), since the key's default is
  classic mode's.
* **Lease (fencing)**: a master answers SEND_OK only while ``can_ack()``: less than ``controllerLeaseMs``
  has passed since it *sent* the last heartbeat that the controller answered naming it master of its
  epoch. The controller declares a master dead ``controllerBrokerHeartbeatTimeoutMs`` after *receiving*
  its last heartbeat (> the lease), so a master cut off from the controller, or paused, falls silent
  before another replica can be elected. A lapsed lease also turns the store read-only until a heartbeat
  renews it. Every heartbeat declares the lease (``leaseMs``): when this broker's connection to the
  controller closes (its death), the controller elects as soon as that lease has surely ended instead of
  after the timeout (docs/decisions/0009). Heartbeats travel on the pool's one connection per controller.
* **SyncStateSet**: the HA master reports a replica that caught up (added, through
  CONTROLLER_ALTER_SYNC_STATE_SET, 1001) or one behind for ``haMaxTimeSlaveNotCatchup`` (removed). An
  addition counts for acks at once (the union of the old and new sets is waited for until the controller
  answers); a removal only once the controller has accepted it, so a send is never acknowledged without
  every member the controller may elect from.
* **Confirmed reads** (unless ``readUnCommitted=true``): the store dispatches, and so consumers see, only
  records that end at or below the confirm offset (``reput_end_phy_offset``): on the master the end of what
  every SyncStateSet member acked, on a slave the confirm offset its master last sent. A record the master
  holds alone may vanish at a failover (the new master stores other records at the same queue offsets), so a
  consumer must never be shown it. Each change of the master's confirm offset schedules a reput, which wakes
  the long polls of the queues it dispatched. Before the role is known (start-up) nothing new is dispatched; a
  new master dispatches everything it holds before it takes sends (its log is the group's from then on).

GroupState (answer body of 904 / 1001, JSON):

| field              | type          | meaning                                                   |
|--------------------|---------------|-----------------------------------------------------------|
| masterId           | int           | the master's replica id, -1: none                         |
| masterAddr         | str           | the master's remoting address ("" if none)                |
| masterHaAddr       | str           | the master's HA address ("" if none)                      |
| masterEpoch        | int           | the current term                                          |
| syncStateSet       | list[int]     | replicas every acknowledged message is on                 |
| syncStateSetEpoch  | int           | version of syncStateSet                                   |
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ferrymq.common.aio import wait_event
from ferrymq.ha.auto_client import AutoSwitchHAClient
from ferrymq.ha.auto_master import AutoSwitchHAMaster
from ferrymq.ha.epoch import EpochFile
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode

if TYPE_CHECKING:
    from ferrymq.broker.app import BrokerController

__all__ = ["ControllerRole", "GroupState", "LEASE_EXPIRED_REMARK", "NOT_MASTER_REMARK"]

log = logging.getLogger(__name__)

#: a heartbeat not answered within this is given up (and the next controller address is tried)
HEARTBEAT_TIMEOUT_MS = 1000
#: an alter-SyncStateSet request not answered within this is retried by the next signal
ALTER_TIMEOUT_MS = 3000
#: how often the lease is checked to turn the store read-only once it lapsed
LEASE_CHECK_INTERVAL_MS = 100
NOT_MASTER_REMARK = "this broker is not the master of its group (controller mode); the route will point at it"
LEASE_EXPIRED_REMARK = ("the master's lease with the controller lapsed: not acknowledged (the message may be "
                        "stored; a new master may be taking over); retry")


@dataclass(frozen=True, slots=True)
class GroupState:
    master_id: int
    master_addr: str
    master_ha_addr: str
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int

    @classmethod
    def from_json(cls, obj: Any) -> GroupState:
        if not isinstance(obj, dict):
            raise ValueError("group state is not an object")
        return cls(int(obj.get("masterId", -1)), str(obj.get("masterAddr") or ""),
                   str(obj.get("masterHaAddr") or ""), int(obj.get("masterEpoch", 0)),
                   frozenset(int(i) for i in obj.get("syncStateSet") or ()), int(obj.get("syncStateSetEpoch", 0)))


class ControllerRole:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        cfg = broker.config
        self.config = cfg
        self.replica_id = cfg.broker_id
        #: SYNC replication while master (the default; ASYNC only with brokerRole=ASYNC_MASTER written)
        self.sync_replication = bool(broker.controller_sync_replication)
        self.controllers = list(cfg.controller_addr)
        self._leader_index = 0
        self.epoch_file = EpochFile.in_store(cfg.root_dir)
        self.ha_master = AutoSwitchHAMaster(
            broker.store, self.epoch_file, cfg.listen_host, cfg.effective_ha_listen_port,
            broker_name=cfg.broker_name, replica_id=self.replica_id, ha_secret=cfg.ha_secret or None,
            all_ack_in_sync_state_set=cfg.all_ack_in_sync_state_set, in_sync_replicas=cfg.in_sync_replicas,
            min_in_sync_replicas=cfg.min_in_sync_replicas,
            ha_max_time_slave_not_catchup_ms=cfg.ha_max_time_slave_not_catchup_ms,
            transfer_batch_size=cfg.ha_transfer_batch_size, heartbeat_interval_ms=cfg.ha_send_heartbeat_interval_ms,
            housekeeping_interval_ms=cfg.ha_housekeeping_interval_ms,
            on_slave_caught_up=self._on_caught_up, on_slave_lagging=self._on_lagging,
            on_confirm_changed=broker.writer.schedule_reput, tls=broker.tls_server)
        self.ha_master.active = False
        self.ha_client = AutoSwitchHAClient(
            broker.store, self.epoch_file, self.replica_id, cfg.broker_name, ha_secret=cfg.ha_secret or None,
            on_appended=lambda: broker.writer.schedule_reput_within(0.001), ssl_context=broker.tls_client_context)
        self.is_master = False
        self.master_epoch = 0
        self.state: GroupState | None = None
        self.lease_until = 0.0  # time.monotonic() seconds
        self.elections_seen = 0
        self.last_error = ""
        self._sss_pending = False
        #: True while a new master dispatches everything it holds (``reput_end_phy_offset`` is unbounded)
        self._taking_over = False
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._client_started = False

    # ---- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.broker.pool.dispatcher.register(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, self._on_notify)
        await self.ha_master.start()
        self._tasks = [asyncio.create_task(self._heartbeat_loop(), name="controller-heartbeat"),
                       asyncio.create_task(self._lease_loop(), name="controller-lease")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self.ha_client.stop()
        await self.ha_master.stop()

    @property
    def ha_port(self) -> int:
        return int(self.ha_master.port)

    # ---- fencing --------------------------------------------------------------------------------
    def can_ack(self) -> bool:
        """May this broker answer SEND_OK now? (master, lease not lapsed)"""
        return self.is_master and time.monotonic() < self.lease_until

    def refusal_remark(self) -> str:
        return LEASE_EXPIRED_REMARK if self.is_master else NOT_MASTER_REMARK

    async def _lease_loop(self) -> None:
        store_config = self.broker.store_config
        while True:
            await asyncio.sleep(LEASE_CHECK_INTERVAL_MS / 1000)
            if not self.is_master:
                continue
            lapsed = time.monotonic() >= self.lease_until
            read_only = store_config.broker_role.value == "SLAVE"
            if lapsed and not read_only:
                log.warning("controller lease lapsed (epoch %d): refusing writes until the controller answers",
                            self.master_epoch)
                self.broker.set_store_writable(False)
                self._reregister()
            elif not lapsed and read_only:
                self.broker.set_store_writable(True)
                self._reregister()

    def _reregister(self) -> None:
        """The id this broker registers under follows the lease (registration.broker_id_of): tell the name
        servers now."""
        registrar = self.broker.registrar
        if registrar is not None:
            registrar.trigger()

    # ---- heartbeats -----------------------------------------------------------------------------
    def _on_notify(self, conn: Any, cmd: RemotingCommand) -> None:
        self._wake.set()
        return None

    async def _heartbeat_loop(self) -> None:
        period_s = self.config.controller_heartbeat_period_ms / 1000
        while True:
            try:
                await self.heartbeat_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("controller heartbeat failed: %s", self.last_error)
            self._wake.clear()
            await wait_event(self._wake, period_s)

    def _heartbeat_request(self) -> RemotingCommand:
        broker = self.broker
        cfg = self.config
        return RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, {
            "clusterName": cfg.broker_cluster_name,
            "brokerName": cfg.broker_name,
            "brokerId": self.replica_id,
            "brokerAddr": broker.broker_addr,
            "haAddr": f"{cfg.broker_ip1}:{self.ha_port}",
            "epoch": self.epoch_file.last_epoch(),
            "maxPhyOffset": int(broker.store.max_phy_offset),
            "confirmOffset": self.confirm_offset,
            # the controller replaces a master whose connection closed once this lease has surely ended
            "leaseMs": cfg.controller_lease_ms,
        })

    @property
    def confirm_offset(self) -> int:
        return int(self.ha_master.confirm_offset if self.is_master else self.ha_client.confirm_offset)

    def reput_end_phy_offset(self) -> int:
        """The store's dispatch bound (``Dispatcher.reput_end``) unless readUnCommitted: the confirm offset."""
        if self._taking_over:
            return int(self.broker.store.max_phy_offset)
        return self.confirm_offset

    async def invoke_controller(self, make: Any, timeout_ms: int) -> RemotingCommand:
        """Send ``make()`` to the leading controller: follows CONTROLLER_NOT_LEADER once per address and
        moves on after a connection error; the last answer or error wins."""
        last_exc: Exception | None = None
        for _ in range(len(self.controllers) + 1):
            addr = self.controllers[self._leader_index % len(self.controllers)]
            try:
                resp = await self.broker.pool.invoke(addr, make(), timeout_ms)
            except Exception as exc:  # unreachable, timed out: the next one
                last_exc = exc
                self._leader_index += 1
                continue
            if resp.code == ResponseCode.CONTROLLER_NOT_LEADER:
                leader = resp.ext_fields.get("leaderAddr") or ""
                if leader and leader in self.controllers:
                    self._leader_index = self.controllers.index(leader)
                else:
                    self._leader_index += 1
                last_exc = RuntimeError(f"controller {addr} is not the leader")
                continue
            return resp
        raise last_exc if last_exc is not None else RuntimeError("no controller answered")

    async def heartbeat_once(self) -> None:
        sent_at = time.monotonic()
        resp = await self.invoke_controller(self._heartbeat_request, HEARTBEAT_TIMEOUT_MS)
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"controller refused the heartbeat: {resp.code} {resp.remark}")
        state = GroupState.from_json(jsonx.loads(resp.body))
        await self.apply(state, sent_at)

    # ---- role changes ---------------------------------------------------------------------------
    async def apply(self, state: GroupState, sent_at: float) -> None:
        async with self._lock:
            self.state = state
            if state.master_id == self.replica_id:
                if not self.is_master or state.master_epoch != self.master_epoch:
                    if state.master_epoch < self.master_epoch:
                        return  # an answer older than what this broker already knows
                    await self._become_master(state, sent_at + self.config.controller_lease_ms / 1000)
                if not self._sss_pending and state.sync_state_set_epoch >= self.ha_master.sync_state_set_epoch:
                    self.ha_master.set_sync_state_set(set(state.sync_state_set), state.sync_state_set_epoch)
                self.lease_until = max(self.lease_until, sent_at + self.config.controller_lease_ms / 1000)
                return
            if state.master_epoch < self.master_epoch:
                return
            await self._become_slave(state)

    async def _become_master(self, state: GroupState, lease_until: float) -> None:
        broker = self.broker
        store = broker.store
        log.warning("controller: becoming MASTER of %s, epoch %d (was %s of epoch %d)", self.config.broker_name,
                    state.master_epoch, "master" if self.is_master else "slave", self.master_epoch)
        self.elections_seen += 1
        self.lease_until = 0.0
        if self._client_started:
            await self.ha_client.stop()
            self._client_started = False
        self.ha_client.set_master(None, state.master_epoch)
        cl = store.commit_log
        if cl.replica_verified_phy < cl.max_offset:
            log.warning("cutting a half-copied record tail [%d, %d) before taking over", cl.replica_verified_phy,
                        cl.max_offset)
            store.truncate_to(cl.replica_verified_phy)
        self._taking_over = True  # the new master's log is the group's: all of it is dispatched (queue offsets)
        try:
            broker.writer.reput_now()
        finally:
            self._taking_over = False
        start = int(store.max_phy_offset)
        if self.epoch_file.last_epoch() < state.master_epoch:
            self.epoch_file.truncate_after(start + 1)
            self.epoch_file.append(state.master_epoch, start)
        self.master_epoch = state.master_epoch
        self.ha_master.set_sync_state_set(set(state.sync_state_set), state.sync_state_set_epoch)
        self.ha_master.active = True
        self.is_master = True
        self.lease_until = lease_until  # before the registration that on_role_changed triggers
        await broker.on_role_changed(master=True, master_addr=None)

    async def _become_slave(self, state: GroupState) -> None:
        broker = self.broker
        was_master = self.is_master
        if was_master:
            log.warning("controller: %s steps down from MASTER of epoch %d; master is now %d of epoch %d",
                        self.config.broker_name, self.master_epoch, state.master_id, state.master_epoch)
            self.elections_seen += 1
        self.is_master = False
        self.lease_until = 0.0
        self.ha_master.active = False
        await self.ha_master.deactivate()
        if was_master:
            # every record up to here was written whole by this broker's own puts: none is a half-copied
            # replica tail (the check at the next takeover must not cut them; the handshake with the new
            # master cuts what diverged)
            cl = broker.store.commit_log
            cl.replica_verified_phy = max(cl.replica_verified_phy, cl.max_offset)
        changed = state.master_epoch != self.master_epoch or was_master
        self.master_epoch = state.master_epoch
        ha_addr = state.master_ha_addr if state.master_id >= 0 else None
        if not self._client_started:
            await self.ha_client.start()
            self._client_started = True
        self.ha_client.set_master(ha_addr or None, state.master_epoch)
        if changed or broker.master_addr != (state.master_addr or None):
            await broker.on_role_changed(master=False, master_addr=state.master_addr or None)

    # ---- SyncStateSet ---------------------------------------------------------------------------
    def _on_caught_up(self, replica_id: int) -> None:
        if self.is_master:
            asyncio.ensure_future(self._alter(add=replica_id))

    def _on_lagging(self, replica_id: int) -> None:
        if self.is_master:
            asyncio.ensure_future(self._alter(remove=replica_id))

    async def _alter(self, add: int | None = None, remove: int | None = None) -> None:
        async with self._lock:
            if not self.is_master or self._sss_pending:
                return
            ham = self.ha_master
            committed = set(ham.sync_state_set)
            new = set(committed)
            if add is not None:
                new.add(add)
            if remove is not None:
                new.discard(remove)
            if new == committed:
                return
            self._sss_pending = True
            if add is not None:  # acks wait for the union while the controller decides
                ham.set_sync_state_set(committed | new, ham.sync_state_set_epoch)
            epoch, sss_epoch = self.master_epoch, ham.sync_state_set_epoch
        state: GroupState | None = None
        try:
            def make() -> RemotingCommand:
                return RemotingCommand.request(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
                    "brokerName": self.config.broker_name, "masterId": self.replica_id,
                    "masterEpoch": epoch, "syncStateSetEpoch": sss_epoch,
                }, jsonx.dumps({"syncStateSet": sorted(new)}))
            resp = await self.invoke_controller(make, ALTER_TIMEOUT_MS)
            ok = resp.code == ResponseCode.SUCCESS
            if ok:
                state = GroupState.from_json(jsonx.loads(resp.body))
                log.info("SyncStateSet of %s is now %s (epoch %d)", self.config.broker_name,
                         sorted(state.sync_state_set), state.sync_state_set_epoch)
            else:
                log.warning("controller refused SyncStateSet %s: %s %s", sorted(new), resp.code, resp.remark)
        except Exception as exc:
            ok = False
            log.warning("SyncStateSet change %s failed: %s", sorted(new), exc)
        async with self._lock:
            self._sss_pending = False
            if state is not None and ok and self.is_master and state.master_epoch == self.master_epoch:
                ham.set_sync_state_set(set(state.sync_state_set), state.sync_state_set_epoch)
            elif self.is_master and self.master_epoch == epoch:
                ham.set_sync_state_set(committed, sss_epoch)  # back to what the controller holds
        self._wake.set()

    # ---- status ---------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"controllerMode": True, "replicaId": self.replica_id, "isMaster": self.is_master,
                               "masterEpoch": self.master_epoch, "leaseValid": self.can_ack(),
                               "epochEntries": [list(e) for e in self.epoch_file.entries()],
                               "elections": self.elections_seen, "lastError": self.last_error,
                               "replication": "SYNC" if self.sync_replication else "ASYNC",
                               "allAckInSyncStateSet": self.ha_master.all_ack_in_sync_state_set}
        if self.is_master:
            out["syncStateSet"] = sorted(self.ha_master.sync_state_set)
            out["replicas"] = self.ha_master.slave_status()
            out["confirmOffset"] = self.ha_master.confirm_offset
        else:
            out["ha"] = self.ha_client.status()
        return out
