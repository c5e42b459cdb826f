"""THE table from store outcomes to response codes (protocol §2.7, §6.5).

PutMessageStatus → SEND response:

| PutMessageStatus              | code | remark                          | header filled |
|-------------------------------|------|---------------------------------|---------------|
| PUT_OK                        | 0    |                                 | yes           |
| FLUSH_DISK_TIMEOUT            | 10   |                                 | yes           |
| FLUSH_SLAVE_TIMEOUT           | 12   |                                 | yes           |
| SLAVE_NOT_AVAILABLE           | 11   |                                 | yes           |
| CREATE_MAPEDFILE_FAILED       | 1    | create mapped file failed ...   | no            |
| MESSAGE_ILLEGAL               | 13   | the message is illegal ...      | no            |
| PROPERTIES_SIZE_EXCEEDED      | 13   | the message is illegal ...      | no            |
| SERVICE_NOT_AVAILABLE         | 14   | service not available now ...   | no            |
| DISK_FULL                     | 14   | ... the broker's disk is full   | no            |
| OPEN_FILES_EXHAUSTED          | 14   | ... cannot open a store file    | no            |
| OS_PAGECACHE_BUSY             | 1    | [PC_SYNCHRONIZED]broker busy... | no            |
| UNKNOWN_ERROR (and any other) | 1    | UNKNOWN_ERROR                   | no            |

GetMessageStatus → PULL response (master; a slave rewrites 21 to 20 in processors/pull.py):

| GetMessageStatus        | code                              |
|-------------------------|-----------------------------------|
| FOUND                   | 0                                 |
| NO_MATCHED_MESSAGE      | 20                                |
| MESSAGE_WAS_REMOVING    | 20                                |
| MESSAGE_CORRUPT         | 20 (nextBeginOffset past them)    |
| NO_MATCHED_LOGIC_QUEUE  | 21 if request offset != 0, else 19|
| NO_MESSAGE_IN_QUEUE     | 21 if request offset != 0, else 19|
| OFFSET_FOUND_NULL       | 19                                |
| OFFSET_OVERFLOW_ONE     | 19                                |
| OFFSET_OVERFLOW_BADLY   | 21                                |
| OFFSET_TOO_SMALL        | 21                                |

TimerStatus → SEND response (a message asking for a delivery time; broker/timer.py):

| TimerStatus           | code | remark                                               |
|-----------------------|------|------------------------------------------------------|
| ILLEGAL_DELIVERY_TIME | 13   | timer message refused: bad delivery time ...         |
| DELAY_TOO_LONG        | 13   | timer message refused: delivery time beyond timerMaxDelaySec ... |
| RETENTION_HELD        | 14   | timer message refused: the disk is above diskSpaceCleanForciblyRatio and pending timer messages hold ... |

RecallStatus → RECALL_MESSAGE (370) response (processors/recall.py):

| RecallStatus        | code | remark                                                          |
|---------------------|------|-----------------------------------------------------------------|
| RECALLED            | 0    |                                                                 |
| NOT_PENDING         | 22   | recall failed, no pending timer message ... (unknown, delivered or recalled) |
| HANDLE_INVALID      | 604  | recall failed, the handle is invalid ...                        |
| TOPIC_MISMATCH      | 604  | recall failed, topic not match                                  |
| OTHER_BROKER        | 604  | recall failed, the handle belongs to broker ...                 |
| TIMESTAMP_INVALID   | 604  | recall failed, timestamp invalid (past or beyond timerMaxDelaySec) |
| TOPIC_NOT_EXIST     | 17   | recall failed, the topic[...] not exist                         |
| SLAVE               | 11   | recall failed, broker service not available (a slave)          |
| NOT_SERVING         | 14   | recall failed, the timer service is not serving (loading, or lease lost) |
| STORE_FAILED        | 1    | recall failed, the recall marker could not be stored ...        |
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from ferrymq.common.timer import TIMER_REFUSED_REMARK
from ferrymq.remoting.codes import ResponseCode as R

SERVICE_NOT_AVAILABLE_REMARK = "service not available now, maybe disk full or the broker is a slave"
DISK_FULL_REMARK = ("service not available now: the broker's disk is full (used above diskSpaceWarningLevelRatio); "
                    "sends are accepted again when space returns")

OPEN_FILES_EXHAUSTED_REMARK = ("service not available now: the broker cannot open a store file (too many open files: "
                               "EMFILE/ENFILE); sends to this queue are accepted again when descriptors are free")


class SendOutcome(NamedTuple):
    code: int
    remark: str | None
    #: the message is stored and the response header must carry msgId/queueId/queueOffset
    stored: bool


PUT_STATUS_TABLE: dict[str, SendOutcome] = {
    "PUT_OK": SendOutcome(R.SUCCESS, None, True),
    "FLUSH_DISK_TIMEOUT": SendOutcome(R.FLUSH_DISK_TIMEOUT, None, True),
    "FLUSH_SLAVE_TIMEOUT": SendOutcome(R.FLUSH_SLAVE_TIMEOUT, None, True),
    "SLAVE_NOT_AVAILABLE": SendOutcome(R.SLAVE_NOT_AVAILABLE, None, True),
    "CREATE_MAPEDFILE_FAILED": SendOutcome(R.SYSTEM_ERROR, "create mapped file failed, server is busy or broken.",
                                           False),
    "MESSAGE_ILLEGAL": SendOutcome(R.MESSAGE_ILLEGAL, "the message is illegal, maybe msg body or properties "
                                                     "length not matched.", False),
    "PROPERTIES_SIZE_EXCEEDED": SendOutcome(R.MESSAGE_ILLEGAL, "the message is illegal, maybe msg properties "
                                                              "length limit 32k.", False),
    "SERVICE_NOT_AVAILABLE": SendOutcome(R.SERVICE_NOT_AVAILABLE, SERVICE_NOT_AVAILABLE_REMARK, False),
    "DISK_FULL": SendOutcome(R.SERVICE_NOT_AVAILABLE, DISK_FULL_REMARK, False),
    "OPEN_FILES_EXHAUSTED": SendOutcome(R.SERVICE_NOT_AVAILABLE, OPEN_FILES_EXHAUSTED_REMARK, False),
    "OS_PAGECACHE_BUSY": SendOutcome(R.SYSTEM_ERROR, "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
                                     False),
    "UNKNOWN_ERROR": SendOutcome(R.SYSTEM_ERROR, "UNKNOWN_ERROR", False),
}


class TimerStatus(Enum):
    ILLEGAL_DELIVERY_TIME = "ILLEGAL_DELIVERY_TIME"
    DELAY_TOO_LONG = "DELAY_TOO_LONG"
    #: the disk is above diskSpaceCleanForciblyRatio and the cleanup would delete segments pending timer messages
    #: still need (they are kept): no more pending messages until space returns
    RETENTION_HELD = "RETENTION_HELD"


class Outcome(NamedTuple):
    code: int
    remark: str | None


TIMER_STATUS_TABLE: dict[TimerStatus, Outcome] = {
    TimerStatus.ILLEGAL_DELIVERY_TIME: Outcome(R.MESSAGE_ILLEGAL, f"{TIMER_REFUSED_REMARK}: bad delivery time"),
    TimerStatus.DELAY_TOO_LONG: Outcome(R.MESSAGE_ILLEGAL,
                                        f"{TIMER_REFUSED_REMARK}: delivery time beyond timerMaxDelaySec"),
    TimerStatus.RETENTION_HELD: Outcome(R.SERVICE_NOT_AVAILABLE,
                                        f"{TIMER_REFUSED_REMARK}: the disk is above diskSpaceCleanForciblyRatio and "
                                        "pending timer messages hold commit log segments the cleanup would delete"),
}


class RecallStatus(Enum):
    RECALLED = "RECALLED"
    NOT_PENDING = "NOT_PENDING"
    HANDLE_INVALID = "HANDLE_INVALID"
    TOPIC_MISMATCH = "TOPIC_MISMATCH"
    OTHER_BROKER = "OTHER_BROKER"
    TIMESTAMP_INVALID = "TIMESTAMP_INVALID"
    TOPIC_NOT_EXIST = "TOPIC_NOT_EXIST"
    SLAVE = "SLAVE"
    NOT_SERVING = "NOT_SERVING"
    STORE_FAILED = "STORE_FAILED"


RECALL_STATUS_TABLE: dict[RecallStatus, Outcome] = {
    RecallStatus.RECALLED: Outcome(R.SUCCESS, None),
    RecallStatus.NOT_PENDING: Outcome(R.QUERY_NOT_FOUND, "recall failed, no pending timer message (unknown, "
                                                         "already delivered or already recalled)"),
    RecallStatus.HANDLE_INVALID: Outcome(R.ILLEGAL_OPERATION, "recall failed, the handle is invalid"),
    RecallStatus.TOPIC_MISMATCH: Outcome(R.ILLEGAL_OPERATION, "recall failed, topic not match"),
    RecallStatus.OTHER_BROKER: Outcome(R.ILLEGAL_OPERATION, "recall failed, the handle belongs to another broker"),
    RecallStatus.TIMESTAMP_INVALID: Outcome(R.ILLEGAL_OPERATION, "recall failed, timestamp invalid (past or beyond "
                                                                 "timerMaxDelaySec)"),
    RecallStatus.TOPIC_NOT_EXIST: Outcome(R.TOPIC_NOT_EXIST, "recall failed, the topic does not exist"),
    RecallStatus.SLAVE: Outcome(R.SLAVE_NOT_AVAILABLE, "recall failed, broker service not available (a slave)"),
    RecallStatus.NOT_SERVING: Outcome(R.SERVICE_NOT_AVAILABLE, "recall failed, the timer service is not serving "
                                                               "(loading its pending messages, or not the master)"),
    RecallStatus.STORE_FAILED: Outcome(R.SYSTEM_ERROR, "recall failed, the recall marker could not be stored"),
}


def send_outcome(status: Enum | str) -> SendOutcome:
    name = status if isinstance(status, str) else status.name
    return PUT_STATUS_TABLE.get(name) or SendOutcome(R.SYSTEM_ERROR, name, False)


#: status name -> code; None means "21 if the request offset != 0 else 19"
PULL_STATUS_TABLE: dict[str, int | None] = {
    "FOUND": R.SUCCESS,
    "NO_MATCHED_MESSAGE": R.PULL_RETRY_IMMEDIATELY,
    "MESSAGE_WAS_REMOVING": R.PULL_RETRY_IMMEDIATELY,
    "MESSAGE_CORRUPT": R.PULL_RETRY_IMMEDIATELY,
    "NO_MATCHED_LOGIC_QUEUE": None,
    "NO_MESSAGE_IN_QUEUE": None,
    "OFFSET_FOUND_NULL": R.PULL_NOT_FOUND,
    "OFFSET_OVERFLOW_ONE": R.PULL_NOT_FOUND,
    "OFFSET_OVERFLOW_BADLY": R.PULL_OFFSET_MOVED,
    "OFFSET_TOO_SMALL": R.PULL_OFFSET_MOVED,
}


def pull_code(status: Enum | str, request_offset: int) -> int:
    name = status if isinstance(status, str) else status.name
    if name not in PULL_STATUS_TABLE:
        return R.PULL_RETRY_IMMEDIATELY
    code = PULL_STATUS_TABLE[name]
    if code is None:
        return R.PULL_OFFSET_MOVED if request_offset != 0 else R.PULL_NOT_FOUND
    return code
