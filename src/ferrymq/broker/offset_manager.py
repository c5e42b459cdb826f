"""Committed consumer offsets: ``config/consumerOffset.json`` (protocol §5.5).

``{"offsetTable":{"<topic>@<group>":{0:123,1:45}}}`` — queue-id keys may be bare numbers on read; we
write them quoted (fastjson reads both). Persisted every flushConsumerOffsetInterval (built in steps and
written by a worker thread: ``snapshot_if_dirty``) and on stop. The file and its ``.bak`` both unreadable is a
config error: the broker refuses to start rather than answer offset 0 for every group (config_file.py).

Indexes topic -> groups and group -> topics keep the per-topic and per-group look-ups O(result).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from ferrymq.broker.config_file import SNAPSHOT_STEP_ENTRIES, JsonPersisted, json_object_in_steps

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager(JsonPersisted):
    def __init__(self, config_dir: str) -> None:
        super().__init__(config_dir, "consumerOffset.json")
        #: "topic@group" -> queue id -> committed queue offset
        self.table: dict[str, dict[int, int]] = {}
        #: on a slave: commits made here (while the master was unreachable) that the master has not taken yet:
        #: ("topic@group", queue id) -> offset
        self.local_commits: dict[tuple[str, int], int] | None = None
        #: topic -> groups and group -> topics with a key in ``table`` (dicts of names to None, not sets: a dict
        #: of strings is not tracked by the garbage collector, so the indexes add nothing to its full passes)
        self._groups_by_topic: dict[str, dict[str, None]] = {}
        self._topics_by_group: dict[str, dict[str, None]] = {}

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if offset < 0:  # ali-ons sends -1 for "never consumed"
            return
        key = self.key(topic, group)
        queues = self.table.get(key)
        if queues is None:
            queues = self.table[key] = {}
            self._index(topic, group)
        queues[queue_id] = offset
        self._dirty = True
        if self.local_commits is not None:
            self.local_commits[(key, queue_id)] = offset

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """Committed offset, or -1."""
        return self.table.get(self.key(topic, group), {}).get(queue_id, -1)

    def groups_of_topic(self, topic: str) -> set[str]:
        return set(self._groups_by_topic.get(topic, ()))

    def topics_of_group(self, group: str) -> set[str]:
        return set(self._topics_by_group.get(group, ()))

    def groups_with_offsets(self) -> list[str]:
        return list(self._topics_by_group)

    def remove_topic(self, topic: str) -> None:
        for group in self._groups_by_topic.pop(topic, {}):
            self.table.pop(self.key(topic, group), None)
            topics = self._topics_by_group.get(group)
            if topics is not None:
                topics.pop(topic, None)
                if not topics:
                    del self._topics_by_group[group]
        self._dirty = True

    def _index(self, topic: str, group: str) -> None:
        self._groups_by_topic.setdefault(topic, {})[group] = None
        self._topics_by_group.setdefault(group, {})[topic] = None

    def _index_key(self, key: str) -> None:
        topic, sep, group = key.partition(TOPIC_GROUP_SEPARATOR)
        if sep:
            self._index(topic, group)

    # ---- persistence (load, persist, persist_if_dirty, snapshot_if_dirty: JsonPersisted) -----------------
    def encode(self) -> dict[str, Any]:
        return {"offsetTable": {k: dict(v) for k, v in self.table.items()}}

    def snapshot_parts(self) -> tuple[dict[str, Any], str, Mapping[str, Any], Callable[[Any], Any]]:
        return {}, "offsetTable", self.table, dict

    def decode(self, obj: dict[str, Any]) -> None:
        for k, queues in (obj.get("offsetTable") or {}).items():
            key = str(k)
            if key not in self.table:
                self._index_key(key)
            self.table[key] = {int(q): int(o) for q, o in (queues or {}).items()}

    async def merge_from_master(self, obj: dict[str, Any]) -> dict[tuple[str, int], int]:
        """Slave sync: the master's table wins per queue, except where this slave holds a larger offset
        committed here (while the master was down): that one is kept, and returned so the slave hands it to the
        master (UPDATE_CONSUMER_OFFSET) and consumers going back to the master are not rewound. Offsets the
        master reset below an older slave value are kept as the master has them: only commits made on the slave
        since the last merge count. The master's keys are taken SNAPSHOT_STEP_ENTRIES at a time between yields
        to the event loop."""
        master = obj.get("offsetTable") or {}
        keys = list(master)
        for start in range(0, len(keys), SNAPSHOT_STEP_ENTRIES):
            if start:
                await asyncio.sleep(0)
            self.decode({"offsetTable": {key: master[key] for key in keys[start:start + SNAPSHOT_STEP_ENTRIES]}})
        push: dict[tuple[str, int], int] = {}
        for (key, queue_id), offset in list((self.local_commits or {}).items()):
            if key not in self.table:
                self._index_key(key)
            current = self.table.setdefault(key, {}).get(queue_id, -1)
            if offset > current:
                self.table[key][queue_id] = offset
                push[(key, queue_id)] = offset
            elif self.local_commits is not None:
                del self.local_commits[(key, queue_id)]
        self._dirty = True
        return push

    def pushed(self, key: str, queue_id: int, offset: int) -> None:
        """The master took a local commit: forget it unless a newer one came meanwhile."""
        if self.local_commits is not None and self.local_commits.get((key, queue_id)) == offset:
            del self.local_commits[(key, queue_id)]

    async def table_json(self) -> bytes:
        """GET_ALL_CONSUMER_OFFSET's body (``encode()``'s content), encoded SNAPSHOT_STEP_ENTRIES keys at a time
        between yields to the event loop; each key's queues as they are when its step runs."""
        return b'{"offsetTable":' + await json_object_in_steps(self.table, dict) + b"}"
