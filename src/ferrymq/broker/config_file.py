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
