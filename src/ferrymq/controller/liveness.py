"""The leader's heartbeat table: who was heard when, with which offsets (in memory, not Raft state).

Pure (the clock is passed in as ``now_ms``, a monotonic millisecond count). A replica is alive while its
last heartbeat is younger than ``timeout_ms``. When a controller becomes Raft leader it knows nothing of
the brokers (they sent their heartbeats to the old leader), so ``grant_grace`` marks every replica of the
state as heard "now" without offsets: no master is declared dead before one timeout, and a grace entry
is never an election candidate (``heard`` False) until its own heartbeat arrives.

**Closed connections** (docs/decisions/0009): when the connection a replica's latest heartbeat came on
closes (``channel_closed``), the replica is dead once every lease that heartbeat (or a deposed leader's
answer) can have granted has ended, if that is before the timeout:
``dead_at_ms = min(last_ms + timeout_ms, max(last_ms, lease_floor_ms) + lease_ms + LEASE_END_MARGIN_MS)``,
``lease_ms`` being the lease the broker declared in that heartbeat and ``lease_floor_ms`` the caller's bound on
a deposed leader's last renewal (its own readiness + check-quorum's window). A heartbeat without a lease
keeps the full timeout; the next heartbeat (on a new connection) makes the replica alive again.

Indexes by group name and by connection keep ``channels``, ``channel_closed`` and ``forget_channel`` to the
entries concerned (no walk over the whole table).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ferrymq.controller.state import ReplicaView

#: bound on the entries (groups x replicas) the table keeps; beyond it the stalest are dropped
MAX_ENTRIES = 64 * 10_000
#: after a closed connection, how long beyond the end of the replica's last lease it still counts as alive:
#: the broker's gap between its lease check and its SEND_OK write, timer lateness, clock rates (decision 0009)
LEASE_END_MARGIN_MS = 200

Key = tuple[str, int]


@dataclass(slots=True)
class Beat:
    last_ms: int
    heard: bool
    max_phy_offset: int = -1
    epoch: int = 0
    confirm_offset: int = -1
    #: the connection the heartbeat came on (where role-change notices go); opaque here
    channel: Any = None
    #: the lease (ms) the broker declared in this heartbeat; None: unknown (the full timeout applies)
    lease_ms: int | None = None
    #: set once ``channel`` closed: when the replica is dead (before the timeout); None: the timeout rules
    dead_at_ms: int | None = None


class LivenessTable:
    def __init__(self, timeout_ms: int) -> None:
        if timeout_ms <= 0:
            raise ValueError("timeout_ms must be positive")
        self.timeout_ms = timeout_ms
        self._beats: dict[Key, Beat] = {}
        self._by_name: dict[str, set[int]] = {}
        self._by_channel: dict[Any, set[Key]] = {}

    # ---- index upkeep -------------------------------------------------------------------------------
    def _unlink_channel(self, key: Key, channel: Any) -> None:
        if channel is None:
            return
        keys = self._by_channel.get(channel)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_channel[channel]

    def _drop(self, key: Key) -> None:
        b = self._beats.pop(key)
        self._unlink_channel(key, b.channel)
        ids = self._by_name.get(key[0])
        if ids is not None:
            ids.discard(key[1])
            if not ids:
                del self._by_name[key[0]]

    # ---- writes -------------------------------------------------------------------------------------
    def beat(self, broker_name: str, broker_id: int, now_ms: int, *, max_phy_offset: int, epoch: int,
             confirm_offset: int, channel: Any = None, lease_ms: int | None = None,
             lease_floor_ms: int = 0) -> int | None:
        """Note a heartbeat; returns when the replica is dead if its connection is already closed (the close
        event came while the heartbeat waited for the leader), else None."""
        key = (broker_name, broker_id)
        old = self._beats.get(key)
        if old is None and len(self._beats) >= MAX_ENTRIES:
            self._drop(min(self._beats, key=lambda k: self._beats[k].last_ms))
        if old is not None and old.channel is not channel:
            self._unlink_channel(key, old.channel)
        beat = Beat(now_ms, True, max_phy_offset, epoch, confirm_offset, channel, lease_ms)
        self._beats[key] = beat
        self._by_name.setdefault(broker_name, set()).add(broker_id)
        if channel is not None:
            self._by_channel.setdefault(channel, set()).add(key)
            if getattr(channel, "closed", False):  # closed while the heartbeat waited: no close event follows
                beat.dead_at_ms = self._dead_at(beat, lease_floor_ms)
                return beat.dead_at_ms
        return None

    def grant_grace(self, replicas: Iterable[Key], now_ms: int) -> None:
        """Forget everything and treat ``replicas`` as heard now (see the module docstring)."""
        self._beats = {key: Beat(now_ms, False) for key in replicas}
        self._by_channel = {}
        self._by_name = {}
        for name, rid in self._beats:
            self._by_name.setdefault(name, set()).add(rid)

    def _dead_at(self, b: Beat, lease_floor_ms: int) -> int | None:
        if b.lease_ms is None:
            return None
        by_lease = max(b.last_ms, lease_floor_ms) + b.lease_ms + LEASE_END_MARGIN_MS
        return by_lease if by_lease < b.last_ms + self.timeout_ms else None

    def channel_closed(self, channel: Any, lease_floor_ms: int) -> list[tuple[str, int, int]]:
        """``channel`` closed: the replicas whose latest heartbeat came on it become dead at the end of their
        lease (module docstring); returns ``(broker_name, broker_id, dead_at_ms)`` of those that die before
        their timeout. Forgets the channel (no more notices go to it)."""
        out: list[tuple[str, int, int]] = []
        for key in self._by_channel.pop(channel, ()):
            b = self._beats.get(key)
            if b is None or b.channel is not channel:
                continue
            b.channel = None
            dead_at = self._dead_at(b, lease_floor_ms)
            if dead_at is not None:
                b.dead_at_ms = dead_at
                out.append((key[0], key[1], dead_at))
        return out

    def forget_channel(self, channel: Any) -> None:
        for key in self._by_channel.pop(channel, ()):
            b = self._beats.get(key)
            if b is not None and b.channel is channel:
                b.channel = None

    # ---- reads --------------------------------------------------------------------------------------
    def _alive(self, b: Beat, now_ms: int) -> bool:
        return now_ms - b.last_ms < self.timeout_ms and (b.dead_at_ms is None or now_ms < b.dead_at_ms)

    def alive(self, broker_name: str, broker_id: int, now_ms: int) -> bool:
        b = self._beats.get((broker_name, broker_id))
        return b is not None and self._alive(b, now_ms)

    def view(self, broker_name: str, broker_id: int, now_ms: int) -> ReplicaView | None:
        b = self._beats.get((broker_name, broker_id))
        if b is None:
            return None
        return ReplicaView(alive=self._alive(b, now_ms), heard=b.heard,
                           max_phy_offset=b.max_phy_offset, epoch=b.epoch, confirm_offset=b.confirm_offset,
                           last_heartbeat_ago_ms=max(0, now_ms - b.last_ms))

    def views(self, broker_name: str, broker_ids: Iterable[int], now_ms: int) -> dict[int, ReplicaView]:
        out: dict[int, ReplicaView] = {}
        for rid in broker_ids:
            v = self.view(broker_name, rid, now_ms)
            if v is not None:
                out[rid] = v
        return out

    def channels(self, broker_name: str) -> list[Any]:
        out = []
        for rid in sorted(self._by_name.get(broker_name, ())):
            b = self._beats.get((broker_name, rid))
            if b is not None and b.channel is not None:
                out.append(b.channel)
        return out
