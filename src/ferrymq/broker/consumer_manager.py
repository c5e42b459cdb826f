"""Live consumer channels per group, from heartbeats (protocol §2.7 HEART_BEAT, §3.4, §1.5).

A channel without a heartbeat for ``channel_expired_ms`` (120 s) is dropped by ``scan_expired`` (run
every 10 s); a closed connection is dropped at once. Whenever a group's channel set changes, every
channel of the group gets NOTIFY_CONSUMER_IDS_CHANGED (oneway), through the ``on_ids_changed`` hook. A channel
that unregisters (UNREGISTER_CLIENT: the client is leaving) is also reported to ``on_client_left`` with its
group and the client id of its heartbeats (the broker releases that client's queue locks in the group).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ferrymq.common.message import java_string_hash
from ferrymq.common.sql92 import is_tag_type

log = logging.getLogger(__name__)

CHANNEL_EXPIRED_MS = 120_000
SUB_ALL = "*"
TAG_SEPARATOR = "||"

CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM_WHERE = (
    "CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST", "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP",
)


def enum_name(value: Any, names: tuple[str, ...], default: str) -> str:
    """Heartbeat enums arrive as names (ali-ons, Java) or ordinals (C++)."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return names[value] if 0 <= value < len(names) else default
    if isinstance(value, str):
        if value.isdigit():
            return enum_name(int(value), names, default)
        return value if value in names else default
    return default


def as_int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass(slots=True)
class SubscriptionData:
    """A topic subscription; hash codes are always recomputed from the tags (never trust C++ codeSet)."""

    topic: str
    sub_string: str = SUB_ALL
    tags_set: frozenset[str] = frozenset()
    code_set: frozenset[int] = frozenset()
    sub_version: int = 0
    expression_type: str = "TAG"

    @classmethod
    def build(cls, topic: str, sub_string: str | None, sub_version: int = 0,
              expression_type: str | None = None) -> SubscriptionData:
        text = (sub_string or "").strip()
        if expression_type and not is_tag_type(expression_type):  # SQL92: the whole text is one expression
            return cls(topic, text, sub_version=sub_version, expression_type=expression_type)
        if not text or text == SUB_ALL:
            return cls(topic, SUB_ALL, sub_version=sub_version, expression_type=expression_type or "TAG")
        tags = frozenset(t.strip() for t in text.split(TAG_SEPARATOR) if t.strip())
        return cls(topic, text, tags, frozenset(java_string_hash(t) for t in tags), sub_version,
                   expression_type or "TAG")

    @property
    def matches_all(self) -> bool:
        return is_tag_type(self.expression_type) and (self.sub_string == SUB_ALL or not self.tags_set)

    def matches_code(self, tags_code: int) -> bool:
        return self.matches_all or tags_code in self.code_set

    def to_json(self) -> dict[str, Any]:
        return {
            "classFilterMode": False, "codeSet": sorted(self.code_set), "expressionType": self.expression_type,
            "subString": self.sub_string, "subVersion": self.sub_version, "tagsSet": sorted(self.tags_set),
            "topic": self.topic,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SubscriptionData:
        return cls.build(str(obj.get("topic", "")), obj.get("subString"), as_int(obj.get("subVersion")),
                         obj.get("expressionType"))


@dataclass(slots=True)
class ClientChannel:
    conn: Any
    client_id: str
    language: str
    version: int
    last_update_ms: int


@dataclass(slots=True)
class ConsumerData:
    group: str
    consume_type: str
    message_model: str
    consume_from_where: str
    subscriptions: list[SubscriptionData]
    unit_mode: bool = False

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ConsumerData:
        subs = [SubscriptionData.from_json(s) for s in obj.get("subscriptionDataSet") or [] if isinstance(s, dict)]
        unit = obj.get("unitMode")
        return cls(
            group=str(obj.get("groupName", "")),
            consume_type=enum_name(obj.get("consumeType"), CONSUME_TYPES, "CONSUME_PASSIVELY"),
            message_model=enum_name(obj.get("messageModel"), MESSAGE_MODELS, "CLUSTERING"),
            consume_from_where=enum_name(obj.get("consumeFromWhere"), CONSUME_FROM_WHERE, CONSUME_FROM_WHERE[0]),
            subscriptions=subs,
            unit_mode=unit is True or str(unit).lower() in ("true", "1"),
        )


@dataclass(slots=True)
class ConsumerGroupInfo:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[Any, ClientChannel] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return [c.client_id for c in self.channels.values()]


class ConsumerManager:
    def __init__(self, *, clock_ms: Callable[[], int], channel_expired_ms: int = CHANNEL_EXPIRED_MS) -> None:
        self._clock_ms = clock_ms
        self.channel_expired_ms = channel_expired_ms
        self.groups: dict[str, ConsumerGroupInfo] = {}
        #: connection -> the groups it has a channel in (a closed connection costs O(its groups))
        self._groups_of_conn: dict[Any, set[str]] = {}
        #: client id -> its channels, keyed by (group, connection) (request-reply finds one in O(1))
        self._by_client: dict[str, dict[tuple[str, Any], ClientChannel]] = {}
        #: (group, channels) after the group's channel set changed
        self.on_ids_changed: Callable[[str, list[ClientChannel]], None] | None = None
        #: (group, client id) of a channel that unregistered
        self.on_client_left: Callable[[str, str], object] | None = None

    def register(self, conn: Any, client_id: str, language: str, version: int, data: ConsumerData) -> bool:
        """Record a heartbeat; True when the group's channel set changed."""
        now = self._clock_ms()
        info = self.groups.get(data.group)
        if info is None:
            info = self.groups[data.group] = ConsumerGroupInfo(data.group)
        info.consume_type = data.consume_type
        info.message_model = data.message_model
        info.consume_from_where = data.consume_from_where
        ch = info.channels.get(conn)
        changed = ch is None or ch.client_id != client_id
        if ch is None:
            ch = info.channels[conn] = ClientChannel(conn, client_id, language, version, now)
            self._groups_of_conn.setdefault(conn, set()).add(data.group)
            index_channel(self._by_client, data.group, ch)
        else:
            if ch.client_id != client_id:
                unindex_channel(self._by_client, data.group, ch)
                ch.client_id = client_id
                index_channel(self._by_client, data.group, ch)
            ch.last_update_ms = now
        for sub in data.subscriptions:
            old = info.subscriptions.get(sub.topic)
            if (old is None or old.sub_version < sub.sub_version or old.sub_string != sub.sub_string
                    or old.expression_type != sub.expression_type):
                info.subscriptions[sub.topic] = sub
        keep = {s.topic for s in data.subscriptions}
        for topic in [t for t in info.subscriptions if t not in keep]:
            del info.subscriptions[topic]
        if changed:
            self._notify(info)
        return changed

    def unregister(self, conn: Any, group: str) -> None:
        info = self.groups.get(group)
        ch = info.channels.pop(conn, None) if info is not None else None
        if info is not None and ch is not None:
            unindex_channel(self._by_client, group, ch)
            self._forget(conn, group)
            self._after_removal(info)
            if self.on_client_left is not None:
                self.on_client_left(group, ch.client_id)

    def channel_closed(self, conn: Any) -> None:
        for group in sorted(self._groups_of_conn.pop(conn, ())):
            info = self.groups.get(group)
            ch = info.channels.pop(conn, None) if info is not None else None
            if info is not None and ch is not None:
                unindex_channel(self._by_client, group, ch)
                self._after_removal(info)

    def _forget(self, conn: Any, group: str) -> None:
        groups = self._groups_of_conn.get(conn)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._groups_of_conn[conn]

    def scan_expired(self) -> int:
        now = self._clock_ms()
        removed = 0
        for info in list(self.groups.values()):
            stale = [c for c, ch in info.channels.items() if now - ch.last_update_ms > self.channel_expired_ms]
            for conn in stale:
                ch = info.channels.pop(conn)
                unindex_channel(self._by_client, info.group, ch)
                self._forget(conn, info.group)
                log.info("consumer channel %s of group %s expired", ch.client_id, info.group)
                close = getattr(conn, "close", None)
                if close is not None:
                    close()
                removed += 1
            if stale:
                self._after_removal(info)
        return removed

    def _after_removal(self, info: ConsumerGroupInfo) -> None:
        if not info.channels:
            self.groups.pop(info.group, None)
        else:
            self._notify(info)

    def _notify(self, info: ConsumerGroupInfo) -> None:
        if self.on_ids_changed is not None and info.channels:
            self.on_ids_changed(info.group, list(info.channels.values()))

    def get(self, group: str) -> ConsumerGroupInfo | None:
        return self.groups.get(group)

    def subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.groups.get(group)
        return None if info is None else info.subscriptions.get(topic)

    def groups_subscribing(self, topic: str) -> list[str]:
        return [g for g, info in self.groups.items() if topic in info.subscriptions]

    def find_channel(self, client_id: str) -> ClientChannel | None:
        """An open channel of ``client_id`` in any group (request-reply pushes go to it): O(its channels)."""
        return find_open_channel(self._by_client, client_id)


def index_channel(by_client: dict[str, dict[tuple[str, Any], ClientChannel]], group: str, ch: ClientChannel) -> None:
    by_client.setdefault(ch.client_id, {})[(group, ch.conn)] = ch


def unindex_channel(by_client: dict[str, dict[tuple[str, Any], ClientChannel]], group: str,
                    ch: ClientChannel) -> None:
    channels = by_client.get(ch.client_id)
    if channels is not None:
        channels.pop((group, ch.conn), None)
        if not channels:
            del by_client[ch.client_id]


def find_open_channel(by_client: dict[str, dict[tuple[str, Any], ClientChannel]], client_id: str
                      ) -> ClientChannel | None:
    for ch in by_client.get(client_id, {}).values():
        if not getattr(ch.conn, "closed", False):
            return ch
    return None
