"""Persisted JSON config files under ``<storePathRootDir>/config`` (protocol §5.5), and the change journal
that keeps each change O(1) (docs/decisions/0005-metadata-journal-and-snapshots.md).

Snapshot file (``topics.json``, ``subscriptionGroup.json``, ``consumerOffset.json``): RocketMQ's format,
pretty-printed; readers accept fastjson's bare numeric keys (``{0:12}``) through ``jsonx.loads``. A snapshot
is written to ``<file>.tmp``, fsynced, the current file copied to ``<file>.bak``, and the temporary file
renamed over the current one (then the directory fsynced).

Journal file ``<file>.journal`` (topics and subscription groups only): one JSON object per line, appended
(one ``write``) before the change is acknowledged:

| field   | type                               | meaning                                              |
|---------|------------------------------------|------------------------------------------------------|
| ``v``   | ``{"counter":n,"timestamp":ms}``   | the table's data version after the change            |
| ``put`` | string                             | key of an entry created or replaced (with ``value``) |
| ``value`` | object                           | the entry, as in the snapshot's table                |
| ``del`` | string                             | key of an entry deleted                              |

Loading reads the snapshot (or, when it is unreadable, ``.bak``) and replays the journal lines whose
``v.counter`` is above the snapshot's. After a snapshot the journal keeps the lines above the counter of
``.bak`` (the snapshot before), so either file plus the journal gives the whole table. A torn last line
(a crash inside the append) is dropped; a bad line before the last is a config error.

A snapshot and its ``.bak`` that both exist and cannot be read or parsed are a config error naming the
file: the broker refuses to start rather than start from an empty table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ferrymq.common.topic import DataVersion
from ferrymq.errors import ConfigError
from ferrymq.remoting import jsonx
from ferrymq.store.checkpoint import fsync_dir

log = logging.getLogger(__name__)

#: entries turned into JSON per step of an asynchronous snapshot, between two yields to the event loop
SNAPSHOT_STEP_ENTRIES = 500
JOURNAL_SUFFIX = ".journal"


async def json_values_in_steps(table: Mapping[str, Any], to_json: Callable[[Any], Any],
                               step: int = SNAPSHOT_STEP_ENTRIES) -> dict[str, Any]:
    """``{key: to_json(value)}`` of ``table``, ``step`` entries between two yields to the event loop. The keys
    are listed at once (no per-entry objects: a list of 100,000 (key, value) pairs alone cost ~90 ms of
    allocation and garbage collection); each value is read when its step runs, and keys removed meanwhile are
    left out."""
    keys = list(table)
    out: dict[str, Any] = {}
    for start in range(0, len(keys), step):
        if start:
            await asyncio.sleep(0)
        for key in keys[start:start + step]:
            value = table.get(key)
            if value is not None:
                out[key] = to_json(value)
    return out


async def json_object_in_steps(table: Mapping[str, Any], to_json: Callable[[Any], Any],
                               step: int = SNAPSHOT_STEP_ENTRIES) -> bytes:
    """The JSON object ``{key: to_json(value)}`` of ``table`` as bytes, encoded ``step`` entries at a time
    between two yields to the event loop (a whole-table answer never holds the loop at estate size); values
    are read as in ``json_values_in_steps``."""
    keys = list(table)
    parts: list[bytes] = []
    for start in range(0, len(keys), step):
        if start:
            await asyncio.sleep(0)
        chunk: dict[str, Any] = {}
        for key in keys[start:start + step]:
            value = table.get(key)
            if value is not None:
                chunk[key] = to_json(value)
        if chunk:
            parts.append(jsonx.dumps(chunk)[1:-1])
    return b"{" + b",".join(parts) + b"}"


class JsonConfigFile:
    def __init__(self, path: str) -> None:
        self.path = path
        #: serialises writers (the snapshot thread and a synchronous persist on the loop)
        self._lock = threading.Lock()
        #: generation of the content now in the file (a write of an older generation is skipped)
        self._generation = -1

    def load(self) -> Any | None:
        """The parsed file, falling back to ``.bak``; None when neither exists. ConfigError when one of them
        exists and neither can be read and parsed (an empty file counts as unreadable)."""
        problems: list[str] = []
        for candidate in (self.path, self.path + ".bak"):
            try:
                with open(candidate, "rb") as fh:
                    data = fh.read()
            except FileNotFoundError:
                continue
            except OSError as exc:
                problems.append(f"{candidate}: {exc.strerror or exc}")
                log.warning("cannot read %s: %s", candidate, exc)
                continue
            if not data.strip():
                # ferrymq writes a snapshot to a temporary file and renames it: an empty file is damage, not an
                # empty table (that is written as "{}"); starting from nothing would be a guess
                problems.append(f"{candidate}: empty")
                log.warning("%s is empty", candidate)
                continue
            try:
                return jsonx.loads(data)
            except ValueError as exc:
                problems.append(f"{candidate}: not JSON ({exc})")
                log.warning("cannot parse %s: %s", candidate, exc)
        if problems:
            raise ConfigError(os.path.basename(self.path),
                              f"cannot read {self.path} nor its .bak ({'; '.join(problems)}); restore one of "
                              "them or move both away to start with an empty table")
        return None

    def persist(self, obj: Any) -> None:
        self.write_raw(jsonx.dumps_pretty(obj))

    def write_raw(self, data: bytes, generation: int | None = None) -> bool:
        """Write ``data`` as the new content (tmp + fsync + .bak + rename). With a ``generation``, a write
        older than the file's content is skipped (False)."""
        with self._lock:
            if generation is not None:
                if generation < self._generation:
                    return False
                self._generation = generation
            directory = os.path.dirname(self.path) or "."
            os.makedirs(directory, exist_ok=True)
            tmp = self.path + ".tmp"
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if os.path.exists(self.path):
                shutil.copyfile(self.path, self.path + ".bak")
            os.replace(tmp, self.path)
            fsync_dir(directory)
            return True


class JsonPersisted:
    """A table kept in one JSON config file. A subclass gives ``encode()`` (the file's object) and
    ``decode(obj)`` (take a parsed object in); ``load`` ignores a missing or non-object file.
    ``_dirty`` marks changes not yet persisted (``persist_if_dirty``, ``snapshot_if_dirty``).

    ``snapshot_if_dirty`` is the event loop's way: the file's object is built in steps of
    SNAPSHOT_STEP_ENTRIES entries (``snapshot_parts``), yielding to the loop between steps, and encoded and
    written in a worker thread."""

    def __init__(self, config_dir: str, file_name: str) -> None:
        self._file = JsonConfigFile(os.path.join(config_dir, file_name))
        self._dirty = False
        #: snapshots taken so far (the generation of the next one)
        self._generation = 0
        #: held while a snapshot is built and written (one at a time; a slave's table replacement waits too)
        self._snapshot_lock = asyncio.Lock()

    def encode(self) -> dict[str, Any]:
        raise NotImplementedError

    def decode(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def load(self) -> None:
        obj = self._file.load()
        if isinstance(obj, dict):
            self.decode(obj)

    def persist(self) -> None:
        gen = self._next_generation()
        self._dirty = False
        self._file.write_raw(jsonx.dumps_pretty(self.encode()), gen)

    def persist_if_dirty(self) -> None:
        if self._dirty:
            self.persist()

    def _next_generation(self) -> int:
        self._generation += 1
        return self._generation

    # ---- asynchronous snapshots ------------------------------------------------------------------
    def snapshot_parts(self) -> tuple[dict[str, Any], str, Mapping[str, Any], Callable[[Any], Any]]:
        """(the file's object without its big table, the table's key, the table, entry -> JSON value). The
        entries are read in steps (``json_values_in_steps``): a later change may be in the snapshot or not, which
        the journal's replay above the head's data version makes right."""
        raise NotImplementedError

    async def snapshot_if_dirty(self) -> bool:
        """Persist the table without holding the event loop: True when a snapshot was written. Skipped while
        another snapshot is on its way (the timer comes again)."""
        if not self._dirty or self._snapshot_lock.locked():
            return False
        async with self._snapshot_lock:
            return await self._snapshot_locked()

    async def snapshot_now(self) -> bool:
        """Persist the table now without holding the event loop (after a snapshot on its way): True when
        written. For changes that must be in the file before they are answered."""
        async with self._snapshot_lock:
            return await self._snapshot_locked()

    async def _snapshot_locked(self) -> bool:
        gen = self._next_generation()
        self._dirty = False
        head, table_key, table, to_json = self.snapshot_parts()
        marker = self._snapshot_taken()
        head[table_key] = await json_values_in_steps(table, to_json)
        try:
            written = await asyncio.to_thread(self._write_in_thread, head, gen)
        except BaseException:
            self._dirty = True
            raise
        if written:
            self._snapshot_written(marker)
        return written

    def _write_in_thread(self, obj: dict[str, Any], generation: int) -> bool:
        return self._file.write_raw(jsonx.dumps_pretty(obj), generation)

    def _snapshot_taken(self) -> Any:
        """Hook: state to remember when the snapshot's content is taken (journaled tables)."""
        return None

    def _snapshot_written(self, marker: Any) -> None:
        """Hook: the snapshot taken with ``marker`` is now the file's content."""


class JournaledJsonTable(JsonPersisted):
    """A JsonPersisted table whose changes are appended to ``<file>.journal`` before they are
    acknowledged (O(1) per change) and folded into the snapshot on a timer. A subclass keeps
    ``data_version`` (with ``counter``) and gives ``entry_to_json`` / ``apply_journal``."""

    data_version: Any

    def __init__(self, config_dir: str, file_name: str) -> None:
        super().__init__(config_dir, file_name)
        self._journal_path = self._file.path + JOURNAL_SUFFIX
        self._journal_fd: int | None = None
        #: (counter, line) of every line now in the journal file
        self._journal_lines: list[tuple[int, bytes]] = []
        #: data version counter of the snapshot file's content, and of its .bak
        self._file_counter = 0

    def apply_journal(self, key: str, value: Any | None) -> None:
        """Replay one journal line: ``value`` None deletes ``key``."""
        raise NotImplementedError

    # ---- load ------------------------------------------------------------------------------------
    def load(self) -> None:
        super().load()
        self._file_counter = self.data_version.counter
        self._replay_journal()

    def _replay_journal(self) -> None:
        try:
            with open(self._journal_path, "rb") as fh:
                raw_lines = fh.read().split(b"\n")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ConfigError(os.path.basename(self._journal_path), f"cannot read {self._journal_path}: {exc}") \
                from None
        if raw_lines and raw_lines[-1] == b"":
            raw_lines.pop()
        replayed = 0
        for i, line in enumerate(raw_lines):
            try:
                obj = jsonx.loads(line)
                version = DataVersion.from_json(obj["v"])
                key = str(obj["put"] if "put" in obj else obj["del"])
                value = obj.get("value") if "put" in obj else None
                if "put" in obj and not isinstance(value, dict):
                    raise ValueError("put without an object value")
            except (ValueError, KeyError, TypeError) as exc:
                if i == len(raw_lines) - 1:
                    log.warning("%s: dropping a torn last line (%s)", self._journal_path, exc)
                    break
                raise ConfigError(os.path.basename(self._journal_path),
                                  f"{self._journal_path} line {i + 1} is damaged ({exc}); restore the file or "
                                  "move it away (the changes since the last snapshot are then lost)") from None
            self._journal_lines.append((version.counter, line + b"\n"))
            if version.counter <= self.data_version.counter:
                continue
            try:
                self.apply_journal(key, value)
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(os.path.basename(self._journal_path),
                                  f"{self._journal_path} line {i + 1}: {exc}") from None
            self.data_version = version
            replayed += 1
        if replayed:
            self._dirty = True
            log.info("%s: replayed %d change(s) after the snapshot", self._journal_path, replayed)

    # ---- journal ---------------------------------------------------------------------------------
    def journal_put(self, key: str, value_json: Any) -> None:
        self._append({"v": self.data_version.to_json(), "put": key, "value": value_json})

    def journal_delete(self, key: str) -> None:
        self._append({"v": self.data_version.to_json(), "del": key})

    def _append(self, obj: dict[str, Any]) -> None:
        line = jsonx.dumps(obj) + b"\n"
        self._dirty = True  # whatever happens below, the next snapshot holds the change
        if self._journal_fd is None:
            os.makedirs(os.path.dirname(self._journal_path) or ".", exist_ok=True)
            self._journal_fd = os.open(self._journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fd = self._journal_fd
        size_before = os.fstat(fd).st_size
        view = memoryview(line)
        try:
            while view:  # a short write (nearly full disk) goes on with the rest
                view = view[os.write(fd, view):]
        except OSError:
            # never leave a torn line in the middle of the journal (loading refuses one): cut it back off
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size_before)
            raise
        self._journal_lines.append((self.data_version.counter, line))

    def _compact_journal(self, keep_above: int) -> None:
        """Keep the lines above counter ``keep_above`` (the .bak's): written to a temporary file and renamed."""
        kept = [(c, line) for c, line in self._journal_lines if c > keep_above]
        if len(kept) == len(self._journal_lines):
            return
        self._write_journal(kept)

    def _write_journal(self, lines: list[tuple[int, bytes]]) -> None:
        """The journal file holds exactly ``lines`` (written to a temporary file and renamed; removed if none)."""
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
        if lines:
            tmp = self._journal_path + ".tmp"
            with open(tmp, "wb") as fh:
                fh.write(b"".join(line for _, line in lines))
            os.replace(tmp, self._journal_path)
        else:
            try:
                os.unlink(self._journal_path)
            except FileNotFoundError:
                pass
        self._journal_lines = lines

    def close_journal(self) -> None:
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None

    # ---- snapshots -------------------------------------------------------------------------------
    def persist(self) -> None:
        bak_counter = self._file_counter
        counter = self.data_version.counter
        super().persist()
        self._file_counter = counter
        self._compact_journal(min(bak_counter, counter))

    async def install_replacement(self, install: Callable[[], None]) -> None:
        """Slave sync: ``install()`` swaps in the master's table and data version (built beforehand, in steps);
        the table is then written as a snapshot (in steps and a worker thread) and the replaced table's journal
        lines are dropped. It waits for a snapshot on its way, so that one cannot fold the new table's journal
        by the old table's counters. Until the snapshot is written, the files still hold the replaced table with
        its journal (a crash meanwhile restarts from it, and the next sync replaces it again)."""
        async with self._snapshot_lock:
            install()
            self._journal_lines = []  # the replaced table's lines no longer apply (the file is rewritten below)
            self._file_counter = self.data_version.counter
            self._dirty = True
            try:
                await self._snapshot_locked()
            finally:
                self._write_journal(list(self._journal_lines))

    def _snapshot_taken(self) -> Any:
        return self.data_version.counter

    def _snapshot_written(self, marker: Any) -> None:
        bak_counter = self._file_counter
        self._file_counter = int(marker)
        self._compact_journal(min(bak_counter, int(marker)))
