"""The leader's work: heartbeats, elections, the dead-master scan, role-change notices.

Only the Raft leader acts, and only while a majority of the Raft group answered it within
``QUORUM_CONTACT_MS`` (check-quorum, ``RaftNode.quorum_contact_age_ms``): a leader cut off from the majority
stops answering heartbeats, so it renews no master's lease, long before pysyncobj makes it step down. The
check runs when a request starts and again right before a heartbeat's answer (the one that renews a
lease). Before it answers anything after winning an election it commits a no-op (so its applied state is
the committed one) and grants every known replica one heartbeat timeout of grace
(``LivenessTable.grant_grace``). Elections run one at a time on a leader (``_elect_lock``) and are written
as compare-and-set ``elect`` commands, so a stale decision is fenced rather than applied.

A master whose heartbeat connection closes (a SIGKILLed broker's kernel closes it at once) is replaced
when the lease of its last heartbeat has surely ended, before the heartbeat timeout (``channel_closed``,
``LivenessTable.channel_closed``, docs/decisions/0009): a timer runs that election at the moment, not the
next scan. A master that is only silent keeps the whole timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ferrymq.controller.config import ControllerConfig
from ferrymq.controller.liveness import Key, LivenessTable
from ferrymq.controller.raft import QUORUM_CONTACT_MS, NotLeaderError, RaftError, RaftNode
from ferrymq.controller.state import (
    NO_MASTER,
    NOOP_CMD,
    CommandResult,
    GroupState,
    Status,
    choose_master,
    elect_cmd,
    group_to_wire,
    set_controller_addr_cmd,
    upsert_replica_cmd,
)
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

log = logging.getLogger(__name__)

#: period of the dead-master scan
SCAN_INTERVAL_MS = 500
#: period of the attempts to publish this controller's listen address through Raft
PUBLISH_ADDR_RETRY_MS = 1000

ClockMs = Callable[[], int]


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class ControllerCore:
    def __init__(self, cfg: ControllerConfig, raft: RaftNode, *, clock_ms: ClockMs = monotonic_ms) -> None:
        self.cfg = cfg
        self.raft = raft
        self.clock_ms = clock_ms
        self.liveness = LivenessTable(cfg.heartbeat_timeout_ms)
        #: this controller's remoting address, as published for 2007 redirects (set by the server)
        self.listen_addr = ""
        self._ready_generation = -1
        self._barrier: asyncio.Task[None] | None = None
        self._barrier_generation = -1
        self._elect_lock = asyncio.Lock()
        #: elections applied by this node as leader (tests and logs)
        self.elections = 0
        self._quorum_lost_logged = -1
        #: clock_ms() when this node last became a ready leader (bounds a deposed leader's last lease renewal)
        self.ready_at_ms = 0
        #: elections due when a closed connection's lease ends, by replica
        self._lease_end_timers: dict[Key, asyncio.TimerHandle] = {}
        self._lease_end_tasks: set[asyncio.Task[Any]] = set()

    # ---- leadership ---------------------------------------------------------------------------------
    def leader_listen_addr(self) -> str | None:
        leader = self.raft.leader_addr
        if leader is None:
            return None
        if leader == self.raft.self_addr:  # not named while it lacks a majority (check-quorum)
            return (self.listen_addr or None) if self.raft.has_quorum_contact() else None
        return self.raft.controller_addr(leader)

    def check_quorum(self) -> None:
        """NotLeaderError unless this node leads with a majority heard within QUORUM_CONTACT_MS."""
        if not self.raft.is_leader:
            raise NotLeaderError("not the controller leader")
        age_ms = self.raft.quorum_contact_age_ms()
        if age_ms > QUORUM_CONTACT_MS:
            if self._quorum_lost_logged != self.raft.role_generation:
                self._quorum_lost_logged = self.raft.role_generation
                log.warning("controller %s leads without a majority (last heard %s ms ago): answering no broker "
                            "until it hears one again", self.listen_addr,
                            "never" if age_ms == float("inf") else f"{age_ms:.0f}")
            raise NotLeaderError("the controller leader lost contact with the majority of its Raft group")

    async def ensure_leader(self) -> None:
        """Return when this node is the leader with a committed, applied state and a majority heard within
        QUORUM_CONTACT_MS; NotLeaderError otherwise."""
        self.check_quorum()
        generation = self.raft.role_generation
        if generation == self._ready_generation:
            return
        barrier = self._barrier
        failed = barrier is not None and barrier.done() and (barrier.cancelled() or barrier.exception() is not None)
        if barrier is None or self._barrier_generation != generation or failed:
            self._barrier_generation = generation
            self._barrier = barrier = asyncio.ensure_future(self._become_ready(generation))
        assert barrier is not None
        await asyncio.shield(barrier)
        self.check_quorum()

    async def _become_ready(self, generation: int) -> None:
        await self.raft.apply(NOOP_CMD)
        state = self.raft.snapshot()
        now = self.clock_ms()
        self.liveness.grant_grace([(name, rid) for name, g in state.groups.items() for rid in g.replicas], now)
        self._cancel_lease_ends()  # due under an earlier leadership; the grace decides now
        self.ready_at_ms = now
        self._ready_generation = generation
        log.info("controller %s is the leader (term %d): %d broker groups, grace %d ms", self.listen_addr,
                 self.raft.term, len(state.groups), self.cfg.heartbeat_timeout_ms)

    async def publish_addr_loop(self) -> None:
        """Put this controller's listen address into the replicated state (once; again if it changes)."""
        while True:
            if self.listen_addr and self.raft.controller_addr(self.raft.self_addr) != self.listen_addr:
                with contextlib.suppress(RaftError):
                    await self.raft.apply(set_controller_addr_cmd(self.raft.self_addr, self.listen_addr))
            await asyncio.sleep(PUBLISH_ADDR_RETRY_MS / 1000)

    # ---- views ---------------------------------------------------------------------------------------
    def wire(self, group: GroupState) -> dict[str, Any]:
        views = self.liveness.views(group.broker_name, group.replicas, self.clock_ms())
        return group_to_wire(group, views)

    def wire_json(self, group: dict[str, Any] | None) -> dict[str, Any] | None:
        return self.wire(GroupState.from_json(group)) if group is not None else None

    # ---- heartbeats ----------------------------------------------------------------------------------
    async def heartbeat(self, *, cluster_name: str, broker_name: str, broker_id: int, broker_addr: str,
                        ha_addr: str, epoch: int, max_phy_offset: int, confirm_offset: int,
                        channel: Any = None, lease_ms: int | None = None) -> tuple[Status, GroupState | None, str]:
        await self.ensure_leader()
        dead_at_ms = self.liveness.beat(broker_name, broker_id, self.clock_ms(), max_phy_offset=max_phy_offset,
                                        epoch=epoch, confirm_offset=confirm_offset, channel=channel,
                                        lease_ms=lease_ms, lease_floor_ms=self.lease_floor_ms())
        self._cancel_lease_end(broker_name, broker_id)  # heard again: alive, nothing due
        if dead_at_ms is not None:  # ... on a connection that has closed meanwhile
            self._schedule_lease_end(broker_name, broker_id, dead_at_ms)
        group = self.raft.group(broker_name)
        info = group.replicas.get(broker_id) if group is not None else None
        if info is None or info.broker_addr != broker_addr or info.ha_addr != ha_addr:
            res = await self.raft.apply(upsert_replica_cmd(cluster_name, broker_name, broker_id, broker_addr,
                                                           ha_addr))
            if res.status is not Status.SUCCESS:
                return res.status, self.raft.group(broker_name), res.remark
            if info is None:
                log.info("replica %s/%d joined (%s, ha %s)", broker_name, broker_id, broker_addr, ha_addr)
            group = self.raft.group(broker_name)
        assert group is not None
        if group.master_id == NO_MASTER or not self.liveness.alive(broker_name, group.master_id, self.clock_ms()):
            await self.elect(broker_name, None, reason="no live master")
        self.check_quorum()  # the answer renews a master's lease: only with a majority heard just now
        return Status.SUCCESS, self.raft.group(broker_name), ""

    def forget_channel(self, channel: Any) -> None:
        self.liveness.forget_channel(channel)

    def lease_floor_ms(self) -> int:
        """The latest a deposed Raft leader may have renewed a lease: check-quorum lets it answer brokers for
        QUORUM_CONTACT_MS after the majority that elected this node stopped answering it (decision 0009)."""
        return self.ready_at_ms + QUORUM_CONTACT_MS

    def channel_closed(self, channel: Any) -> None:
        """A broker connection closed: a master whose latest heartbeat came on it is replaced once its lease
        has surely ended (a timer, LivenessTable.channel_closed); replicas that are not master just stop
        being election candidates then."""
        if not self.raft.is_leader:
            self.liveness.forget_channel(channel)
            return
        for name, rid, dead_at_ms in self.liveness.channel_closed(channel, self.lease_floor_ms()):
            self._schedule_lease_end(name, rid, dead_at_ms)

    def _schedule_lease_end(self, name: str, rid: int, dead_at_ms: int) -> None:
        """The master ``rid`` of ``name`` is dead at ``dead_at_ms``: elect then (nothing for other replicas)."""
        group = self.raft.group(name)
        if group is None or group.master_id != rid:
            return
        now = self.clock_ms()
        log.info("broker group %s: master %d's controller connection closed; its lease ends in %d ms",
                 name, rid, max(0, dead_at_ms - now))
        self._cancel_lease_end(name, rid)
        delay_s = (max(0, dead_at_ms - now) + 1) / 1000  # +1: the clock counts whole ms
        self._lease_end_timers[(name, rid)] = asyncio.get_running_loop().call_later(
            delay_s, self._lease_ended, name, rid)

    def _cancel_lease_end(self, name: str, rid: int) -> None:
        timer = self._lease_end_timers.pop((name, rid), None)
        if timer is not None:
            timer.cancel()

    def _lease_ended(self, name: str, rid: int) -> None:
        self._lease_end_timers.pop((name, rid), None)
        task = asyncio.ensure_future(self._elect_if_master_dead(name, rid))
        self._lease_end_tasks.add(task)
        task.add_done_callback(self._lease_end_tasks.discard)

    async def _elect_if_master_dead(self, name: str, rid: int) -> None:
        try:
            if not self.raft.is_leader:
                return
            group = self.raft.group(name)
            if group is None or group.master_id != rid or self.liveness.alive(name, rid, self.clock_ms()):
                return  # replaced meanwhile, or heard again: the scan looks after it
            await self.elect(name, None, reason=f"master {rid}'s connection closed and its lease ended")
        except RaftError as exc:
            log.debug("election after a closed connection skipped: %s", exc)
        except Exception:  # the scan elects later
            log.exception("election after a closed connection failed")

    def close(self) -> None:
        """Cancel the pending lease-end elections (the server is stopping)."""
        self._cancel_lease_ends()
        for task in self._lease_end_tasks:
            task.cancel()

    def _cancel_lease_ends(self) -> None:
        for timer in self._lease_end_timers.values():
            timer.cancel()
        self._lease_end_timers.clear()

    # ---- elections -----------------------------------------------------------------------------------
    async def elect(self, broker_name: str, designated: int | None, *,
                    reason: str) -> tuple[Status, GroupState | None, str]:
        """Run one election of ``broker_name`` (normal when ``designated`` is None)."""
        await self.ensure_leader()
        async with self._elect_lock:
            group = self.raft.group(broker_name)
            if group is None:
                return Status.METADATA_NOT_EXIST, None, f"unknown broker group {broker_name!r}"
            views = self.liveness.views(broker_name, group.replicas, self.clock_ms())
            decision = choose_master(group, views, unclean=self.cfg.elect_unclean, designated=designated)
            old_view = views.get(group.master_id)
            if not decision.changed:
                remark = "" if decision.status is Status.SUCCESS else _election_remark(decision.status, designated)
                return decision.status, group, remark
            res = await self.raft.apply(elect_cmd(broker_name, group.master_id, group.master_epoch,
                                                  decision.master_id))
            after = self.raft.group(broker_name)
            if res.status is not Status.SUCCESS:
                return res.status, after, res.remark
            self.elections += 1
            assert after is not None
            if decision.master_id == NO_MASTER:
                log.warning("broker group %s has no master: master %d lost (%s), no eligible replica "
                            "(SyncStateSet %s)", broker_name, group.master_id, reason, after.sync_state_set)
            else:
                heard = ("" if old_view is None
                         else f"; master {group.master_id} last heard {old_view.last_heartbeat_ago_ms} ms ago"
                         if old_view.heard else f"; master {group.master_id} not heard since this controller leads")
                log.info("broker group %s: master %d -> %d, epoch %d (%s%s)", broker_name, group.master_id,
                         after.master_id, after.master_epoch, reason, heard)
            self.notify_role_changed(after)
            status = Status.SUCCESS if decision.master_id != NO_MASTER else decision.status
            remark = "" if status is Status.SUCCESS else _election_remark(status, designated)
            return status, after, remark

    async def scan_once(self) -> int:
        """Elect where a master is dead or missing; the number of groups looked at."""
        if not self.raft.is_leader:
            return 0
        await self.ensure_leader()
        now = self.clock_ms()
        names = self.raft.group_names()
        for name in names:
            group = self.raft.group(name)
            if group is None:
                continue
            if group.master_id != NO_MASTER and self.liveness.alive(name, group.master_id, now):
                continue
            reason = ("no master" if group.master_id == NO_MASTER
                      else f"master {group.master_id} not alive (silent for the heartbeat timeout, or its "
                           "connection closed and its lease ended)")
            await self.elect(name, None, reason=reason)
        return len(names)

    async def scan_loop(self) -> None:
        while True:
            await asyncio.sleep(SCAN_INTERVAL_MS / 1000)
            try:
                await self.scan_once()
            except RaftError as exc:
                log.debug("scan skipped: %s", exc)
            except Exception:  # the scan must keep running
                log.exception("controller scan failed")

    def notify_role_changed(self, group: GroupState) -> None:
        """NOTIFY_BROKER_ROLE_CHANGED, oneway, to every replica connection of the group (best effort)."""
        wire = self.wire(group)
        body = jsonx.dumps(wire)
        for channel in self.liveness.channels(group.broker_name):
            if getattr(channel, "closed", True):
                continue
            cmd = RemotingCommand.request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, {
                "brokerName": group.broker_name, "masterId": group.master_id,
                "masterEpoch": group.master_epoch, "masterAddr": wire["masterAddr"],
                "syncStateSetEpoch": group.sync_state_set_epoch}, body=body)
            try:
                channel.invoke_oneway(cmd)
            except Exception as exc:  # a closing connection: the heartbeat answer carries the news too
                log.debug("role-change notice to %s failed: %s", getattr(channel, "peer_addr", "?"), exc)

    async def apply(self, cmd: dict[str, Any]) -> CommandResult:
        await self.ensure_leader()
        return await self.raft.apply(cmd)


def _election_remark(status: Status, designated: int | None) -> str:
    if status is Status.BROKER_NOT_ALIVE:
        return f"broker {designated} is not a known alive replica"
    if status is Status.MASTER_NOT_AVAILABLE:
        return "no eligible replica: none alive in the SyncStateSet"
    return status.value
