"""Consumer offset stores.

* ``RemoteOffsetStore`` (clustering): offsets live on the broker (QUERY/UPDATE_CONSUMER_OFFSET); a local
  table holds the newest value per queue and is pushed every ``persist_offset_interval_ms`` and on stop.
* ``LocalFileOffsetStore`` (broadcasting): a JSON file per group, written atomically (temp + rename):

  ``{"offsetTable": [{"topic": s, "brokerName": s, "queueId": i, "offset": i}, ...]}``
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import orjson

from ferrymq.common.route import MessageQueue

log = logging.getLogger(__name__)

OffsetReader = Callable[[MessageQueue], Awaitable[int]]
OffsetWriter = Callable[[MessageQueue, int], Awaitable[None]]


class OffsetStore:
    """In-memory table; subclasses add where offsets persist."""

    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}
        self._dirty: set[MessageQueue] = set()

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = False) -> None:
        old = self.table.get(mq)
        if increase_only and old is not None and offset <= old:
            return
        self.table[mq] = offset
        self._dirty.add(mq)

    def read_memory(self, mq: MessageQueue) -> int:
        return self.table.get(mq, -1)

    async def read_store(self, mq: MessageQueue) -> int:
        raise NotImplementedError

    async def read(self, mq: MessageQueue) -> int:
        """Memory first, else the persistent store; -1 when nothing is known."""
        if mq in self.table:
            return self.table[mq]
        offset = await self.read_store(mq)
        if offset >= 0:
            self.table[mq] = offset
        return offset

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)
        self._dirty.discard(mq)

    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> None:
        raise NotImplementedError


class RemoteOffsetStore(OffsetStore):
    def __init__(self, reader: OffsetReader, writer: OffsetWriter) -> None:
        super().__init__()
        self._reader = reader
        self._writer = writer

    async def read_store(self, mq: MessageQueue) -> int:
        return await self._reader(mq)

    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> None:
        targets = set(self.table) if mqs is None else set(mqs) & set(self.table)
        for mq in sorted(targets):
            offset = self.table[mq]
            if offset < 0:
                continue
            try:
                await self._writer(mq, offset)
                self._dirty.discard(mq)
            except Exception as exc:
                log.warning("committing offset %d of %s failed: %s", offset, mq, exc)


class LocalFileOffsetStore(OffsetStore):
    def __init__(self, directory: str | os.PathLike[str], group: str) -> None:
        super().__init__()
        self.path = Path(directory) / group / "offsets.json"
        self._loaded: dict[MessageQueue, int] = self._load()

    def _load(self) -> dict[MessageQueue, int]:
        for candidate in (self.path, self.path.with_suffix(".json.bak")):
            try:
                obj = orjson.loads(candidate.read_bytes())
            except FileNotFoundError:
                continue
            except orjson.JSONDecodeError:
                log.warning("offset file %s is corrupt; trying the backup", candidate)
                continue
            return {MessageQueue.from_json(e): int(e["offset"]) for e in obj.get("offsetTable", [])}
        return {}

    async def read_store(self, mq: MessageQueue) -> int:
        return self._loaded.get(mq, -1)

    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> None:
        self.persist_sync()

    def persist_sync(self) -> None:
        merged = dict(self._loaded)
        merged.update({mq: off for mq, off in self.table.items() if off >= 0})
        entries = [{**mq.to_json(), "offset": off} for mq, off in sorted(merged.items())]
        data = orjson.dumps({"offsetTable": entries}, option=orjson.OPT_INDENT_2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            os.replace(self.path, self.path.with_suffix(".json.bak"))
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".offsets.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._loaded = merged
        self._dirty.clear()
