"""Queue selectors: ``selector(mqs, msg, arg) -> MessageQueue``."""

from __future__ import annotations

import random
from typing import Any

from ferrymq.common.message import Message, java_string_hash
from ferrymq.common.route import MessageQueue


def select_by_hash(mqs: list[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
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

    def __call__(self, mqs: list[MessageQueue], msg: Message | None = None, arg: Any = None) -> MessageQueue:
        if not mqs:
            raise ValueError("no message queue to select from")
        return mqs[self.next_index() % len(mqs)]
