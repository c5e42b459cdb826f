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
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

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
