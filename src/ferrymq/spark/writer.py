"""Batch and streaming sinks: every row becomes one message; every send's status is checked.

Input columns (validated on the driver from the DataFrame's schema; other columns are ignored):

| column     | type                         | required | becomes                                             |
|------------|------------------------------|----------|-----------------------------------------------------|
| value      | string or binary             | yes      | body (strings UTF-8 encoded); null fails the task   |
| topic      | string                       | unless the ``topic`` option is set (the option wins) |
| key        | string                       | no       | KEYS (space-separated keys are indexed separately)  |
| tags       | string                       | no       | TAGS                                                |
| properties | map<string,string>           | no       | user properties                                     |
| queueId    | int or bigint                | no       | target queue (else the producer picks one)          |
| brokerName | string                       | no       | with queueId: the queue's broker                    |

Sends run pipelined (``sendPipelineDepth`` in flight) on the process's loop thread, through a producer
cached per executor process. A send that raises, or answers anything but SEND_OK, fails the task
with the broker's error (at-least-once: Spark retries the task, earlier rows may be sent twice).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass

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

from ferrymq.client.producer import Producer
from ferrymq.client.values import SendResult, SendStatus, new_message
from ferrymq.common.message import Message
from ferrymq.common.route import MessageQueue
from ferrymq.errors import ClientError, ConfigError, FerryError
from ferrymq.spark import runtime
from ferrymq.spark.options import SinkOptions

log = logging.getLogger("ferrymq.spark")


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


async def _target_queue(
    producer: Producer,
    topic: str,
    queue_id: int | None,
    broker: str | None,
    cache: dict[str, list[MessageQueue]],
) -> MessageQueue | None:
    if queue_id is None:
        return None
    if broker is not None:
        return MessageQueue(topic, broker, int(queue_id))
    if topic not in cache:
        cache[topic] = await producer.fetch_publish_message_queues(topic)
    matches = [mq for mq in cache[topic] if mq.queue_id == queue_id]
    if len(matches) != 1:
        where = ", ".join(sorted({mq.broker_name for mq in matches})) or "no broker"
        raise SendFailedError(
            f"queueId {queue_id} of topic {topic} is ambiguous or unknown ({where}); add a brokerName column"
        )
    return matches[0]


async def send_all(opts: SinkOptions, rows: list[tuple[Message, int | None, str | None]]) -> int:
    """Send with at most ``send_pipeline_depth`` in flight; raise on the first failed send."""
    producer = await runtime.started_producer(opts)
    sem = asyncio.Semaphore(opts.send_pipeline_depth)
    queues: dict[str, list[MessageQueue]] = {}

    async def one(msg: Message, queue_id: int | None, broker: str | None) -> SendResult:
        async with sem:
            mq = await _target_queue(producer, msg.topic, queue_id, broker, queues)
            try:
                result = await producer.send(msg, queue=mq)
            except (FerryError, ClientError) as exc:
                raise SendFailedError(f"send to topic {msg.topic} failed: {exc}") from exc
            if result.status is not SendStatus.SEND_OK:
                raise SendFailedError(
                    f"send to {result.message_queue} answered {result.status.name} (msgId {result.msg_id})"
                )
            return result

    tasks = [asyncio.ensure_future(one(*row)) for row in rows]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    return len(rows)


def write_batches(iterator: Iterator[pa.RecordBatch], opts: SinkOptions, layout: SinkLayout) -> SentCount:
    total = 0
    timeout_s = opts.send_timeout_ms / 1000 + runtime.RUN_GRACE_S
    for batch in iterator:
        if batch.num_rows == 0:
            continue
        rows = build_messages(batch, opts, layout)
        total += runtime.run(send_all(opts, rows), timeout_s + batch.num_rows * 0.01)
    return SentCount(total)


class RocketMQBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, layout: SinkLayout) -> None:
        self.opts = opts
        self.layout = layout

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        return write_batches(iterator, self.opts, self.layout)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        sent = sum(m.rows for m in messages if isinstance(m, SentCount))
        log.info("rocketmq sink: %d messages sent", sent)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        sent = sum(m.rows for m in messages if isinstance(m, SentCount))
        log.warning("rocketmq sink: write aborted after %d messages were sent (not retractable)", sent)


class RocketMQStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, layout: SinkLayout) -> None:
        self.opts = opts
        self.layout = layout

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        return write_batches(iterator, self.opts, self.layout)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sent = sum(m.rows for m in messages if isinstance(m, SentCount))
        log.info("rocketmq sink: batch %d, %d messages sent", batchId, sent)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("rocketmq sink: batch %d aborted (sent messages are not retractable)", batchId)
