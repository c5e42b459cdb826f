"""Translation between ``apache.rocketmq.v2`` (the 5.x gRPC protocol) and ferrymq's 4.x values; sans-IO.

Message fields, 5.x ``Message`` -> 4.x message properties (``to_remoting_message``):

| 5.x field                                | 4.x property / field                       |
|------------------------------------------|--------------------------------------------|
| topic.name                               | topic                                      |
| body (body_encoding IDENTITY or GZIP)    | body (a GZIP body is inflated)             |
| user_properties                          | properties (4.x reserved names refused)    |
| system_properties.message_id             | UNIQ_KEY                                   |
| system_properties.tag                    | TAGS                                       |
| system_properties.keys                   | KEYS (space separated)                     |
| system_properties.message_group          | __SHARDINGKEY                              |
| system_properties.delivery_timestamp     | TIMER_DELIVER_MS (ms; none when not future) |
| message_type TRANSACTION                 | TRAN_MSG=true, PGROUP                      |

4.x ``MessageExt`` -> 5.x ``Message`` (``to_grpc_message``): the same table backwards, plus store_timestamp,
store_host ("ip:port"), born_host, queue_id, queue_offset, body_digest (MD5, upper-case hex: the one digest
the Python, Node and Java SDKs all check alike; their CRC32 texts differ), and the pop fields receipt_handle,
invisible_duration and delivery_attempt; delivery_timestamp from TIMER_DELIVER_MS. message_type is FIFO when
__SHARDINGKEY is set, DELAY when DELAY or TIMER_DELIVER_MS is, TRANSACTION when TRAN_MSG is, else NORMAL.

Receipt handle (opaque to clients; one per delivery), five fields joined by ``.``:

| field        | meaning                                                            |
|--------------|--------------------------------------------------------------------|
| epoch        | random token of the proxy process that delivered (restart -> new)  |
| serial       | delivery number within that process (a redelivery gets a new one)  |
| queue_id     | queue of the message                                               |
| queue_offset | consume-queue offset of the message                                |
| broker_name  | broker group (last: it may itself contain dots)                    |
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import hmac
import socket
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from ferrymq.common.message import (
    KEY_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    Message,
    MessageExt,
    bytes_to_host,
    decode_offset_msg_id,
)
from ferrymq.common.route import MessageQueue as RemotingQueue
from ferrymq.common.timer import PROPERTY_TIMER_DELIVER_MS, TIMER_REFUSED_REMARK
from ferrymq.errors import BrokerError, FerryError, RemotingError, RemotingTimeoutError
from ferrymq.proxy.v2 import definition_pb2 as pb

#: 4.x property carrying the 5.x message group (RocketMQ's MessageConst.PROPERTY_SHARDING_KEY)
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
#: 4.x property names a 5.x client may not set as user properties (RocketMQ's reserved keys)
RESERVED_PROPERTY_NAMES = frozenset({
    "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP",
    "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG",
    "MQ2_FLAG", "RECONSUME_TIME", "MSG_REGION", "TRACE_ON", "UNIQ_KEY", "MAX_RECONSUME_TIMES",
    "CONSUME_START_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "SHARDING_KEY", PROPERTY_SHARDING_KEY, "CLUSTER", "MSG_TYPE", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL",
    "ARRIVE_TIME", "PUSH_REPLY_TIME", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS",
    "__STARTDELIVERTIME",
})
#: 4.x properties that travel as 5.x system properties (not copied into user_properties)
SYSTEM_PROPERTY_NAMES = RESERVED_PROPERTY_NAMES
#: RocketMQ's default messageDelayLevel, in ms (the broker's table when the proxy is not told another)
DEFAULT_DELAY_LEVELS_MS: tuple[int, ...] = tuple(
    s * 1000 for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200))
#: distinct store/born host fields whose ``ip:port`` text is kept
HOST_TEXT_CACHE_SIZE = 4096
#: hex digits of a transaction id's MAC (64 bits)
TRANSACTION_MAC_HEX = 16
#: the message types every route advertises (ferrymq topics carry no message-type attribute)
ACCEPTED_MESSAGE_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
#: 4.x permission bits -> 5.x Permission
_PERM_READ, _PERM_WRITE = 4, 2


class TranslateError(FerryError):
    """A 5.x request that cannot be expressed in 4.x terms; ``code`` is the v2 status code to answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# ---- status -------------------------------------------------------------------------------------------
#: 4.x response code -> v2 status code (the one table; anything else is INTERNAL_SERVER_ERROR)
V2_CODE_BY_RESPONSE_CODE: dict[int, int] = {
    0: pb.OK,
    2: pb.TOO_MANY_REQUESTS,          # SYSTEM_BUSY
    10: pb.MASTER_PERSISTENCE_TIMEOUT,  # FLUSH_DISK_TIMEOUT
    11: pb.HA_NOT_AVAILABLE,          # SLAVE_NOT_AVAILABLE
    12: pb.SLAVE_PERSISTENCE_TIMEOUT,   # FLUSH_SLAVE_TIMEOUT
    13: pb.BAD_REQUEST,               # MESSAGE_ILLEGAL
    14: pb.INTERNAL_SERVER_ERROR,     # SERVICE_NOT_AVAILABLE (no master, store not writable)
    16: pb.FORBIDDEN,                 # NO_PERMISSION
    17: pb.TOPIC_NOT_FOUND,           # TOPIC_NOT_EXIST
    22: pb.MESSAGE_NOT_FOUND,         # QUERY_NOT_FOUND (a recall of no pending timer message)
    23: pb.ILLEGAL_FILTER_EXPRESSION,  # SUBSCRIPTION_PARSE_FAILED
    26: pb.CONSUMER_GROUP_NOT_FOUND,  # SUBSCRIPTION_GROUP_NOT_EXIST
    215: pb.TOO_MANY_REQUESTS,        # FLOW_CONTROL
    604: pb.BAD_REQUEST,              # ILLEGAL_OPERATION (a recall handle that is unreadable, late or foreign)
}


def status(code: int = pb.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)  # type: ignore[arg-type]


def status_of_error(exc: BaseException) -> pb.Status:
    """The v2 status answering a failure (a broker's code, a timeout, a refused translation)."""
    if isinstance(exc, TranslateError):
        return status(exc.code, str(exc))
    if isinstance(exc, BrokerError) and exc.code == 13 and exc.remark.startswith(TIMER_REFUSED_REMARK):
        return status(pb.ILLEGAL_DELIVERY_TIME, str(exc))  # the broker's refusal of a delivery time
    if isinstance(exc, BrokerError):
        return status(V2_CODE_BY_RESPONSE_CODE.get(exc.code, pb.INTERNAL_SERVER_ERROR), str(exc))
    if isinstance(exc, RemotingTimeoutError):
        return status(pb.PROXY_TIMEOUT, str(exc))
    if isinstance(exc, RemotingError):
        return status(pb.INTERNAL_SERVER_ERROR, f"broker unreachable: {exc}")
    return status(pb.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")


# ---- time -----------------------------------------------------------------------------------------------
def timestamp_ms(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def to_timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def to_duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


# ---- routes --------------------------------------------------------------------------------------------
def endpoints_of(host: str, port: int) -> pb.Endpoints:
    try:
        socket.inet_aton(host)
        scheme = pb.IPv4
    except OSError:
        scheme = pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])  # type: ignore[arg-type]


def permission_of(perm_bits: int) -> int:
    readable, writable = bool(perm_bits & _PERM_READ), bool(perm_bits & _PERM_WRITE)
    if readable and writable:
        return pb.READ_WRITE
    if readable:
        return pb.READ
    if writable:
        return pb.WRITE
    return pb.NONE


def route_queues(topic: pb.Resource, queue_perms: Iterable[tuple[str, int, int]],
                 endpoints: pb.Endpoints) -> list[pb.MessageQueue]:
    """5.x queues of a topic from ``(broker_name, queue_id, perm_bits)`` triples, every one served at
    ``endpoints`` (the proxy itself)."""
    out = []
    for broker_name, queue_id, perm_bits in queue_perms:
        out.append(pb.MessageQueue(
            topic=topic, id=queue_id, permission=permission_of(perm_bits),  # type: ignore[arg-type]
            broker=pb.Broker(name=broker_name, id=0, endpoints=endpoints),
            accept_message_types=ACCEPTED_MESSAGE_TYPES))  # type: ignore[arg-type]
    return out


def fifo_queue(message_group: str, queues: list[RemotingQueue]) -> RemotingQueue:
    """The queue of a message group: a stable hash over the writable queues (the same group always maps to
    the same queue while the queue count stays)."""
    if not queues:
        raise TranslateError(pb.TOPIC_NOT_FOUND, "topic has no writable queue")
    return queues[zlib.crc32(message_group.encode()) % len(queues)]


# ---- messages --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A 5.x message made ready for SEND_MESSAGE_V2."""

    message: Message
    message_id: str
    message_group: str | None
    transactional: bool
    #: the delivery time asked for (a timer message; None: at once)
    deliver_ms: int | None = None


def to_remoting_message(msg: pb.Message, *, now_ms: int, producer_group: str,
                        max_body_bytes: int) -> OutgoingMessage:
    sp = msg.system_properties
    topic = msg.topic.name
    if not topic:
        raise TranslateError(pb.ILLEGAL_TOPIC, "message without a topic")
    if not sp.message_id:
        raise TranslateError(pb.ILLEGAL_MESSAGE_ID, "message without a message_id")
    body = msg.body
    if sp.body_encoding == pb.GZIP:
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError) as exc:
            raise TranslateError(pb.MESSAGE_CORRUPTED, f"gzip body cannot be inflated: {exc}") from None
    if not body:
        raise TranslateError(pb.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > max_body_bytes:
        raise TranslateError(pb.MESSAGE_BODY_TOO_LARGE,
                             f"message body of {len(body)} bytes exceeds {max_body_bytes}")
    props: dict[str, str] = {}
    for key, value in msg.user_properties.items():
        if key in RESERVED_PROPERTY_NAMES:
            raise TranslateError(pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {key!r} is reserved")
        props[key] = value
    props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = sp.message_id
    if sp.HasField("tag"):
        if not sp.tag.strip() or "|" in sp.tag:
            raise TranslateError(pb.ILLEGAL_MESSAGE_TAG, f"tag {sp.tag!r} is empty or holds '|'")
        props[PROPERTY_TAGS] = sp.tag
    if sp.keys:
        props[PROPERTY_KEYS] = KEY_SEPARATOR.join(sp.keys)
    group = sp.message_group if sp.HasField("message_group") else None
    transactional = sp.message_type == pb.TRANSACTION
    if group is not None:
        if not group:
            raise TranslateError(pb.ILLEGAL_MESSAGE_GROUP, "message group is empty")
        props[PROPERTY_SHARDING_KEY] = group
    if sp.HasField("delivery_timestamp"):
        if group is not None or transactional:
            raise TranslateError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                                 "a delivery timestamp cannot go with a message group or a transaction")
        deliver_ms = timestamp_ms(sp.delivery_timestamp)
        if deliver_ms > now_ms:  # any time: the broker keeps it as a timer message (refused beyond its maximum)
            props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_ms)
    if transactional:
        if group is not None:
            raise TranslateError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                                 "a transactional message cannot have a message group")
        props[PROPERTY_TRANSACTION_PREPARED] = "true"
        props[PROPERTY_PRODUCER_GROUP] = producer_group
    return OutgoingMessage(Message(topic, body, 0, props), sp.message_id, group, transactional,
                           int(props[PROPERTY_TIMER_DELIVER_MS]) if PROPERTY_TIMER_DELIVER_MS in props else None)


def message_type_of(properties: Mapping[str, str]) -> int:
    if PROPERTY_SHARDING_KEY in properties:
        return pb.FIFO
    if PROPERTY_DELAY_TIME_LEVEL in properties or PROPERTY_TIMER_DELIVER_MS in properties:
        return pb.DELAY
    if properties.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return pb.TRANSACTION
    return pb.NORMAL


def message_id_of(msg: MessageExt) -> str:
    """The 5.x message id of a stored message: the client's UNIQ_KEY, else the broker's offset id."""
    return msg.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or msg.offset_msg_id


@functools.lru_cache(maxsize=HOST_TEXT_CACHE_SIZE)
def _host_text(raw: bytes) -> str:
    """``ip:port`` of an 8-byte host field (cached: the same few hosts come again and again)."""
    try:
        ip, port = bytes_to_host(raw)
    except (ValueError, OSError):
        return ""
    return f"{ip}:{port}"


def to_grpc_message(msg: MessageExt, *, receipt_handle: str | None = None, invisible_ms: int | None = None,
                    delivery_attempt: int | None = None, into: pb.Message | None = None) -> pb.Message:
    """The 5.x message of a stored one; ``into``: an empty message to fill (e.g. a response's field, so it is
    not copied there)."""
    props = msg.properties
    out = pb.Message() if into is None else into
    out.body = msg.body
    out.topic.name = msg.topic
    sp = out.system_properties  # filled in place: no intermediate messages to copy
    sp.message_id = message_id_of(msg)
    sp.body_encoding = pb.IDENTITY
    sp.message_type = message_type_of(props)  # type: ignore[assignment]
    sp.born_timestamp.FromMilliseconds(msg.born_timestamp)
    sp.born_host = _host_text(msg.born_host).partition(":")[0]
    sp.store_timestamp.FromMilliseconds(msg.store_timestamp)
    sp.store_host = _host_text(msg.store_host)
    sp.queue_id = msg.queue_id
    sp.queue_offset = msg.queue_offset
    sp.body_digest.type = pb.MD5
    sp.body_digest.checksum = hashlib.md5(msg.body).hexdigest().upper()
    user = out.user_properties
    for key, value in props.items():
        if key not in SYSTEM_PROPERTY_NAMES:
            user[key] = value
    tag = props.get(PROPERTY_TAGS)
    if tag:
        sp.tag = tag
    raw_keys = props.get(PROPERTY_KEYS)
    if raw_keys:
        sp.keys.extend(k for k in raw_keys.split(KEY_SEPARATOR) if k)
    group = props.get(PROPERTY_SHARDING_KEY)
    if group:
        sp.message_group = group
    deliver_ms = props.get(PROPERTY_TIMER_DELIVER_MS)
    if deliver_ms and deliver_ms.isdigit():
        sp.delivery_timestamp.FromMilliseconds(int(deliver_ms))
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_ms is not None:
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    if delivery_attempt is not None:
        sp.delivery_attempt = delivery_attempt
    return out


# ---- receipt handles --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    epoch: str
    serial: int
    queue_id: int
    queue_offset: int
    broker_name: str

    def encode(self) -> str:
        return f"{self.epoch}.{self.serial}.{self.queue_id}.{self.queue_offset}.{self.broker_name}"

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        parts = text.split(".", 4)
        if len(parts) != 5 or not parts[0] or not parts[4]:
            raise TranslateError(pb.INVALID_RECEIPT_HANDLE, f"malformed receipt handle {text[:64]!r}")
        try:
            return cls(parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[4])
        except ValueError:
            raise TranslateError(pb.INVALID_RECEIPT_HANDLE, f"malformed receipt handle {text[:64]!r}") from None


# ---- transaction ids ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TransactionId:
    """What END_TRANSACTION needs of a half message, carried by the 5.x ``transaction_id`` (opaque to clients),
    three fields joined by ``.``:

    | field          | meaning                                                                          |
    |----------------|----------------------------------------------------------------------------------|
    | offset_msg_id  | the broker's id of the half message: its store host (END_TRANSACTION goes there) and commit-log offset |
    | queue_offset   | the half message's offset in the half topic (``tranStateTableOffset``)            |
    | mac            | HMAC-SHA256 of the two and the message's topic under the proxy process's key, cut to 16 hex digits: an id is good only for its own topic and proxy run (a client may end only a transaction of a topic it may publish to) |
    """

    offset_msg_id: str
    queue_offset: int

    def _mac(self, key: bytes, topic: str) -> str:
        text = f"{self.offset_msg_id}.{self.queue_offset}.{topic}".encode()
        return hmac.new(key, text, hashlib.sha256).hexdigest()[:TRANSACTION_MAC_HEX]

    def encode(self, key: bytes, topic: str) -> str:
        return f"{self.offset_msg_id}.{self.queue_offset}.{self._mac(key, topic)}"

    @classmethod
    def decode(cls, text: str, key: bytes, topic: str) -> TransactionId:
        parts = text.split(".")
        try:
            tid = cls(parts[0], int(parts[1]))
            decode_offset_msg_id(tid.offset_msg_id)
        except (ValueError, IndexError):
            raise TranslateError(pb.INVALID_TRANSACTION_ID, f"malformed transaction id {text[:64]!r}") from None
        if len(parts) != 3 or not hmac.compare_digest(parts[2], tid._mac(key, topic)):
            raise TranslateError(pb.INVALID_TRANSACTION_ID,
                                 f"transaction id {text[:64]!r} is not one of this proxy run for topic {topic} "
                                 "(the broker's check-back decides the transaction)")
        return tid


def half_to_grpc_message(half: MessageExt) -> pb.Message:
    """A stored half message as the 5.x message its producer sent (real topic and queue, TRANSACTION type)."""
    props = dict(half.properties)
    real_topic = props.pop(PROPERTY_REAL_TOPIC, half.topic)
    real_queue = props.pop(PROPERTY_REAL_QUEUE_ID, None)
    props[PROPERTY_TRANSACTION_PREPARED] = "true"
    out = to_grpc_message(dataclasses.replace(half, properties=props))
    out.topic.name = real_topic
    if real_queue is not None and real_queue.isdigit():
        out.system_properties.queue_id = int(real_queue)
    return out


# ---- filters -------------------------------------------------------------------------------------------
def filter_of(expr: pb.FilterExpression | None) -> tuple[str, str]:
    """(expression, 4.x expressionType) of a 5.x filter; no filter is every tag."""
    if expr is None or not expr.expression:
        return "*", "TAG"
    if expr.type == pb.SQL:
        return expr.expression, "SQL92"
    return expr.expression, "TAG"
