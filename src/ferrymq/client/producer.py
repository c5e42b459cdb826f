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
import itertools
import logging
import os
import random
import socket
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ferrymq.client import api, routes
from ferrymq.client.config import (
    COMPRESS_LEVEL,
    COMPRESS_MSG_BODY_OVER_BYTES,
    DEFAULT_TOPIC_QUEUE_NUMS,
    MAX_MESSAGE_SIZE_BYTES,
    ClientConfig,
    parse_name_servers,
)
from ferrymq.client.fault import LatencyFaultTolerance
from ferrymq.client.instance import ClientInstance
from ferrymq.client.selectors import RoundRobin
from ferrymq.client.values import SendResult
from ferrymq.common import message_codec
from ferrymq.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SYSFLAG_COMPRESSED,
    Message,
    properties_to_string,
)
from ferrymq.common.route import MessageQueue
from ferrymq.common.topic import (
    DEFAULT_TOPIC,
    NOT_ALLOWED_SEND_TOPICS,
    RETRY_GROUP_TOPIC_PREFIX,
    validate_topic,
)
from ferrymq.errors import BrokerError, ClientError, RemotingError, RemotingTimeoutError, TopicNotExistError

log = logging.getLogger(__name__)

Selector = Callable[[list[MessageQueue], Message, Any], MessageQueue]

_UNIQ_COUNTER = itertools.count(random.randrange(1 << 16))
_UNIQ_PREFIX: bytes | None = None


def new_uniq_key(client_ip: str = "127.0.0.1") -> str:
    """A 32-hex-char client message id: IPv4(4) pid(2) random(4) ms-since-month-start(4) counter(2)."""
    global _UNIQ_PREFIX
    if _UNIQ_PREFIX is None:
        try:
            ip = socket.inet_aton(client_ip)
        except OSError:
            ip = b"\x7f\x00\x00\x01"
        _UNIQ_PREFIX = ip + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)
    now = datetime.now()
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    ms = int((now - month_start).total_seconds() * 1000) & 0xFFFFFFFF
    return (_UNIQ_PREFIX + struct.pack(">IH", ms, next(_UNIQ_COUNTER) & 0xFFFF)).hex().upper()


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
    ) -> None:
        config = ClientConfig(parse_name_servers(name_server),
                              poll_name_server_interval_ms=poll_name_server_interval_ms,
                              heartbeat_broker_interval_ms=heartbeat_broker_interval_ms)
        if instance_name:
            config.instance_name = instance_name
        self.config = config
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
        self._instance = ClientInstance(self.config)
        self._instance.producer_groups.add(self.group)
        await self._instance.start()

    async def close(self) -> None:
        if self._instance is not None:
            await self._instance.close()
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
        if since is None or time.monotonic() - since > self.config.poll_name_server_interval_ms / 1000:
            try:
                route = await inst.get_route(topic)
                self._fallback_since.pop(topic, None)
                mqs = routes.publish_queues(topic, route)
                if mqs:
                    return mqs, False
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
            raise ClientError(f"no route info of topic {topic}")
        return mqs, True

    def _select(self, mqs: list[MessageQueue], last_broker: str | None) -> MessageQueue:
        n = len(mqs)
        start = self._rr.next_index()
        candidates = [mqs[(start + i) % n] for i in range(n)]
        if self.fault.enabled:
            for mq in candidates:
                if self.fault.is_available(mq.broker_name) and mq.broker_name != last_broker:
                    return mq
            for mq in candidates:
                if self.fault.is_available(mq.broker_name):
                    return mq
        for mq in candidates:
            if mq.broker_name != last_broker:
                return mq
        return candidates[0]

    # ---- message preparation ---------------------------------------------------------------------------
    def _validate(self, msg: Message) -> None:
        reason = validate_topic(msg.topic)
        if reason:
            raise ClientError(reason)
        if msg.topic in NOT_ALLOWED_SEND_TOPICS:
            raise ClientError(f"sending to topic {msg.topic} is forbidden")
        if not msg.body:
            raise ClientError("message body is empty")
        if len(msg.body) > self.max_message_size_bytes:
            raise ClientError(f"message body is {len(msg.body)} bytes, above the {self.max_message_size_bytes} limit")

    def _ensure_uniq_key(self, msg: Message) -> str:
        uniq = msg.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if not uniq:
            uniq = new_uniq_key(self.config.client_ip)
            msg.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
        return uniq

    def _build(self, msg: Message, mq: MessageQueue, via_default: bool, *, oneway: bool = False) -> Any:
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
        return api.build_send(
            producer_group=self.group, topic=msg.topic, queue_id=mq.queue_id, sys_flag=sys_flag,
            born_timestamp_ms=int(time.time() * 1000), flag=msg.flag,
            properties=properties_to_string(msg.properties), body=body, reconsume_times=reconsume_times,
            max_reconsume_times=max_reconsume, broker_name=mq.broker_name,
            default_topic_queue_nums=self.default_topic_queue_nums, oneway=oneway,
        )

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
            msg.topic, lambda mq, via: self._build(msg, mq, via), uniq, queue=queue,
            selector=(lambda mqs: selector(mqs, msg, arg)) if selector else None, timeout_ms=timeout_ms)

    async def send_batch(self, msgs: Sequence[Message], *, queue: MessageQueue | None = None,
                         timeout_ms: int | None = None) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE (320); stored in one queue, consecutive."""
        if not msgs:
            raise ClientError("batch is empty")
        topic = msgs[0].topic
        for m in msgs:
            self._validate(m)
            if m.topic != topic:
                raise ClientError("all messages of a batch must have the same topic")
            if m.delay_level or PROPERTY_DELAY_TIME_LEVEL in m.properties:
                raise ClientError("delayed messages cannot be batched")
            if m.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                raise ClientError("retry-topic messages cannot be batched")
        uniqs = [self._ensure_uniq_key(m) for m in msgs]
        body = message_codec.encode_batch_body((m.flag, m.body, properties_to_string(m.properties)) for m in msgs)
        if len(body) > self.max_message_size_bytes:
            raise ClientError(f"batch body is {len(body)} bytes, above the {self.max_message_size_bytes} limit")

        def build(mq: MessageQueue, via_default: bool) -> Any:
            return api.build_send(
                producer_group=self.group, topic=topic, queue_id=mq.queue_id, sys_flag=0,
                born_timestamp_ms=int(time.time() * 1000), flag=0, properties="", body=body, batch=True,
                broker_name=mq.broker_name, default_topic_queue_nums=self.default_topic_queue_nums)

        return await self._send_with_retries(topic, build, ",".join(uniqs), queue=queue, selector=None,
                                             timeout_ms=timeout_ms)

    async def _send_with_retries(
        self,
        topic: str,
        build: Callable[[MessageQueue, bool], Any],
        uniq: str,
        *,
        queue: MessageQueue | None,
        selector: Callable[[list[MessageQueue]], MessageQueue] | None,
        timeout_ms: int | None,
    ) -> SendResult:
        inst = self.instance
        total_ms = timeout_ms or self.send_timeout_ms
        deadline = time.monotonic() + total_ms / 1000
        fixed: MessageQueue | None = queue
        mqs, via_default = await self.publish_queues(topic)
        if fixed is None and selector is not None:
            fixed = selector(mqs)
        attempts = 1 if fixed is not None else 1 + max(0, self.retry_times_when_send_failed)
        last_broker: str | None = None
        last_exc: Exception | None = None
        for attempt in range(attempts):
            mq = fixed or self._select(mqs, last_broker)
            last_broker = mq.broker_name
            addr = inst.master_addr(mq.broker_name)
            if addr is None:
                inst.trigger_route_refresh()
                last_exc = ClientError(f"broker {mq.broker_name} has no master in the route")
                self.fault.update(mq.broker_name, 0, isolation=True)
                continue
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise RemotingTimeoutError(f"send to {topic} timed out after {total_ms} ms "
                                           f"({attempt} attempts)") from last_exc
            started = time.monotonic()
            try:
                resp = await inst.invoke(addr, build(mq, via_default), remaining_ms)
                result = api.parse_send(resp, mq, uniq)
            except BrokerError as exc:
                self.fault.update(mq.broker_name, (time.monotonic() - started) * 1000, isolation=True)
                if not exc.retriable or fixed is not None:
                    raise
                last_exc = exc
                log.debug("send to %s failed (%s); retrying", mq, exc)
                continue
            except RemotingError as exc:
                self.fault.update(mq.broker_name, (time.monotonic() - started) * 1000, isolation=True)
                if fixed is not None:
                    raise
                last_exc = exc
                log.debug("send to %s failed (%s); retrying", mq, exc)
                continue
            self.fault.update(mq.broker_name, (time.monotonic() - started) * 1000)
            return result
        assert last_exc is not None
        raise last_exc

    async def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None) -> None:
        """Fire and forget: no answer is awaited and no retry is made."""
        self._validate(msg)
        self._ensure_uniq_key(msg)
        mqs, via_default = await self.publish_queues(msg.topic)
        mq = queue or self._select(mqs, None)
        addr = self.instance.master_addr(mq.broker_name)
        if addr is None:
            raise ClientError(f"broker {mq.broker_name} has no master in the route")
        await self.instance.invoke_oneway(addr, self._build(msg, mq, via_default, oneway=True))

    async def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        mqs, _ = await self.publish_queues(topic)
        return list(mqs)

    async def send_many(self, msgs: Sequence[Message]) -> list[SendResult]:
        """Send concurrently (pipelined on the shared connections); results in input order."""
        return list(await asyncio.gather(*(self.send(m) for m in msgs)))
