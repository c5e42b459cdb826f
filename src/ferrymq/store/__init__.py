"""Message store: commit log + consume queues + index, in RocketMQ 4.x's on-disk format.

Synchronous and single-writer; no networking, no asyncio. Entry point: ``MessageStore``.
"""

from ferrymq.store.config import BrokerRole, FlushDiskType, StoreConfig
from ferrymq.store.errors import (
    StoreCorruptError,
    StoreDirError,
    StoreDiskFullError,
    StoreError,
    StoreLockedError,
)
from ferrymq.store.filter import MessageFilter, TagFilter
from ferrymq.store.message_store import MessageStore
from ferrymq.store.results import (
    AppendMessageResult,
    AppendMessageStatus,
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
)

__all__ = [
    "AppendMessageResult",
    "AppendMessageStatus",
    "BrokerRole",
    "FlushDiskType",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageFilter",
    "MessageStore",
    "PutMessageResult",
    "PutMessageStatus",
    "QueryMessageResult",
    "StoreConfig",
    "StoreCorruptError",
    "StoreDirError",
    "StoreError",
    "StoreLockedError",
    "StoreDiskFullError",
    "TagFilter",
]
