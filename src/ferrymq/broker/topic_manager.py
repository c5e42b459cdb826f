"""Topic table of one broker: ``config/topics.json``, built-in topics, TBW102 auto-create (§3.6).

``topics.json``: ``{"dataVersion":{"counter":n,"timestamp":ms},"topicConfigTable":{"<topic>":TopicConfig}}``

A change is appended to ``topics.json.journal`` before it is acknowledged and folded into ``topics.json`` by
the broker's snapshot timer (config_file.py). The registration body's topic table is kept encoded, one
fragment per topic, updated with each change, so that a registration costs a join, not an encode of every
topic (``wrapper_json``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

from ferrymq.broker.config_file import SNAPSHOT_STEP_ENTRIES, JournaledJsonTable
from ferrymq.common.topic import (
    BENCHMARK_TOPIC,
    DEFAULT_TOPIC,
    OFFSET_MOVED_EVENT,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    SCHEDULE_TOPIC,
    SELF_TEST_TOPIC,
    DataVersion,
    TopicConfig,
    is_inherited,
)
from ferrymq.remoting import jsonx

log = logging.getLogger(__name__)

RW = PERM_READ | PERM_WRITE
#: queue count of %RETRY% and %DLQ% topics (retryQueueNums)
SYS_GROUP_TOPIC_QUEUE_NUMS = 1
SCHEDULE_QUEUE_NUMS = 18
BENCHMARK_QUEUE_NUMS = 1024
CLUSTER_TOPIC_QUEUE_NUMS = 16


class TopicManager(JournaledJsonTable):
    def __init__(
        self,
        config_dir: str,
        *,
        cluster_name: str,
        broker_name: str,
        auto_create_topic_enable: bool = True,
        default_topic_queue_nums: int = 8,
        clock_ms: Callable[[], int],
    ) -> None:
        super().__init__(config_dir, "topics.json")
        self._clock_ms = clock_ms
        self.auto_create_topic_enable = auto_create_topic_enable
        self.table: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()
        #: called after a topic is created or updated (the broker re-registers at once)
        #: called after each change; ``urgent`` for a topic a client's request created (auto-create in a send,
        #: a group's %RETRY% / %DLQ% topic): the client asks for its route next
        self.on_change: Callable[..., None] | None = None
        #: called instead of ``on_change`` with a topic created or replaced (its config), ``urgent`` as there:
        #: registers that topic alone (``NameServerRegistrar.register_topic``); deletions call ``on_change``
        self.on_topic_put: Callable[..., None] | None = None
        #: on a slave: topic -> how many queues its store holds (``get`` answers read-only configs from it for
        #: topics the master's config has not brought yet)
        self.replica_queue_count: Callable[[str], int] | None = None
        self._derived: dict[str, TopicConfig] = {}
        #: topics the master's table dropped (deleted there): never served from the slave's own queues
        self._deleted_on_master: set[str] = set()
        #: topic -> its ``"name":{TopicConfig JSON}`` fragment of the registration body; None: to rebuild
        self._fragments: dict[str, bytes] | None = None
        builtins = [
            TopicConfig(SELF_TEST_TOPIC, 1, 1),
            TopicConfig(BENCHMARK_TOPIC, BENCHMARK_QUEUE_NUMS, BENCHMARK_QUEUE_NUMS),
            TopicConfig(cluster_name, CLUSTER_TOPIC_QUEUE_NUMS, CLUSTER_TOPIC_QUEUE_NUMS, RW | PERM_INHERIT),
            TopicConfig(broker_name, 1, 1, RW | PERM_INHERIT),
            TopicConfig(OFFSET_MOVED_EVENT, 1, 1),
            TopicConfig(SCHEDULE_TOPIC, SCHEDULE_QUEUE_NUMS, SCHEDULE_QUEUE_NUMS),
            TopicConfig(f"{cluster_name}_REPLY_TOPIC", 1, 1),
        ]
        if auto_create_topic_enable:
            builtins.append(TopicConfig(DEFAULT_TOPIC, default_topic_queue_nums, default_topic_queue_nums,
                                        RW | PERM_INHERIT))
        for tc in builtins:
            self.table[tc.topic_name] = tc

    # ---- persistence ---------------------------------------------------------------
    def load(self) -> None:
        super().load()
        if not self.auto_create_topic_enable and DEFAULT_TOPIC in self.table:
            tc = self.table[DEFAULT_TOPIC]
            self.table[DEFAULT_TOPIC] = TopicConfig(tc.topic_name, tc.read_queue_nums, tc.write_queue_nums, RW,
                                                    tc.topic_filter_type, tc.topic_sys_flag, tc.order)
        # built here, before the broker serves, so that no registration or GET_ALL_TOPIC_CONFIG builds them
        # all at once on the running event loop
        self._fragments = {name: _fragment(tc) for name, tc in self.table.items()}

    def decode(self, obj: dict[str, Any]) -> None:
        for name, raw in (obj.get("topicConfigTable") or {}).items():
            raw = dict(raw)
            raw.setdefault("topicName", name)
            self.table[str(name)] = TopicConfig.from_json(raw)
        self.data_version = DataVersion.from_json(obj.get("dataVersion"))

    def encode(self) -> dict[str, Any]:
        return {
            "dataVersion": self.data_version.to_json(),
            "topicConfigTable": {name: tc.to_json() for name, tc in self.table.items()},
        }

    def snapshot_parts(self) -> tuple[dict[str, Any], str, Mapping[str, Any], Callable[[Any], Any]]:
        return ({"dataVersion": self.data_version.to_json()}, "topicConfigTable", self.table,
                TopicConfig.to_json)

    def apply_journal(self, key: str, value: Any | None) -> None:
        if value is None:
            self.table.pop(key, None)
        else:
            self.table[key] = TopicConfig.from_json({**value, "topicName": key})

    def wrapper_json(self) -> bytes:
        """The TopicConfigSerializeWrapper JSON (as ``encode()``, same content) from the kept fragments."""
        fragments = self._fragments
        if fragments is None:
            fragments = self._fragments = {name: _fragment(tc) for name, tc in self.table.items()}
        return (b'{"dataVersion":' + jsonx.dumps(self.data_version.to_json()) + b',"topicConfigTable":{'
                + b",".join(fragments.values()) + b"}}")

    def _changed(self, topic: str, *, urgent: bool = False) -> None:
        """One topic was created, replaced or deleted: journaled (O(1)) before the caller answers."""
        self.data_version.next_version(self._clock_ms())
        tc = self.table.get(topic)
        if tc is None:
            self.journal_delete(topic)
            if self._fragments is not None:
                self._fragments.pop(topic, None)
        else:
            self.journal_put(topic, tc.to_json())
            if self._fragments is not None:
                self._fragments[topic] = _fragment(tc)
        if tc is not None and self.on_topic_put is not None:
            self.on_topic_put(tc, urgent=urgent)
        elif self.on_change is not None:
            if urgent:
                self.on_change(urgent=True)
            else:
                self.on_change()

    # ---- lookups -------------------------------------------------------------------------
    def get(self, topic: str) -> TopicConfig | None:
        tc = self.table.get(topic)
        if tc is None and self.replica_queue_count is not None and topic not in self._deleted_on_master:
            return self._replicated(topic)
        return tc

    def _replicated(self, topic: str) -> TopicConfig | None:
        """A slave's read-only config for a topic whose consume queues it built from the replicated log before
        the master's topic config reached it (queue count from its own queues): acknowledged messages stay
        readable from the slave even when the master died before the config sync."""
        assert self.replica_queue_count is not None
        count = self.replica_queue_count(topic)
        if count <= 0:
            return None
        tc = self._derived.get(topic)
        if tc is None or tc.read_queue_nums != count:
            tc = self._derived[topic] = TopicConfig(topic, count, count, PERM_READ)
        return tc

    def adopt_replicated(self, queue_ids: dict[str, list[int]]) -> list[str]:
        """A slave becoming master (controller mode): every topic it holds consume queues for but has no
        config of (the master died before the config sync) becomes a read-write topic with as many queues
        as it holds, so its messages stay readable and producers can go on sending. The adopted names."""
        adopted = []
        for topic, ids in sorted(queue_ids.items()):
            if topic in self.table or topic in self._deleted_on_master or not ids:
                continue
            count = max(ids) + 1
            self.table[topic] = TopicConfig(topic, count, count, RW)
            adopted.append(topic)
            self._changed(topic)
        self._derived.clear()
        if adopted:
            log.warning("took over %d topic(s) known only from the replicated log: %s", len(adopted),
                        ", ".join(adopted[:10]))
        return adopted

    # ---- creation ------------------------------------------------------------------------
    def create_in_send(self, topic: str, default_topic: str, queue_nums: int, topic_sys_flag: int = 0
                       ) -> TopicConfig | None:
        """Auto-create ``topic`` from the template ``default_topic`` (needs PERM_INHERIT); None if refused."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        template = self.table.get(default_topic)
        if template is None:
            return None
        if default_topic == DEFAULT_TOPIC and not self.auto_create_topic_enable:
            return None
        if not is_inherited(template.perm):
            return None
        nums = max(1, min(queue_nums, template.write_queue_nums))
        tc = TopicConfig(topic, nums, nums, template.perm & ~PERM_INHERIT, topic_sys_flag=topic_sys_flag)
        self.table[topic] = tc
        log.info("auto-created topic %s from %s with %d queues", topic, default_topic, nums)
        self._changed(topic, urgent=True)
        return tc

    def create_sys_group_topic(self, topic: str, queue_nums: int = SYS_GROUP_TOPIC_QUEUE_NUMS, perm: int = RW,
                               topic_sys_flag: int = 0) -> TopicConfig:
        """%RETRY% / %DLQ% topics (create-if-absent)."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        tc = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=topic_sys_flag)
        self.table[topic] = tc
        self._changed(topic, urgent=True)
        return tc

    def update(self, tc: TopicConfig) -> None:
        self.table[tc.topic_name] = tc
        self._changed(tc.topic_name)

    def delete(self, topic: str) -> bool:
        if self.table.pop(topic, None) is None:
            return False
        self._changed(topic)
        return True

    async def replace_all(self, obj: dict[str, Any]) -> None:
        """Slave sync: take the master's table and data version wholesale. A topic the master no longer has
        was deleted there: the slave stops serving it from its own queues too. The new table (and its
        registration fragments) is built SNAPSHOT_STEP_ENTRIES topics at a time between yields to the event
        loop and swapped in at once; then written as a snapshot (config_file.install_replacement)."""
        master = obj.get("topicConfigTable") or {}
        names = list(master)
        version = DataVersion.from_json(obj.get("dataVersion"))
        table: dict[str, TopicConfig] = {}
        fragments: dict[str, bytes] = {}
        for start in range(0, len(names), SNAPSHOT_STEP_ENTRIES):
            if start:
                await asyncio.sleep(0)
            for name in names[start:start + SNAPSHOT_STEP_ENTRIES]:
                raw = master[name]
                tc = TopicConfig.from_json({**raw, "topicName": raw.get("topicName", name)})
                table[str(name)] = tc
                fragments[str(name)] = _fragment(tc)

        def install() -> None:
            removed = [name for name in self.table if name not in table]
            self.table = table
            self.data_version = version
            self._deleted_on_master = {n for n in self._deleted_on_master if n not in table} | set(removed)
            for name in removed:
                self._derived.pop(name, None)
            self._fragments = fragments

        await self.install_replacement(install)

    def random_queue_id(self, tc: TopicConfig) -> int:
        return random.randrange(max(1, tc.write_queue_nums))


def _fragment(tc: TopicConfig) -> bytes:
    return jsonx.dumps(tc.topic_name) + b":" + jsonx.dumps(tc.to_json())
