"""Values of the client API: message constructor, send/pull/consume outcomes."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from ferrymq.common.message import (
    KEY_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    Message,
    MessageExt,
)
from ferrymq.common.route import MessageQueue


def new_message(
    topic: str,
    body: bytes | str,
    *,
    tags: str | None = None,
    keys: str | Iterable[str] | None = None,
    properties: dict[str, str] | None = None,
    delay_level: int = 0,
    flag: int = 0,
) -> Message:
    """Build a message. ``keys`` is one key or several (stored space-separated, each indexed)."""
    if type(body) is not bytes:  # bytes(b) of a bytes object is b itself: skip the call
        body = bytes(body.encode("utf-8") if isinstance(body, str) else body)
    props: dict[str, str] = {k: str(v) for k, v in properties.items()} if properties else {}
    if tags:
        props[PROPERTY_TAGS] = tags
    if keys:
        key_list = [keys] if isinstance(keys, str) else [str(k) for k in keys]
        props[PROPERTY_KEYS] = KEY_SEPARATOR.join(k for k in key_list if k)
    if delay_level:
        if delay_level < 0:
            raise ValueError("delay_level must be >= 0")
        props[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)
    return Message(topic, body, flag, props)


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


#: SEND response code → status (the message is stored in all four cases, protocol §2.7).
SEND_STATUS_BY_CODE = {
    0: SendStatus.SEND_OK,
    10: SendStatus.FLUSH_DISK_TIMEOUT,
    12: SendStatus.FLUSH_SLAVE_TIMEOUT,
    11: SendStatus.SLAVE_NOT_AVAILABLE,
}


@dataclass(slots=True)
class SendResult:
    status: SendStatus
    msg_id: str  # client-generated UNIQ_KEY (comma-joined for a batch)
    offset_msg_id: str  # broker's offset msgId (comma-joined for a batch)
    message_queue: MessageQueue
    queue_offset: int


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


#: PULL response code → status (protocol §2.7).
PULL_STATUS_BY_CODE = {
    0: PullStatus.FOUND,
    19: PullStatus.NO_NEW_MSG,
    20: PullStatus.NO_MATCHED_MSG,
    21: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(slots=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = 0
    raw_body: bytes = b""


class ConsumeStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    # orderly listeners may use these names; they mean the same two outcomes
    SUCCESS = "CONSUME_SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "RECONSUME_LATER"


class MessageModel(enum.Enum):
    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(enum.Enum):
    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5
