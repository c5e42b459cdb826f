"""Typed request headers of the broker's main codes (protocol §2.4, §2.5). Sans-IO.

SEND_MESSAGE (10) uses full names, SEND_MESSAGE_V2 (310) / SEND_BATCH_MESSAGE (320) single letters:

| V2 | V1 name               | type | V2 | V1 name            | type |
|----|-----------------------|------|----|--------------------|------|
| a  | producerGroup         | s    | h  | flag               | i    |
| b  | topic                 | s    | i  | properties         | s    |
| c  | defaultTopic          | s    | j  | reconsumeTimes     | i    |
| d  | defaultTopicQueueNums | i    | k  | unitMode           | b    |
| e  | queueId               | i    | l  | maxReconsumeTimes  | i    |
| f  | sysFlag               | i    | m  | batch              | b    |
| g  | bornTimestamp         | l    | n  | brokerName         | s    |

Booleans: Java parses only "true"; we also accept the C++ 1.2.4 "1" (docs/decisions/0001-cpp-batch-flag.md).

With the remoting C extension (``remoting.codec.NATIVE``) the usual V2 header (plain decimal integers, "true" /
"false" flags) is read by ``send_header_v2``; ``SendHeader._parse_v2`` is the reference and takes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ferrymq.errors import ProtocolError
from ferrymq.remoting.codec import NATIVE, RemotingCommand
from ferrymq.remoting.codes import RequestCode

V2_TO_V1 = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
    "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
    "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName",
}
CLIENT_DEFAULT_TOPIC_QUEUE_NUMS = 4
_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_BATCH = int(RequestCode.SEND_BATCH_MESSAGE)


def parse_bool(value: str | None, default: bool = False) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in ("true", "1")


#: header integers are Java longs (Long.parseLong refuses anything outside this range)
JAVA_LONG_MIN = -(2**63)
JAVA_LONG_MAX = 2**63 - 1
#: int fields of topic and group configs are Java ints
JAVA_INT_MIN = -(2**31)
JAVA_INT_MAX = 2**31 - 1


def _int(fields: dict[str, str], key: str, default: int | None = None) -> int:
    raw = fields.get(key)
    if raw is None or raw == "":
        if default is None:
            raise ProtocolError(f"missing header field {key!r}")
        return default
    try:
        value = int(raw)
    except ValueError:
        try:
            value = int(float(raw))
        except (ValueError, OverflowError):
            raise ProtocolError(f"header field {key!r} is not an integer: {raw[:40]!r}") from None
    if not JAVA_LONG_MIN <= value <= JAVA_LONG_MAX:
        raise ProtocolError(f"header field {key!r} is out of the 64-bit range: {raw[:40]!r}")
    return value


@dataclass(slots=True)
class SendHeader:
    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str
    reconsume_times: int
    unit_mode: bool
    max_reconsume_times: int | None
    batch: bool

    @classmethod
    def parse(cls, cmd: RemotingCommand) -> SendHeader:
        f = cmd.ext_fields
        code = cmd.code
        if _native_v2 is not None and (code == _SEND_V2 or code == _SEND_BATCH):
            native: SendHeader | None = _native_v2(f, code == _SEND_BATCH)
            if native is not None:
                return native
        v2 = code == _SEND_V2 or code == _SEND_BATCH or ("b" in f and "topic" not in f)
        if v2 and "topic" not in f:
            fast = cls._parse_v2(f, code)
            if fast is not None:
                return fast
        if v2:
            f = {V2_TO_V1.get(k, k): v for k, v in f.items()}
        topic = f.get("topic")
        if not topic:
            raise ProtocolError("missing header field 'topic'")
        max_rt = f.get("maxReconsumeTimes")
        header = cls(
            producer_group=f.get("producerGroup", ""),
            topic=topic,
            default_topic=f.get("defaultTopic") or "TBW102",
            default_topic_queue_nums=_int(f, "defaultTopicQueueNums", CLIENT_DEFAULT_TOPIC_QUEUE_NUMS),
            queue_id=_int(f, "queueId", -1),
            sys_flag=_int(f, "sysFlag", 0),
            born_timestamp=_int(f, "bornTimestamp", 0),
            flag=_int(f, "flag", 0),
            properties=f.get("properties", ""),
            reconsume_times=_int(f, "reconsumeTimes", 0),
            unit_mode=parse_bool(f.get("unitMode")),
            max_reconsume_times=_int(f, "maxReconsumeTimes") if max_rt not in (None, "") else None,
            batch=cmd.code == RequestCode.SEND_BATCH_MESSAGE or parse_bool(f.get("batch")),
        )
        header._check_int_fields()
        return header

    def _check_int_fields(self) -> None:
        """The Java header declares these as ``Integer``; a value outside that range is a bad request (it could
        not be stored: the record layout has 32-bit fields)."""
        for key, value in (("defaultTopicQueueNums", self.default_topic_queue_nums), ("queueId", self.queue_id),
                           ("sysFlag", self.sys_flag), ("flag", self.flag), ("reconsumeTimes", self.reconsume_times),
                           ("maxReconsumeTimes", self.max_reconsume_times)):
            if value is not None and not JAVA_INT_MIN <= value <= JAVA_INT_MAX:
                raise ProtocolError(f"header field {key!r} is outside the 32-bit int range: {value}")

    @classmethod
    def _parse_v2(cls, f: dict[str, str], code: int) -> SendHeader | None:
        """Single-letter header without its V1 names: read the letters directly (the hot path).
        None when a field needs the general parser's fallbacks (missing, float-like, ...)."""
        get = f.get
        topic = get("b")
        if not topic:
            return None
        d = get("d")
        e = get("e")
        fl = get("f")
        g = get("g")
        h = get("h")
        j = get("j")
        l_ = get("l")
        try:
            queue_nums = int(d) if d else CLIENT_DEFAULT_TOPIC_QUEUE_NUMS
            queue_id = int(e) if e else -1
            sys_flag = int(fl) if fl else 0
            born = int(g) if g else 0
            flag = int(h) if h else 0
            reconsume = int(j) if j else 0
            max_rt = int(l_) if l_ else None
        except ValueError:
            return None
        # every value of a string of at most 9 characters is inside the Java int range (18: long): only longer
        # strings need the range checks (the general parser refuses them with its message)
        if ((d is not None and len(d) > 9) or (e is not None and len(e) > 9) or (fl is not None and len(fl) > 9)
                or (g is not None and len(g) > 18) or (h is not None and len(h) > 9)
                or (j is not None and len(j) > 9) or (l_ is not None and len(l_) > 9)):
            ints = (queue_nums, queue_id, sys_flag, flag, reconsume, 0 if max_rt is None else max_rt)
            if min(ints) < JAVA_INT_MIN or max(ints) > JAVA_INT_MAX or not JAVA_LONG_MIN <= born <= JAVA_LONG_MAX:
                return None
        k = get("k")
        m = get("m")
        return cls(
            get("a", ""), topic, get("c") or "TBW102", queue_nums, queue_id, sys_flag, born, flag, get("i", ""),
            reconsume, False if k is None or k == "false" else parse_bool(k), max_rt,
            code == _SEND_BATCH or (m is not None and m != "false" and parse_bool(m)),
        )


def _native_send_header() -> Any:
    if NATIVE is None:
        return None
    try:
        NATIVE.set_class("send_header", SendHeader, tuple(f.name for f in fields(SendHeader)))
    except (TypeError, ValueError):  # an extension built for other fields: the Python parser runs
        return None
    return NATIVE.send_header_v2


#: ``send_header_v2(ext_fields, is_batch)`` of the extension: a ``SendHeader`` equal to ``_parse_v2``'s, or None
_native_v2 = _native_send_header()
#: the same for the send processor, which calls it for a SEND_MESSAGE_V2 before ``SendHeader.parse`` (one frame
#: less per send); None without the extension (or with ``FERRYMQ_PURE_PYTHON=1``)
native_send_header_v2 = _native_v2


# PullSysFlag bits (§2.7 PULL)
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
PULL_FLAG_CLASS_FILTER = 0x8
PULL_FLAG_LITE_PULL = 0x10


@dataclass(slots=True)
class PullHeader:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_ms: int
    subscription: str | None
    sub_version: int
    expression_type: str

    @classmethod
    def parse(cls, cmd: RemotingCommand) -> PullHeader:
        f = cmd.ext_fields
        group = f.get("consumerGroup")
        topic = f.get("topic")
        if not group or not topic:
            raise ProtocolError("PULL_MESSAGE needs consumerGroup and topic")
        return cls(
            consumer_group=group,
            topic=topic,
            queue_id=_int(f, "queueId"),
            queue_offset=_int(f, "queueOffset"),
            max_msg_nums=_int(f, "maxMsgNums", 32),
            sys_flag=_int(f, "sysFlag", 0),
            commit_offset=_int(f, "commitOffset", 0),
            suspend_timeout_ms=_int(f, "suspendTimeoutMillis", 15000),
            subscription=f.get("subscription"),
            sub_version=_int(f, "subVersion", 0),
            expression_type=f.get("expressionType") or "TAG",
        )

    @property
    def has_commit_offset(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_COMMIT_OFFSET)

    @property
    def has_suspend(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUSPEND)

    @property
    def has_subscription(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUBSCRIPTION)


def get_int(cmd: RemotingCommand, key: str, default: int | None = None) -> int:
    return _int(cmd.ext_fields, key, default)


def get_str(cmd: RemotingCommand, key: str) -> str:
    value = cmd.ext_fields.get(key)
    if not value:
        raise ProtocolError(f"missing header field {key!r}")
    return value
