"""Batch and streaming sinks: every row becomes one message; every send's status is checked.

Input columns (validated on the driver from the DataFrame's schema; other columns are ignored):

| column     | type                         | required | becomes                                             |
|------------|------------------------------|----------|-----------------------------------------------------|
| value      | string or binary             | yes      | body (strings UTF-8 encoded); null fails the task   |
| topic      | string                       | unless the ``topic`` option is set (the option wins) |
| key        | string                       | no       | KEYS (space-separated keys are indexed separately)  |
| tags       | string                       | no       | TAGS                                                |
| properties | map<string,string>           | no       | user properties                                     |
| queueId    | int or bigint                | no       | target queue (else: by key, or round robin)         |
| brokerName | string                       | no       | with queueId: the queue's broker                    |

Queue of a row: its ``queueId`` (with ``brokerName``) when set; else, when it has a key, the queue at
``abs(Java String.hashCode(key)) % len(queues)`` of the topic's writable queues in (brokerName, queueId) order
(RocketMQ's SelectMessageQueueByHash with the key as argument: same key, same queue, so per-key order holds, as
Kafka's default partitioner); else round robin. Rows of one target queue go out together as
SEND_BATCH_MESSAGE requests of at most ``SINK_BATCH_MAX_MESSAGES`` messages and ``SINK_BATCH_MAX_BYTES`` of
bodies (rows with a delay level are sent one by one: the broker does not batch them).

Queues are written concurrently (``sendPipelineDepth`` requests in flight), each queue's requests one after the
other so rows keep their order within a queue. They run on the process's loop thread, through a producer
cached per executor process. A request that raises, or answers anything but SEND_OK, fails the task
with the broker's error (at-least-once: Spark retries the task, earlier rows may be sent twice).
With ``exactlyOnce=true`` tasks, commit and abort go to ``exactly_once`` (decision 0006).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from ferrymq.client.producer import Producer, new_uniq_keys
from ferrymq.client.selectors import RoundRobin, select_by_hash
from ferrymq.client.values import SendResult, SendStatus, new_message
from ferrymq.common import message_codec
from ferrymq.common.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    Message,
)
from ferrymq.common.route import MessageQueue
from ferrymq.errors import ClientError, ConfigError, FerryError
from ferrymq.spark import exactly_once, runtime
from ferrymq.spark.options import SinkOptions

log = logging.getLogger("ferrymq.spark")

#: Messages per SEND_BATCH_MESSAGE request of the sink.
SINK_BATCH_MAX_MESSAGES = 512
#: Body bytes per SEND_BATCH_MESSAGE request (well under the broker's 4 MiB maxMessageSize with the headers).
SINK_BATCH_MAX_BYTES = 1024 * 1024


class SendFailedError(FerryError):
    """A message of the batch was not stored as asked (error, or a status other than SEND_OK)."""


@dataclass(frozen=True, slots=True)
class SinkLayout:
    """Which optional columns the DataFrame has (checked once on the driver)."""

    has_topic: bool
    has_key: bool
    has_tags: bool
    has_properties: bool
    has_queue_id: bool
    has_broker_name: bool


def validate_sink_schema(schema: StructType, opts: SinkOptions) -> SinkLayout:
    fields = {f.name: f.dataType for f in schema.fields}

    def check(name: str, allowed: tuple[type, ...], what: str) -> bool:
        if name not in fields:
            return False
        if not isinstance(fields[name], allowed):
            raise ConfigError(name, f"column must be {what}, got {fields[name].simpleString()}")
        return True

    if "value" not in fields:
        raise ConfigError("value", f"column is required by the rocketmq sink (columns: {', '.join(fields)})")
    check("value", (StringType, BinaryType), "string or binary")
    has_topic = check("topic", (StringType,), "string")
    if not has_topic and opts.topic is None:
        raise ConfigError("topic", "set the topic option or provide a string 'topic' column")
    has_props = check("properties", (MapType,), "map<string,string>")
    if has_props:
        mt = fields["properties"]
        assert isinstance(mt, MapType)
        if not isinstance(mt.keyType, StringType) or not isinstance(mt.valueType, StringType):
            raise ConfigError("properties", f"column must be map<string,string>, got {mt.simpleString()}")
    return SinkLayout(
        has_topic=has_topic,
        has_key=check("key", (StringType,), "string"),
        has_tags=check("tags", (StringType,), "string"),
        has_properties=has_props,
        has_queue_id=check("queueId", (IntegerType, LongType, ShortType), "int"),
        has_broker_name=check("brokerName", (StringType,), "string"),
    )


@dataclass
class SentCount(WriterCommitMessage):
    rows: int


def _column(batch: pa.RecordBatch, name: str, present: bool) -> list | None:
    if not present:
        return None
    return batch.column(batch.schema.get_field_index(name)).to_pylist()


def build_messages(
    batch: pa.RecordBatch, opts: SinkOptions, layout: SinkLayout
) -> list[tuple[Message, int | None, str | None]]:
    """(message, queueId, brokerName) per row."""
    values = _column(batch, "value", True) or []
    topics = _column(batch, "topic", layout.has_topic and opts.topic is None)
    keys = _column(batch, "key", layout.has_key)
    tags = _column(batch, "tags", layout.has_tags)
    props = _column(batch, "properties", layout.has_properties)
    qids = _column(batch, "queueId", layout.has_queue_id)
    brokers = _column(batch, "brokerName", layout.has_broker_name)
    result: list[tuple[Message, int | None, str | None]] = []
    for i, value in enumerate(values):
        if value is None:
            raise SendFailedError(f"row {i} of the batch has a null value; the rocketmq sink needs a body")
        topic = opts.topic if topics is None else topics[i]
        if not topic:
            raise SendFailedError(
                f"row {i} of the batch has a null or empty topic and no topic option is set"
            )
        row_props = dict(props[i]) if props is not None and props[i] else None
        msg = new_message(
            topic,
            value if isinstance(value, bytes | str) else bytes(value),
            tags=tags[i] if tags is not None else None,
            keys=keys[i] if keys is not None else None,
            properties=row_props,
        )
        result.append(
            (msg, qids[i] if qids is not None else None, brokers[i] if brokers is not None else None)
        )
    return result


async def _topic_queues(producer: Producer, topic: str, cache: dict[str, list[MessageQueue]]) -> list[MessageQueue]:
    if topic not in cache:
        cache[topic] = sorted(await producer.fetch_publish_message_queues(topic))
        if not cache[topic]:
            raise SendFailedError(f"topic {topic} has no writable queue")
    return cache[topic]


async def _explicit_queue(
    producer: Producer, topic: str, queue_id: int, broker: str | None, cache: dict[str, list[MessageQueue]]
) -> MessageQueue:
    if broker is not None:
        return MessageQueue(topic, broker, int(queue_id))
    matches = [mq for mq in await _topic_queues(producer, topic, cache) if mq.queue_id == queue_id]
    if len(matches) != 1:
        where = ", ".join(sorted({mq.broker_name for mq in matches})) or "no broker"
        raise SendFailedError(
            f"queueId {queue_id} of topic {topic} is ambiguous or unknown ({where}); add a brokerName column"
        )
    return matches[0]


class QueuePlanner:
    """Target queue per row: explicit queueId, else hash of the key, else round robin (per writer task)."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.cache: dict[str, list[MessageQueue]] = {}
        self.round_robin = RoundRobin()

    def spread(self, queues: list[MessageQueue], keys: list | None, n: int) -> dict[MessageQueue, list[int]]:
        """Rows 0..n-1 of one topic by queue: keyed rows by key hash (each distinct key hashed once), the others
        round robin."""
        nq = len(queues)
        result: dict[MessageQueue, list[int]] = {}
        if keys is None:
            first = self.round_robin.next_indexes(n)
            for j in range(min(nq, n)):
                result[queues[(first + j) % nq]] = list(range(j, n, nq))
            return result
        memo: dict[str, MessageQueue] = {}
        for i, key in enumerate(keys):
            if key:
                mq = memo.get(key)
                if mq is None:
                    mq = memo[key] = select_by_hash(queues, None, key)
            else:
                mq = self.round_robin(queues)
            result.setdefault(mq, []).append(i)
        return result

    async def target(self, msg: Message, queue_id: int | None, broker: str | None) -> MessageQueue:
        return await self.target_of(msg.topic, msg.properties.get(PROPERTY_KEYS), queue_id, broker)

    async def target_of(self, topic: str, key: str | None, queue_id: int | None, broker: str | None) -> MessageQueue:
        if queue_id is not None:
            return await _explicit_queue(self.producer, topic, queue_id, broker, self.cache)
        queues = self.cache.get(topic) or await _topic_queues(self.producer, topic, self.cache)
        if key:
            return select_by_hash(queues, None, key)
        return self.round_robin(queues)


def _chunks(body_sizes: list[int]) -> list[tuple[int, int]]:
    """[start, end) index ranges of consecutive runs of at most SINK_BATCH_MAX_MESSAGES messages and
    SINK_BATCH_MAX_BYTES of bodies (a single larger body is a run of its own)."""
    result: list[tuple[int, int]] = []
    start = size = 0
    for i, n in enumerate(body_sizes):
        if i > start and (i - start >= SINK_BATCH_MAX_MESSAGES or size + n > SINK_BATCH_MAX_BYTES):
            result.append((start, i))
            start, size = i, 0
        size += n
    if start < len(body_sizes):
        result.append((start, len(body_sizes)))
    return result


def _check_sent(result: SendResult, mq: MessageQueue) -> None:
    if result.status is not SendStatus.SEND_OK:
        raise SendFailedError(f"send to {result.message_queue or mq} answered {result.status.name} "
                              f"(msgId {result.msg_id})")


async def _run_all(jobs: list[Coroutine[Any, Any, None]]) -> None:
    """Run the per-queue jobs concurrently; the first failure cancels the others."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()


async def send_all(opts: SinkOptions, rows: list[tuple[Message, int | None, str | None]]) -> int:
    """Group rows by target queue and send them as SEND_BATCH requests, at most ``send_pipeline_depth`` in
    flight; raise on the first failed request."""
    producer = await runtime.started_producer(opts)
    planner = QueuePlanner(producer)
    per_queue: dict[MessageQueue, list[Message]] = {}
    singles: list[tuple[Message, MessageQueue]] = []
    for msg, queue_id, broker in rows:
        mq = await planner.target(msg, queue_id, broker)
        if msg.delay_level or PROPERTY_DELAY_TIME_LEVEL in msg.properties:
            singles.append((msg, mq))
        else:
            per_queue.setdefault(mq, []).append(msg)
    sem = asyncio.Semaphore(opts.send_pipeline_depth)

    async def request(msgs: list[Message], mq: MessageQueue) -> None:
        async with sem:
            try:
                result = await producer.send_batch(msgs, queue=mq) if len(msgs) > 1 else await producer.send(
                    msgs[0], queue=mq)
            except (FerryError, ClientError) as exc:
                raise SendFailedError(f"send of {len(msgs)} message(s) to {mq} failed: {exc}") from exc
            _check_sent(result, mq)

    async def one_queue(mq: MessageQueue, msgs: list[Message]) -> None:
        # one request at a time per queue: rows keep their order in the queue
        for start, end in _chunks([len(m.body) for m in msgs]):
            await request(msgs[start:end], mq)

    jobs = [one_queue(mq, msgs) for mq, msgs in per_queue.items()]
    jobs += [request([msg], mq) for msg, mq in singles]
    await _run_all(jobs)
    return len(rows)


def _property_texts(keys: list | None, tags: list | None, uniqs: list[str]) -> list[bytes]:
    """The encoded properties of each row: KEYS and TAGS when set, and the row's UNIQ_KEY."""
    tail = [f"{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}{NAME_VALUE_SEPARATOR}{u}" for u in uniqs]
    if tags is not None:
        tail = [f"{PROPERTY_TAGS}{NAME_VALUE_SEPARATOR}{t}{PROPERTY_SEPARATOR}{x}" if t else x
                for t, x in zip(tags, tail, strict=True)]  # fmt: skip
    if keys is not None:
        tail = [f"{PROPERTY_KEYS}{NAME_VALUE_SEPARATOR}{k}{PROPERTY_SEPARATOR}{x}" if k else x
                for k, x in zip(keys, tail, strict=True)]  # fmt: skip
    return list(map(str.encode, tail))


async def send_columns(opts: SinkOptions, batch: pa.RecordBatch, layout: SinkLayout) -> int:
    """``send_all`` for batches without a properties column, built column by column: no Message per row, the
    SEND_BATCH bodies encoded in one C-level pass per request (``message_codec.encode_batch_columns``)."""
    producer = await runtime.started_producer(opts)
    planner = QueuePlanner(producer)
    n = batch.num_rows
    values = _column(batch, "value", True) or []
    if None in values:
        raise SendFailedError(f"row {values.index(None)} of the batch has a null value; the rocketmq sink needs a body")
    bodies: list[bytes] = [v.encode() if isinstance(v, str) else v for v in values]
    too_big = [i for i, b in enumerate(bodies) if not b or len(b) > producer.max_message_size_bytes]
    if too_big:
        i = too_big[0]
        raise SendFailedError(f"row {i} of the batch has a body of {len(bodies[i])} bytes (1 to "
                              f"{producer.max_message_size_bytes} allowed)")
    topics = _column(batch, "topic", layout.has_topic and opts.topic is None)
    keys = _column(batch, "key", layout.has_key)
    tags = _column(batch, "tags", layout.has_tags)
    qids = _column(batch, "queueId", layout.has_queue_id)
    brokers = _column(batch, "brokerName", layout.has_broker_name)
    uniqs = new_uniq_keys(n, producer.config.client_ip)
    props = _property_texts(keys, tags, uniqs)
    per_queue: dict[MessageQueue, list[int]] = {}
    if qids is None and topics is None and opts.topic is not None:  # one topic, no explicit queue: no await per row
        queues = await _topic_queues(producer, opts.topic, planner.cache)
        per_queue = planner.spread(queues, keys, n)
    for i in range(n if not per_queue else 0):
        topic = opts.topic if topics is None else topics[i]
        if not topic:
            raise SendFailedError(f"row {i} of the batch has a null or empty topic and no topic option is set")
        mq = await planner.target_of(topic, keys[i] if keys is not None else None,
                                     qids[i] if qids is not None else None,
                                     brokers[i] if brokers is not None else None)  # fmt: skip
        per_queue.setdefault(mq, []).append(i)
    sem = asyncio.Semaphore(opts.send_pipeline_depth)

    async def request(mq: MessageQueue, rows: list[int]) -> None:
        try:
            body = message_codec.encode_batch_columns(repeat(0), [bodies[i] for i in rows], [props[i] for i in rows])
        except message_codec.RecordFormatError as exc:  # a key or tag of over 32 KiB
            raise SendFailedError(f"a row for {mq} cannot be sent: {exc}") from exc
        async with sem:
            try:
                result = await producer.send_batch_encoded(mq.topic, body, [uniqs[i] for i in rows], queue=mq)
            except (FerryError, ClientError) as exc:
                raise SendFailedError(f"send of {len(rows)} message(s) to {mq} failed: {exc}") from exc
        _check_sent(result, mq)

    async def one_queue(mq: MessageQueue, rows: list[int]) -> None:
        # one request at a time per queue: rows keep their order in the queue
        for start, end in _chunks([len(bodies[i]) for i in rows]):
            await request(mq, rows[start:end])

    await _run_all([one_queue(mq, rows) for mq, rows in per_queue.items()])
    return n


def write_batches(iterator: Iterator[pa.RecordBatch], opts: SinkOptions, layout: SinkLayout) -> SentCount:
    total = 0
    timeout_s = opts.send_timeout_ms / 1000 + runtime.RUN_GRACE_S
    for batch in iterator:
        if batch.num_rows == 0:
            continue
        budget_s = timeout_s + batch.num_rows * 0.01
        if layout.has_properties:  # user properties (maybe a delay level): message by message
            total += runtime.run(send_all(opts, build_messages(batch, opts, layout)), budget_s)
        else:
            total += runtime.run(send_columns(opts, batch, layout), budget_s)
    return SentCount(total)


class RocketMQBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, layout: SinkLayout) -> None:
        self.opts = opts
        self.layout = layout
        #: the epoch group of this job when exactly-once (made on the driver, pickled to the tasks)
        self.job_group = f"job-{uuid.uuid4().hex}" if opts.exactly_once else None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        if self.opts.exactly_once:
            return exactly_once.write_partition(iterator, self.opts, self.layout, self.job_group)
        return write_batches(iterator, self.opts, self.layout)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.exactly_once:
            exactly_once.commit(self.opts, messages, 0)
            return
        sent = sum(m.rows for m in messages if isinstance(m, SentCount))
        log.info("rocketmq sink: %d messages sent", sent)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.exactly_once:
            exactly_once.abort(self.opts, messages, 0)
            return
        sent = sum(m.rows for m in messages if isinstance(m, SentCount))
        log.warning("rocketmq sink: write aborted after %d messages were sent (not retractable)", sent)


class RocketMQStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, layout: SinkLayout) -> None:
        self.opts = opts
        self.layout = layout

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        if self.opts.exactly_once:
            return exactly_once.write_partition(iterator, self.opts, self.layout)
        return write_batches(iterator, self.opts, self.layout)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.opts.exactly_once:
            exactly_once.commit(self.opts, messages, batchId)
            return
        sent = sum(m.rows for m in messages if isinstance(m, SentCount))
        log.info("rocketmq sink: batch %d, %d messages sent", batchId, sent)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.opts.exactly_once:
            exactly_once.abort(self.opts, messages, batchId)
            return
        log.warning("rocketmq sink: batch %d aborted (sent messages are not retractable)", batchId)
