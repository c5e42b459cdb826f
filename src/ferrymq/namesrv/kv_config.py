"""Name server KV config: namespace -> {key: value} (PUT/GET/DELETE_KV_CONFIG, GET_KVLIST_BY_NAMESPACE).

Kept in memory; when a ``path`` is given the whole table is loaded from it at start and rewritten
(atomically: temp file + rename) after every change, as ``{"configTable": {ns: {k: v}}}``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ferrymq.errors import ConfigError
from ferrymq.remoting import jsonx

log = logging.getLogger(__name__)

#: Namespace whose entries give a topic's orderTopicConf ("brokerName:queueNums;...").
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


class KVConfigManager:
    def __init__(self, path: str | Path | None = None) -> None:
        self._path = Path(path) if path is not None else None
        self._table: dict[str, dict[str, str]] = {}
        if self._path is not None and self._path.exists():
            self._load(self._path)

    def _load(self, path: Path) -> None:
        try:
            obj = jsonx.loads(path.read_bytes())
            table = obj.get("configTable") or {}
            self._table = {str(ns): {str(k): str(v) for k, v in kv.items()} for ns, kv in table.items()}
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            raise ConfigError("kv_config_path", f"cannot read {path}: {exc}") from exc
        log.info("loaded %d KV config namespaces from %s", len(self._table), path)

    def _persist(self) -> None:
        if self._path is None:
            return
        tmp = self._path.with_name(self._path.name + ".tmp")
        tmp.write_bytes(jsonx.dumps_pretty({"configTable": self._table}))
        os.replace(tmp, self._path)

    def put(self, namespace: str, key: str, value: str) -> None:
        ns = self._table.setdefault(namespace, {})
        if ns.get(key) == value:
            return
        ns[key] = value
        log.info("KV config put %s/%s=%s", namespace, key, value)
        self._persist()

    def get(self, namespace: str, key: str) -> str | None:
        return self._table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> bool:
        ns = self._table.get(namespace)
        if ns is None or key not in ns:
            return False
        del ns[key]
        if not ns:
            del self._table[namespace]
        log.info("KV config deleted %s/%s", namespace, key)
        self._persist()
        return True

    def namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of the namespace's table, or None when it has no entries."""
        ns = self._table.get(namespace)
        return dict(ns) if ns else None
