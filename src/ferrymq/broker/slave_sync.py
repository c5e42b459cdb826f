"""SlaveSynchronize: a slave copies its master's metadata (not messages) (protocol §6.6).

| step                | request                               | every                   | effect on the slave           |
|---------------------|---------------------------------------|-------------------------|-------------------------------|
| topics              | GET_ALL_TOPIC_CONFIG (21)             | METADATA_POLL_MS (500)  | data version differs -> replace table + version, persist |
| subscription groups | GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) | METADATA_POLL_MS       | data version differs -> replace, persist |
| consumer offsets    | GET_ALL_CONSUMER_OFFSET (43)          | OFFSET_SYNC_MS (1000)   | merge (below), persist        |

Each table is taken in steps between yields to the event loop (``replace_all`` / ``merge_from_master``) and
persisted as a snapshot built in steps and written by a worker thread, so a sync of an estate-size table
never holds the slave's loop; the master likewise encodes its answers in steps (processors/admin.py).
| delay offsets       | GET_ALL_DELAY_OFFSET (45)             | slaveSyncInterval (10 s)| body written verbatim to ``delayOffset.json`` |
| timer checkpoint    | GET_TIMER_CHECK_POINT (60)            | slaveSyncInterval (10 s)| body written verbatim to ``timerCheckpoint.json`` (broker/timer.py) once the replicated log reaches its ``phyOffset`` |

Topics and groups are asked for with the slave's data version (``knownDataVersion``, a ferrymq extension,
processors/admin.py): a ferrymq master answers "unchanged" with no body, so a change reaches the slave within
about half a second at the cost of one small frame per poll; any other master sends its whole table.

Consumer offsets: the master's value wins per queue, except an offset committed on this slave (while the
master was unreachable) that is larger than the master's: the slave keeps it and hands it to the master with
UPDATE_CONSUMER_OFFSET (15), so a consumer that goes back to the master is not rewound. Only commits made on
the slave since the last merge count, so an offset reset on the master is not undone later.

Runs only while ``master_addr`` is known and differs from the broker's own address. Requests go to
the master's main (remoting) port through the broker's ``ConnectionPool``. A failing step is
logged and the next one still runs. Setting ``master_addr`` to a new address syncs at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ferrymq.broker.processors.admin import KNOWN_VERSION_FIELD, UNCHANGED_FIELD
from ferrymq.common.aio import wait_event
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.pool import ConnectionPool

__all__ = ["SlaveSynchronize"]

log = logging.getLogger(__name__)

DEFAULT_SYNC_INTERVAL_MS = 10_000
#: RocketMQ runs the first sync 3 s after start.
FIRST_SYNC_DELAY_MS = 3_000
SYNC_REQUEST_TIMEOUT_MS = 3_000
#: period of the topic / subscription group version poll (a change reaches the slave within about this)
METADATA_POLL_MS = 500
#: period of the consumer offset copy
OFFSET_SYNC_MS = 1_000


def _attr(obj: Any, *names: str) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def _version_of(obj: Any) -> dict[str, Any] | None:
    dv = obj.get("dataVersion") if isinstance(obj, dict) else None
    if not isinstance(dv, dict):
        return None
    return {"counter": int(dv.get("counter", 0)), "timestamp": int(dv.get("timestamp", 0))}


def _local_version(manager: Any) -> dict[str, Any] | None:
    dv = getattr(manager, "data_version", None)
    if dv is None:
        return None
    raw = dv.to_json() if hasattr(dv, "to_json") else dv
    return {"counter": int(raw.get("counter", 0)), "timestamp": int(raw.get("timestamp", 0))}


class SlaveSynchronize:
    def __init__(self, controller: Any, interval_ms: int | None = None) -> None:
        self.controller = controller
        cfg = getattr(controller, "config", None)
        configured = getattr(cfg, "slave_sync_interval_ms", None)
        self.interval_ms = int(interval_ms or configured or DEFAULT_SYNC_INTERVAL_MS)
        self.first_delay_ms = min(FIRST_SYNC_DELAY_MS, self.interval_ms)
        self._master_addr: str | None = None
        self._own_pool: ConnectionPool | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self.sync_count = 0
        self.last_error: str | None = None

    # ---- master address ------------------------------------------------------------------------
    @property
    def master_addr(self) -> str | None:
        return self._master_addr

    @master_addr.setter
    def master_addr(self, addr: str | None) -> None:
        changed = addr != self._master_addr
        self._master_addr = addr or None
        if changed and addr and self._wake is not None:
            self._wake.set()

    # ---- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is not None:
            return
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="slave-sync")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._own_pool is not None:
            await self._own_pool.close()
            self._own_pool = None

    async def _run(self) -> None:
        """sync_all right away when the master address changes and every slaveSyncInterval; in between the
        cheap polls: topics and groups every METADATA_POLL_MS, consumer offsets every OFFSET_SYNC_MS."""
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        next_full = loop.time() + self.first_delay_ms / 1000.0
        next_offsets = loop.time()
        while True:
            woken = await wait_event(self._wake, METADATA_POLL_MS / 1000.0)
            self._wake.clear()
            now = loop.time()
            try:
                if woken or now >= next_full:
                    next_full = now + self.interval_ms / 1000.0
                    next_offsets = now + OFFSET_SYNC_MS / 1000.0
                    await self.sync_all()
                else:
                    steps = [("topic config", self.sync_topic_config),
                             ("subscription groups", self.sync_subscription_group_config)]
                    if now >= next_offsets:
                        next_offsets = now + OFFSET_SYNC_MS / 1000.0
                        steps.append(("consumer offsets", self.sync_consumer_offset))
                    await self._run_steps(steps)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # pragma: no cover - the steps log themselves
                log.exception("slave sync failed: %s", exc)

    # ---- one round -----------------------------------------------------------------------------
    def _should_sync(self) -> str | None:
        addr = self._master_addr
        if not addr:
            return None
        own = getattr(self.controller, "broker_addr", None)
        if own is not None and addr == own:
            return None
        return addr

    def _pool(self) -> ConnectionPool:
        pool = getattr(self.controller, "pool", None)
        if isinstance(pool, ConnectionPool) and not pool.closed:
            return pool
        if self._own_pool is None:
            self._own_pool = ConnectionPool()
        return self._own_pool

    async def _fetch(self, addr: str, code: int, known_version: Any = None) -> bytes | None:
        fields = {}
        if known_version is not None:
            fields[KNOWN_VERSION_FIELD] = f"{known_version['counter']}:{known_version['timestamp']}"
        cmd = RemotingCommand.request(code, fields)
        resp = await self._pool().invoke(addr, cmd, SYNC_REQUEST_TIMEOUT_MS)
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"request {code} answered {resp.code} {resp.remark or ''}")
        if resp.ext_fields.get(UNCHANGED_FIELD) == "true":
            return None
        return resp.body

    async def sync_all(self) -> bool:
        """One round of the five steps; True when every step succeeded."""
        ok = await self._run_steps([
            ("topic config", self.sync_topic_config),
            ("consumer offsets", self.sync_consumer_offset),
            ("delay offsets", self.sync_delay_offset),
            ("timer checkpoint", self.sync_timer_checkpoint),
            ("subscription groups", self.sync_subscription_group_config),
        ])
        if ok:
            self.sync_count += 1
            self.last_error = None
        return ok

    async def _run_steps(self, steps: list[tuple[str, Any]]) -> bool:
        addr = self._should_sync()
        if addr is None:
            return False
        ok = True
        for name, step in steps:
            try:
                await step(addr)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                ok = False
                self.last_error = f"{name}: {exc!r}"
                log.warning("slave sync of %s from %s failed: %r", name, addr, exc)
        return ok

    async def sync_topic_config(self, addr: str) -> None:
        topics = _attr(self.controller, "topics", "topic_manager")
        body = await self._fetch(addr, RequestCode.GET_ALL_TOPIC_CONFIG,
                                 _local_version(topics) if topics is not None else None)
        if not body:
            return
        obj = jsonx.loads(body)
        if topics is None or not isinstance(obj, dict):
            return
        if _version_of(obj) != _local_version(topics):
            await topics.replace_all(obj)
            log.info(
                "slave sync: topic config replaced from master %s (%d topics)",
                addr,
                len(obj.get("topicConfigTable") or {}),
            )

    async def sync_consumer_offset(self, addr: str) -> None:
        body = await self._fetch(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
        if not body:
            return
        obj = jsonx.loads(body)
        offsets = _attr(self.controller, "offsets", "offset_manager")
        if offsets is None or not isinstance(obj, dict):
            return
        push = await offsets.merge_from_master(obj)
        for (key, queue_id), offset in push.items():
            topic, _, group = key.partition("@")
            cmd = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
                "consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset})
            resp = await self._pool().invoke(addr, cmd, SYNC_REQUEST_TIMEOUT_MS)
            if resp.code == ResponseCode.SUCCESS:
                offsets.pushed(key, queue_id, offset)
                log.info("slave sync: handed offset %d of %s queue %d (committed here) to the master", offset, key,
                         queue_id)
        await offsets.snapshot_if_dirty()

    async def sync_delay_offset(self, addr: str) -> None:
        body = await self._fetch(addr, RequestCode.GET_ALL_DELAY_OFFSET)
        if not body:
            return
        schedule = _attr(self.controller, "schedule", "schedule_service")
        if schedule is None:
            return
        jsonx.loads(body)  # only write something that parses
        await asyncio.to_thread(schedule.write_raw, bytes(body))  # tmp + fsync + rename: off the event loop

    async def sync_timer_checkpoint(self, addr: str) -> None:
        timer = _attr(self.controller, "timer")
        if timer is None:
            return
        resp = await self._pool().invoke(addr, RemotingCommand.request(RequestCode.GET_TIMER_CHECK_POINT),
                                         SYNC_REQUEST_TIMEOUT_MS)
        if resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            return  # a RocketMQ 4.x master keeps no timer messages
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"request {RequestCode.GET_TIMER_CHECK_POINT} answered {resp.code} {resp.remark or ''}")
        body = resp.body
        if not body:
            return
        obj = jsonx.loads(body)
        if not isinstance(obj, dict):  # only write something that parses
            raise ValueError("timer checkpoint is not a JSON object")
        store = _attr(self.controller, "store")
        if store is not None and int(store.max_phy_offset) < int(obj.get("phyOffset") or 0):
            # the messages it counts as delivered may not be replicated here yet: the next round takes it
            log.debug("slave sync: timer checkpoint at %s ahead of the replicated log, not taken yet",
                      obj.get("phyOffset"))
            return
        await asyncio.to_thread(timer.write_raw, bytes(body))  # tmp + fsync + rename: off the event loop

    async def sync_subscription_group_config(self, addr: str) -> None:
        groups = _attr(self.controller, "groups", "subscription_manager")
        body = await self._fetch(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                                 _local_version(groups) if groups is not None else None)
        if not body:
            return
        obj = jsonx.loads(body)
        if groups is None or not isinstance(obj, dict):
            return
        if _version_of(obj) != _local_version(groups):
            await groups.replace_all(obj)
            log.info("slave sync: subscription groups replaced from master %s", addr)
