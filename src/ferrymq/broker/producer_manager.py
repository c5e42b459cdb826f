"""Live producer channels per group (heartbeats; expiry 120 s; closed connections dropped at once)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ferrymq.broker.consumer_manager import CHANNEL_EXPIRED_MS, ClientChannel


class ProducerManager:
    def __init__(self, *, clock_ms: Callable[[], int], channel_expired_ms: int = CHANNEL_EXPIRED_MS) -> None:
        self._clock_ms = clock_ms
        self.channel_expired_ms = channel_expired_ms
        self.groups: dict[str, dict[Any, ClientChannel]] = {}
        #: connection -> the groups it has a channel in (a closed connection costs O(its groups))
        self._groups_of_conn: dict[Any, set[str]] = {}

    def register(self, conn: Any, group: str, client_id: str, language: str, version: int) -> None:
        chans = self.groups.setdefault(group, {})
        ch = chans.get(conn)
        if ch is None:
            chans[conn] = ClientChannel(conn, client_id, language, version, self._clock_ms())
            self._groups_of_conn.setdefault(conn, set()).add(group)
        else:
            ch.last_update_ms = self._clock_ms()

    def unregister(self, conn: Any, group: str) -> None:
        chans = self.groups.get(group)
        if chans is not None:
            chans.pop(conn, None)
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
                del chans[conn]
                self._forget(conn, group)
                removed += 1
            if not chans:
                del self.groups[group]
        return removed

    def channels(self, group: str) -> list[ClientChannel]:
        return list(self.groups.get(group, {}).values())

    def find_channel(self, client_id: str) -> ClientChannel | None:
        """An open channel of ``client_id`` in any group (request-reply pushes go to it)."""
        for chans in self.groups.values():
            for ch in chans.values():
                if ch.client_id == client_id and not getattr(ch.conn, "closed", False):
                    return ch
        return None
