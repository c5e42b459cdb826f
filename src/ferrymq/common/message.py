"""Message values shared by broker, store and client (no I/O).

Properties string (RocketMQ 4.x, see protocol §4.4)::

    name \\x01 value \\x02 name \\x01 value [\\x02]

Java writes no trailing ``\\x02``; C++ and ali-ons do. We write none and accept both.

Offset message id (§4.5), uppercase hex of:

| bytes | field                          |
|-------|--------------------------------|
| 4     | store host IPv4                |
| 4     | store port (int32)             |
| 8     | commit log physical offset     |
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Well-known property keys.
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_CLUSTER = "CLUSTER"

KEY_SEPARATOR = " "

# Request-reply (RocketMQ 4.6+): the requester sets the first three, the responder copies them onto the reply
# (with MSG_TYPE=reply); the broker adds PUSH_REPLY_TIME when it pushes, the requester ARRIVE_TIME on arrival.
PROPERTY_CORRELATION_ID = "CORRELATION_ID"
PROPERTY_MESSAGE_REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
PROPERTY_MESSAGE_TTL = "TTL"
PROPERTY_MESSAGE_TYPE = "MSG_TYPE"
PROPERTY_PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
PROPERTY_REPLY_MESSAGE_ARRIVE_TIME = "ARRIVE_TIME"
#: MSG_TYPE of a reply message (a request carries no MSG_TYPE)
REPLY_MESSAGE_FLAG = "reply"
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"


def reply_topic(cluster_name: str) -> str:
    """``<cluster>_REPLY_TOPIC``: where the brokers of a cluster store replies."""
    return f"{cluster_name}_{REPLY_TOPIC_POSTFIX}"

# sysFlag bits (§4.2)
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_NOT_TYPE = 0x0
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20


def properties_to_string(properties: dict[str, str]) -> str:
    """Encode a properties dict the Java way (no trailing separator; None values skipped)."""
    return PROPERTY_SEPARATOR.join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in properties.items() if v is not None
    )


def string_to_properties(text: str | None) -> dict[str, str]:
    """Decode a properties string; tolerates a trailing separator and junk segments."""
    result: dict[str, str] = {}
    if not text:
        return result
    for item in text.split(PROPERTY_SEPARATOR):
        if len(item) < 2:
            continue
        idx = item.find(NAME_VALUE_SEPARATOR)
        if idx <= 0:
            continue
        result[item[:idx]] = item[idx + 1 :]
    return result


def java_string_hash(text: str) -> int:
    """Java ``String.hashCode()`` as a signed int32 (over UTF-16 code units)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def tags_hash_code(tags: str | None) -> int:
    """Consume-queue tagsCode for a TAGS value; no tags → 0."""
    if not tags:
        return 0
    return java_string_hash(tags)


def ip_to_bytes(ip: str) -> bytes:
    try:
        return socket.inet_aton(ip)
    except OSError:
        return b"\x7f\x00\x00\x01"


_MSGID = struct.Struct(">4siq")


def encode_offset_msg_id(store_ip: str, store_port: int, phy_offset: int) -> str:
    """Offset msgId: uppercase hex of store IPv4, port and commit log physical offset."""
    return _MSGID.pack(ip_to_bytes(store_ip), store_port, phy_offset).hex().upper()


def encode_offset_msg_id_raw(store_host: bytes, phy_offset: int) -> str:
    """Offset msgId from an 8-byte stored host field (4 IP bytes + int32 port)."""
    return (store_host + struct.pack(">q", phy_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """Return (ip, port, phy_offset) from a 32-hex-char offset msgId; ValueError if malformed."""
    if len(msg_id) != 32:
        raise ValueError(f"offset msgId must be 32 hex characters, got {len(msg_id)}")
    raw = bytes.fromhex(msg_id)
    ip_b, port, phy_offset = _MSGID.unpack(raw)
    return socket.inet_ntoa(ip_b), port, phy_offset


class _PropertyAccessors:
    """Property readers shared by Message and MessageExt (no state of its own: keeps their slots)."""

    __slots__ = ()
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []


@dataclass(slots=True)
class Message(_PropertyAccessors):
    """A message as a producer builds it."""

    topic: str
    body: bytes
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def delay_level(self) -> int:
        try:
            return int(self.properties.get(PROPERTY_DELAY_TIME_LEVEL, "0"))
        except ValueError:
            return 0


@dataclass(slots=True)
class MessageExt(_PropertyAccessors):
    """A stored message, as decoded from a commit log record (protocol §4.1)."""

    topic: str
    body: bytes
    flag: int
    properties: dict[str, str]
    queue_id: int
    queue_offset: int
    phy_offset: int
    store_size: int
    body_crc: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes  # 4 IP bytes + int32 port (8 bytes)
    store_timestamp: int
    store_host: bytes  # 4 IP bytes + int32 port (8 bytes)
    reconsume_times: int
    prepared_transaction_offset: int

    @property
    def offset_msg_id(self) -> str:
        return encode_offset_msg_id_raw(self.store_host, self.phy_offset)

    @property
    def msg_id(self) -> str:
        """The client-visible id: UNIQ_KEY if the producer set one, else the offset msgId."""
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or self.offset_msg_id


def host_to_bytes(ip: str, port: int) -> bytes:
    """8-byte stored host field: IPv4 bytes + int32 port."""
    return ip_to_bytes(ip) + struct.pack(">i", port)


def bytes_to_host(raw: bytes) -> tuple[str, int]:
    return socket.inet_ntoa(raw[:4]), struct.unpack(">i", raw[4:8])[0]


@dataclass(slots=True)
class MessageExtBrokerInner:
    """What the broker hands the store for one put (the store assigns offsets and timestamp)."""

    topic: str
    queue_id: int
    body: bytes
    flag: int = 0
    properties_string: str = ""
    tags_code: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
    store_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    store_timestamp: int = 0  # filled by the store at append time
    # keys indexed by the store (UNIQ_KEY + KEYS); derived by the broker from properties
    index_keys: tuple[str, ...] = ()
    wait_store_msg_ok: bool = True
