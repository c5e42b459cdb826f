"""Raft replication of the ControllerState with pysyncobj (the only module that imports it).

pysyncobj runs its own thread ("tick" thread: sockets, elections, applying committed entries). One
replicated method, ``command(cmd)``, applies a state command (``state.apply_command``) on every node in log
order. The asyncio side calls ``await RaftNode.apply(cmd)``: the command is queued to pysyncobj with a
callback that, on the tick thread, hands the outcome to the event loop (``loop.call_soon_threadsafe``); the
await ends when the command is committed and applied on this node, or with ``NotLeaderError`` /
``RaftTimeoutError``.

Files in ``controllerStorePath``:

| file          | written by         | content                                                           |
|---------------|--------------------|-------------------------------------------------------------------|
| raft.journal  | pysyncobj          | the Raft log (every command, pickled dicts), term and vote          |
| raft.journal.meta | pysyncobj      | commit index (saved once a second)                                |
| raft.dump     | pysyncobj (log compaction) | full state: ``{"state": <ControllerState JSON bytes>}``   |

A restart replays the dump and the journal, so the state survives a crash (a single node commits its old
entries again once it is leader). Timing (seconds, from the heartbeat timeout): an isolated leader steps
down after ``leaderFallbackTimeout`` = half the broker heartbeat timeout, before a new leader may declare
a master dead (the new leader's grace is one whole timeout).

**Check-quorum.** pysyncobj's step-down comes late (half the heartbeat timeout) and only when its tick
thread runs, so the controller does not rely on it: ``quorum_contact_age_ms()`` is how long ago a
majority of the Raft group (this node included) last answered this leader's appends, read from the same
per-peer response times pysyncobj's own fallback uses. ``ControllerCore`` answers brokers (renews their
leases) only while it is below ``QUORUM_CONTACT_MS``. A leader cut off from the majority therefore stops
renewing leases within ``QUORUM_CONTACT_MS``; with the broker lease (``controllerLeaseMs``) the old master
stops acknowledging within ``QUORUM_CONTACT_MS + controllerLeaseMs`` (2.5 s with the defaults) of the
cut, while the majority needs ``RAFT_MIN_TIMEOUT_S`` to elect a new leader and one heartbeat timeout of
grace before it declares the master dead (3.5 s at the earliest).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.syncobj import SyncObjException

from ferrymq.common import aio
from ferrymq.controller.state import CommandResult, ControllerState, GroupState, Status, apply_command
from ferrymq.errors import ConfigError, FerryError

log = logging.getLogger(__name__)

JOURNAL_FILE = "raft.journal"
DUMP_FILE = "raft.dump"
#: pysyncobj: leader -> follower append period (also its heartbeat)
APPEND_ENTRIES_PERIOD_S = 0.1
#: pysyncobj: follower election timeout range (must exceed 3 append periods)
RAFT_MIN_TIMEOUT_S = 0.5
RAFT_MAX_TIMEOUT_S = 1.0
#: the same for a single node (no peer to wait for: it only has to win its own vote)
SINGLE_NODE_APPEND_ENTRIES_PERIOD_S = 0.05
SINGLE_NODE_RAFT_MIN_TIMEOUT_S = 0.16
SINGLE_NODE_RAFT_MAX_TIMEOUT_S = 0.2
#: pysyncobj: a silent peer connection is dropped after this (must be >= RAFT_MAX_TIMEOUT_S)
CONNECTION_TIMEOUT_S = 2.0
#: pysyncobj: reconnect period to a peer that is down
CONNECTION_RETRY_S = 0.5
#: binding the Raft port: attempts, then the start fails
MAX_BIND_RETRIES = 3
#: default wait for one command to be committed and applied
APPLY_TIMEOUT_MS = 3000
#: commands waiting in pysyncobj's queue before it answers QUEUE_FULL
COMMANDS_QUEUE_SIZE = 10_000
#: check-quorum: a leader acts as one (answers brokers, renews their leases) only while a majority of the
#: Raft group answered its appends within this (5 append periods; see the module docstring)
QUORUM_CONTACT_MS = 500
#: pysyncobj's private per-peer "last answer" table (monotonic seconds), the one its leader fallback reads
_LAST_RESPONSE_ATTR = "_SyncObj__lastResponseTime"


class RaftError(FerryError):
    retriable = True


class NotLeaderError(RaftError):
    pass


class RaftTimeoutError(RaftError):
    pass


class _ReplicatedState(SyncObjConsumer):  # type: ignore[misc]
    """The replicated object: a ControllerState guarded by a lock (the tick thread writes, the event loop
    reads copies)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.state = ControllerState()
        #: every applied command, for tests and logs
        self.applied_count = 0

    @replicated  # type: ignore[misc]
    def command(self, cmd: dict[str, Any]) -> CommandResult:
        with self.lock:
            result = apply_command(self.state, cmd)
            self.applied_count += 1
        if result.status is Status.INVALID_REQUEST:
            log.warning("raft command %s refused: %s", cmd.get("op"), result.remark)
        return result

    def _serialize(self) -> dict[str, Any]:
        with self.lock:
            return {"state": orjson.dumps(self.state.to_json())}

    def _deserialize(self, data: dict[str, Any]) -> None:
        state = ControllerState.from_json(orjson.loads(data["state"]))
        with self.lock:
            self.state = state

    def snapshot(self) -> ControllerState:
        with self.lock:
            return self.state.copy()

    def group(self, broker_name: str) -> GroupState | None:
        with self.lock:
            group = self.state.groups.get(broker_name)
            return copy.deepcopy(group) if group is not None else None

    def group_names(self) -> list[str]:
        with self.lock:
            return sorted(self.state.groups)

    def controller_addr(self, raft_addr: str) -> str | None:
        with self.lock:
            return self.state.controller_addrs.get(raft_addr)


@dataclass(slots=True)
class RaftSettings:
    self_addr: str
    other_addrs: list[str]
    store_path: str
    #: broker heartbeat timeout; the leader fallback is derived from it
    heartbeat_timeout_ms: int
    #: pysyncobj writes the full dump (and trims the journal) after this many entries (or LOG_COMPACTION_MIN_S)
    log_compaction_min_entries: int = 5000


class RaftNode:
    """``start()`` binds the Raft port and starts pysyncobj's thread; ``stop()`` ends it."""

    def __init__(self, settings: RaftSettings, *,
                 on_role_changed: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self._replicated = _ReplicatedState()
        self._obj: SyncObj | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_role_changed = on_role_changed
        #: +1 on every Raft role change of this node (read by the event loop)
        self.role_generation = 0

    def _conf(self) -> SyncObjConf:
        store = self.settings.store_path
        single = not self.settings.other_addrs
        append_s = SINGLE_NODE_APPEND_ENTRIES_PERIOD_S if single else APPEND_ENTRIES_PERIOD_S
        return SyncObjConf(
            journalFile=os.path.join(store, JOURNAL_FILE),
            fullDumpFile=os.path.join(store, DUMP_FILE),
            useFork=False,
            bindAddress=self.settings.self_addr,
            maxBindRetries=MAX_BIND_RETRIES,
            appendEntriesPeriod=append_s,
            raftMinTimeout=SINGLE_NODE_RAFT_MIN_TIMEOUT_S if single else RAFT_MIN_TIMEOUT_S,
            raftMaxTimeout=SINGLE_NODE_RAFT_MAX_TIMEOUT_S if single else RAFT_MAX_TIMEOUT_S,
            connectionTimeout=CONNECTION_TIMEOUT_S,
            connectionRetryTime=CONNECTION_RETRY_S,
            leaderFallbackTimeout=max(append_s * 2, self.settings.heartbeat_timeout_ms / 2000),
            commandsQueueSize=COMMANDS_QUEUE_SIZE,
            logCompactionMinEntries=self.settings.log_compaction_min_entries,
            onStateChanged=self._state_changed,
        )

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Blocking (binding takes up to a second): call from a thread or at start-up."""
        if self._obj is not None:
            raise RuntimeError("raft node already started")
        self._loop = loop
        try:
            os.makedirs(self.settings.store_path, exist_ok=True)
        except OSError as exc:
            raise ConfigError("controllerStorePath", f"cannot create {self.settings.store_path}: {exc}") from None
        obj = SyncObj(self.settings.self_addr, self.settings.other_addrs, conf=self._conf(),
                      consumers=[self._replicated])
        if not isinstance(getattr(obj, _LAST_RESPONSE_ATTR, None), dict):
            obj.destroy_synchronous()
            raise RaftError("this pysyncobj version keeps no per-peer answer times: check-quorum impossible")
        try:
            obj.waitBinded()
        except SyncObjException:
            obj.destroy_synchronous()
            raise RaftError(f"cannot bind the Raft address {self.settings.self_addr} "
                            "(in use, or not an address of this host)") from None
        self._obj = obj
        log.info("raft node %s started (peers %s, store %s)", self.settings.self_addr,
                 self.settings.other_addrs or "none", self.settings.store_path)

    def stop(self) -> None:
        obj, self._obj = self._obj, None
        if obj is not None:
            obj.destroy_synchronous()

    def _state_changed(self, old: int, new: int) -> None:
        """pysyncobj's thread: a role change (0 follower, 1 candidate, 2 leader)."""
        self.role_generation += 1
        log.info("raft node %s: role %s -> %s", self.settings.self_addr, old, new)
        loop, cb = self._loop, self._on_role_changed
        if loop is not None and cb is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(cb)

    # ---- reads (event loop) ----------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        obj = self._obj
        return obj is not None and bool(obj._isLeader())

    def quorum_contact_age_ms(self) -> float:
        """How long ago (ms, monotonic) a majority of the Raft group, this node included, last answered this
        node as leader: 0 for a single node, ``inf`` when not the leader. pysyncobj's tick thread writes the
        answer times; reading them from another thread is safe under the GIL (one C-level copy)."""
        obj = self._obj
        if obj is None or not obj._isLeader():
            return math.inf
        others = len(self.settings.other_addrs)
        if others == 0:
            return 0.0
        try:
            times = sorted(list(getattr(obj, _LAST_RESPONSE_ATTR).values()), reverse=True)
        except RuntimeError:  # changed size while copied (a leadership change): no verdict, no quorum
            return math.inf
        needed = (others + 1) // 2  # peers that make a majority with this node
        if len(times) < needed:
            return math.inf
        return max(0.0, (time.monotonic() - times[needed - 1]) * 1000)

    def has_quorum_contact(self, max_age_ms: float = QUORUM_CONTACT_MS) -> bool:
        """Leader that heard from a majority within ``max_age_ms`` (check-quorum)."""
        return self.quorum_contact_age_ms() <= max_age_ms

    @property
    def leader_addr(self) -> str | None:
        """Raft address of the current leader, when known."""
        obj = self._obj
        if obj is None:
            return None
        leader = obj._getLeader()
        if leader is None:
            return None
        return str(getattr(leader, "address", leader))

    @property
    def term(self) -> int:
        obj = self._obj
        return int(obj._getTerm()) if obj is not None else 0

    @property
    def self_addr(self) -> str:
        return self.settings.self_addr

    def snapshot(self) -> ControllerState:
        """A copy of the whole applied state."""
        return self._replicated.snapshot()

    def group(self, broker_name: str) -> GroupState | None:
        """A copy of one group as applied on this node."""
        return self._replicated.group(broker_name)

    def group_names(self) -> list[str]:
        return self._replicated.group_names()

    def controller_addr(self, raft_addr: str) -> str | None:
        """The controllerListen address a controller published for its Raft address."""
        return self._replicated.controller_addr(raft_addr)

    @property
    def applied_count(self) -> int:
        return self._replicated.applied_count

    # ---- writes (event loop) ---------------------------------------------------------------------
    async def apply(self, cmd: dict[str, Any], timeout_ms: int = APPLY_TIMEOUT_MS) -> CommandResult:
        """Replicate ``cmd``; its result once committed and applied here."""
        obj = self._obj
        if obj is None:
            raise RaftError("raft node not started")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[CommandResult] = loop.create_future()

        def settle(result: Any, error: int) -> None:
            if fut.done():
                return
            if error == FAIL_REASON.SUCCESS:
                fut.set_result(result)
            elif error in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER, FAIL_REASON.LEADER_CHANGED):
                fut.set_exception(NotLeaderError(f"raft command {cmd.get('op')} failed: {_reason(error)}"))
            else:
                fut.set_exception(RaftError(f"raft command {cmd.get('op')} failed: {_reason(error)}"))

        def callback(result: Any, error: int) -> None:  # pysyncobj's thread
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, result, error)

        self._replicated.command(cmd, callback=callback)
        try:
            return await aio.wait_for(fut, timeout_ms / 1000)
        except TimeoutError:
            raise RaftTimeoutError(f"raft command {cmd.get('op')} not committed within {timeout_ms} ms") from None


def _reason(error: int) -> str:
    for name in ("QUEUE_FULL", "MISSING_LEADER", "DISCARDED", "NOT_LEADER", "LEADER_CHANGED",
                 "REQUEST_DENIED", "UNKNOWN_OUTCOME"):
        if getattr(FAIL_REASON, name, None) == error:
            return name
    return f"error {error}"
