"""Per-process client runtime: one asyncio loop thread, cached pull consumers and producers.

Spark reuses Python workers across tasks and micro-batches, so a module-level cache (like Kafka's
consumer pool) keeps broker connections and routes warm. Everything here runs in the *current*
Python process: the driver-side planner, the streaming source runner, or an executor worker.

| name                    | role                                                                   |
|-------------------------|------------------------------------------------------------------------|
| ``run(coro)``           | run a coroutine on the process's loop thread and wait for its result  |
| (first use)             | ``allocator.tune()``: heap thresholds that reuse freed batch buffers  |
| ``pull_consumer(opts)`` | started ``PullConsumer`` cached by (nameServer, group, readFromSlave)  |
| ``producer(opts)``      | started ``Producer`` cached by (nameServer, group, sendTimeoutMs)      |
| ``ClusterMetadata``     | the driver's ``planning.Metadata``: topics, queues, min/max/search     |

The driver's metadata look-ups and the requests they send (all of a look-up's requests are concurrent, so each
look-up is one round trip):

| look-up                         | requests                                                                 |
|---------------------------------|--------------------------------------------------------------------------|
| ``queues_of(topics)``           | GET_ROUTEINFO_BY_TOPIC per topic, to the name server                    |
| ``offset_bounds`` / ``min_offsets`` / ``max_offsets`` | GET_TOPIC_STATS_INFO per (topic, broker group): every queue's min and max offset; per queue GET_MIN_OFFSET + GET_MAX_OFFSET for queues the answer lacks, or when the broker refuses the code |
| ``search_offsets(queues, ms)``  | SEARCH_OFFSET_BY_TIMESTAMP per queue                                     |
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ferrymq.client import api
from ferrymq.client.consumer.pull import PullConsumer
from ferrymq.client.jsonmq import mq_keyed_map
from ferrymq.common import aio
from ferrymq.common.route import MessageQueue
from ferrymq.errors import BrokerError, ClientError, FerryError, ProtocolError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.spark import allocator
from ferrymq.spark.options import ExecutorOptions, SinkOptions
from ferrymq.spark.planning import OffsetMap

if TYPE_CHECKING:  # the producer is the sink's: a source's processes do not import it
    from ferrymq.client.producer import Producer

log = logging.getLogger("ferrymq.spark")

T = TypeVar("T")

#: Extra seconds a blocking ``run`` waits beyond the request timeouts inside the coroutine.
RUN_GRACE_S = 30.0
#: Concurrent metadata requests (min/max/search offset) from the driver.
METADATA_CONCURRENCY = 64

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_consumers: dict[tuple[Any, ...], PullConsumer] = {}
_producers: dict[tuple[Any, ...], Producer] = {}


def loop() -> asyncio.AbstractEventLoop:
    """The process's background event loop (re-created after a fork)."""
    global _loop, _loop_pid
    with _lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
            if _loop_pid != os.getpid():
                _consumers.clear()
                _producers.clear()
            allocator.tune()
            new_loop = asyncio.new_event_loop()
            thread = threading.Thread(target=new_loop.run_forever, name="ferrymq-spark-loop", daemon=True)
            thread.start()
            _loop, _loop_pid = new_loop, os.getpid()
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    return asyncio.run_coroutine_threadsafe(coro, loop())


def run(coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
    """Run ``coro`` on the loop thread; block until done (cancelled on timeout)."""
    future = submit(coro)
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"ferrymq call did not finish within {timeout_s} s") from None


async def _started_consumer(opts: ExecutorOptions) -> PullConsumer:
    key = opts.client_key
    consumer = _consumers.get(key)
    if consumer is None:
        consumer = PullConsumer(
            opts.name_server,
            opts.group,
            read_from_slave=opts.read_from_slave,
            pull_timeout_ms=opts.pull_timeout_ms,
            **opts.security.client_kwargs(),
        )
        await consumer.start()
        _consumers[key] = consumer
    return consumer


def pull_consumer(opts: ExecutorOptions) -> PullConsumer:
    return run(_started_consumer(opts), opts.pull_timeout_ms / 1000 + RUN_GRACE_S)


async def started_producer(opts: SinkOptions) -> Producer:
    key = opts.producer_key
    producer = _producers.get(key)
    if producer is None:
        from ferrymq.client.producer import Producer

        producer = Producer(opts.name_server, opts.group, send_timeout_ms=opts.send_timeout_ms,
                            **opts.security.client_kwargs())
        await producer.start()
        _producers[key] = producer
    return producer


async def _close_all() -> None:
    clients: list[PullConsumer | Producer] = [*_consumers.values(), *_producers.values()]
    _consumers.clear()
    _producers.clear()
    for client in clients:
        try:
            await aio.wait_for(client.close(), 5)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def shutdown() -> None:
    """Close cached clients and stop the loop thread (also registered with atexit)."""
    global _loop
    if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
        return
    try:
        asyncio.run_coroutine_threadsafe(_close_all(), _loop).result(10)
    except Exception:  # noqa: BLE001
        pass
    _loop.call_soon_threadsafe(_loop.stop)
    _loop = None


atexit.register(shutdown)


async def _gather_limited(coros: Sequence[Awaitable[T]], limit: int = METADATA_CONCURRENCY) -> list[T]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Awaitable[T]) -> T:
        async with sem:
            return await c

    return list(await asyncio.gather(*(one(c) for c in coros)))


def _is_missing_topic(exc: BaseException) -> bool:
    if isinstance(exc, BrokerError) and exc.code == ResponseCode.TOPIC_NOT_EXIST:
        return True
    return isinstance(exc, ClientError) and ("no readable queue" in str(exc) or "not exist" in str(exc))


class ClusterMetadata:
    """``planning.Metadata`` backed by a cached PullConsumer of this process."""

    def __init__(self, opts: ExecutorOptions) -> None:
        self.opts = opts
        self.timeout_s = opts.pull_timeout_ms / 1000 + RUN_GRACE_S

    def _run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run a look-up, retried ``fetchOffset.numRetries`` times ``fetchOffset.retryIntervalMs`` apart when
        it fails on the network or the broker (a restart, a master failover while routes catch up)."""
        attempts = self.opts.fetch_offset_num_retries + 1
        for attempt in range(1, attempts):
            try:
                return run(make(), self.timeout_s)
            except (FerryError, OSError, TimeoutError) as exc:
                log.warning("rocketmq source: metadata look-up failed (attempt %d of %d): %s; retrying in %d ms",
                            attempt, attempts, exc, self.opts.fetch_offset_retry_interval_ms)
                time.sleep(self.opts.fetch_offset_retry_interval_ms / 1000)
        return run(make(), self.timeout_s)  # the last attempt: its failure is the caller's

    async def _consumer(self) -> PullConsumer:
        return await _started_consumer(self.opts)

    def topics(self) -> list[str]:
        async def go() -> list[str]:
            consumer = await self._consumer()
            cmd = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {})
            resp = await consumer.instance.invoke_namesrv(cmd, self.opts.pull_timeout_ms)
            if resp.code != ResponseCode.SUCCESS:
                raise FerryError(f"name server refused the topic list: code {resp.code} {resp.remark or ''}")
            body = jsonx.loads(resp.body) if resp.body else {}
            return sorted(str(t) for t in body.get("topicList") or [])

        return self._run(go)

    def queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues of ``topic``; [] when the topic does not exist (yet)."""
        return self.queues_of([topic])[topic]

    def queues_of(self, topics: Sequence[str]) -> dict[str, list[MessageQueue]]:
        """Readable queues of each topic (routes fetched concurrently); [] for a topic that does not exist."""

        async def one(consumer: PullConsumer, topic: str) -> list[MessageQueue]:
            try:
                return sorted(await consumer.fetch_subscribe_message_queues(topic))
            except FerryError as exc:
                if _is_missing_topic(exc):
                    return []
                raise

        async def go() -> dict[str, list[MessageQueue]]:
            consumer = await self._consumer()
            found = await _gather_limited([one(consumer, t) for t in topics])
            return dict(zip(topics, found, strict=True))

        return self._run(go)

    def offset_bounds(self, queues: Sequence[MessageQueue]) -> tuple[OffsetMap, OffsetMap]:
        """(min offsets, max offsets) of ``queues``: one GET_TOPIC_STATS_INFO per (topic, broker group)."""

        async def go() -> tuple[OffsetMap, OffsetMap]:
            consumer = await self._consumer()
            groups: dict[tuple[str, str], list[MessageQueue]] = {}
            for mq in queues:
                groups.setdefault((mq.topic, mq.broker_name), []).append(mq)
            mins: OffsetMap = {}
            maxs: OffsetMap = {}
            for lo, hi in await _gather_limited([self._group_bounds(consumer, g) for g in groups.values()]):
                mins.update(lo)
                maxs.update(hi)
            return mins, maxs

        return self._run(go)

    async def _group_bounds(self, consumer: PullConsumer, queues: list[MessageQueue]) -> tuple[OffsetMap, OffsetMap]:
        """Bounds of queues of one topic on one broker group, from its topic stats; the queues the answer
        lacks (more read than write queues) or all of them when the broker refuses it, queue by queue."""
        topic, broker_name = queues[0].topic, queues[0].broker_name
        if broker_name not in consumer.instance.broker_addrs:  # not routed yet (planning from a checkpoint)
            await consumer.instance.update_route(topic)
        addr = await consumer.core.admin_addr(broker_name)
        cmd = RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
        stats: dict[MessageQueue, Any] = {}
        try:
            resp = api.check(await consumer.instance.invoke(addr, cmd, self.opts.pull_timeout_ms))
            stats = {mq: value for mq, value in mq_keyed_map(resp.body or b"{}", "offsetTable")
                     if isinstance(value, dict)}  # fmt: skip
        except (BrokerError, ProtocolError) as exc:  # e.g. a broker that does not serve the code
            log.info("rocketmq source: topic stats of %s from %s unavailable (%s); asking queue by queue",
                     topic, addr, exc)  # fmt: skip
        mins: OffsetMap = {}
        maxs: OffsetMap = {}
        rest: list[MessageQueue] = []
        for mq in queues:
            value = stats.get(mq)
            if value is not None and "minOffset" in value and "maxOffset" in value:
                mins[mq], maxs[mq] = int(value["minOffset"]), int(value["maxOffset"])
            else:
                rest.append(mq)
        if rest:
            found = await _gather_limited([*(consumer.min_offset(mq) for mq in rest),
                                           *(consumer.max_offset(mq) for mq in rest)])  # fmt: skip
            mins.update(zip(rest, found[: len(rest)], strict=True))
            maxs.update(zip(rest, found[len(rest):], strict=True))
        return mins, maxs

    def min_offsets(self, queues: Sequence[MessageQueue]) -> OffsetMap:
        return self.offset_bounds(queues)[0]

    def max_offsets(self, queues: Sequence[MessageQueue]) -> OffsetMap:
        return self.offset_bounds(queues)[1]

    def search_offsets(self, queues: Sequence[MessageQueue], timestamp_ms: int) -> OffsetMap:
        async def go() -> OffsetMap:
            consumer = await self._consumer()
            values = await _gather_limited([consumer.search_offset(mq, timestamp_ms) for mq in queues])
            return dict(zip(queues, values, strict=True))

        return self._run(go)
