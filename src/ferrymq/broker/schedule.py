"""Delayed delivery through SCHEDULE_TOPIC_XXXX (protocol §4.10, §5.6). Masters only.

Queue ``level-1`` of SCHEDULE_TOPIC_XXXX holds the messages of delay level ``level``; its consume
queue tagsCode is the delivery time in ms. For each level we keep the next queue offset to deliver
in ``config/delayOffset.json`` (``{"offsetTable":{1:0,2:5}}``). One task walks every level: due
entries are re-stored under REAL_TOPIC/REAL_QID with DELAY removed and WAIT=false.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ferrymq.broker.config_file import JsonPersisted
from ferrymq.common.aio import wait_event
from ferrymq.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageExt,
    MessageExtBrokerInner,
    properties_to_string,
    tags_hash_code,
)
from ferrymq.common.topic import SCHEDULE_TOPIC

log = logging.getLogger(__name__)

#: idle / not-yet-due re-check period
TICK_MS = 100
#: back-off after a failed re-store
ERROR_BACKOFF_MS = 10_000
#: consume queue entries examined per level per tick
UNITS_PER_TICK = 64


def inner_from_delayed(msg: MessageExt) -> MessageExtBrokerInner | None:
    """The real message behind a SCHEDULE_TOPIC_XXXX record."""
    props = dict(msg.properties)
    real_topic = props.pop(PROPERTY_REAL_TOPIC, None)
    real_qid = props.pop(PROPERTY_REAL_QUEUE_ID, None)
    if not real_topic or real_qid is None:
        return None
    props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
    props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
    try:
        queue_id = int(real_qid)
    except ValueError:
        return None
    keys = []
    if props.get("UNIQ_KEY"):
        keys.append(props["UNIQ_KEY"])
    keys.extend(k for k in props.get("KEYS", "").split(" ") if k)
    return MessageExtBrokerInner(
        topic=real_topic, queue_id=queue_id, body=msg.body, flag=msg.flag,
        properties_string=properties_to_string(props), tags_code=tags_hash_code(props.get("TAGS")),
        sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
        store_host=msg.store_host, reconsume_times=msg.reconsume_times,
        index_keys=tuple(keys), wait_store_msg_ok=False,
    )


class ScheduleMessageService(JsonPersisted):
    def __init__(self, store: Any, put: Callable[[MessageExtBrokerInner], Any], config_dir: str,
                 delay_levels_ms: list[int], clock_ms: Callable[[], int]) -> None:
        self._store = store
        self._put = put
        super().__init__(config_dir, "delayOffset.json")
        self.delay_levels_ms = delay_levels_ms
        self._clock_ms = clock_ms
        self.offsets: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    @property
    def max_level(self) -> int:
        return len(self.delay_levels_ms)

    # ---- persistence (load, persist, persist_if_dirty: JsonPersisted) ------------------------
    def decode(self, obj: dict[str, Any]) -> None:
        self.offsets = {int(k): int(v) for k, v in (obj.get("offsetTable") or {}).items()}

    def encode(self) -> dict[str, Any]:
        return {"offsetTable": dict(sorted(self.offsets.items()))}

    def write_raw(self, data: bytes) -> None:
        """Slave sync: the master's delayOffset.json verbatim."""
        self._file.write_raw(data)
        self.load()

    # ---- delivery --------------------------------------------------------------------------------
    def tick(self) -> int:
        """Deliver every due message; returns how many were delivered."""
        now = self._clock_ms()
        delivered = 0
        for level in range(1, self.max_level + 1):
            delivered += self._deliver_level(level, now)
        return delivered

    def _deliver_level(self, level: int, now_ms: int) -> int:
        queue_id = level - 1
        offset = self.offsets.get(level, 0)
        min_offset = self._store.get_min_offset_in_queue(SCHEDULE_TOPIC, queue_id)
        if offset < min_offset:
            offset = min_offset
        delivered = 0
        units = self._store.get_consume_queue_units(SCHEDULE_TOPIC, queue_id, offset, UNITS_PER_TICK)
        for phy_offset, _size, deliver_ms in units:
            if deliver_ms > now_ms:
                break
            msg = self._store.look_message_by_offset(phy_offset)
            inner = inner_from_delayed(msg) if msg is not None else None
            if inner is not None:
                result = self._put(inner)
                if result.append_result is None:
                    log.warning("re-storing delayed message at %d failed: %s", phy_offset, result.status)
                    break
                delivered += 1
            offset += 1
        if offset != self.offsets.get(level, 0):
            self.offsets[level] = offset
            self._dirty = True
        return delivered

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                self.tick()
                delay_ms = TICK_MS
            except Exception:
                log.exception("delay delivery failed")
                delay_ms = ERROR_BACKOFF_MS
            self._wake.clear()
            await wait_event(self._wake, delay_ms / 1000)

    def start(self) -> None:
        if self._task is not None and not self._task.done():
            return  # already delivering (a controller-mode master re-elected in a newer epoch)
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        self.persist()
