"""Outcome values of store operations (status names exactly as RocketMQ's)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ferrymq.common.message import encode_offset_msg_id_raw


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    #: the store's file system is above diskSpaceWarningLevelRatio (MessageStore.check_disk_space)
    DISK_FULL = "DISK_FULL"
    CREATE_MAPEDFILE_FAILED = "CREATE_MAPEDFILE_FAILED"
    #: no file descriptor left to open the queue's consume queue file (EMFILE / ENFILE)
    OPEN_FILES_EXHAUSTED = "OPEN_FILES_EXHAUSTED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    LMQ_CONSUME_QUEUE_NUM_EXCEEDED = "LMQ_CONSUME_QUEUE_NUM_EXCEEDED"


class AppendMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    END_OF_FILE = "END_OF_FILE"
    MESSAGE_SIZE_EXCEEDED = "MESSAGE_SIZE_EXCEEDED"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    #: the scan found only records that fail their magic/size/offset/CRC check (skipped, never served)
    MESSAGE_CORRUPT = "MESSAGE_CORRUPT"


@dataclass(slots=True)
class AppendMessageResult:
    """Where a put landed. For a batch: ``wrote_offset``/``queue_offset`` are the first message's."""

    status: AppendMessageStatus
    wrote_offset: int = 0  # phy offset of the (first) record
    wrote_bytes: int = 0  # bytes of the record(s), filler excluded
    store_timestamp: int = 0
    queue_offset: int = 0  # logical offset of the (first) message
    msg_num: int = 1
    store_host: bytes = b"\x00" * 8
    record_offsets: tuple[int, ...] = ()  # phy offset of each record (batch)
    #: the comma-joined batch ``msg_id`` when the native batch put built it (same text; not compared)
    joined_msg_id: str = field(default="", compare=False, repr=False)

    @property
    def msg_id(self) -> str:
        """Offset msgId of the (first) record; for a batch, the comma-joined ids as SEND returns."""
        if self.joined_msg_id:
            return self.joined_msg_id
        if len(self.record_offsets) > 1:
            return ",".join(self.msg_ids)
        return encode_offset_msg_id_raw(self.store_host, self.wrote_offset)

    @property
    def msg_ids(self) -> list[str]:
        offsets = self.record_offsets or (self.wrote_offset,)
        return [encode_offset_msg_id_raw(self.store_host, off) for off in offsets]


@dataclass(slots=True)
class PutMessageResult:
    status: PutMessageStatus
    append_result: AppendMessageResult | None = None

    def is_ok(self) -> bool:
        return self.append_result is not None and self.append_result.status is AppendMessageStatus.PUT_OK


@dataclass(slots=True)
class GetMessageResult:
    status: GetMessageStatus
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    buffers: list[bytes] = field(default_factory=list)  # each one raw record
    message_count: int = 0
    buffer_total_size: int = 0
    suggest_pulling_from_slave: bool = False
    queue_offsets: list[int] = field(default_factory=list)

    def body(self) -> bytes:
        """The PULL response body: records concatenated as stored."""
        return b"".join(self.buffers)


@dataclass(slots=True)
class QueryMessageResult:
    buffers: list[bytes] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phy_offset: int = 0
    buffer_total_size: int = 0

    def body(self) -> bytes:
        return b"".join(self.buffers)
