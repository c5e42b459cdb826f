"""Topic configuration, permissions and names (protocol §3.2, §3.6)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1

DEFAULT_TOPIC = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
BENCHMARK_TOPIC = "BenchmarkTest"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
#: timer messages until they are due (RocketMQ 5; common/timer.py, broker/timer.py)
TIMER_TOPIC = "rmq_sys_wheel_timer"

#: topics a producer may not send to (§2.7 step 3)
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, SELF_TEST_TOPIC,
     OFFSET_MOVED_EVENT, TIMER_TOPIC}
)

TOPIC_MAX_LENGTH = 127
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")

DEFAULT_READ_QUEUE_NUMS = 16
DEFAULT_WRITE_QUEUE_NUMS = 16


def is_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


def is_writeable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)


def is_inherited(perm: int) -> bool:
    return bool(perm & PERM_INHERIT)


def validate_topic(topic: str | None) -> str | None:
    """None if the name is valid, else the reason."""
    if not topic or not topic.strip():
        return "the specified topic is blank"
    if len(topic) > TOPIC_MAX_LENGTH:
        return f"the specified topic is longer than topic max length {TOPIC_MAX_LENGTH}"
    if not _TOPIC_RE.match(topic):
        return f"the specified topic[{topic}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    return None


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_sys_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX) or topic.startswith(DLQ_GROUP_TOPIC_PREFIX) or topic in (
        NOT_ALLOWED_SEND_TOPICS | {DEFAULT_TOPIC, BENCHMARK_TOPIC})


@dataclass(slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = DEFAULT_READ_QUEUE_NUMS
    write_queue_nums: int = DEFAULT_WRITE_QUEUE_NUMS
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TopicConfig:
        return cls(
            topic_name=str(obj["topicName"]),
            read_queue_nums=int(obj.get("readQueueNums", DEFAULT_READ_QUEUE_NUMS)),
            write_queue_nums=int(obj.get("writeQueueNums", DEFAULT_WRITE_QUEUE_NUMS)),
            perm=int(obj.get("perm", PERM_READ | PERM_WRITE)),
            topic_filter_type=str(obj.get("topicFilterType", "SINGLE_TAG")),
            topic_sys_flag=int(obj.get("topicSysFlag", obj.get("topicSynFlag", 0)) or 0),
            order=bool(obj.get("order", False)),
        )


@dataclass(slots=True)
class DataVersion:
    counter: int = 0
    timestamp: int = 0

    def to_json(self) -> dict[str, int]:
        return {"counter": self.counter, "timestamp": self.timestamp}

    @classmethod
    def from_json(cls, obj: dict[str, Any] | None) -> DataVersion:
        obj = obj or {}
        return cls(counter=int(obj.get("counter", 0)), timestamp=int(obj.get("timestamp", 0)))

    def next_version(self, now_ms: int) -> None:
        self.counter += 1
        self.timestamp = now_ms
