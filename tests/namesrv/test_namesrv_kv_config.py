"""KVConfigManager: in-memory table with optional persistence."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferrymq.errors import ConfigError
from ferrymq.namesrv.kv_config import KVConfigManager


def test_memory_only() -> None:
    kv = KVConfigManager()
    kv.put("ns", "k", "v")
    assert kv.get("ns", "k") == "v" and kv.namespace("ns") == {"k": "v"}
    assert kv.delete("ns", "k") and not kv.delete("ns", "k")
    assert kv.namespace("ns") is None and kv.get("ns", "k") is None


def test_persists_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    kv = KVConfigManager(path)
    kv.put("ORDER_TOPIC_CONFIG", "T", "b:4")
    kv.put("ns", "a", "1")
    kv.delete("ns", "a")
    again = KVConfigManager(path)
    assert again.namespace("ORDER_TOPIC_CONFIG") == {"T": "b:4"}
    assert again.namespace("ns") is None


def test_unreadable_file_is_config_error(tmp_path: Path) -> None:
    path = tmp_path / "kv.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError):
        KVConfigManager(path)
