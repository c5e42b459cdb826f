"""Live producer channels per group (heartbeats; expiry 120 s; closed connections dropped at once)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ferrymq.broker.consumer_manager import (
    CHANNEL_EXPIRED_MS,
    ClientChannel,
    find_open_channel,
    index_channel,
    unindex_channel,
)


class ProducerManager:
    def __init__(self, *, clock_ms: Callable[[], int], channel_expired_ms: int = CHANNEL_EXPIRED_MS) -> None:
        self._clock_ms = clock_ms
        self.channel_expired_ms = channel_expired_ms
        self.groups: dict[str, dict[Any, ClientChannel]] = {}
        #: connection -> the groups it has a channel in (a closed connection costs O(its groups))
        self._groups_of_conn: dict[Any, set[str]] = {}
        #: client id -> its channels, keyed by (group, connection) (request-reply finds one in O(1))
        self._by_client: dict[str, dict[tuple[str, Any], ClientChannel]] = {}

    def register(self, conn: Any, group: str, client_id: str, language: str, version: int) -> None:
        chans = self.groups.setdefault(group, {})
        ch = chans.get(conn)
        if ch is None:
            ch = chans[conn] = ClientChannel(conn, client_id, language, version, self._clock_ms())
            self._groups_of_conn.setdefault(conn, set()).add(group)
            index_channel(self._by_client, group, ch)
        else:
            ch.last_update_ms = self._clock_ms()

    def unregister(self, conn: Any, group: str) -> None:
        chans = self.groups.get(group)
        if chans is not None:
            ch = chans.pop(conn, None)
            if ch is not None:
                unindex_channel(self._by_client, group, ch)
            self._forget(conn, group)
            if not chans:
                del self.groups[group]

    def channel_closed(self, conn: Any) -> None:
        for group in list(self._groups_of_conn.get(conn, ())):
            self.unregister(conn, group)
        self._groups_of_conn.pop(conn, None)

    def _forget(self, conn: Any, group: str) -> None:
        groups = self._groups_of_conn.get(conn)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._groups_of_conn[conn]

    def scan_expired(self) -> int:
        now = self._clock_ms()
        removed = 0
        for group, chans in list(self.groups.items()):
            for conn in [c for c, ch in chans.items() if now - ch.last_update_ms > self.channel_expired_ms]:
                unindex_channel(self._by_client, group, chans.pop(conn))
                self._forget(conn, group)
                removed += 1
            if not chans:
                del self.groups[group]
        return removed

    def channels(self, group: str) -> list[ClientChannel]:
        return list(self.groups.get(group, {}).values())

    def find_channel(self, client_id: str) -> ClientChannel | None:
        """An open channel of ``client_id`` in any group (request-reply pushes go to it): O(its channels)."""
        return find_open_channel(self._by_client, client_id)
