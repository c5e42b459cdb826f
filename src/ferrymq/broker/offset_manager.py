"""Committed consumer offsets: ``config/consumerOffset.json`` (protocol §5.5).

``{"offsetTable":{"<topic>@<group>":{0:123,1:45}}}`` — queue-id keys may be bare numbers on read; we
write them quoted (fastjson reads both). Persisted every flushConsumerOffsetInterval and on stop.
"""

from __future__ import annotations

from typing import Any

from ferrymq.broker.config_file import JsonPersisted

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager(JsonPersisted):
    def __init__(self, config_dir: str) -> None:
        super().__init__(config_dir, "consumerOffset.json")
        #: "topic@group" -> queue id -> committed queue offset
        self.table: dict[str, dict[int, int]] = {}
        #: on a slave: commits made here (while the master was unreachable) that the master has not taken yet:
        #: ("topic@group", queue id) -> offset
        self.local_commits: dict[tuple[str, int], int] | None = None

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if offset < 0:  # ali-ons sends -1 for "never consumed"
            return
        key = self.key(topic, group)
        self.table.setdefault(key, {})[queue_id] = offset
        self._dirty = True
        if self.local_commits is not None:
            self.local_commits[(key, queue_id)] = offset

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """Committed offset, or -1."""
        return self.table.get(self.key(topic, group), {}).get(queue_id, -1)

    def groups_of_topic(self, topic: str) -> set[str]:
        prefix = topic + TOPIC_GROUP_SEPARATOR
        return {k[len(prefix):] for k in self.table if k.startswith(prefix)}

    def topics_of_group(self, group: str) -> set[str]:
        suffix = TOPIC_GROUP_SEPARATOR + group
        return {k[: -len(suffix)] for k in self.table if k.endswith(suffix)}

    def remove_topic(self, topic: str) -> None:
        prefix = topic + TOPIC_GROUP_SEPARATOR
        for k in [k for k in self.table if k.startswith(prefix)]:
            del self.table[k]
        self._dirty = True

    # ---- persistence (load, persist, persist_if_dirty: JsonPersisted) -----------------
    def encode(self) -> dict[str, Any]:
        return {"offsetTable": {k: dict(v) for k, v in self.table.items()}}

    def decode(self, obj: dict[str, Any]) -> None:
        for k, queues in (obj.get("offsetTable") or {}).items():
            self.table[str(k)] = {int(q): int(o) for q, o in (queues or {}).items()}

    def merge_from_master(self, obj: dict[str, Any]) -> dict[tuple[str, int], int]:
        """Slave sync: the master's table wins per queue, except where this slave holds a larger offset
        committed here (while the master was down): that one is kept, and returned so the slave hands it to the
        master (UPDATE_CONSUMER_OFFSET) and consumers going back to the master are not rewound. Offsets the
        master reset below an older slave value are kept as the master has them: only commits made on the slave
        since the last merge count."""
        self.decode(obj)
        push: dict[tuple[str, int], int] = {}
        for (key, queue_id), offset in list((self.local_commits or {}).items()):
            current = self.table.setdefault(key, {}).get(queue_id, -1)
            if offset > current:
                self.table[key][queue_id] = offset
                push[(key, queue_id)] = offset
            elif self.local_commits is not None:
                del self.local_commits[(key, queue_id)]
        return push

    def pushed(self, key: str, queue_id: int, offset: int) -> None:
        """The master took a local commit: forget it unless a newer one came meanwhile."""
        if self.local_commits is not None and self.local_commits.get((key, queue_id)) == offset:
            del self.local_commits[(key, queue_id)]
        self.persist()
