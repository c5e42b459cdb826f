"""Push consumer: rebalance, long-poll pulls per queue, concurrent or orderly listeners, retries, offsets.

Flow per assigned queue: a pull task long-polls (sysFlag commitOffset|suspend|subscription,
suspendTimeoutMillis ``broker_suspend_max_time_ms``, request timeout ``consumer_timeout_when_suspend_ms``),
fills the queue's ProcessQueue (paused while it holds ``pull_threshold_for_queue`` messages or
``pull_threshold_size_for_queue_mib`` MiB) and hands batches of ``consume_batch_size`` to the listener.

* Concurrent: batches run concurrently (at most ``consume_concurrency``). A failed batch (RECONSUME_LATER
  or an exception) goes back to the broker (CONSUMER_SEND_MSG_BACK, delayLevel 0), which schedules it on
  ``%RETRY%<group>`` and moves it to ``%DLQ%<group>`` after ``max_reconsume_times``. If the send-back fails
  (transport error or an error code) the message itself is sent to ``%RETRY%<group>`` through the
  instance's internal producer (RECONSUME_TIME = reconsumeTimes + 1, DELAY = 3 + reconsumeTimes, RETRY_TOPIC,
  ORIGIN_MESSAGE_ID, MAX_RECONSUME_TIMES); only if that fails too is the batch retried locally after
  ``retry_local_delay_ms``.
* Orderly: in clustering mode the queue is locked on its master (LOCK_BATCH_MQ) before it is pulled and
  consumed; locks are renewed every ``lock_renew_interval_ms``. One batch at a time per queue, in offset
  order; a failed batch is retried after ``suspend_current_queue_time_ms``, and after
  ``max_reconsume_times`` failures it goes to the DLQ (send-back with delayLevel -1).
* The committed offset of a queue is the lowest offset still being processed; offsets are pushed every
  ``persist_offset_interval_ms`` and on close (to the master, or its lowest slave when it has none).
* Clustering subscribes to ``%RETRY%<group>`` and restores the real topic of retried messages from their
  RETRY_TOPIC property; broadcasting keeps offsets in a local JSON file under ``offset_store_dir``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ferrymq.client import api, routes
from ferrymq.client.config import client_config
from ferrymq.client.consumer.core import ConsumerBase, ConsumerCore
from ferrymq.client.consumer.offset_store import LocalFileOffsetStore, OffsetStore, RemoteOffsetStore
from ferrymq.client.consumer.process_queue import ProcessQueue
from ferrymq.client.consumer.rebalance import allocate_averagely
from ferrymq.client.consumer.status import ConsumeStatusStats
from ferrymq.client.instance import Backoff, ClientInstance, cancel_and_wait
from ferrymq.client.selectors import MessageSelector, as_message_selector
from ferrymq.client.values import ConsumeFromWhere, ConsumeStatus, MessageModel, PullStatus
from ferrymq.common.aio import wait_event
from ferrymq.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    Message,
    MessageExt,
)
from ferrymq.common.route import MessageQueue
from ferrymq.common.tls import TlsClientSettings
from ferrymq.common.topic import RETRY_GROUP_TOPIC_PREFIX, retry_topic
from ferrymq.errors import ClientError, TopicNotExistError
from ferrymq.remoting.codes import RequestCode

log = logging.getLogger(__name__)

Listener = Callable[[list[MessageExt]], ConsumeStatus | None | Awaitable[ConsumeStatus | None]]
AllocateStrategy = Callable[[str, str, list[MessageQueue], list[str]], list[MessageQueue]]

#: A broker lock lasts 60 s; we treat ours as expired after this (rocketmq.client.rebalance.lockMaxLiveTime).
LOCK_MAX_LIVE_MS = 30_000
PULL_BACKOFF_BASE_MS = 100
PULL_BACKOFF_MAX_MS = 3_000
FLOW_CONTROL_WAIT_MS = 50
#: A message re-sent by the client after a failed send-back waits delay level 3 + its reconsume count.
CLIENT_RETRY_DELAY_LEVEL_BASE = 3


class PushConsumer(ConsumerBase):
    _kind = "push"

    def __init__(
        self,
        name_server: str | list[str],
        group: str,
        *,
        message_model: str = "CLUSTERING",
        consume_from_where: str = "CONSUME_FROM_LAST_OFFSET",
        consume_timestamp_ms: int | None = None,
        max_reconsume_times: int = 16,
        pull_batch_size: int = 32,
        consume_batch_size: int = 1,
        orderly: bool = False,
        pull_threshold_for_queue: int = 1000,
        pull_threshold_size_for_queue_mib: int = 100,
        offset_store_dir: str | None = None,
        rebalance_interval_ms: int = 20_000,
        persist_offset_interval_ms: int = 5_000,
        consume_concurrency: int = 20,
        suspend_current_queue_time_ms: int = 1_000,
        retry_local_delay_ms: int = 5_000,
        lock_renew_interval_ms: int = 20_000,
        pull_interval_ms: int = 0,
        read_from_slave: str = "whenMasterDown",
        broker_suspend_max_time_ms: int = api.BROKER_SUSPEND_MAX_TIME_MS,
        consumer_timeout_when_suspend_ms: int = api.CONSUMER_TIMEOUT_WHEN_SUSPEND_MS,
        poll_name_server_interval_ms: int = 30_000,
        heartbeat_broker_interval_ms: int = 30_000,
        allocate_strategy: AllocateStrategy = allocate_averagely,
        instance_name: str | None = None,
        access_key: str = "",
        secret_key: str = "",
        tls: TlsClientSettings | None = None,
        listener: Listener | None = None,
    ) -> None:
        self.model = MessageModel[message_model]
        self.consume_from_where = ConsumeFromWhere[consume_from_where]
        if self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP and consume_timestamp_ms is None:
            consume_timestamp_ms = int(time.time() * 1000) - 30 * 60 * 1000
        self.consume_timestamp_ms = consume_timestamp_ms
        self.config = client_config(name_server, poll_name_server_interval_ms=poll_name_server_interval_ms,
                                    heartbeat_broker_interval_ms=heartbeat_broker_interval_ms,
                                    instance_name=instance_name, access_key=access_key,
                                    secret_key=secret_key, tls=tls)
        self.group = group
        self.max_reconsume_times = max_reconsume_times
        self.pull_batch_size = pull_batch_size
        self.consume_batch_size = max(1, consume_batch_size)
        self.orderly = orderly
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size_bytes = pull_threshold_size_for_queue_mib * 1024 * 1024
        self.offset_store_dir = offset_store_dir or os.path.join(os.path.expanduser("~"), ".ferrymq_offsets")
        self.rebalance_interval_ms = rebalance_interval_ms
        self.persist_offset_interval_ms = persist_offset_interval_ms
        self.consume_concurrency = consume_concurrency
        self.suspend_current_queue_time_ms = suspend_current_queue_time_ms
        self.retry_local_delay_ms = retry_local_delay_ms
        self.lock_renew_interval_ms = lock_renew_interval_ms
        self.pull_interval_ms = pull_interval_ms
        self.read_from_slave = read_from_slave
        self.broker_suspend_max_time_ms = broker_suspend_max_time_ms
        self.consumer_timeout_when_suspend_ms = consumer_timeout_when_suspend_ms
        self.allocate_strategy = allocate_strategy
        self.listener: Listener | None = listener
        self.subscriptions: dict[str, str] = {}
        #: topic -> expression type of its subscription (absent: TAG)
        self.expression_types: dict[str, str] = {}
        self.sub_version = int(time.time() * 1000)
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self._pullers: dict[MessageQueue, asyncio.Task[None]] = {}
        self._consume_tasks: set[asyncio.Task[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_event = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._core: ConsumerCore | None = None
        self._offsets: OffsetStore | None = None
        self._consume_sem: asyncio.Semaphore | None = None
        self._closing = False
        self.rebalance_count = 0
        #: per-topic pull/consume statistics: the statusTable of GET_CONSUMER_RUNNING_INFO
        self.consume_status = ConsumeStatusStats()

    # ---- configuration -----------------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        """``expression``: a tag expression (``"TagA || TagB"``, ``"*"``) or ``MessageSelector.by_sql(...)``;
        a SQL92 selector is checked by a broker at ``start()`` (CHECK_CLIENT_CONFIG)."""
        selector = as_message_selector(expression)
        self.subscriptions[topic] = selector.expression
        if selector.is_tag:
            self.expression_types.pop(topic, None)
        else:
            self.expression_types[topic] = selector.expression_type

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        self.expression_types.pop(topic, None)

    def _subscription_set(self) -> list[dict[str, Any]]:
        return [api.subscription_data(t, e, self.sub_version, self.expression_types.get(t, "TAG"))
                for t, e in sorted(self.subscriptions.items())]

    async def _check_selectors_in_broker(self) -> None:
        """RocketMQ's ``checkClientInBroker``: each non-TAG subscription is compiled by a master of its topic;
        a refusal (SQL92 off, a bad selector) fails ``start()`` with the broker's answer."""
        inst = self.instance
        for topic, expression_type in sorted(self.expression_types.items()):
            route = inst.routes.get(topic)
            addrs = [a for a in (inst.master_addr(b.broker_name) for b in (route.broker_datas if route else []))
                     if a is not None]
            if not addrs:
                continue
            data = api.subscription_data(topic, self.subscriptions[topic], self.sub_version, expression_type)
            api.check(await inst.invoke(addrs[0], api.build_check_client_config(inst.client_id, self.group, data)))

    def register_message_listener(self, listener: Listener) -> Listener:
        """``listener(msgs) -> ConsumeStatus`` (sync or async). None counts as success, an exception as
        RECONSUME_LATER. Usable as a decorator."""
        self.listener = listener
        return listener

    @property
    def clustering(self) -> bool:
        return self.model is MessageModel.CLUSTERING

    @property
    def offset_store(self) -> OffsetStore:
        if self._offsets is None:
            raise ClientError("push consumer is not started")
        return self._offsets

    # ---- lifecycle -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._core is not None:
            return
        if self.listener is None:
            raise ClientError("register a message listener before start()")
        if not self.subscriptions:
            raise ClientError("subscribe to at least one topic before start()")
        if self.clustering:
            self.subscriptions.setdefault(retry_topic(self.group), "*")
        inst = ClientInstance(self.config)
        self._core = ConsumerCore(inst, self.group, self.read_from_slave)
        if self.clustering:
            self._offsets = RemoteOffsetStore(self._core.fetch_committed_offset, self._core.commit_offset)
        else:
            self._offsets = LocalFileOffsetStore(self.offset_store_dir, self.group)
        self._consume_sem = asyncio.Semaphore(self.consume_concurrency)
        self._closing = False
        inst.consumers[self.group] = self
        await inst.start()
        for topic in self.subscriptions:
            try:
                await inst.update_route(topic)
            except TopicNotExistError:
                if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                    log.warning("topic %s is not in the name server yet", topic)
        try:
            await self._check_selectors_in_broker()
        except Exception:
            await inst.close()
            self._core = None
            raise
        await inst.send_heartbeats()
        self._tasks = [asyncio.create_task(self._rebalance_loop(), name=f"ferrymq-rebalance-{self.group}"),
                       asyncio.create_task(self._persist_loop(), name=f"ferrymq-persist-{self.group}")]
        if self.orderly and self.clustering:
            self._tasks.append(asyncio.create_task(self._lock_loop(), name=f"ferrymq-lock-{self.group}"))
        self.rebalance_now()

    async def close(self) -> None:
        if self._core is None or self._closing:
            return
        self._closing = True
        self._rebalance_event.set()
        # stop pulling, let listeners already running finish and commit (batches not yet started are
        # skipped: _closing), then drop the queues and push the offsets
        await cancel_and_wait([*self._tasks, *self._pullers.values()])
        for pq in self.process_queues.values():
            pq.wake()
        if self._consume_tasks:
            await asyncio.wait(list(self._consume_tasks), timeout=self.consumer_timeout_when_suspend_ms / 1000)
        for pq in self.process_queues.values():
            pq.drop()
        await self.offset_store.persist(list(self.process_queues))
        if self.orderly and self.clustering:
            await self._unlock(list(self.process_queues))
        self.process_queues.clear()
        self._pullers.clear()
        await self._core.instance.close()
        self._core = None

    # ---- ConsumerHooks --------------------------------------------------------------------------------------------
    def consumer_data(self) -> dict[str, Any]:
        return {
            "consumeFromWhere": self.consume_from_where.name,
            "consumeType": "CONSUME_PASSIVELY",
            "groupName": self.group,
            "messageModel": self.model.name,
            "subscriptionDataSet": self._subscription_set(),
            "unitMode": False,
        }

    def subscribed_topics(self) -> set[str]:
        return set(self.subscriptions)

    def rebalance_now(self) -> None:
        self._rebalance_event.set()

    def running_info(self) -> dict[str, Any]:
        queues = [(mq, self.process_queue_info(mq, pq)) for mq, pq in sorted(self.process_queues.items())]
        return {
            "properties": {
                "consumeType": "CONSUME_PASSIVELY", "messageModel": self.model.name, "consumeOrderly": str(self.orderly),
                "consumeFromWhere": self.consume_from_where.name, "pullBatchSize": str(self.pull_batch_size),
                "consumeMessageBatchMaxSize": str(self.consume_batch_size), "clientId": self.instance.client_id,
                "PROP_CLIENT_VERSION": "V4_9_7", "PROP_CONSUMER_START_TIMESTAMP": str(self.sub_version),
            },
            "subscriptionSet": self._subscription_set(),
            # keyed by MessageQueue: written in fastjson's object-keyed shape (jsonmq.dumps_mq_keys)
            "mqTable": {mq: info for mq, info in queues},
            "processQueues": [{**mq.to_json(), **info} for mq, info in queues],
            "statusTable": self.consume_status.status_table(),
            "jstack": "",
        }

    def offsets_of(self, topic: str) -> dict[MessageQueue, int]:
        """The offsets held for the queues of ``topic`` this consumer owns (GET_CONSUMER_STATUS_FROM_CLIENT)."""
        return {mq: self.offset_store.read_memory(mq) for mq in sorted(self.process_queues) if mq.topic == topic}

    def process_queue_info(self, mq: MessageQueue, pq: ProcessQueue) -> dict[str, Any]:
        """Java's ProcessQueueInfo of one queue (timestamps in epoch ms, 0 = never)."""
        offsets = list(pq.msgs)
        lock_epoch_ms = 0
        if pq.last_lock_ms:
            lock_epoch_ms = int(time.time() * 1000 - (time.monotonic() * 1000 - pq.last_lock_ms))
        return {
            "commitOffset": self.offset_store.read_memory(mq),
            "cachedMsgMinOffset": min(offsets) if offsets else 0,
            "cachedMsgMaxOffset": max(offsets) if offsets else 0,
            "cachedMsgCount": pq.count,
            "cachedMsgSizeInMiB": pq.msg_bytes // (1024 * 1024),
            "transactionMsgMinOffset": 0,
            "transactionMsgMaxOffset": 0,
            "transactionMsgCount": 0,
            "locked": pq.locked,
            "tryUnlockTimes": 0,
            "lastLockTimestamp": lock_epoch_ms,
            "droped": pq.dropped,
            "lastPullTimestamp": int(pq.last_pull_ms),
            "lastConsumeTimestamp": int(pq.last_consume_ms),
        }

    async def reset_offsets(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """Broker-requested reset: drop the queues, store the new offsets, rebalance to resume there."""
        for mq, offset in offsets.items():
            if mq.topic != topic:
                continue
            await self._remove_queue(mq, persist=False)
            self.offset_store.update(mq, offset)
            await self.offset_store.persist([mq])
            self.offset_store.remove(mq)
        self.rebalance_now()

    # ---- rebalance ---------------------------------------------------------------------------------------------------
    async def _rebalance_loop(self) -> None:
        while not self._closing:
            await wait_event(self._rebalance_event, self.rebalance_interval_ms / 1000)
            self._rebalance_event.clear()
            if self._closing:
                return
            try:
                await self.do_rebalance()
            except Exception:
                log.exception("rebalance of %s failed", self.group)

    async def do_rebalance(self) -> None:
        async with self._rebalance_lock:
            inst = self.instance
            for topic, _expr in list(self.subscriptions.items()):
                route = inst.routes.get(topic)
                if route is None:
                    try:
                        route = await inst.update_route(topic)
                    except Exception as exc:
                        log.debug("no route for %s yet: %s", topic, exc)
                        continue
                mqs = routes.subscribe_queues(topic, route)
                if self.clustering:
                    cids = await self._consumer_ids(route)
                    if cids is None:
                        continue
                    wanted = set(self.allocate_strategy(self.group, inst.client_id, mqs, cids))
                else:
                    wanted = set(mqs)
                await self._apply_allocation(topic, wanted)
            self.rebalance_count += 1

    async def _consumer_ids(self, route: Any) -> list[str] | None:
        for bd in route.broker_datas:
            addr = bd.lowest_addr()
            if addr is None:
                continue
            try:
                return api.parse_consumer_list(await self.instance.invoke(
                    addr, api.build_get_consumer_list(self.group)))
            except Exception as exc:
                log.debug("consumer list from %s failed: %s", addr, exc)
        return None

    async def _apply_allocation(self, topic: str, wanted: set[MessageQueue]) -> None:
        for mq in [m for m in self.process_queues if m.topic == topic and m not in wanted]:
            await self._remove_queue(mq)
        for mq in sorted(wanted - set(self.process_queues)):
            if self._closing:
                return
            pq = ProcessQueue(mq)
            if self.orderly and self.clustering and not await self._lock([mq]):
                continue
            if mq in self.process_queues:
                continue
            try:
                offset = await self._compute_pull_from(mq)
            except Exception as exc:
                log.warning("cannot compute the start offset of %s: %s", mq, exc)
                continue
            if self.orderly and self.clustering:
                pq.locked = True
                pq.last_lock_ms = time.monotonic() * 1000
            self.process_queues[mq] = pq
            self._pullers[mq] = asyncio.create_task(self._pull_loop(pq, offset), name=f"ferrymq-pull-{mq}")

    async def _remove_queue(self, mq: MessageQueue, *, persist: bool = True) -> None:
        pq = self.process_queues.pop(mq, None)
        if pq is None:
            return
        pq.drop()
        task = self._pullers.pop(mq, None)
        if task is not None:
            task.cancel()
        if persist:
            await self.offset_store.persist([mq])
        self.offset_store.remove(mq)
        if self.orderly and self.clustering:
            await self._unlock([mq])

    async def _compute_pull_from(self, mq: MessageQueue) -> int:
        last = await self.offset_store.read_store(mq)
        if last >= 0:
            return last
        where = self.consume_from_where
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return 0
        if mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return 0
        if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
            assert self.consume_timestamp_ms is not None
            return await self.core.query_offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq,
                                                timestamp=self.consume_timestamp_ms)
        return await self.core.query_offset(RequestCode.GET_MAX_OFFSET, mq)

    # ---- orderly locks --------------------------------------------------------------------------------------------
    async def _lock(self, mqs: list[MessageQueue]) -> bool:
        """Lock queues of one or more brokers on their masters; True if all were locked."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        ok_all = True
        now = time.monotonic() * 1000
        for broker, group_mqs in by_broker.items():
            addr = self.instance.master_addr(broker)
            locked: set[MessageQueue] = set()
            if addr is not None:
                try:
                    locked = api.parse_lock(await self.instance.invoke(addr, api.build_lock(
                        RequestCode.LOCK_BATCH_MQ, self.group, self.instance.client_id, group_mqs)))
                except Exception as exc:
                    log.debug("lock on %s failed: %s", addr, exc)
            for mq in group_mqs:
                pq = self.process_queues.get(mq)
                if pq is not None:
                    pq.locked = mq in locked
                    if pq.locked:
                        pq.last_lock_ms = now
                if mq not in locked:
                    ok_all = False
        return ok_all

    async def _unlock(self, mqs: list[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, group_mqs in by_broker.items():
            addr = self.instance.master_addr(broker)
            if addr is None:
                continue
            try:
                await self.instance.invoke(addr, api.build_lock(
                    RequestCode.UNLOCK_BATCH_MQ, self.group, self.instance.client_id, group_mqs), 1000)
            except Exception as exc:
                log.debug("unlock on %s failed: %s", addr, exc)

    async def _lock_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.lock_renew_interval_ms / 1000)
            if self.process_queues:
                await self._lock(list(self.process_queues))

    def _lock_valid(self, pq: ProcessQueue) -> bool:
        if not (self.orderly and self.clustering):
            return True
        return pq.locked and time.monotonic() * 1000 - pq.last_lock_ms < LOCK_MAX_LIVE_MS

    # ---- pulling -------------------------------------------------------------------------------------------------------
    async def _pull_loop(self, pq: ProcessQueue, offset: int) -> None:
        mq = pq.mq
        backoff = Backoff(PULL_BACKOFF_BASE_MS, PULL_BACKOFF_MAX_MS)
        next_offset = offset
        while not pq.dropped and not self._closing:
            if pq.over_limit(self.pull_threshold_for_queue, self.pull_threshold_size_bytes):
                await pq.wait_change(FLOW_CONTROL_WAIT_MS / 1000)
                continue
            if not self._lock_valid(pq):
                await self._lock([mq])
                if not self._lock_valid(pq):
                    await pq.wait_change(self.suspend_current_queue_time_ms / 1000)
                    continue
            commit = self.offset_store.read_memory(mq) if self.clustering else 0
            pull_started_s = time.monotonic()
            try:
                result = await self.core.pull(
                    mq, next_offset, self.pull_batch_size, sub_expression=self.subscriptions.get(mq.topic, "*"),
                    expression_type=self.expression_types.get(mq.topic, "TAG"), sub_version=self.sub_version, commit_offset=commit, block=True,
                    suspend_timeout_ms=self.broker_suspend_max_time_ms,
                    timeout_ms=self.consumer_timeout_when_suspend_ms)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay_ms = backoff.next_delay_ms()
                log.debug("pull %s at %d failed (%s); again in %.0f ms", mq, next_offset, exc, delay_ms)
                await asyncio.sleep(delay_ms / 1000)
                continue
            backoff.reset()
            if pq.dropped:
                return
            if result.status is PullStatus.FOUND and result.messages:
                msgs = result.messages
                self.consume_status.on_pull(mq.topic, (time.monotonic() - pull_started_s) * 1000, len(msgs))
                for m in msgs:
                    self._restore_topic(m)
                pq.put(msgs)
                self._dispatch(pq, msgs)
            elif pq.count == 0:
                # nothing to consume up to next_begin_offset (filtered or empty): move the commit point
                self.offset_store.update(mq, result.next_begin_offset, increase_only=True)
                pq.max_offset_seen = max(pq.max_offset_seen, result.next_begin_offset - 1)
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning("offset %d of %s is illegal; moving to %d", next_offset, mq, result.next_begin_offset)
                self.offset_store.update(mq, result.next_begin_offset)
                await self.offset_store.persist([mq])
            next_offset = result.next_begin_offset
            if self.pull_interval_ms:
                await asyncio.sleep(self.pull_interval_ms / 1000)

    def _restore_topic(self, msg: MessageExt) -> None:
        real = msg.properties.get(PROPERTY_RETRY_TOPIC)
        if real and msg.topic == retry_topic(self.group):
            msg.topic = real

    # ---- consuming ---------------------------------------------------------------------------------------------------
    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._consume_tasks.add(task)
        task.add_done_callback(self._consume_tasks.discard)

    def _dispatch(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if self.orderly:
            if not pq.consuming:
                pq.consuming = True
                self._spawn(self._consume_orderly(pq))
            return
        for i in range(0, len(msgs), self.consume_batch_size):
            self._spawn(self._consume_concurrently(pq, msgs[i:i + self.consume_batch_size]))

    async def _call_listener(self, msgs: list[MessageExt]) -> bool:
        assert self.listener is not None
        started_s = time.monotonic()
        ok = False
        try:
            if inspect.iscoroutinefunction(self.listener):
                status = await self.listener(msgs)
            else:
                status = await asyncio.to_thread(self.listener, msgs)
                if inspect.isawaitable(status):
                    status = await status
            ok = status is None or status is ConsumeStatus.CONSUME_SUCCESS
        except Exception:
            log.exception("message listener of %s raised; messages will be retried", self.group)
        if msgs:
            self.consume_status.on_consume(msgs[0].topic, (time.monotonic() - started_s) * 1000, len(msgs), ok)
        return ok

    async def _send_back(self, msg: MessageExt, mq: MessageQueue, delay_level: int) -> bool:
        """CONSUMER_SEND_MSG_BACK to the queue's master; if that fails, re-send the message to the retry
        topic through the internal producer. False when both failed (the caller retries locally)."""
        addr = self.instance.master_addr(mq.broker_name)
        try:
            if addr is None:
                raise ClientError(f"broker {mq.broker_name} has no master in the route")
            api.check(await self.instance.invoke(addr, api.build_send_back(
                group=self.group, phy_offset=msg.phy_offset, delay_level=delay_level, origin_msg_id=msg.msg_id,
                origin_topic=msg.topic, max_reconsume_times=self.max_reconsume_times)))
            return True
        except Exception as exc:
            log.warning("sending %s back to the broker failed (%s); re-sending it to %s", msg.msg_id, exc,
                        retry_topic(self.group))
        try:
            await self.instance.inner_producer().send(self.retry_message(msg, to_dlq=delay_level < 0))
            return True
        except Exception as exc:
            log.warning("re-sending %s to %s failed: %s", msg.msg_id, retry_topic(self.group), exc)
            return False

    def retry_message(self, msg: MessageExt, *, to_dlq: bool = False) -> Message:
        """The copy of ``msg`` sent to ``%RETRY%<group>`` when the broker's send-back failed: same body,
        flag and properties, one more reconsume; ``to_dlq`` (orderly, out of retries) sets no delay, the
        broker moves it to the DLQ as its reconsume count is past the maximum."""
        props = dict(msg.properties)
        props.pop(PROPERTY_TRANSACTION_PREPARED, None)
        if not props.get(PROPERTY_RETRY_TOPIC):
            props[PROPERTY_RETRY_TOPIC] = msg.topic
        if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
            props[PROPERTY_ORIGIN_MESSAGE_ID] = msg.msg_id
        props[PROPERTY_RECONSUME_TIME] = str(msg.reconsume_times + 1)
        props[PROPERTY_MAX_RECONSUME_TIMES] = str(self.max_reconsume_times)
        if to_dlq:
            props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        else:
            props[PROPERTY_DELAY_TIME_LEVEL] = str(CLIENT_RETRY_DELAY_LEVEL_BASE + msg.reconsume_times)
        return Message(topic=retry_topic(self.group), body=msg.body, flag=msg.flag, properties=props)

    def _commit(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        offset = pq.remove(msgs)
        if offset >= 0 and not pq.dropped:
            self.offset_store.update(pq.mq, offset, increase_only=True)

    async def _consume_concurrently(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        assert self._consume_sem is not None
        async with self._consume_sem:
            if pq.dropped or self._closing:
                return
            ok = await self._call_listener(msgs)
        if pq.dropped:
            return
        if not ok and self.clustering:
            failed = [m for m in msgs if not await self._send_back(m, pq.mq, 0)]
            if failed:
                self._commit(pq, [m for m in msgs if m not in failed])
                for m in failed:
                    m.reconsume_times += 1
                await asyncio.sleep(self.retry_local_delay_ms / 1000)
                if not pq.dropped and not self._closing:
                    self._spawn(self._consume_concurrently(pq, failed))
                return
        elif not ok:
            log.warning("broadcasting consumer %s dropped %d failed messages", self.group, len(msgs))
        self._commit(pq, msgs)

    async def _consume_orderly(self, pq: ProcessQueue) -> None:
        try:
            while not pq.dropped and not self._closing:
                if not self._lock_valid(pq):
                    await self._lock([pq.mq])
                    if not self._lock_valid(pq):
                        await pq.wait_change(self.suspend_current_queue_time_ms / 1000)
                        continue
                msgs = pq.take_in_order(self.consume_batch_size)
                if not msgs:
                    break
                if await self._call_listener(msgs):
                    self._commit(pq, msgs)
                    continue
                if any(m.reconsume_times >= self.max_reconsume_times for m in msgs):
                    if self.clustering and not all([await self._send_back(m, pq.mq, -1) for m in msgs]):
                        await asyncio.sleep(self.suspend_current_queue_time_ms / 1000)
                        continue
                    self._commit(pq, msgs)
                    continue
                for m in msgs:
                    m.reconsume_times += 1
                await asyncio.sleep(self.suspend_current_queue_time_ms / 1000)
        finally:
            pq.consuming = False

    # ---- offsets -------------------------------------------------------------------------------------------------------
    async def _persist_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.persist_offset_interval_ms / 1000)
            try:
                await self.offset_store.persist(list(self.process_queues))
            except Exception:
                log.exception("persisting offsets of %s failed", self.group)
