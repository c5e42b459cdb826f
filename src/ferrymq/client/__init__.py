"""ferrymq client: an asyncio-first RocketMQ 4.x client (producer, pull/push consumers, admin).

Blocking facades live in ``ferrymq.client.sync``.
"""

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
