"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) — protocol §2.7 SEND, §4.9, §4.10.

Check order: slave → 14; broker not writable → 16; topic invalid → 1; topic forbidden → 16; unknown
topic → auto-create via defaultTopic (else 17); queueId out of range → 1 (negative → random); topic not
writable → 16; body too large → 13; retry topic past max reconsume → DLQ; DELAY → SCHEDULE_TOPIC_XXXX; else a
delivery time in the future (TIMER_DELIVER_MS etc., common/timer.py) → rmq_sys_wheel_timer (broker/timer.py), bad or
beyond timerMaxDelaySec → 13; the answer then carries ``recallHandle``.

The handler is a plain function: it answers inline unless the put must wait (SYNC_FLUSH /
SYNC_MASTER with WAIT != false), in which case it returns a coroutine — or, for SYNC_MASTER with
ASYNC_FLUSH, None: the HA ack handler (or the shared deadline sweep) writes the answer to the
connection itself (``_SlaveAckReply``: no task, no future, no loop turn between ack and answer; SEND_OK
is the same templated frame as a plain send's, ``encode_send_ok_response``).

Hot-path notes: topic validation, tags hash codes and born hosts are cached per processor; the
properties string is parsed/re-joined with C-level splits (the tolerant parser is the fallback). With the store's
C extension a plain single send (no retry topic, no transaction flag, no DELAY / TRAN_MSG, ASCII properties) is
put by ``MessageWriter.put_one_raw`` straight from the header (same record, result and WAIT flag); anything it
declines takes the Python path, which answers as before.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import inspect
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from ferrymq.broker.config import BrokerRole
from ferrymq.broker.headers import SendHeader, native_send_header_v2
from ferrymq.broker.queue_files import stored_in_named_queue
from ferrymq.broker.stats import REPLICA_FAILURE_STATUSES
from ferrymq.broker.status_codes import (
    SERVICE_NOT_AVAILABLE_REMARK,
    TIMER_STATUS_TABLE,
    TimerStatus,
    send_outcome,
)
from ferrymq.common.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_CLUSTER,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    SYSFLAG_COMPRESSED,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_NOT_TYPE,
    SYSFLAG_TRANSACTION_PREPARED,
    MessageExtBrokerInner,
    string_to_properties,
    tags_hash_code,
)
from ferrymq.common.message_codec import RecordFormatError, decode_batch_body, inflate_bounded
from ferrymq.common.timer import (
    PROPERTY_TIMER_OUT_MS,
    TIMER_QUEUE_ID,
    TIMER_REQUEST_PROPERTIES,
    TIMER_TOPIC,
    RecallHandle,
    TimerPropertyError,
    deliver_ms_of,
    wants_timer,
)
from ferrymq.common.topic import (
    NOT_ALLOWED_SEND_TOPICS,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    TopicConfig,
    dlq_topic,
    validate_topic,
)
from ferrymq.errors import ProtocolError
from ferrymq.remoting.codec import (
    FLAG_ONEWAY,
    SERIALIZE_JSON,
    RemotingCommand,
    encode_send_ok_response,
    native_send_ok,
)
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from ferrymq.store.results import PutMessageStatus

if TYPE_CHECKING:
    from ferrymq.broker.context import SendContext

log = logging.getLogger(__name__)

#: clients at or above this version (V3_4_9) carry maxReconsumeTimes in the header
VERSION_WITH_MAX_RECONSUME_TIMES = 121
MSG_REGION = "DefaultRegion"
#: SEND response header field of a timer message's recall handle (RocketMQ 5 SendMessageResponseHeader)
RECALL_HANDLE_FIELD = "recallHandle"


def index_keys(props: dict[str, str]) -> tuple[str, ...]:
    keys: list[str] = []
    uniq = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if uniq:
        keys.append(uniq)
    raw = props.get(PROPERTY_KEYS)
    if raw:
        keys.extend(k for k in raw.split(" ") if k)
    return tuple(keys)


def born_host_of(conn: Any) -> bytes:
    """8-byte born host from the peer address; non-IPv4 peers map to 127.0.0.1 (§4.1)."""
    from ferrymq.common.message import host_to_bytes

    peer = getattr(conn, "peer_addr", "") or ""
    host, _, port = peer.rpartition(":")
    parts = host.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
        host = "127.0.0.1"
    return host_to_bytes(host, int(port) if port.isdigit() else 0)


#: entries kept in each of the processor's small caches (topic validity, tags hash codes)
SEND_CACHE_MAX_ENTRIES = 10_000
_SLAVE = BrokerRole.SLAVE
#: (an enum member read off its class goes through ``EnumType.__getattr__``: ~0.1 us per send)
_PUT_OK = PutMessageStatus.PUT_OK
_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)


async def _answer_when_sent(waiting: asyncio.Future[Any]) -> Any:
    """The answer (RemotingCommand, bytes or None) of a send that waited for its queue's first file
    (``QueueFileGate.defer``)."""
    result = await waiting
    if inspect.isawaitable(result):
        result = await result
    return result


def _parse_properties(text: str | None) -> dict[str, str]:
    """``string_to_properties`` with a C-level fast path for well-formed strings (same result)."""
    if not text:
        return {}
    body = text[:-1] if text[-1] == PROPERTY_SEPARATOR else text
    try:
        props = dict(item.split(NAME_VALUE_SEPARATOR, 1) for item in body.split(PROPERTY_SEPARATOR))
    except ValueError:  # an item without a name/value separator: let the tolerant parser skip it
        return string_to_properties(text)
    if "" in props:  # an empty name
        return string_to_properties(text)
    return props


def _properties_text(props: dict[str, str]) -> str:
    """``properties_to_string`` for a dict of str values (what the send path builds)."""
    return PROPERTY_SEPARATOR.join(map(NAME_VALUE_SEPARATOR.join, props.items()))


def _tags_code_cached(cache: dict[str, int], tags: str | None) -> int:
    if not tags:
        return 0
    code = cache.get(tags)
    if code is None:
        code = tags_hash_code(tags)
        if len(cache) < SEND_CACHE_MAX_ENTRIES:
            cache[tags] = code
    return code


def max_reconsume_times(group_max: int, cmd_version: int, header_max: int | None, broker_max: int) -> int:
    """Retries a message of a group gets before the DLQ: the client's header value (clients from V3_4_9 on
    send one) else the group's ``retryMaxTimes``, never more than the broker's ``maxReconsumeTimes``."""
    limit = group_max
    if cmd_version >= VERSION_WITH_MAX_RECONSUME_TIMES and header_max is not None:
        limit = header_max
    return min(limit, broker_max)


class SendProcessor:
    def __init__(self, ctx: SendContext) -> None:
        self.ctx = ctx
        #: topic -> validate_topic() reason (None = valid); the regex runs once per topic
        self._topic_reasons: dict[str, str | None] = {}
        self._tags_codes: dict[str, int] = {}
        #: peer address -> 8-byte born host
        self._born_hosts: dict[str, bytes] = {}
        #: (cluster name, its ASCII bytes) for the native single put; re-encoded when the name changes
        self._cluster_bytes: tuple[str | None, bytes] = (None, b"")

    def _born_host(self, conn: Any) -> bytes:
        peer = getattr(conn, "peer_addr", "") or ""
        raw = self._born_hosts.get(peer)
        if raw is None:
            raw = born_host_of(conn)
            if len(self._born_hosts) >= SEND_CACHE_MAX_ENTRIES:
                self._born_hosts.clear()
            self._born_hosts[peer] = raw
        return raw

    def _validate_topic(self, topic: str) -> str | None:
        cache = self._topic_reasons
        if topic in cache:
            return cache[topic]
        reason = validate_topic(topic)
        if len(cache) < SEND_CACHE_MAX_ENTRIES:
            cache[topic] = reason
        return reason

    def register(self, dispatcher: Any) -> None:
        for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
            dispatcher.register(code, self.handle)

    # ---- entry -------------------------------------------------------------------------------
    def handle(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | bytes | Awaitable[RemotingCommand] | None:
        ctx = self.ctx
        config = ctx.config
        if config.broker_role is _SLAVE:  # config.is_slave without the property and enum lookups
            return cmd.response(R.SERVICE_NOT_AVAILABLE, remark=SERVICE_NOT_AVAILABLE_REMARK)
        role = ctx.controller_role
        if role is not None and not role.can_ack():  # controller mode: a master within its lease only
            return cmd.response(R.SERVICE_NOT_AVAILABLE, remark=role.refusal_remark())
        # SendHeader.parse's extension call made here for the usual SEND_MESSAGE_V2 (one frame less per send)
        h = native_send_header_v2(cmd.ext_fields, False) if cmd.code == _SEND_V2 and native_send_header_v2 else None
        if h is None:
            try:
                h = SendHeader.parse(cmd)
            except ProtocolError as exc:
                return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        checked = self._check_topic(cmd, h)
        if type(checked) is RemotingCommand:
            return checked
        tc: TopicConfig = checked  # type: ignore[assignment]
        if len(cmd.body) > config.max_message_size:
            return cmd.response(R.MESSAGE_ILLEGAL, remark=f"message body size exceeded, max "
                                                          f"{config.max_message_size}")
        queue_id = h.queue_id if h.queue_id >= 0 else ctx.topics.random_queue_id(tc)
        gate = ctx.queue_files
        # gate.may_defer() written out (once per send): a queue in the making, or none yet
        if ((gate.lines or (h.topic, queue_id) not in gate.queues) and not h.sys_flag & SYSFLAG_TRANSACTION_MASK
                and not h.topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and stored_in_named_queue(h.properties)):
            # a new queue: its first consume queue file is made on a thread, then the send runs (queue_files.py)
            waiting = gate.defer(h.topic, queue_id, functools.partial(self._send_now, conn, cmd, h, queue_id))
            if waiting is not None:
                return _answer_when_sent(waiting)
        return self._send_now(conn, cmd, h, queue_id)

    def _send_now(self, conn: Any, cmd: RemotingCommand, h: SendHeader, queue_id: int
                  ) -> RemotingCommand | bytes | Awaitable[RemotingCommand] | None:
        if h.batch:
            return self._send_batch(conn, cmd, h, queue_id)
        return self._send_one(conn, cmd, h, queue_id)

    def _check_topic(self, cmd: RemotingCommand, h: SendHeader) -> TopicConfig | RemotingCommand:
        ctx = self.ctx
        topic = h.topic
        if not ctx.config.broker_permission & PERM_WRITE:  # is_writeable() inlined, as the checks below
            existing = ctx.topics.get(topic)
            if existing is not None and existing.order:  # only order topics are refused (§2.7 SEND check 1)
                return cmd.response(R.NO_PERMISSION, remark=f"the broker[{ctx.config.broker_ip1}] sending message "
                                                            "is forbidden")
        reasons = self._topic_reasons
        reason = reasons[topic] if topic in reasons else self._validate_topic(topic)
        if reason is not None:
            return cmd.response(R.SYSTEM_ERROR, remark=reason)
        if topic in NOT_ALLOWED_SEND_TOPICS:
            return cmd.response(R.NO_PERMISSION, remark=f"Sending message to topic[{topic}] is forbidden.")
        tc = ctx.topics.get(topic)
        if tc is None:
            try:
                if h.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                    tc = ctx.topics.create_sys_group_topic(h.topic, 1, PERM_READ | PERM_WRITE)
                else:
                    tc = ctx.topics.create_in_send(h.topic, h.default_topic, h.default_topic_queue_nums)
            except OSError as exc:  # the topic journal could not be written: refuse, nothing is stored
                return self._refuse_metadata_write(cmd, h.topic, exc)
            if tc is None:
                return cmd.response(R.TOPIC_NOT_EXIST, remark=f"topic[{h.topic}] not exist, apply first please! "
                                                              "https://rocketmq.apache.org/docs/bestPractice/06FAQ")
        if h.queue_id >= tc.write_queue_nums and h.queue_id >= tc.read_queue_nums:
            return cmd.response(R.SYSTEM_ERROR, remark=f"request queueId[{h.queue_id}] is illegal, {tc.topic_name} "
                                                       f"Producer: {cmd.ext_fields.get('producerGroup', '')}")
        if not tc.perm & PERM_WRITE:
            return cmd.response(R.NO_PERMISSION, remark=f"the topic[{h.topic}] sending message is forbidden")
        return tc

    def _refuse_metadata_write(self, cmd: RemotingCommand, topic: str, exc: OSError) -> RemotingCommand:
        """A send whose topic could not be created durably (no descriptor or no disk for topics.json's journal):
        the same refusal as a store that cannot write, and a (throttled) log line with the cause."""
        status = {errno.EMFILE: "OPEN_FILES_EXHAUSTED", errno.ENFILE: "OPEN_FILES_EXHAUSTED",
                  errno.ENOSPC: "DISK_FULL", errno.EDQUOT: "DISK_FULL"}.get(exc.errno or 0)
        log.warning("cannot create topic %s: %s", topic, exc)
        if status is None:
            return cmd.response(R.SYSTEM_ERROR, remark=f"cannot create topic {topic}: {exc.strerror or exc}")
        outcome = send_outcome(status)
        return cmd.response(outcome.code, remark=outcome.remark)

    # ---- single message ----------------------------------------------------------------------
    def _retry_to_dlq(self, cmd: RemotingCommand, h: SendHeader, topic: str, queue_id: int
                      ) -> tuple[str, int] | RemotingCommand:
        """Retry topic past max reconsume times → (%DLQ%group, 0)."""
        if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return topic, queue_id
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
        sg = self.ctx.groups.find(group)
        if sg is None:
            return cmd.response(R.SUBSCRIPTION_GROUP_NOT_EXIST, remark=f"subscription group not exist, {group}")
        max_rt = max_reconsume_times(sg.retry_max_times, cmd.version, h.max_reconsume_times,
                                     self.ctx.config.max_reconsume_times)
        if h.reconsume_times < max_rt:
            return topic, queue_id
        dlq = dlq_topic(group)
        self.ctx.topics.create_sys_group_topic(dlq, 1, PERM_READ | PERM_WRITE)
        return dlq, 0

    def _send_one(self, conn: Any, cmd: RemotingCommand, h: SendHeader, queue_id: int
                  ) -> RemotingCommand | bytes | Awaitable[RemotingCommand] | None:
        ctx = self.ctx
        writer = ctx.writer
        if (writer.native_put_one and not h.sys_flag & SYSFLAG_TRANSACTION_MASK
                and not h.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)):
            fast = self._put_one_native(conn, cmd, h, queue_id)
            if fast is not None:
                result, wait = fast
                if h.topic == SCHEDULE_TOPIC:
                    ctx.wake_schedule()
                return self._finish(cmd, result, queue_id, wait, conn)
        routed = self._retry_to_dlq(cmd, h, h.topic, queue_id)
        if isinstance(routed, RemotingCommand):
            return routed
        topic, queue_id_stored = routed
        props = _parse_properties(h.properties)
        recall: RecallHandle | None = None
        wait = props.pop(PROPERTY_WAIT_STORE_MSG_OK, "true").lower() != "false"
        props[PROPERTY_CLUSTER] = ctx.config.broker_cluster_name
        sys_flag = h.sys_flag
        tran_type = sys_flag & SYSFLAG_TRANSACTION_MASK
        if props.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
            if ctx.config.reject_transaction_message:
                return cmd.response(R.NO_PERMISSION, remark=f"the broker[{ctx.config.broker_ip1}] refuses "
                                                            "transactional messages (rejectTransactionMessage)")
            props.setdefault(PROPERTY_PRODUCER_GROUP, cmd.ext_fields.get("producerGroup", ""))
            props[PROPERTY_REAL_TOPIC] = topic
            props[PROPERTY_REAL_QUEUE_ID] = str(queue_id_stored)
            sys_flag = (sys_flag & ~SYSFLAG_TRANSACTION_MASK) | SYSFLAG_TRANSACTION_NOT_TYPE
            topic, queue_id_stored = TRANS_HALF_TOPIC, 0
        elif tran_type in (SYSFLAG_TRANSACTION_NOT_TYPE, SYSFLAG_TRANSACTION_COMMIT):
            level = _delay_level(props)
            if level > 0:
                level = min(level, ctx.schedule_max_level)
                props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
                props[PROPERTY_REAL_TOPIC] = topic
                props[PROPERTY_REAL_QUEUE_ID] = str(queue_id_stored)
                topic, queue_id_stored = SCHEDULE_TOPIC, level - 1
                for name in TIMER_REQUEST_PROPERTIES:  # a delay level wins over a delivery time (as RocketMQ)
                    props.pop(name, None)
            elif wants_timer(props):
                timed = self._to_timer(cmd, props, topic, queue_id_stored)
                if isinstance(timed, RemotingCommand):
                    return timed
                if timed is not None:
                    recall = timed
                    topic, queue_id_stored = TIMER_TOPIC, TIMER_QUEUE_ID
        elif tran_type == SYSFLAG_TRANSACTION_PREPARED:
            pass
        inner = MessageExtBrokerInner(
            topic=topic, queue_id=queue_id_stored, body=cmd.body, flag=h.flag,
            properties_string=_properties_text(props),
            tags_code=_tags_code_cached(self._tags_codes, props.get(PROPERTY_TAGS)),
            sys_flag=sys_flag, born_timestamp=h.born_timestamp, born_host=self._born_host(conn),
            store_host=ctx.store_host, reconsume_times=h.reconsume_times, index_keys=index_keys(props),
            wait_store_msg_ok=wait,
        )
        result = ctx.writer.put(inner)
        if topic == SCHEDULE_TOPIC:
            ctx.wake_schedule()
        elif recall is not None:
            return self._finish_timer(cmd, result, queue_id, wait, recall)
        return self._finish(cmd, result, queue_id, wait, conn)

    def _to_timer(self, cmd: RemotingCommand, props: dict[str, str], topic: str, queue_id: int
                  ) -> RecallHandle | RemotingCommand | None:
        """Rewrite ``props`` of a message asking for a delivery time into the timer topic's (TIMER_OUT_MS,
        REAL_TOPIC, REAL_QID): its recall handle (an empty message id when it has no UNIQ_KEY); None when the
        time is not in the future (the message is stored as it is); a refusal for a bad or too distant time."""
        ctx = self.ctx
        now_ms = ctx.clock_ms()
        try:
            deliver_ms = deliver_ms_of(props, now_ms)
        except TimerPropertyError as exc:
            outcome = TIMER_STATUS_TABLE[TimerStatus.ILLEGAL_DELIVERY_TIME]
            return cmd.response(outcome.code, remark=f"{outcome.remark}: {exc}")
        if deliver_ms is None or deliver_ms <= now_ms:
            return None
        max_delay_ms = ctx.config.timer_max_delay_sec * 1000
        if deliver_ms - now_ms > max_delay_ms:
            outcome = TIMER_STATUS_TABLE[TimerStatus.DELAY_TOO_LONG]
            return cmd.response(outcome.code, remark=f"{outcome.remark}: {deliver_ms - now_ms} ms ahead, at most "
                                                     f"{max_delay_ms} ms (timerMaxDelaySec)")
        store = ctx.store
        if store.retention_held and store.disk_used_pct >= ctx.config.disk_space_clean_forcibly_ratio:
            outcome = TIMER_STATUS_TABLE[TimerStatus.RETENTION_HELD]
            return cmd.response(outcome.code, remark=f"{outcome.remark} (disk {store.disk_used_pct:.1f}% used, "
                                                     f"diskSpaceCleanForciblyRatio "
                                                     f"{ctx.config.disk_space_clean_forcibly_ratio}%)")
        props[PROPERTY_TIMER_OUT_MS] = str(deliver_ms)
        props[PROPERTY_REAL_TOPIC] = topic
        props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
        return RecallHandle(topic, ctx.config.broker_name, deliver_ms,
                            props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, ""))

    def _put_one_native(self, conn: Any, cmd: RemotingCommand, h: SendHeader, queue_id: int
                        ) -> tuple[Any, bool] | None:
        """The put of ``_send_one`` for a plain message (no retry topic, no transaction flag — checked by the
        caller —, no DELAY / TRAN_MSG property, ASCII properties) done by the C extension from the header's
        properties string: the same record, result and WAIT flag. None when it declines (anything unusual,
        any refusal): nothing was stored and the Python path decides and answers."""
        text = h.properties
        if text:
            if not text.isascii():
                return None
            props = text.encode("ascii")
        else:
            props = b""
        cluster = self._cluster_bytes
        name = self.ctx.config.broker_cluster_name
        if cluster[0] is not name:
            if not name.isascii():
                return None
            cluster = self._cluster_bytes = (name, name.encode("ascii"))
        born_host = self._born_hosts.get(getattr(conn, "peer_addr", "")) or self._born_host(conn)
        ctx = self.ctx
        return ctx.writer.put_one_raw(h.topic, queue_id, cmd.body, props, cluster[1], h.flag, h.sys_flag,
                                      h.born_timestamp, born_host, ctx.store_host, h.reconsume_times)

    # ---- batch ---------------------------------------------------------------------------------
    def _send_batch(self, conn: Any, cmd: RemotingCommand, h: SendHeader, queue_id: int
                    ) -> RemotingCommand | bytes | Awaitable[RemotingCommand] | None:
        ctx = self.ctx
        if h.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return cmd.response(R.MESSAGE_ILLEGAL, remark="batch request does not support retry group "
                                                          f"{h.topic}")
        if h.sys_flag & SYSFLAG_TRANSACTION_MASK:
            return cmd.response(R.MESSAGE_ILLEGAL, remark="batch message does not support transaction")
        if h.sys_flag & SYSFLAG_COMPRESSED:
            # the Apache C++ client 1.x compresses a whole batch body of >= 4 KiB and sets sysFlag bit 0; the
            # entries are stored uncompressed, one record each, without the flag
            try:
                cmd.body = inflate_bounded(cmd.body, ctx.config.max_message_size)
            except ValueError as exc:
                return cmd.response(R.MESSAGE_ILLEGAL, remark=f"bad batch body: {exc}")
            h.sys_flag &= ~SYSFLAG_COMPRESSED
        batch_props = string_to_properties(h.properties)
        wait = batch_props.pop(PROPERTY_WAIT_STORE_MSG_OK, "true").lower() != "false"
        fast = self._put_batch_native(conn, cmd, h, queue_id, batch_props)
        if fast is not None:
            return self._finish(cmd, fast, queue_id, wait, conn)
        try:
            entries = decode_batch_body(cmd.body)
        except (RecordFormatError, ValueError) as exc:
            return cmd.response(R.MESSAGE_ILLEGAL, remark=f"bad batch body: {exc}")
        if not entries:
            return cmd.response(R.MESSAGE_ILLEGAL, remark="empty batch")
        born_host = self._born_host(conn)
        tags_codes = self._tags_codes
        cluster = ctx.config.broker_cluster_name
        store_host = ctx.store_host
        topic, sys_flag, born_ts, reconsume = h.topic, h.sys_flag, h.born_timestamp, h.reconsume_times
        inners: list[MessageExtBrokerInner] = []
        append = inners.append
        for flag, body, props_text in entries:
            # _parse_properties inlined (C-level split; the tolerant parser when malformed)
            if not props_text:
                props: dict[str, str] = {}
            else:
                text = props_text[:-1] if props_text[-1] == PROPERTY_SEPARATOR else props_text
                try:
                    props = dict(item.split(NAME_VALUE_SEPARATOR, 1) for item in text.split(PROPERTY_SEPARATOR))
                except ValueError:
                    props = string_to_properties(props_text)
                else:
                    if "" in props:
                        props = string_to_properties(props_text)
            if batch_props:
                props.update(batch_props)
            props.pop(PROPERTY_WAIT_STORE_MSG_OK, None)
            if ((PROPERTY_DELAY_TIME_LEVEL in props and _delay_level(props) > 0)
                    or (PROPERTY_TRANSACTION_PREPARED in props
                        and props[PROPERTY_TRANSACTION_PREPARED].lower() == "true")
                    or wants_timer(props)):
                return cmd.response(R.MESSAGE_ILLEGAL, remark="batch messages do not support DELAY, delivery times "
                                                              "(timer messages) or transactions")
            props[PROPERTY_CLUSTER] = cluster
            tags = props.get(PROPERTY_TAGS)
            if not tags:
                tags_code = 0
            else:
                tags_code = tags_codes.get(tags)  # type: ignore[assignment]
                if tags_code is None:
                    tags_code = _tags_code_cached(tags_codes, tags)
            uniq = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            keys = ((uniq,) if uniq else ()) if PROPERTY_KEYS not in props else index_keys(props)
            append(MessageExtBrokerInner(
                topic, queue_id, body, flag, PROPERTY_SEPARATOR.join(map(NAME_VALUE_SEPARATOR.join, props.items())),
                tags_code, sys_flag, born_ts, born_host, store_host, reconsume, 0, 0, keys, wait,
            ))
        result = ctx.writer.put_batch(inners)
        return self._finish(cmd, result, queue_id, wait, conn)

    def _put_batch_native(self, conn: Any, cmd: RemotingCommand, h: SendHeader, queue_id: int,
                          batch_props: dict[str, str]) -> Any:
        """The batch put of ``_send_batch`` done by the C extension from the request body (same records,
        same result); None when it declines (no extension, malformed or unusual batch, any refusal) and
        the Python path below decides and answers."""
        ctx = self.ctx
        try:
            merge = PROPERTY_SEPARATOR.join(map(NAME_VALUE_SEPARATOR.join, batch_props.items())).encode("ascii")
            cluster = ctx.config.broker_cluster_name.encode("ascii")
        except UnicodeEncodeError:
            return None
        return ctx.writer.put_batch_raw(h.topic, queue_id, cmd.body, merge, cluster, h.sys_flag, h.born_timestamp,
                                        self._born_host(conn), ctx.store_host, h.reconsume_times)

    # ---- response ---------------------------------------------------------------------------------
    def _finish(self, cmd: RemotingCommand, result: Any, queue_id: int, wait: bool, conn: Any = None
                ) -> RemotingCommand | bytes | Awaitable[RemotingCommand] | None:
        status = result.status
        if status is _PUT_OK and result.append_result is not None:
            writer = self.ctx.writer
            # writer.needs_wait(wait) written out: once per send
            if wait and (writer.sync_flush or (writer.sync_master and writer.ha_service is not None)):
                if writer.sync_master and not writer.sync_flush and hasattr(writer.ha_service, "on_slave_ack"):
                    return self._finish_on_slave_ack(conn, cmd, result, queue_id)
                if writer.sync_flush and not (writer.sync_master and writer.ha_service is not None):
                    return self._finish_on_flush(conn, cmd, result, queue_id)
                return self._finish_after_wait(cmd, result, queue_id)
            ar = result.append_result
            # the usual answer: a templated frame, byte for byte what encode() writes for the SUCCESS command
            # (encode_send_ok_response's extension call made here: one frame less per send)
            if native_send_ok is not None and cmd.serialize_type == SERIALIZE_JSON:
                frame: bytes | None = native_send_ok(cmd.opaque, ar.msg_id, queue_id, ar.queue_offset)
                if frame is not None:
                    return frame
            return encode_send_ok_response(cmd.opaque, ar.msg_id, queue_id, ar.queue_offset, cmd.serialize_type)
        outcome = send_outcome(status)
        if outcome.stored and result.append_result is not None and self.ctx.writer.needs_wait(wait):
            return self._finish_after_wait(cmd, result, queue_id)
        return self._response(cmd, result, queue_id, status.name)

    def _finish_on_slave_ack(self, conn: Any, cmd: RemotingCommand, result: Any, queue_id: int
                             ) -> RemotingCommand | bytes | None:
        """SYNC_MASTER + ASYNC_FLUSH: ``MessageWriter.wait_stored`` without a task or future — the HA
        ack handler writes the answer to ``conn`` itself (same statuses: SLAVE_NOT_AVAILABLE /
        FLUSH_SLAVE_TIMEOUT). Returns the answer when it is known at once, else None (answered later)."""
        ar = result.append_result
        end = ar.wrote_offset + ar.wrote_bytes
        ha = self.ctx.writer.ha_service
        if not ha.is_slave_ok(end):
            return self._response(cmd, result, queue_id, "SLAVE_NOT_AVAILABLE")
        reply = _SlaveAckReply(self, conn, cmd, result, queue_id)
        ha.on_slave_ack(end, self.ctx.config.replica_wait_ms, reply)
        reply.inline = False
        return reply.response  # None unless the ack (or a refusal) came inline

    def _finish_on_flush(self, conn: Any, cmd: RemotingCommand, result: Any, queue_id: int
                         ) -> RemotingCommand | bytes | None:
        """SYNC_FLUSH (no replica wait): the flush round's callback writes the answer to ``conn`` itself, like
        ``_finish_on_slave_ack`` (FLUSH_DISK_TIMEOUT when the flush does not come in syncFlushTimeout)."""
        reply = _FlushReply(self, conn, cmd, result, queue_id)
        self.ctx.writer.on_flushed(result, reply)
        reply.inline = False
        return reply.response

    def _finish_timer(self, cmd: RemotingCommand, result: Any, queue_id: int, wait: bool, recall: RecallHandle
                      ) -> RemotingCommand | Awaitable[RemotingCommand]:
        """``_finish`` for a message stored in the timer topic: the answer also carries its ``recallHandle``
        (RocketMQ 5's SendMessageResponseHeader field; none for a message without UNIQ_KEY)."""
        extra = {RECALL_HANDLE_FIELD: recall.encode()} if recall.message_id else None
        if send_outcome(result.status).stored and result.append_result is not None and \
                self.ctx.writer.needs_wait(wait):
            return self._finish_after_wait(cmd, result, queue_id, extra)
        return self._response(cmd, result, queue_id, result.status.name, extra)

    async def _finish_after_wait(self, cmd: RemotingCommand, result: Any, queue_id: int,
                                 extra: dict[str, str] | None = None) -> RemotingCommand:
        status = await self.ctx.writer.wait_stored(result)
        role = self.ctx.controller_role
        if role is not None and not role.can_ack():
            # deposed or cut off from the controller while waiting: never SEND_OK (the record may be cut when
            # this broker rejoins as a slave); the producer retries
            return cmd.response(R.SERVICE_NOT_AVAILABLE, remark=role.refusal_remark())
        return self._response(cmd, result, queue_id, status, extra)

    def _response(self, cmd: RemotingCommand, result: Any, queue_id: int, status: str,
                  extra: dict[str, str] | None = None) -> RemotingCommand:
        if status in REPLICA_FAILURE_STATUSES:
            self.ctx.stats.on_replica_failure(status)
        outcome = send_outcome(status)
        ar = result.append_result
        if not outcome.stored or ar is None:
            remark = outcome.remark or status
            if status == "DISK_FULL":
                remark = f"{remark} {self.ctx.store.disk_full_detail()}"
            return cmd.response(outcome.code, remark=remark)
        fields: dict[str, Any] = {
            "msgId": ar.msg_id,
            "queueId": queue_id,
            "queueOffset": ar.queue_offset,
            "MSG_REGION": MSG_REGION,
            "TRACE_ON": "true",
        }
        if extra:
            fields.update(extra)
        return cmd.response(outcome.code, fields, remark=outcome.remark)


class _SlaveAckReply:
    """The ``on_slave_ack`` callback of one SYNC_MASTER send: builds the answer and writes it to the
    connection in the ack handler (no future, no done-callback loop turn). While ``inline`` (the
    callback ran inside ``on_slave_ack``) the answer is kept in ``response`` for the handler to return.
    Writes follow ``Connection._reply``: nothing for oneway requests or closed connections."""

    __slots__ = ("proc", "conn", "cmd", "result", "queue_id", "inline", "response", "started_s")
    #: the status answered when the wait fails, and whether the wait is a replica wait (its histogram)
    timeout_status = "FLUSH_SLAVE_TIMEOUT"
    replica_wait = True

    def __init__(self, proc: SendProcessor, conn: Any, cmd: RemotingCommand, result: Any, queue_id: int) -> None:
        self.proc = proc
        self.conn = conn
        self.cmd = cmd
        self.result = result
        self.queue_id = queue_id
        self.inline = True
        self.response: RemotingCommand | bytes | None = None
        self.started_s = time.perf_counter()

    def __call__(self, ok: bool) -> None:
        cmd = self.cmd
        if self.proc is not None and self.replica_wait:  # (None in unit tests of the reply alone)
            self.proc.ctx.stats.sync_wait.observe(time.perf_counter() - self.started_s)
        resp: RemotingCommand | bytes
        role = self.proc.ctx.controller_role if self.proc is not None else None
        try:
            if ok and role is not None and not role.can_ack():
                # controller mode: deposed or cut off from the controller while waiting — never SEND_OK
                resp = cmd.response(R.SERVICE_NOT_AVAILABLE, remark=role.refusal_remark())
            elif ok:
                ar = self.result.append_result
                # the templated SEND_OK frame (as SendProcessor._finish), carrying the request's opaque
                resp = encode_send_ok_response(cmd.opaque, ar.msg_id, self.queue_id, ar.queue_offset,
                                               cmd.serialize_type)
            else:
                resp = self.proc._response(cmd, self.result, self.queue_id, self.timeout_status)
        except Exception as exc:  # answered as SYSTEM_ERROR, like a failing handler
            log.exception("SYNC_MASTER answer for code %s failed", cmd.code)
            resp = cmd.response(R.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")
        if self.inline:
            self.response = resp
            return
        conn = self.conn
        if cmd.flag & FLAG_ONEWAY or conn is None or conn.closed:
            return
        if type(resp) is not bytes:
            resp.opaque = cmd.opaque  # type: ignore[union-attr]
        try:
            conn.send(resp)
        except Exception as exc:  # the connection went away meanwhile
            log.debug("SYNC_MASTER answer to %s not sent: %s", getattr(conn, "peer_addr", "?"), exc)


class _FlushReply(_SlaveAckReply):
    """The ``on_flushed`` callback of one SYNC_FLUSH send (``_SlaveAckReply``'s answers, FLUSH_DISK_TIMEOUT
    when the flush does not come in time)."""

    __slots__ = ()
    timeout_status = "FLUSH_DISK_TIMEOUT"
    replica_wait = False


def _delay_level(props: dict[str, str]) -> int:
    raw = props.get(PROPERTY_DELAY_TIME_LEVEL)
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        return 0
