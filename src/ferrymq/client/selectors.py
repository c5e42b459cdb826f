"""Queue selectors (``selector(mqs, msg, arg) -> MessageQueue``) and message selectors (what a consumer
subscribes with: a tag expression or a SQL92 expression, RocketMQ's ``MessageSelector``)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ferrymq.common.message import Message, java_string_hash
from ferrymq.common.route import MessageQueue
from ferrymq.common.sql92 import EXPRESSION_TYPE_SQL92, EXPRESSION_TYPE_TAG, is_tag_type


def select_by_hash(mqs: list[MessageQueue], msg: Message | None, arg: Any) -> MessageQueue:
    """Same ``arg`` (e.g. an order id) → same queue, so per-key order holds. Stable across processes
    (Java ``String.hashCode`` of ``str(arg)``, or the int itself)."""
    if not mqs:
        raise ValueError("no message queue to select from")
    key = arg if isinstance(arg, int) else java_string_hash(str(arg))
    return mqs[abs(key) % len(mqs)]


def select_random(mqs: list[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    if not mqs:
        raise ValueError("no message queue to select from")
    return random.choice(mqs)


class RoundRobin:
    """Round-robin over a queue list, skipping brokers the caller says to avoid."""

    def __init__(self, start: int | None = None) -> None:
        self._index = random.randrange(1 << 16) if start is None else start

    def next_index(self) -> int:
        self._index = (self._index + 1) & 0x7FFFFFFF
        return self._index

    def next_indexes(self, n: int) -> int:
        """Reserve ``n`` consecutive picks at once; returns the first (as ``n`` calls of ``next_index``)."""
        first = (self._index + 1) & 0x7FFFFFFF
        self._index = (self._index + n) & 0x7FFFFFFF
        return first

    def __call__(self, mqs: list[MessageQueue], msg: Message | None = None, arg: Any = None) -> MessageQueue:
        if not mqs:
            raise ValueError("no message queue to select from")
        return mqs[self.next_index() % len(mqs)]


@dataclass(frozen=True, slots=True)
class MessageSelector:
    """What a consumer subscribes with: ``by_tag("TagA || TagB")`` (a plain string means the same) or
    ``by_sql("a BETWEEN 1 AND 3 AND TAGS = 'TagA'")``, evaluated by the broker on message properties (the
    broker needs ``enablePropertyFilter=true``)."""

    expression: str = "*"
    expression_type: str = EXPRESSION_TYPE_TAG

    @classmethod
    def by_tag(cls, expression: str = "*") -> MessageSelector:
        return cls(expression or "*", EXPRESSION_TYPE_TAG)

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        if not expression or not expression.strip():
            raise ValueError("a SQL92 selector needs an expression")
        return cls(expression, EXPRESSION_TYPE_SQL92)

    @property
    def is_tag(self) -> bool:
        return is_tag_type(self.expression_type)


def as_message_selector(expression: str | MessageSelector | None) -> MessageSelector:
    """A subscription argument (tag expression string, None or MessageSelector) as a MessageSelector."""
    if isinstance(expression, MessageSelector):
        return expression
    return MessageSelector.by_tag(expression or "*")
