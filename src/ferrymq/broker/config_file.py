"""Persisted JSON config files under ``<storePathRootDir>/config`` (protocol §5.5).

Before each persist the previous content is copied to ``<file>.bak``; the new content is written to a
temporary file and renamed over the old one. Files are pretty-printed; readers accept fastjson's bare
numeric keys (``{0:12}``) through ``jsonx.loads``.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

from ferrymq.remoting import jsonx

log = logging.getLogger(__name__)


class JsonConfigFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> Any | None:
        """The parsed file, falling back to ``.bak``; None when neither exists or parses."""
        for candidate in (self.path, self.path + ".bak"):
            try:
                with open(candidate, "rb") as fh:
                    data = fh.read()
            except FileNotFoundError:
                continue
            if not data.strip():
                continue
            try:
                return jsonx.loads(data)
            except ValueError as exc:
                log.warning("cannot parse %s: %s", candidate, exc)
        return None

    def persist(self, obj: Any) -> None:
        self.write_raw(jsonx.dumps_pretty(obj))

    def write_raw(self, data: bytes) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        if os.path.exists(self.path):
            shutil.copyfile(self.path, self.path + ".bak")
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, self.path)


class JsonPersisted:
    """A table kept in one JSON config file. A subclass gives ``encode()`` (the file's object) and
    ``decode(obj)`` (take a parsed object in); ``load`` ignores a missing or non-object file.
    ``_dirty`` marks changes not yet persisted (``persist_if_dirty``)."""

    def __init__(self, config_dir: str, file_name: str) -> None:
        self._file = JsonConfigFile(os.path.join(config_dir, file_name))
        self._dirty = False

    def encode(self) -> dict[str, Any]:
        raise NotImplementedError

    def decode(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def load(self) -> None:
        obj = self._file.load()
        if isinstance(obj, dict):
            self.decode(obj)

    def persist(self) -> None:
        self._file.persist(self.encode())
        self._dirty = False

    def persist_if_dirty(self) -> None:
        if self._dirty:
            self.persist()
