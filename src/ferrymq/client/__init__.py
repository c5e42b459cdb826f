"""ferrymq client: an asyncio-first RocketMQ 4.x client (producer, pull/push consumers, admin).

Blocking facades live in ``ferrymq.client.sync``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ferrymq.client.admin import Admin
    from ferrymq.client.consumer.pull import PullConsumer
    from ferrymq.client.consumer.push import PushConsumer
    from ferrymq.client.consumer.rebalance import allocate_averagely, allocate_averagely_by_circle
    from ferrymq.client.producer import Producer
    from ferrymq.client.selectors import MessageSelector, select_by_hash, select_random
    from ferrymq.client.values import (
        ConsumeStatus,
        PullResult,
        PullStatus,
        SendResult,
        SendStatus,
        new_message,
    )
    from ferrymq.common.message import Message, MessageExt
    from ferrymq.common.route import MessageQueue, TopicRouteData

#: Where each exported name lives; a submodule is imported on first use of one of its names, so a process
#: that needs one client (a pull consumer) does not import the others.
_LAZY = {
    "Admin": "ferrymq.client.admin",
    "PullConsumer": "ferrymq.client.consumer.pull",
    "PushConsumer": "ferrymq.client.consumer.push",
    "allocate_averagely": "ferrymq.client.consumer.rebalance",
    "allocate_averagely_by_circle": "ferrymq.client.consumer.rebalance",
    "Producer": "ferrymq.client.producer",
    "MessageSelector": "ferrymq.client.selectors",
    "select_by_hash": "ferrymq.client.selectors",
    "select_random": "ferrymq.client.selectors",
    "ConsumeStatus": "ferrymq.client.values",
    "PullResult": "ferrymq.client.values",
    "PullStatus": "ferrymq.client.values",
    "SendResult": "ferrymq.client.values",
    "SendStatus": "ferrymq.client.values",
    "new_message": "ferrymq.client.values",
    "Message": "ferrymq.common.message",
    "MessageExt": "ferrymq.common.message",
    "MessageQueue": "ferrymq.common.route",
    "TopicRouteData": "ferrymq.common.route",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Admin",
    "ConsumeStatus",
    "Message",
    "MessageExt",
    "MessageQueue",
    "MessageSelector",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "SendResult",
    "SendStatus",
    "TopicRouteData",
    "allocate_averagely",
    "allocate_averagely_by_circle",
    "new_message",
    "select_by_hash",
    "select_random",
]
