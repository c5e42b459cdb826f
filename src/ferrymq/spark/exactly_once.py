"""The exactly-once sink (``.option("exactlyOnce", "true")``; decision 0006): rows as half messages of an epoch,
made visible by the driver's commit through epoch records that the brokers hold.

* **Epoch group and epoch.** Streaming: Spark's query id (``sql.streaming.queryId``, kept in the checkpoint,
  the same after a restart) and the micro-batch id (``streaming.sql.batchId``), both read from the task's
  local properties. Batch writes (``df.write``): a job id drawn when the writer is made, epoch 0.
* **Task** (``write_partition``): draws a writer token, groups its rows by the queue the default sink would pick
  and sends each run of at most 512 rows / 1 MiB of bodies as one half message whose body is the run's
  SEND_BATCH body (never retried elsewhere: one send, at most one half message per run; the broker stores every
  row of it at commit), and returns an ``EpochCommit`` with the handles of its half messages. Properties of
  each half message:

  | property                         | value                                                      |
  |----------------------------------|------------------------------------------------------------|
  | ``TRAN_MSG``                     | ``true``                                                   |
  | ``PGROUP``                       | ``spark-eos-<epoch group>`` (the producer group)           |
  | ``EOS_GROUP``                    | the epoch group                                            |
  | ``EOS_EPOCH``                    | the epoch (decimal)                                        |
  | ``EOS_WRITER``                   | the writer token (32 hex digits)                           |
  | ``EOS_BATCH``                    | ``1``: the body is a SEND_BATCH body of the run's rows       |
  | ``CHECK_IMMUNITY_TIME_IN_SECONDS`` | ``exactlyOnce.timeoutMs`` / 1000                         |

* **Driver** (``commit_epoch``): the winners are the tokens of the commit messages Spark hands over. An epoch
  record (a half message with ``EOS_RECORD=1``, body = the tokens, one per line) goes to one queue of the
  topic on every broker group of its route, the coordinator (smallest broker name) first, each sealed with
  END_TRANSACTION, whose answer (``eosWinners``) names the epoch's winners on that broker: the first record
  wins. When the coordinator already had a record (a re-run after a crash in an earlier commit), its winners
  are adopted and propagated. Then the winners' half messages are committed and this run's other half messages
  rolled back. A failed END after the records is left to the broker's check-back, which decides by the record.
* **abort** rolls back every half message it is handed.

``FERRYMQ_SPARK_EOS_FAULT_FILE`` (fault tests only): when the named file exists and holds ``commit <n> <pgid>``,
the commit deletes it after the records and ``n`` END_TRANSACTIONs and SIGKILLs process group ``pgid`` (the
driver's) and its own (the Python workers').
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from ferrymq.client.producer import Producer
from ferrymq.client.values import SendStatus, new_message
from ferrymq.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_ROLLBACK,
    Message,
    decode_offset_msg_id,
)
from ferrymq.common.route import MessageQueue
from ferrymq.errors import ClientError, FerryError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.spark import runtime
from ferrymq.spark.options import SinkOptions

log = logging.getLogger("ferrymq.spark")

PROPERTY_EOS_GROUP = "EOS_GROUP"
PROPERTY_EOS_EPOCH = "EOS_EPOCH"
PROPERTY_EOS_WRITER = "EOS_WRITER"
PROPERTY_EOS_RECORD = "EOS_RECORD"
PROPERTY_EOS_BATCH = "EOS_BATCH"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
#: Spark's local properties of a streaming task
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
PRODUCER_GROUP_PREFIX = "spark-eos-"
#: the commit refuses a batch whose oldest half message is this close to exactlyOnce.timeoutMs
COMMIT_MARGIN_MS = 60_000
#: END_TRANSACTIONs in flight from the driver
END_PIPELINE_DEPTH = 256
FAULT_FILE_ENV = "FERRYMQ_SPARK_EOS_FAULT_FILE"


class EpochCommitError(FerryError):
    """The driver could not record or commit an epoch; the batch fails (its re-run decides again)."""


@dataclass(frozen=True, slots=True)
class HalfHandle:
    broker_name: str
    topic: str
    queue_id: int
    half_phy_offset: int
    half_queue_offset: int
    #: rows in the half message (a batch body)
    rows: int = 1


@dataclass
class EpochCommit(WriterCommitMessage):
    """What a task hands to the driver: its epoch, writer token and half messages."""

    group: str
    epoch: int
    writer: str
    started_ms: int
    halves: list[HalfHandle] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(h.rows for h in self.halves)


def producer_group(epoch_group: str) -> str:
    return PRODUCER_GROUP_PREFIX + epoch_group


def _eos_options(opts: SinkOptions, epoch_group: str) -> SinkOptions:
    return dataclasses.replace(opts, group=producer_group(epoch_group))


def task_epoch(batch_group: str | None) -> tuple[str, int, int]:
    """(epoch group, epoch, partition) of the running task: streaming from Spark's local properties, batch from
    the job's group."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None
    batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
    if query_id and batch_id is not None and batch_id.isdigit():
        return query_id, int(batch_id), partition
    if batch_group is None:
        raise EpochCommitError("the exactly-once sink found no streaming query id or batch id in the task")
    return batch_group, 0, partition


async def _send_halves(opts: SinkOptions, rows: list[tuple[Message, int | None, str | None]], epoch_group: str,
                       epoch: int, writer: str) -> list[HalfHandle]:
    """Rows grouped by target queue, each run of at most SINK_BATCH_MAX_MESSAGES / SINK_BATCH_MAX_BYTES sent as
    one half message whose body is the run's SEND_BATCH body (``EOS_BATCH=1``: the broker stores every message
    of it in the queue at commit); the handles of the half messages."""
    from ferrymq.spark.writer import QueuePlanner, SendFailedError, _chunks, _run_all

    eos_opts = _eos_options(opts, epoch_group)
    producer = await runtime.started_producer(eos_opts)
    # a batch body is stored as it is (the broker splits it at commit): never compressed as a whole
    producer.compress_msg_body_over_bytes = producer.max_message_size_bytes + 1
    planner = QueuePlanner(producer)
    per_queue: dict[MessageQueue, list[Message]] = {}
    for msg, queue_id, broker in rows:
        if msg.delay_level or PROPERTY_DELAY_TIME_LEVEL in msg.properties:
            raise SendFailedError("the exactly-once sink cannot send delayed messages (transactional messages "
                                  "are never delayed)")
        per_queue.setdefault(await planner.target(msg, queue_id, broker), []).append(msg)
    header = {
        PROPERTY_TRANSACTION_PREPARED: "true", PROPERTY_PRODUCER_GROUP: eos_opts.group,
        PROPERTY_EOS_GROUP: epoch_group, PROPERTY_EOS_EPOCH: str(epoch), PROPERTY_EOS_WRITER: writer,
        PROPERTY_EOS_BATCH: "1",
        PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: str(max(1, opts.exactly_once_timeout_ms // 1000))}
    runs = [(mq, msgs[a:b]) for mq, msgs in per_queue.items() for a, b in _chunks([len(m.body) for m in msgs])]
    handles: list[HalfHandle | None] = [None] * len(runs)
    sem = asyncio.Semaphore(opts.send_pipeline_depth)

    async def one(i: int, mq: MessageQueue, msgs: list[Message]) -> None:
        try:
            body, _ = producer._encode_batch(msgs, mq.topic)
        except (FerryError, ClientError, ValueError) as exc:
            raise SendFailedError(f"rows for {mq} cannot be sent: {exc}") from exc
        half = new_message(mq.topic, body, properties=dict(header))
        async with sem:
            try:
                result = await producer.send(half, queue=mq)
            except (FerryError, ClientError) as exc:
                raise SendFailedError(f"half message to {mq} failed: {exc}") from exc
        if result.status is not SendStatus.SEND_OK:
            raise SendFailedError(f"half message to {mq} answered {result.status.name}")
        _, _, phy = decode_offset_msg_id(result.offset_msg_id)
        handles[i] = HalfHandle(mq.broker_name, mq.topic, mq.queue_id, phy, result.queue_offset, len(msgs))

    await _run_all([one(i, mq, msgs) for i, (mq, msgs) in enumerate(runs)])
    return [h for h in handles if h is not None]


def write_partition(iterator: Iterator[pa.RecordBatch], opts: SinkOptions, layout: Any,
                    batch_group: str | None = None) -> EpochCommit:
    """A task's rows as half messages of its epoch; the EpochCommit for the driver."""
    from ferrymq.spark.writer import build_messages

    epoch_group, epoch, _ = task_epoch(batch_group)
    commit = EpochCommit(epoch_group, epoch, uuid.uuid4().hex, int(time.time() * 1000))
    timeout_s = opts.send_timeout_ms / 1000 + runtime.RUN_GRACE_S
    for batch in iterator:
        if batch.num_rows == 0:
            continue
        rows = build_messages(batch, opts, layout)
        commit.halves += runtime.run(_send_halves(opts, rows, epoch_group, epoch, commit.writer),
                                     timeout_s + batch.num_rows * 0.01)
    return commit


# ---- driver -----------------------------------------------------------------------------------------------


def _end_command(group: str, handle: HalfHandle, kind: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": handle.half_queue_offset,
        "commitLogOffset": handle.half_phy_offset, "commitOrRollback": kind, "fromTransactionCheck": "false",
        "msgId": "", "transactionId": ""})


async def _master_addr(producer: Producer, topic: str, broker_name: str) -> str:
    addr = producer.instance.master_addr(broker_name)
    if addr is None:
        producer.instance.trigger_route_refresh()
        await producer.fetch_publish_message_queues(topic)
        addr = producer.instance.master_addr(broker_name)
    if addr is None:
        raise EpochCommitError(f"no master of broker group {broker_name} is known")
    return addr


async def _end(producer: Producer, group: str, handle: HalfHandle, kind: int, timeout_ms: int) -> RemotingCommand:
    addr = await _master_addr(producer, handle.topic, handle.broker_name)
    return await producer.instance.invoke(addr, _end_command(group, handle, kind), timeout_ms)


async def _record(producer: Producer, opts: SinkOptions, mq: MessageQueue, epoch_group: str, epoch: int,
                  winners: list[str]) -> set[str]:
    """Store and seal the epoch record on ``mq``'s broker; the winners that broker holds for the epoch."""
    group = producer.group
    msg = new_message(mq.topic, "\n".join(winners).encode("ascii"), properties={
        PROPERTY_TRANSACTION_PREPARED: "true", PROPERTY_PRODUCER_GROUP: group, PROPERTY_EOS_GROUP: epoch_group,
        PROPERTY_EOS_EPOCH: str(epoch), PROPERTY_EOS_RECORD: "1"})
    result = await producer.send(msg, queue=mq)
    if result.status is not SendStatus.SEND_OK:
        raise EpochCommitError(f"epoch record on {mq.broker_name} answered {result.status.name}")
    _, _, phy = decode_offset_msg_id(result.offset_msg_id)
    handle = HalfHandle(mq.broker_name, mq.topic, mq.queue_id, phy, result.queue_offset)
    resp = await _end(producer, group, handle, SYSFLAG_TRANSACTION_COMMIT, opts.send_timeout_ms)
    if resp.code != ResponseCode.SUCCESS or resp.ext_fields.get("eosEpochRecorded") != "true":
        raise EpochCommitError(f"epoch record on {mq.broker_name} not sealed: code {resp.code} "
                               f"{resp.remark or ''} (a broker without epoch records, or an epoch older than "
                               "the latest recorded)")
    return {t for t in str(resp.ext_fields.get("eosWinners", "")).split(",") if t}


def _fault_point(ends_done: int) -> None:
    path = os.environ.get(FAULT_FILE_ENV)
    if not path or not os.path.exists(path):
        return
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return
    if len(words) == 3 and words[0] == "commit" and words[1].isdigit() and ends_done >= int(words[1]):
        os.remove(path)
        log.warning("fault injection: killing the driver during the commit")
        try:
            os.killpg(int(words[2]), signal.SIGKILL)
        finally:
            os.killpg(os.getpgrp(), signal.SIGKILL)


async def commit_epoch(opts: SinkOptions, messages: list[EpochCommit], epoch: int) -> tuple[int, int]:
    """Record and commit one epoch; (rows committed, rows rolled back) by this call."""
    assert opts.topic is not None
    epoch_group = messages[0].group
    if any(m.group != epoch_group for m in messages):
        raise EpochCommitError("commit messages of different queries in one batch")
    oldest_ms = min(m.started_ms for m in messages)
    if time.time() * 1000 - oldest_ms > opts.exactly_once_timeout_ms - COMMIT_MARGIN_MS:
        raise EpochCommitError(f"batch {epoch} waited too long for its commit (exactlyOnce.timeoutMs "
                               f"{opts.exactly_once_timeout_ms}); its half messages may be discarded, re-run it")
    eos_opts = _eos_options(opts, epoch_group)
    producer = await runtime.started_producer(eos_opts)
    queues = sorted(await producer.fetch_publish_message_queues(opts.topic))
    first_queue: dict[str, MessageQueue] = {}
    for mq in queues:
        first_queue.setdefault(mq.broker_name, mq)
    for m in messages:
        for h in m.halves:
            first_queue.setdefault(h.broker_name, MessageQueue(h.topic, h.broker_name, h.queue_id))
    if not first_queue:
        raise EpochCommitError(f"topic {opts.topic} has no writable queue for the epoch record")
    brokers = sorted(first_queue)
    winners = sorted({m.writer for m in messages})
    recorded = await _record(producer, opts, first_queue[brokers[0]], epoch_group, epoch, winners)
    if recorded != set(winners):
        log.warning("rocketmq sink: batch %d of query %s was recorded by an earlier run; this run's rows are "
                    "rolled back and the earlier run's are committed", epoch, epoch_group)
        winners = sorted(recorded)
    for broker in brokers[1:]:
        others = await _record(producer, opts, first_queue[broker], epoch_group, epoch, winners)
        if others != set(winners):
            raise EpochCommitError(f"broker {broker} holds other winners for batch {epoch} of query "
                                   f"{epoch_group} than the coordinator {brokers[0]}")
    won = set(winners)
    decisions = [(h, SYSFLAG_TRANSACTION_COMMIT if m.writer in won else SYSFLAG_TRANSACTION_ROLLBACK)
                 for m in messages for h in m.halves]
    sem = asyncio.Semaphore(END_PIPELINE_DEPTH)
    done = 0

    async def one(handle: HalfHandle, kind: int) -> None:
        nonlocal done
        async with sem:
            try:
                resp = await _end(producer, eos_opts.group, handle, kind, opts.send_timeout_ms)
            except (TimeoutError, FerryError, ClientError, OSError) as exc:
                log.warning("rocketmq sink: END_TRANSACTION for %s failed (%s); the broker's check-back decides "
                            "it by the epoch record", handle, exc)
                return
            done += 1
            _fault_point(done)
            if resp.code != ResponseCode.SUCCESS:
                log.warning("rocketmq sink: END_TRANSACTION for %s answered %d %s", handle, resp.code,
                            resp.remark or "")

    await asyncio.gather(*(one(h, k) for h, k in decisions))
    committed = sum(h.rows for h, k in decisions if k == SYSFLAG_TRANSACTION_COMMIT)
    return committed, sum(h.rows for h, _ in decisions) - committed


async def abort_epoch(opts: SinkOptions, messages: list[EpochCommit]) -> int:
    """Roll back every half message handed over (best effort; the records and check-back decide the rest)."""
    if not messages:
        return 0
    eos_opts = _eos_options(opts, messages[0].group)
    producer = await runtime.started_producer(eos_opts)
    sem = asyncio.Semaphore(END_PIPELINE_DEPTH)

    async def one(handle: HalfHandle) -> bool:
        async with sem:
            try:
                resp = await _end(producer, eos_opts.group, handle, SYSFLAG_TRANSACTION_ROLLBACK,
                                  opts.send_timeout_ms)
            except (TimeoutError, FerryError, ClientError, OSError):
                return False
            return resp.code == ResponseCode.SUCCESS

    results = await asyncio.gather(*(one(h) for m in messages for h in m.halves))
    return sum(results)


def commit(opts: SinkOptions, messages: list[WriterCommitMessage | None], epoch: int) -> None:
    ours = [m for m in messages if isinstance(m, EpochCommit)]
    if len(ours) != len(messages):
        raise EpochCommitError(f"batch {epoch}: {len(messages) - len(ours)} task(s) sent no commit message")
    if not any(m.halves for m in ours):
        log.info("rocketmq sink: batch %d had no rows", epoch)
        return
    budget_s = opts.send_timeout_ms / 1000 * 4 + runtime.RUN_GRACE_S + sum(m.rows for m in ours) * 0.001
    committed, rolled_back = runtime.run(commit_epoch(opts, ours, epoch), budget_s)
    log.info("rocketmq sink: batch %d committed: %d messages visible, %d rolled back", epoch, committed,
             rolled_back)


def abort(opts: SinkOptions, messages: list[WriterCommitMessage | None], epoch: int) -> None:
    ours = [m for m in messages if isinstance(m, EpochCommit)]
    done = runtime.run(abort_epoch(opts, ours), opts.send_timeout_ms / 1000 * 2 + runtime.RUN_GRACE_S)
    log.warning("rocketmq sink: batch %d aborted, %d half messages rolled back", epoch, done)
