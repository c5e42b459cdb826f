"""The narrow seam between HA and the message store.

The master reads committed bytes with ``read_from(phy_offset, max_bytes)`` (never across a
segment, ``b""`` when nothing is there); the slave writes with ``append_at(phy_offset, data)``.
``StoreView`` adapts a ``ferrymq.store.message_store.MessageStore`` (or any object with the same
names) to the ``CommitLogSource`` / ``CommitLogSink`` protocols of the sans-IO connections.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StoreView", "segment_size_of"]


def segment_size_of(store: Any) -> int:
    """The commit log segment size (``mapped_file_size_commit_log``) of ``store``."""
    for holder in (
        store,
        getattr(store, "config", None),
        getattr(store, "store_config", None),
        getattr(store, "_config", None),
    ):
        if holder is None:
            continue
        size = getattr(holder, "mapped_file_size_commit_log", None)
        if isinstance(size, int) and size > 0:
            return size
    raise ValueError("cannot find mapped_file_size_commit_log on the store; pass segment_size=")


class StoreView:
    def __init__(self, store: Any, segment_size: int | None = None) -> None:
        self.store = store
        self.segment_size = segment_size if segment_size is not None else segment_size_of(store)

    def max_phy_offset(self) -> int:
        value = self.store.max_phy_offset
        return int(value() if callable(value) else value)

    def read_from(self, phy_offset: int, max_bytes: int) -> bytes:
        return bytes(self.store.read_from(phy_offset, max_bytes))

    def append_at(self, phy_offset: int, data: bytes | memoryview) -> bool:
        return bool(self.store.append_at(phy_offset, data))
