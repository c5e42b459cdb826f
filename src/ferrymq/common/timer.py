"""Timer messages (RocketMQ 5 "timer messages": delivery at any time up to a maximum) and their recall
handles: property names, the delivery time a message asks for, the handle's text. Sans-IO; used by the
broker (broker/timer.py, processors/send.py, processors/recall.py) and the 5.x proxy.

Properties a producer sets to ask for a delivery time (the first one present wins, in this order):

| property             | value                                   | who sends it                          |
|----------------------|-----------------------------------------|---------------------------------------|
| TIMER_DELAY_SEC      | delay in seconds from the broker's now  | RocketMQ 5 remoting clients           |
| TIMER_DELAY_MS       | delay in ms from the broker's now       | RocketMQ 5 remoting clients           |
| TIMER_DELIVER_MS     | delivery time, ms since the epoch       | RocketMQ 5 clients, the 5.x proxy     |
| __STARTDELIVERTIME   | delivery time, ms since the epoch       | ali-ons / Aliyun ONS (setStartDeliverTime) |

Properties the broker writes on the record it keeps in the timer topic (``rmq_sys_wheel_timer``, queue 0):

| property             | value                                                              |
|----------------------|--------------------------------------------------------------------|
| TIMER_OUT_MS         | the delivery time, ms since the epoch                              |
| REAL_TOPIC, REAL_QID | where the message goes when due                                    |
| TIMER_DEL_UNIQKEY    | recall marker only: ``<topic>+<UNIQ_KEY>`` of the recalled message |
| TIMER_ROLL_FROM      | a rolled record only: the timer queue offset of the record it replaces (broker/timer.py) |
| TIMER_ROLL_TIMES     | a rolled record only: how many times it was rolled (RocketMQ 5's name) |

Recall handle (RocketMQ's ``RecallMessageHandle`` v1): URL-safe base64 (with padding) of five fields
joined by one space:

| field        | meaning                                             |
|--------------|-----------------------------------------------------|
| version      | ``v1``                                              |
| topic        | the message's topic                                 |
| broker_name  | the broker group that keeps the timer record        |
| timestamp    | its delivery time (TIMER_OUT_MS), ms, decimal       |
| message_id   | its UNIQ_KEY                                        |
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass

from ferrymq.common.topic import (
    TIMER_TOPIC as TIMER_TOPIC,  # the system topic of timer messages (re-exported)
)
from ferrymq.errors import FerryError

#: the one queue of TIMER_TOPIC
TIMER_QUEUE_ID = 0

PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
#: ali-ons / Aliyun ONS: absolute delivery time in ms
PROPERTY_START_DELIVER_TIME = "__STARTDELIVERTIME"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROPERTY_TIMER_ROLL_FROM = "TIMER_ROLL_FROM"
PROPERTY_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"

#: the properties that make a message a timer message, in the order they are looked at
TIMER_REQUEST_PROPERTIES = (PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELIVER_MS,
                            PROPERTY_START_DELIVER_TIME)
#: the same names as they appear in a serialized properties string (name + NAME_VALUE_SEPARATOR)
TIMER_REQUEST_NEEDLES = tuple(name.encode("ascii") + b"\x01" for name in TIMER_REQUEST_PROPERTIES)

RECALL_HANDLE_VERSION = "v1"
#: how the broker's refusal of a delivery time begins (MESSAGE_ILLEGAL; the 5.x endpoint answers
#: ILLEGAL_DELIVERY_TIME for it)
TIMER_REFUSED_REMARK = "timer message refused"
#: longest recall handle text accepted (a topic of 127 characters, a broker name, a timestamp and an id fit)
RECALL_HANDLE_MAX_CHARS = 1024


class TimerPropertyError(FerryError):
    """A timer property whose value is not a whole number."""


def wants_timer(properties: Mapping[str, str]) -> bool:
    return any(name in properties for name in TIMER_REQUEST_PROPERTIES)


def deliver_ms_of(properties: Mapping[str, str], now_ms: int) -> int | None:
    """The delivery time (ms since the epoch) a message's properties ask for; None when they ask for none.
    Raises ``TimerPropertyError`` for a value that is not a whole number."""
    for name in TIMER_REQUEST_PROPERTIES:
        raw = properties.get(name)
        if raw is None:
            continue
        try:
            value = int(raw.strip())
        except ValueError:
            raise TimerPropertyError(f"timer property {name}={raw!r} is not a whole number") from None
        if name == PROPERTY_TIMER_DELAY_SEC:
            return now_ms + value * 1000
        if name == PROPERTY_TIMER_DELAY_MS:
            return now_ms + value
        return value
    return None


def delete_key(topic: str, uniq_key: str) -> str:
    """The recall marker's TIMER_DEL_UNIQKEY of message ``uniq_key`` of ``topic``."""
    return f"{topic}+{uniq_key}"


@dataclass(frozen=True, slots=True)
class RecallHandle:
    topic: str
    broker_name: str
    deliver_ms: int
    message_id: str

    def encode(self) -> str:
        raw = " ".join((RECALL_HANDLE_VERSION, self.topic, self.broker_name, str(self.deliver_ms), self.message_id))
        return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> RecallHandle:
        """Raises ``ValueError`` (with a message for the client) when ``text`` is not a v1 handle."""
        if not text or len(text) > RECALL_HANDLE_MAX_CHARS:
            raise ValueError("recall handle is invalid")
        try:
            raw = base64.urlsafe_b64decode(text.encode("ascii")).decode("utf-8")
        except (binascii.Error, UnicodeError, ValueError):
            raise ValueError("recall handle is invalid") from None
        items = raw.split(" ")
        if len(items) < 5 or items[0] != RECALL_HANDLE_VERSION:
            raise ValueError("recall handle is invalid")
        try:
            deliver_ms = int(items[3])
        except ValueError:
            raise ValueError("recall handle is invalid: bad timestamp") from None
        return cls(items[1], items[2], deliver_ms, items[4])
