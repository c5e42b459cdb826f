"""The leader's heartbeat table: who was heard when, with which offsets (in memory, not Raft state).

Pure (the clock is passed in as ``now_ms``, a monotonic millisecond count). A replica is alive while its
last heartbeat is younger than ``timeout_ms``. When a controller becomes Raft leader it knows nothing of
the brokers (they sent their heartbeats to the old leader), so ``grant_grace`` marks every replica of the
state as heard "now" without offsets: no master is declared dead before one timeout, and a grace entry
is never an election candidate (``heard`` False) until its own heartbeat arrives.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ferrymq.controller.state import ReplicaView

#: bound on the entries (groups x replicas) the table keeps; beyond it the stalest are dropped
MAX_ENTRIES = 64 * 10_000


@dataclass(slots=True)
class Beat:
    last_ms: int
    heard: bool
    max_phy_offset: int = -1
    epoch: int = 0
    confirm_offset: int = -1
    #: the connection the heartbeat came on (where role-change notices go); opaque here
    channel: Any = None


class LivenessTable:
    def __init__(self, timeout_ms: int) -> None:
        if timeout_ms <= 0:
            raise ValueError("timeout_ms must be positive")
        self.timeout_ms = timeout_ms
        self._beats: dict[tuple[str, int], Beat] = {}

    def beat(self, broker_name: str, broker_id: int, now_ms: int, *, max_phy_offset: int, epoch: int,
             confirm_offset: int, channel: Any = None) -> None:
        key = (broker_name, broker_id)
        if key not in self._beats and len(self._beats) >= MAX_ENTRIES:
            stalest = min(self._beats, key=lambda k: self._beats[k].last_ms)
            del self._beats[stalest]
        self._beats[key] = Beat(now_ms, True, max_phy_offset, epoch, confirm_offset, channel)

    def grant_grace(self, replicas: Iterable[tuple[str, int]], now_ms: int) -> None:
        """Forget everything and treat ``replicas`` as heard now (see the module docstring)."""
        self._beats = {key: Beat(now_ms, False) for key in replicas}

    def alive(self, broker_name: str, broker_id: int, now_ms: int) -> bool:
        b = self._beats.get((broker_name, broker_id))
        return b is not None and now_ms - b.last_ms < self.timeout_ms

    def view(self, broker_name: str, broker_id: int, now_ms: int) -> ReplicaView | None:
        b = self._beats.get((broker_name, broker_id))
        if b is None:
            return None
        return ReplicaView(alive=now_ms - b.last_ms < self.timeout_ms, heard=b.heard,
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
        return [b.channel for (name, _), b in self._beats.items() if name == broker_name and b.channel is not None]

    def forget_channel(self, channel: Any) -> None:
        for b in self._beats.values():
            if b.channel is channel:
                b.channel = None
