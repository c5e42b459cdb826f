"""Consumer group configs: ``config/subscriptionGroup.json`` (protocol §3.5, §5.5).

``{"dataVersion":{"counter":n,"timestamp":ms},"subscriptionGroupTable":{"<group>":SubscriptionGroupConfig}}``;
a change is appended to ``subscriptionGroup.json.journal`` before it is acknowledged and folded into the file
by the broker's snapshot timer (config_file.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ferrymq.broker.config_file import SNAPSHOT_STEP_ENTRIES, JournaledJsonTable, json_object_in_steps
from ferrymq.broker.headers import JAVA_INT_MAX, JAVA_INT_MIN
from ferrymq.common.topic import DataVersion
from ferrymq.remoting import jsonx

log = logging.getLogger(__name__)

DEFAULT_RETRY_MAX_TIMES = 16


@dataclass(slots=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    _KEYS = (
        ("groupName", "group_name", str), ("consumeEnable", "consume_enable", bool),
        ("consumeFromMinEnable", "consume_from_min_enable", bool),
        ("consumeBroadcastEnable", "consume_broadcast_enable", bool),
        ("retryQueueNums", "retry_queue_nums", int), ("retryMaxTimes", "retry_max_times", int),
        ("brokerId", "broker_id", int), ("whichBrokerWhenConsumeSlowly", "which_broker_when_consume_slowly", int),
        ("notifyConsumerIdsChangedEnable", "notify_consumer_ids_changed_enable", bool),
    )

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, attr) for key, attr, _ in self._KEYS}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SubscriptionGroupConfig:
        cfg = cls(group_name=str(obj["groupName"]))
        for key, attr, typ in cls._KEYS[1:]:
            if key in obj and obj[key] is not None:
                value = obj[key]
                if typ is bool and isinstance(value, str):
                    value = value.lower() == "true"
                value = typ(value)
                if typ is int and not JAVA_INT_MIN <= value <= JAVA_INT_MAX:
                    raise ValueError(f"{key} {value} is outside the int range")
                setattr(cfg, attr, value)
        return cfg


class SubscriptionGroupManager(JournaledJsonTable):
    def __init__(self, config_dir: str, *, auto_create: bool, clock_ms: Callable[[], int]) -> None:
        super().__init__(config_dir, "subscriptionGroup.json")
        self.auto_create = auto_create
        self._clock_ms = clock_ms
        self.table: dict[str, SubscriptionGroupConfig] = {}
        self.data_version = DataVersion()
        for name in ("TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                     "CID_ONSAPI_PULL", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_RMQ_SYS_TRANS"):
            self.table[name] = SubscriptionGroupConfig(name)

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config, auto-created when allowed; None otherwise."""
        cfg = self.table.get(group)
        if cfg is None and self.auto_create:
            cfg = SubscriptionGroupConfig(group)
            self.table[group] = cfg
            try:
                self._changed(group)
            except OSError as exc:
                # an auto-created group is a default config the next request would create again: serve it, and
                # let the next snapshot persist it, rather than fail the consumer's pull or heartbeat on a full disk
                log.warning("group %s auto-created but not journaled (%s); the next snapshot writes it", group, exc)
        return cfg

    def update(self, cfg: SubscriptionGroupConfig) -> None:
        self.table[cfg.group_name] = cfg
        self._changed(cfg.group_name)

    def delete(self, group: str) -> bool:
        if self.table.pop(group, None) is None:
            return False
        self._changed(group)
        return True

    def _changed(self, group: str) -> None:
        """One group was created, replaced or deleted: journaled (O(1)) before the caller answers."""
        self.data_version.next_version(self._clock_ms())
        cfg = self.table.get(group)
        if cfg is None:
            self.journal_delete(group)
        else:
            self.journal_put(group, cfg.to_json())

    def snapshot_parts(self) -> tuple[dict[str, Any], str, Mapping[str, Any], Callable[[Any], Any]]:
        return ({"dataVersion": self.data_version.to_json()}, "subscriptionGroupTable", self.table,
                SubscriptionGroupConfig.to_json)

    def apply_journal(self, key: str, value: Any | None) -> None:
        if value is None:
            self.table.pop(key, None)
        else:
            self.table[key] = SubscriptionGroupConfig.from_json({**value, "groupName": key})

    def encode(self) -> dict[str, Any]:
        return {
            "dataVersion": self.data_version.to_json(),
            "subscriptionGroupTable": {k: v.to_json() for k, v in self.table.items()},
        }

    def decode(self, obj: dict[str, Any]) -> None:
        for name, raw in (obj.get("subscriptionGroupTable") or {}).items():
            raw = dict(raw)
            raw.setdefault("groupName", name)
            self.table[str(name)] = SubscriptionGroupConfig.from_json(raw)
        self.data_version = DataVersion.from_json(obj.get("dataVersion"))

    async def replace_all(self, obj: dict[str, Any]) -> None:
        """Slave sync: take the master's table and data version wholesale, built SNAPSHOT_STEP_ENTRIES groups
        at a time between yields to the event loop and swapped in at once; then written as a snapshot
        (config_file.install_replacement)."""
        master = obj.get("subscriptionGroupTable") or {}
        names = list(master)
        version = DataVersion.from_json(obj.get("dataVersion"))
        table: dict[str, SubscriptionGroupConfig] = {}
        for start in range(0, len(names), SNAPSHOT_STEP_ENTRIES):
            if start:
                await asyncio.sleep(0)
            for name in names[start:start + SNAPSHOT_STEP_ENTRIES]:
                raw = master[name]
                table[str(name)] = SubscriptionGroupConfig.from_json({**raw, "groupName": raw.get("groupName", name)})

        def install() -> None:
            self.table = table
            self.data_version = version

        await self.install_replacement(install)

    async def table_json(self) -> bytes:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG's body (``encode()``'s content), encoded in steps. The data version
        is the one before the steps: a change meanwhile makes a slave that holds this body ask again."""
        head = b'{"dataVersion":' + jsonx.dumps(self.data_version.to_json()) + b',"subscriptionGroupTable":'
        body = await json_object_in_steps(self.table, SubscriptionGroupConfig.to_json)
        return head + body + b"}"
