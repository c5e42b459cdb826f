"""Asyncio producer (protocol §2.5, §3.6, §4.2, §4.9).

* UNIQ_KEY is generated client side (32 hex chars: IPv4, pid, random, ms in month, counter).
* Queues round-robin over the masters' write queues; a failed or slow broker group is avoided for a
  while (``fault.LatencyFaultTolerance``); retriable failures retry on another broker group, up to
  ``retry_times_when_send_failed`` more times, all within ``send_timeout_ms``.
* Explicit ``queue=`` or ``selector=`` sends are tried once (order matters more than delivery there).
* A topic unknown to the name server (17) falls back to the TBW102 route (at most 4 queues per broker),
  like the C++ client, so an auto-create broker creates it.
* Bodies ≥ ``compress_msg_body_over_bytes`` are zlib-compressed and flagged with sysFlag bit 0
  (never for batches).
* Many sends may be in flight on one connection at once (requests are matched by opaque).
"""

from __future__ import annotations

import asyncio
import calendar
import functools
import itertools
import logging
import os
import random
import socket
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from itertools import islice, repeat
from operator import and_, attrgetter, contains, setitem
from typing import Any

from ferrymq.client import api, request_reply, routes
from ferrymq.client.config import (
    COMPRESS_LEVEL,
    COMPRESS_MSG_BODY_OVER_BYTES,
    DEFAULT_TOPIC_QUEUE_NUMS,
    MAX_MESSAGE_SIZE_BYTES,
    ClientConfig,
    parse_name_servers,
)
from ferrymq.client.fault import LatencyFaultTolerance
from ferrymq.client.instance import ClientInstance, acquire_shared, release_shared
from ferrymq.client.selectors import RoundRobin
from ferrymq.client.values import SendResult
from ferrymq.common import aio, message_codec
from ferrymq.common.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_SEPARATOR,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SYSFLAG_COMPRESSED,
    Message,
    MessageExt,
    properties_to_string,
    reply_topic,
)
from ferrymq.common.route import MessageQueue, TopicRouteData
from ferrymq.common.tls import TlsClientSettings
from ferrymq.common.topic import (
    DEFAULT_TOPIC,
    NOT_ALLOWED_SEND_TOPICS,
    RETRY_GROUP_TOPIC_PREFIX,
    validate_topic,
)
from ferrymq.errors import (
    BrokerError,
    ClientError,
    RemotingError,
    RemotingTimeoutError,
    RequestTimeoutError,
    TopicNotExistError,
)
from ferrymq.remoting.codec import FLAG_ONEWAY, RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode

log = logging.getLogger(__name__)

Selector = Callable[[list[MessageQueue], Message, Any], MessageQueue]

#: bound of the per-producer topic caches (cleared when full)
_CACHE_MAX = 4096
#: the broker does not take writes (not the master, lease lapsed, ...)
SERVICE_NOT_AVAILABLE_CODE = int(ResponseCode.SERVICE_NOT_AVAILABLE)
_PROPERTY_SEPARATOR = PROPERTY_SEPARATOR
_NAME_VALUE_SEPARATOR = NAME_VALUE_SEPARATOR
_join_props = PROPERTY_SEPARATOR.join
_join_item = NAME_VALUE_SEPARATOR.join
_topic_of = attrgetter("topic")
_body_of = attrgetter("body")
_flag_of = attrgetter("flag")
_properties_of = attrgetter("properties")
_send_command = api.send_command

_SEND_MESSAGE_V2 = int(RequestCode.SEND_MESSAGE_V2)
_parse_send = api.parse_send


def _properties_text(props: dict[str, str]) -> str:
    """A message's properties as the SEND header's ``properties`` string."""
    try:  # all keys and values str (the usual case): joined in C
        return _join_props(map(_join_item, props.items()))
    except TypeError:  # a None (skipped) or non-str value
        return properties_to_string(props)


_UNIQ_COUNTER = itertools.count(random.randrange(1 << 16))
_UNIQ_PREFIX: bytes | None = None
#: uppercase hex of _UNIQ_PREFIX (20 chars), and the bytes it was made from
_uniq_prefix_hex = ""
_uniq_prefix_src: bytes | None = None
#: [second of the last lookup, epoch time of that second's local month start (naive local arithmetic)]
_month_base: list[float] = [-1.0, 0.0]


def _month_start(sec: int) -> float:
    """Epoch seconds ``b`` such that ``t - b`` is the naive local time at ``t`` (in second ``sec``) minus
    local midnight of the 1st of that month: ``datetime.now() - month_start``, without datetimes."""
    lt = time.localtime(sec)
    return calendar.timegm((lt.tm_year, lt.tm_mon, 1, 0, 0, 0)) - lt.tm_gmtoff


#: [prefix hex + hex of the ms-in-month of the last key, that ms]: keys made within one millisecond share it
_uniq_head: list[Any] = ["", -1]
#: "00" .. "FF": the counter's two bytes in uppercase hex
_HEX_BYTE = tuple(f"{i:02X}" for i in range(256))


def new_uniq_key(client_ip: str = "127.0.0.1") -> str:
    """A 32-hex-char client message id: IPv4(4) pid(2) random(4) ms-since-month-start(4) counter(2)."""
    global _UNIQ_PREFIX, _uniq_prefix_hex, _uniq_prefix_src
    if _UNIQ_PREFIX is None:
        try:
            ip = socket.inet_aton(client_ip)
        except OSError:
            ip = b"\x7f\x00\x00\x01"
        _UNIQ_PREFIX = ip + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)
    head = _uniq_head
    if _UNIQ_PREFIX is not _uniq_prefix_src:
        _uniq_prefix_src = _UNIQ_PREFIX
        _uniq_prefix_hex = _UNIQ_PREFIX.hex().upper()
        head[1] = -1
    t = time.time()
    cache = _month_base
    sec = int(t)
    if sec != cache[0]:
        cache[1] = _month_start(sec)
        cache[0] = sec
    ms = int((t - cache[1]) * 1000) & 0xFFFFFFFF
    counter = next(_UNIQ_COUNTER) & 0xFFFF
    if ms != head[1]:
        head[0] = _uniq_prefix_hex + ms.to_bytes(4, "big").hex().upper()
        head[1] = ms
    return head[0] + _HEX_BYTE[counter >> 8] + _HEX_BYTE[counter & 0xFF]


#: keys per clock read in ``new_uniq_keys`` (a block never spans more than a sixteenth of the 16-bit counter)
_BULK_UNIQ_MAX = 4096


@functools.lru_cache(maxsize=16)
def _hex4_slices(n: int) -> tuple[slice, ...]:
    """slice(0, 4), slice(4, 8), ... (n of them): the 4-char counter pieces of a key block."""
    return tuple(map(slice, range(0, 4 * n, 4), range(4, 4 * n + 4, 4)))


def _uniq_key_block(n: int, client_ip: str) -> tuple[str, str]:
    """(prefix, counters) of ``n`` (2 .. 4096) keys as ``new_uniq_key`` makes them with the clock read once:
    key i is ``prefix`` (28 chars: IP, pid, random, ms since month start) + ``counters[4i:4i+4]`` (the next
    counter values, uppercase hex)."""
    first = new_uniq_key(client_ip)
    m = n - 1
    last = next(islice(_UNIQ_COUNTER, m - 1, None))  # takes m more counter values: last - m + 1 .. last
    rest = struct.pack(f">{m}H", *map(and_, range(last - m + 1, last + 1), repeat(0xFFFF))).hex().upper()
    return first[:28], first[28:] + rest


def new_uniq_keys(n: int, client_ip: str = "127.0.0.1") -> list[str]:
    """``n`` keys as ``new_uniq_key`` makes them, the clock read once per block of ``_BULK_UNIQ_MAX`` keys (the
    counter still counts per key)."""
    keys: list[str] = []
    for start in range(0, n, _BULK_UNIQ_MAX):
        m = min(_BULK_UNIQ_MAX, n - start)
        if m == 1:
            keys.append(new_uniq_key(client_ip))
            continue
        prefix, counters = _uniq_key_block(m, client_ip)
        keys += map(prefix.__add__, map(counters.__getitem__, _hex4_slices(m)))
    return keys


class Producer:
    def __init__(
        self,
        name_server: str | list[str],
        group: str = "DEFAULT_PRODUCER",
        *,
        send_timeout_ms: int = 3000,
        retry_times_when_send_failed: int = 2,
        compress_msg_body_over_bytes: int = COMPRESS_MSG_BODY_OVER_BYTES,
        max_message_size_bytes: int = MAX_MESSAGE_SIZE_BYTES,
        send_latency_fault_enable: bool = True,
        default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
        poll_name_server_interval_ms: int = 30_000,
        heartbeat_broker_interval_ms: int = 30_000,
        instance_name: str | None = None,
        access_key: str = "",
        secret_key: str = "",
        tls: TlsClientSettings | None = None,
    ) -> None:
        config = ClientConfig(parse_name_servers(name_server),
                              poll_name_server_interval_ms=poll_name_server_interval_ms,
                              heartbeat_broker_interval_ms=heartbeat_broker_interval_ms,
                              access_key=access_key, secret_key=secret_key, tls=tls)
        if instance_name:
            config.instance_name = instance_name
        self.config = config
        #: an explicit instance name: share the started instance of producers with the same name and options
        self._share_instance = bool(instance_name)
        self.group = group
        self.send_timeout_ms = send_timeout_ms
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.compress_msg_body_over_bytes = compress_msg_body_over_bytes
        self.max_message_size_bytes = max_message_size_bytes
        self.default_topic_queue_nums = default_topic_queue_nums
        self.fault = LatencyFaultTolerance(enabled=send_latency_fault_enable)
        self._rr = RoundRobin()
        self._instance: ClientInstance | None = None
        #: topic -> monotonic time of the last "topic not in name server" answer (TBW102 fallback)
        self._fallback_since: dict[str, float] = {}
        #: topic -> (route object, its publish queues): recomputed whenever the instance replaces the route
        self._mq_cache: dict[str, tuple[TopicRouteData, list[MessageQueue]]] = {}
        #: topics that passed the name checks of ``_validate``
        self._valid_topics: set[str] = set()
        #: topic -> broker name -> (group, default topic queue nums, their SEND field dict): see ``_build``
        self._send_fields: dict[str, dict[str, tuple[Any, Any, dict[str, str]]]] = {}
        #: masters heartbeated for request-reply (see ``_prepare_request``)
        self._request_heartbeat_addrs: set[str] = set()

    @classmethod
    def bound_to(cls, instance: ClientInstance, group: str) -> Producer:
        """A producer sending through an already started instance (its internal producer): no own
        instance, registered in the instance's heartbeats; ``close()`` must not be called on it."""
        producer = cls(list(instance.config.name_servers), group)
        producer.config = instance.config
        producer._instance = instance
        instance.producer_groups.add(group)
        return producer

    # ---- lifecycle -------------------------------------------------------------------------------------
    @property
    def instance(self) -> ClientInstance:
        if self._instance is None:
            raise ClientError("producer is not started")
        return self._instance

    async def start(self) -> None:
        if self._instance is not None:
            return
        if self._share_instance:
            # producers of this loop with the same instance name and equal options use one instance (one
            # connection per broker), like Java producers sharing an instanceName (instance.py)
            instance = await acquire_shared(self.config, self)
            self._instance = instance
            instance.producer_groups.add(self.group)
            return
        self._instance = ClientInstance(self.config)
        self._instance.producer_groups.add(self.group)
        await self._instance.start()

    async def close(self) -> None:
        instance = self._instance
        if instance is None:
            return
        others = release_shared(instance, self) if self._share_instance else []
        if others:
            # other producers still use the instance: only this producer's group leaves it (unless one of
            # them is of the same group)
            self._instance = None
            if not any(getattr(p, "group", None) == self.group for p in others):
                await instance.unregister_producer(self.group)
            return
        await instance.close()
        self._instance = None

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- routing -----------------------------------------------------------------------------------------
    async def publish_queues(self, topic: str) -> tuple[list[MessageQueue], bool]:
        """(queues, via_default_topic). Falls back to TBW102 when the name server does not know the topic."""
        inst = self.instance
        since = self._fallback_since.get(topic)
        if since is not None and inst.routes.get(topic) is not None:
            since = None  # the topic's own route has arrived meanwhile (another call fetched it): use it
        if since is None or time.monotonic() - since > self.config.poll_name_server_interval_ms / 1000:
            try:
                route = await inst.get_route(topic)
                self._fallback_since.pop(topic, None)
                cached = self._mq_cache.get(topic)
                if cached is not None and cached[0] is route:
                    return list(cached[1]), False  # callers get their own list, as before the cache
                mqs = routes.publish_queues(topic, route)
                if mqs:
                    if len(self._mq_cache) >= _CACHE_MAX:
                        self._mq_cache.clear()
                    self._mq_cache[topic] = (route, mqs)
                    return list(mqs), False
                inst.trigger_route_refresh()
                raise ClientError(f"no writable master queue for topic {topic}")
            except TopicNotExistError:
                self._fallback_since[topic] = time.monotonic()
        try:
            default_route = await inst.get_route(DEFAULT_TOPIC)
        except TopicNotExistError:
            raise ClientError(f"no route info of topic {topic} (and no {DEFAULT_TOPIC} to auto-create it)") from None
        mqs = routes.publish_queues(topic, default_route, max_queue_nums=self.default_topic_queue_nums)
        if not mqs:
            # the broker that was to auto-create the topic is gone (a failover): ask for the topic's own route
            # at the next send instead of trusting the fallback for a whole poll interval
            self._fallback_since.pop(topic, None)
            inst.trigger_route_refresh()
            raise ClientError(f"no route info of topic {topic}")
        return mqs, True

    def _queues_now(self, topic: str) -> list[MessageQueue] | None:
        """The publish queues ``publish_queues`` would return right now without I/O (the topic's route is
        cached, not via TBW102, queues already computed for that route object), else None."""
        if topic in self._fallback_since:
            return None
        cached = self._mq_cache.get(topic)
        if cached is None or self.instance.routes.get(topic) is not cached[0]:
            return None
        return cached[1]

    def _select(self, mqs: list[MessageQueue], last_broker: str | None) -> MessageQueue:
        """Round-robin from the next index: the first queue whose broker is available (latency fault
        tolerance) and not ``last_broker``, else the first available one, else the first not on
        ``last_broker``, else the first."""
        n = len(mqs)
        start = self._rr.next_index()
        fault = self.fault
        if fault.enabled:
            is_available = fault.is_available
            for i in range(start, start + n):
                mq = mqs[i % n]
                if mq.broker_name != last_broker and is_available(mq.broker_name):
                    return mq
            for i in range(start, start + n):
                mq = mqs[i % n]
                if is_available(mq.broker_name):
                    return mq
        if last_broker is not None:
            for i in range(start, start + n):
                mq = mqs[i % n]
                if mq.broker_name != last_broker:
                    return mq
        return mqs[start % n]

    # ---- message preparation ---------------------------------------------------------------------------
    def _validate(self, msg: Message) -> None:
        if msg.topic not in self._valid_topics:  # the usual case skips the call (hot path)
            self._check_topic(msg.topic)
        if not msg.body:
            raise ClientError("message body is empty")
        if len(msg.body) > self.max_message_size_bytes:
            raise ClientError(f"message body is {len(msg.body)} bytes, above the {self.max_message_size_bytes} limit")

    def _check_topic(self, topic: str) -> None:
        """A valid topic that may be sent to (cached once checked)."""
        if topic not in self._valid_topics:
            reason = validate_topic(topic)
            if reason:
                raise ClientError(reason)
            if topic in NOT_ALLOWED_SEND_TOPICS:
                raise ClientError(f"sending to topic {topic} is forbidden")
            if len(self._valid_topics) >= _CACHE_MAX:
                self._valid_topics.clear()
            self._valid_topics.add(topic)

    def _ensure_uniq_key(self, msg: Message) -> str:
        uniq = msg.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if not uniq:
            uniq = new_uniq_key(self.config.client_ip)
            msg.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
        return uniq

    def _build(self, msg: Message, mq: MessageQueue, via_default: bool, *, oneway: bool = False) -> Any:
        """The SEND_MESSAGE_V2 request of ``msg`` for ``mq`` (what ``_build_general`` makes). The usual message
        (not compressed, not a retry topic, int flag and queue id) copies the cached field dict of its (topic,
        broker, group, default queue nums) and fills in queueId, bornTimestamp, flag and properties: the same
        keys in the same order with the same strings as ``api.build_send`` gives."""
        body = msg.body
        topic = msg.topic
        flag = msg.flag
        qid = mq.queue_id
        if (len(body) >= self.compress_msg_body_over_bytes or type(flag) is not int or type(qid) is not int
                or type(topic) is not str or topic.startswith(RETRY_GROUP_TOPIC_PREFIX)):
            return self._build_general(msg, mq, via_default, oneway=oneway)
        properties = _properties_text(msg.properties)
        broker_name = mq.broker_name
        by_broker = self._send_fields.get(topic)
        entry = None if by_broker is None else by_broker.get(broker_name)
        if entry is None or entry[0] is not self.group or entry[1] is not self.default_topic_queue_nums:
            entry = self._send_fields_entry(topic, broker_name)
        fields = entry[2].copy()
        fields["e"] = str(qid)
        fields["g"] = str(int(time.time() * 1000))
        if flag:
            fields["h"] = str(flag)
        fields["i"] = properties
        return RemotingCommand(_SEND_MESSAGE_V2, fields, body, 0, FLAG_ONEWAY if oneway else 0)

    def _send_fields_entry(self, topic: str, broker_name: str) -> tuple[Any, Any, dict[str, str]]:
        """(group, default topic queue nums, SEND fields of ``topic`` on ``broker_name`` with queueId 0,
        sysFlag 0, bornTimestamp 0, flag 0, no properties, reconsume 0) for ``_build``; cached."""
        group = self.group
        dtqn = self.default_topic_queue_nums
        fields = _send_command(group, topic, 0, 0, 0, 0, "", b"", 0, None, False, broker_name, DEFAULT_TOPIC, dtqn,
                               False).ext_fields
        entry = (group, dtqn, fields)
        by_broker = self._send_fields.get(topic)
        if by_broker is None:
            if len(self._send_fields) >= _CACHE_MAX:
                self._send_fields.clear()
            by_broker = self._send_fields[topic] = {}
        elif len(by_broker) >= _CACHE_MAX:
            by_broker.clear()
        by_broker[broker_name] = entry
        return entry

    def _build_general(self, msg: Message, mq: MessageQueue, via_default: bool, *, oneway: bool = False) -> Any:
        body = msg.body
        sys_flag = 0
        if len(body) >= self.compress_msg_body_over_bytes:
            body = zlib.compress(body, COMPRESS_LEVEL)
            sys_flag |= SYSFLAG_COMPRESSED
        reconsume_times = 0
        max_reconsume: int | None = None
        if msg.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            reconsume_times = int(msg.properties.get(PROPERTY_RECONSUME_TIME, "0") or 0)
            max_raw = msg.properties.get(PROPERTY_MAX_RECONSUME_TIMES)
            max_reconsume = int(max_raw) if max_raw else None
        properties = _properties_text(msg.properties)
        # api.build_send(producer_group=..., ..., oneway=oneway) with positional arguments
        return _send_command(self.group, msg.topic, mq.queue_id, sys_flag, int(time.time() * 1000), msg.flag,
                             properties, body, reconsume_times, max_reconsume, False, mq.broker_name, DEFAULT_TOPIC,
                             self.default_topic_queue_nums, oneway)

    # ---- sending -------------------------------------------------------------------------------------------
    async def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: Selector | None = None,
        arg: Any = None,
        timeout_ms: int | None = None,
    ) -> SendResult:
        self._validate(msg)
        uniq = self._ensure_uniq_key(msg)
        return await self._send_with_retries(
            msg.topic, None, uniq, queue, (lambda mqs: selector(mqs, msg, arg)) if selector else None, timeout_ms,
            msg)

    async def send_batch(self, msgs: Sequence[Message], *, queue: MessageQueue | None = None,
                         timeout_ms: int | None = None) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE (320); stored in one queue, consecutive."""
        if not msgs:
            raise ClientError("batch is empty")
        topic = msgs[0].topic
        body, uniq = self._encode_batch(msgs, topic)
        return await self._send_batch_body(topic, body, uniq, queue, timeout_ms)

    async def send_batch_encoded(self, topic: str, body: bytes, uniq_keys: Sequence[str], *,
                                 queue: MessageQueue | None = None, timeout_ms: int | None = None) -> SendResult:
        """Send a SEND_BATCH_MESSAGE body the caller encoded (``message_codec.encode_batch_columns``), for callers
        that build batches column by column. The caller vouches for the entries (non-empty bodies, none above
        ``max_message_size_bytes``, no delay level, a UNIQ_KEY property each, listed in ``uniq_keys``); the topic
        and the body's size are checked here."""
        if not uniq_keys:
            raise ClientError("batch is empty")
        self._check_topic(topic)
        return await self._send_batch_body(topic, body, ",".join(uniq_keys), queue, timeout_ms)

    async def _send_batch_body(self, topic: str, body: bytes, uniq: str, queue: MessageQueue | None,
                               timeout_ms: int | None) -> SendResult:
        """Send an encoded SEND_BATCH_MESSAGE body (its size checked here) with the usual retries."""
        if len(body) > self.max_message_size_bytes:
            raise ClientError(f"batch body is {len(body)} bytes, above the {self.max_message_size_bytes} limit")

        def build(mq: MessageQueue, via_default: bool) -> Any:
            return api.build_send(
                producer_group=self.group, topic=topic, queue_id=mq.queue_id, sys_flag=0,
                born_timestamp_ms=int(time.time() * 1000), flag=0, properties="", body=body, batch=True,
                broker_name=mq.broker_name, default_topic_queue_nums=self.default_topic_queue_nums)

        return await self._send_with_retries(topic, build, uniq, queue, None, timeout_ms)

    def _check_batch(self, msgs: Sequence[Message], topic: str) -> None:
        """The batch checks, message by message (raises the first failure)."""
        for m in msgs:
            self._validate(m)
            if m.topic != topic:
                raise ClientError("all messages of a batch must have the same topic")
            if m.delay_level or PROPERTY_DELAY_TIME_LEVEL in m.properties:
                raise ClientError("delayed messages cannot be batched")
            if m.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                raise ClientError("retry-topic messages cannot be batched")

    def _encode_batch(self, msgs: Sequence[Message], topic: str) -> tuple[bytes, str]:
        """(SEND_BATCH body, comma-joined UNIQ_KEYs) after the batch checks; sets a missing UNIQ_KEY property
        on each message. The usual case (plain dicts of str, no UNIQ_KEY yet, distinct dicts) runs column-wise
        in C-level ``map``s; anything else goes message by message. Same bytes either way."""
        n = len(msgs)
        props_list = list(map(_properties_of, msgs))
        bodies = list(map(_body_of, msgs))
        try:
            lens = list(map(len, bodies))
            suspect = (topic not in self._valid_topics or list(map(_topic_of, msgs)).count(topic) != n
                       or not min(lens) or max(lens) > self.max_message_size_bytes
                       or topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
                       or any(map(contains, props_list, repeat(PROPERTY_DELAY_TIME_LEVEL))))
        except TypeError:  # a body without len(), properties that are not a container, ...
            suspect = True
        if suspect:
            self._check_batch(msgs, topic)  # raises the message-by-message error (or finds none)
        uniq_key = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
        first = props_list[0]
        if (1 < n <= _BULK_UNIQ_MAX and type(first) is dict and uniq_key not in first
                and props_list.count(first) == n  # all equal to the first (dict ==: not the order) ...
                and (len(first) < 2 or list(map(tuple, props_list)).count(tuple(first)) == n)  # ... same order
                and all(map(str.__instancecheck__, first)) and all(map(str.__instancecheck__, first.values()))
                and len(set(map(id, props_list))) == n):
            return self._encode_batch_shared(msgs, props_list, bodies, lens, first)
        if (all(map(isinstance, props_list, repeat(dict))) and not any(map(contains, props_list, repeat(uniq_key)))
                and len(set(map(id, props_list))) == n):
            uniqs = new_uniq_keys(n, self.config.client_ip)
            any(map(setitem, props_list, repeat(uniq_key), uniqs))  # setitem returns None: consumes all
        else:
            uniqs = [self._ensure_uniq_key(m) for m in msgs]
        try:  # all dicts of str keys and values (the usual case): joined in C
            strings = list(map(_join_props, map(map, repeat(_join_item), map(dict.items, props_list))))
        except TypeError:  # a None (skipped) or non-str value, or not a dict
            strings = list(map(properties_to_string, props_list))
        body = message_codec.encode_batch_columns(map(_flag_of, msgs), bodies, list(map(str.encode, strings)))
        return body, ",".join(uniqs)

    def _encode_batch_shared(self, msgs: Sequence[Message], props_list: list[dict[str, str]], bodies: list[bytes],
                             lens: list[int], shared: dict[str, str]) -> tuple[bytes, str]:
        """``_encode_batch`` for 2..4096 messages with distinct properties dicts all equal to ``shared`` (str
        keys and values, same order, no UNIQ_KEY): every entry's properties are one text + its UNIQ_KEY."""
        n = len(msgs)
        key_prefix, counters = _uniq_key_block(n, self.config.client_ip)
        slices = _hex4_slices(n)
        uniqs = list(map(key_prefix.__add__, map(counters.__getitem__, slices)))
        text = _join_props(map(_join_item, shared.items()))  # before the keys go in (``shared`` is msgs[0]'s)
        any(map(setitem, props_list, repeat(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), uniqs))  # consumes all
        head = f"{text}{_PROPERTY_SEPARATOR if text else ''}{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}" \
               f"{_NAME_VALUE_SEPARATOR}{key_prefix}".encode()
        body = message_codec.encode_batch_shared_properties(
            list(map(_flag_of, msgs)), bodies, lens, head, counters.encode("ascii"), slices)
        return body, ",".join(uniqs)

    async def _send_with_retries(
        self,
        topic: str,
        build: Callable[[MessageQueue, bool], Any] | None,
        uniq: str,
        queue: MessageQueue | None,
        selector: Callable[[list[MessageQueue]], MessageQueue] | None,
        timeout_ms: int | None,
        msg: Message | None = None,
    ) -> SendResult:
        """Send the request ``build(mq, via_default)`` makes (``build`` None: ``self._build(msg, mq, via_default)``)
        with retries on other broker groups (none for a fixed ``queue`` or a ``selector``)."""
        inst = self._instance or self.instance  # (the property raises "not started")
        total_ms = timeout_ms or self.send_timeout_ms
        monotonic = time.monotonic
        deadline = monotonic() + total_ms / 1000
        fixed: MessageQueue | None = queue
        mqs = self._queues_now(topic)
        if mqs is not None:
            via_default = False
        else:
            mqs, via_default = await self.publish_queues(topic)
        if fixed is None and selector is not None:
            fixed = selector(list(mqs))  # a copy: the list is cached
        retries = self.retry_times_when_send_failed
        attempts = 1 if fixed is not None or retries <= 0 else 1 + retries  # (1 + max(0, retries))
        last_broker: str | None = None
        last_exc: Exception | None = None
        fault = self.fault
        for attempt in range(attempts):
            if fixed is not None:
                mq = fixed
            elif last_broker is None and not fault.enabled:
                # what _select() answers without fault tolerance and without a broker to avoid: the next
                # round-robin queue
                mq = mqs[self._rr.next_index() % len(mqs)]
            else:
                mq = self._select(mqs, last_broker)
            broker_name = last_broker = mq.broker_name
            addr = inst.master_addr(broker_name)
            if addr is None:
                inst.trigger_route_refresh()
                last_exc = ClientError(f"broker {broker_name} has no master in the route")
                fault.update(broker_name, 0, isolation=True)
                continue
            started = monotonic()
            remaining_ms = int((deadline - started) * 1000)
            if remaining_ms <= 0:
                raise RemotingTimeoutError(f"send to {topic} timed out after {total_ms} ms "
                                           f"({attempt} attempts)") from last_exc
            try:
                cmd = self._build(msg, mq, via_default) if build is None else build(mq, via_default)  # type: ignore[arg-type]
                conn = inst.ready_connection(addr)
                if conn is not None:  # connected: no coroutine and no connection bookkeeping in between
                    resp = await conn.request(inst._stamp(cmd), remaining_ms)
                else:
                    resp = await inst.invoke(addr, cmd, remaining_ms)
                result = _parse_send(resp, mq, uniq)
            except BrokerError as exc:
                fault.update(broker_name, (monotonic() - started) * 1000, isolation=True)
                if exc.code == SERVICE_NOT_AVAILABLE_CODE:
                    # a broker that stopped being the master (controller mode, or a demoted one): the route
                    # names the new master once the election is over
                    inst.trigger_route_refresh()
                if not exc.retriable or fixed is not None:
                    raise
                last_exc = exc
                log.debug("send to %s failed (%s); retrying", mq, exc)
                continue
            except RemotingError as exc:
                fault.update(broker_name, (monotonic() - started) * 1000, isolation=True)
                if isinstance(exc, RemotingTimeoutError):
                    # a master that does not answer (paused, overloaded, partitioned) may have been replaced:
                    # look at the route now instead of at the next periodic poll
                    inst.trigger_route_refresh()
                if fixed is not None:
                    raise
                last_exc = exc
                log.debug("send to %s failed (%s); retrying", mq, exc)
                continue
            if fault.enabled:
                fault.update(broker_name, (monotonic() - started) * 1000)
            return result
        assert last_exc is not None
        raise last_exc

    async def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None) -> None:
        """Fire and forget: no answer is awaited and no retry is made."""
        self._validate(msg)
        self._ensure_uniq_key(msg)
        cached = self._queues_now(msg.topic)
        if cached is not None:
            mqs, via_default = cached, False
        else:
            mqs, via_default = await self.publish_queues(msg.topic)
        mq = queue or self._select(mqs, None)
        addr = self.instance.master_addr(mq.broker_name)
        if addr is None:
            raise ClientError(f"broker {mq.broker_name} has no master in the route")
        await self.instance.invoke_oneway(addr, self._build(msg, mq, via_default, oneway=True))

    # ---- request-reply (RocketMQ 4.6+; see request_reply.py) ------------------------------------------------
    async def request(self, msg: Message, timeout_ms: int | None = None) -> MessageExt:
        """Send ``msg`` as a request and wait for its reply (what a responder sends with ``reply``).
        ``RequestTimeoutError`` when no reply arrives within ``timeout_ms`` (default ``send_timeout_ms``),
        which covers the send too."""
        inst = self.instance
        total_ms = timeout_ms or self.send_timeout_ms
        deadline = time.monotonic() + total_ms / 1000
        self._validate(msg)
        correlation_id = request_reply.mark_request(msg, inst.client_id, total_ms)
        await self._prepare_request(msg.topic)
        waiter = inst.replies.expect(correlation_id)
        try:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise RemotingTimeoutError(f"request to {msg.topic}: no time left to send it")
            await self.send(msg, timeout_ms=remaining_ms)
            remaining_s = max(deadline - time.monotonic(), 0.0)
            try:
                return await aio.wait_for(waiter, remaining_s)
            except TimeoutError:
                raise RequestTimeoutError(
                    f"no reply to the request sent to {msg.topic} (CORRELATION_ID {correlation_id}) within "
                    f"{total_ms} ms") from None
        finally:
            inst.replies.discard(correlation_id)
            if not waiter.done():
                waiter.cancel()

    async def _prepare_request(self, topic: str) -> None:
        """Make sure a reply can find us: know the routes of ``topic`` and of the reply topics of its
        clusters, and heartbeat (as this producer group) every master of them not heartbeated yet."""
        inst = self.instance
        _, via_default = await self.publish_queues(topic)
        route = inst.routes.get(DEFAULT_TOPIC if via_default else topic)
        for cluster in sorted({b.cluster for b in (route.broker_datas if route else []) if b.cluster}):
            reply = reply_topic(cluster)
            if reply not in inst.routes:
                try:
                    await inst.update_route(reply)
                except TopicNotExistError:
                    log.debug("no route for %s: replies come only through the request topic's brokers", reply)
        addrs = set(inst.heartbeat_addrs(masters_only=True))
        if not addrs <= self._request_heartbeat_addrs:
            await inst.send_heartbeats()
            self._request_heartbeat_addrs = addrs

    async def reply(self, request: Message | MessageExt, body: bytes | str, *,
                    timeout_ms: int | None = None) -> SendResult:
        """Answer a received request message: SEND_REPLY_MESSAGE_V2 to ``<cluster>_REPLY_TOPIC``; the broker
        pushes it to the requester. Tried once: a ``BrokerError`` (code 1) says why the push failed (the
        requester is gone, timed out, or not connected to that broker)."""
        msg = request_reply.create_reply_message(request, body)
        self._validate(msg)
        uniq = self._ensure_uniq_key(msg)
        mqs, via_default = await self.publish_queues(msg.topic)
        mq = self._select(mqs, None)

        def build(mq: MessageQueue, via_default: bool) -> Any:
            cmd = self._build_general(msg, mq, via_default)
            cmd.code = RequestCode.SEND_REPLY_MESSAGE_V2
            return cmd

        return await self._send_with_retries(msg.topic, build, uniq, mq, None, timeout_ms)

    async def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        mqs, _ = await self.publish_queues(topic)
        return list(mqs)

    async def send_many(self, msgs: Sequence[Message]) -> list[SendResult]:
        """Send concurrently (pipelined on the shared connections); results in input order."""
        return list(await asyncio.gather(*(self.send(m) for m in msgs)))
