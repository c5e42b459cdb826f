"""Transactional messages (RocketMQ 4.x semantics): half messages, decisions, check-backs. Masters only.

* A send with ``TRAN_MSG=true`` is a **half message**: stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with the
  real topic and queue in ``REAL_TOPIC`` / ``REAL_QID`` (send processor), invisible to consumers of the real
  topic. ``rejectTransactionMessage=true`` refuses it (NO_PERMISSION).
* END_TRANSACTION (37) names the half message by ``commitLogOffset`` (its phy offset) and
  ``tranStateTableOffset`` (its queue offset in the half topic). **Commit** stores the real message (topic,
  queue, body, flag, keys, tags and properties of the half one, transaction markers removed, sysFlag
  TRANSACTION_COMMIT, ``preparedTransactionOffset`` = the half message's phy offset); **rollback** stores
  nothing. Either way an **op record** goes to ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0 (table below), in the
  same loop turn as the real message. Each half message is decided once, also after a restart (the decisions
  are rebuilt from the op topic at start): the same decision again (a check-back answer and the producer's
  own answer) is acknowledged and ignored; a different one (a rollback after a commit, a commit after a
  rollback or a discard) is refused (CONFLICT). With ACL, the caller needs PUB on the half message's real
  topic (processors/end_transaction.py).
* **Check-back**: every ``transactionCheckInterval`` the service walks the undecided half messages; one older
  than ``transactionTimeOut`` (or its ``CHECK_IMMUNITY_TIME_IN_SECONDS``) is asked about with
  CHECK_TRANSACTION_STATE (39, oneway) on a live connection of its producer group (``PGROUP``), at most
  ``transactionCheckMax`` times; then it is discarded (an op record with ``discard``), logged and counted.
  The producer answers with END_TRANSACTION (``fromTransactionCheck=true``). Check counts live in memory: a
  restart gives every half message a fresh allowance.
* **Epochs** (decision 0006, the exactly-once Spark sink): a half message with ``EOS_GROUP``, ``EOS_EPOCH`` and
  ``EOS_WRITER`` is decided by the **epoch record** of (group, epoch): a half message with ``EOS_RECORD=1``,
  the same group and epoch, and the winning writer tokens as its body (one per line, ASCII). The first record
  of an epoch read from the half topic wins; records are rolled back when read (never visible). Check-back and
  END_TRANSACTION COMMIT both follow the record: token named → COMMIT; record without the token, or a record of
  a later epoch of the group → ROLLBACK; no record → a COMMIT is refused and the check-back asks as usual.
  END_TRANSACTION on a record answers the epoch's winners (``EndStatus.EPOCH_RECORDED``). A half message with
  ``EOS_BATCH=1`` carries a SEND_BATCH body: its commit stores every message of it in its real queue in one
  batch put (sysFlag without a transaction type; ``preparedTransactionOffset`` = the half message's on the
  Python path, 0 on the C extension's).

Op record (topic ``RMQ_SYS_TRANS_OP_HALF_TOPIC``, queue 0, tags ``d``):

| part     | value                                                                    |
|----------|--------------------------------------------------------------------------|
| body     | ``<half queue offset>`` in decimal ASCII                                 |
| property | ``TRAN_DECISION`` = ``commit`` / ``rollback`` / ``discard``                |

CHECK_TRANSACTION_STATE request: ext fields ``tranStateTableOffset``, ``commitLogOffset``, ``msgId``,
``transactionId``, ``offsetMsgId``, ``producerGroup``; body = the half message as stored (commit log record
format, its ``REAL_TOPIC`` / ``REAL_QID`` name the real destination).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ferrymq.common.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_CLUSTER,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    MessageExt,
    MessageExtBrokerInner,
    string_to_properties,
    tags_hash_code,
)
from ferrymq.common.message_codec import RecordFormatError, decode_batch_body, decode_record
from ferrymq.common.topic import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

log = logging.getLogger(__name__)

OP_TAGS = "d"
PROPERTY_DECISION = "TRAN_DECISION"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_ID = "__transactionId__"
#: epoch properties (decision 0006)
PROPERTY_EOS_GROUP = "EOS_GROUP"
PROPERTY_EOS_EPOCH = "EOS_EPOCH"
PROPERTY_EOS_WRITER = "EOS_WRITER"
PROPERTY_EOS_RECORD = "EOS_RECORD"
#: the half message's body is a SEND_BATCH body of several messages for its real queue, committed together
PROPERTY_EOS_BATCH = "EOS_BATCH"
#: properties of the half message that the committed message does not carry
_TRANSACTION_PROPERTIES = (PROPERTY_TRANSACTION_PREPARED, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID,
                           PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, PROPERTY_EOS_GROUP, PROPERTY_EOS_EPOCH,
                           PROPERTY_EOS_WRITER, PROPERTY_EOS_RECORD, PROPERTY_EOS_BATCH)
#: half messages read per check round at most (the rest wait for the next round)
MAX_CHECKS_PER_ROUND = 10_000
#: records read from a queue per get_message call while scanning
SCAN_BATCH = 256


class Decision(Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    DISCARD = "discard"


class EndStatus(Enum):
    """Outcome of END_TRANSACTION, mapped to a response in processors/end_transaction.py."""

    APPLIED = "APPLIED"
    ALREADY_DECIDED = "ALREADY_DECIDED"
    #: the half message already has a different decision (``TransactionService.decision_of`` says which)
    CONFLICT = "CONFLICT"
    NOT_FOUND = "NOT_FOUND"
    WRONG_GROUP = "WRONG_GROUP"
    STORE_FAILED = "STORE_FAILED"
    #: END_TRANSACTION on an epoch record: the epoch's winners are in ``TransactionService.epoch_winners``
    EPOCH_RECORDED = "EPOCH_RECORDED"
    #: a COMMIT of an epoch half message whose token the epoch's record does not name: rolled back instead
    NOT_IN_EPOCH = "NOT_IN_EPOCH"
    #: a COMMIT of an epoch half message before any record of its epoch: nothing decided
    EPOCH_NOT_RECORDED = "EPOCH_NOT_RECORDED"


@dataclass(frozen=True, slots=True)
class EpochTag:
    """The epoch properties of a half message (``record``: it is the epoch's record)."""

    group: str
    epoch: int
    writer: str
    record: bool

    @staticmethod
    def of(half: MessageExt) -> EpochTag | None:
        props = half.properties
        group = props.get(PROPERTY_EOS_GROUP)
        epoch = props.get(PROPERTY_EOS_EPOCH, "")
        if not group or not epoch.isdigit():
            return None
        return EpochTag(group, int(epoch), props.get(PROPERTY_EOS_WRITER, ""), props.get(PROPERTY_EOS_RECORD) == "1")


def parse_winners(body: bytes) -> frozenset[str]:
    """The writer tokens of an epoch record's body (one per line)."""
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        return frozenset()
    return frozenset(line for line in text.split("\n") if line)


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    timeout_ms: int = 6000
    check_interval_ms: int = 60_000
    check_max: int = 15


def _props_text(props: dict[str, str]) -> str:
    return PROPERTY_SEPARATOR.join(f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in props.items())


class TransactionService:
    """Decisions and check-backs of one broker's half messages (``ctx``: the BrokerController)."""

    def __init__(self, ctx: Any, config: TransactionConfig, clock_ms: Callable[[], int]) -> None:
        self.ctx = ctx
        self.config = config
        self.clock_ms = clock_ms
        #: half queue offsets that have an op record -> its decision (None: an op record without a readable one)
        self.decided: dict[int, Decision | None] = {}
        #: every half queue offset below this is decided (where the check walk starts)
        self.scan_from = 0
        self.check_counts: dict[int, int] = {}
        self.discarded = 0
        self.checks_sent = 0
        self._op_loaded_to = 0
        #: epoch group -> epoch -> winning writer tokens (the first record read); see ``load_epoch_records``
        self.epoch_records: dict[str, dict[int, frozenset[str]]] = {}
        #: epoch group -> highest epoch recorded
        self.latest_epoch: dict[str, int] = {}
        #: (half queue offset of the record, group, epoch) in read order, for pruning
        self._record_order: deque[tuple[int, str, int]] = deque()
        self._half_indexed_to = 0
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle (master only) -----------------------------------------------------------------
    def start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        self.load_decisions()
        self.load_epoch_records()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # ---- op topic --------------------------------------------------------------------------------
    def _scan(self, topic: str, start: int) -> tuple[list[MessageExt], int]:
        """Records of ``topic`` queue 0 from queue offset ``start``; (records, next offset)."""
        store = self.ctx.store
        out: list[MessageExt] = []
        offset = max(start, store.get_min_offset_in_queue(topic, 0))
        end = store.get_max_offset_in_queue(topic, 0)
        while offset < end:
            res = store.get_message("", topic, 0, offset, SCAN_BATCH, None)
            if not res.buffers:
                break
            for raw in res.buffers:
                try:
                    out.append(decode_record(raw))
                except RecordFormatError:
                    log.warning("unreadable record in %s at queue offset %d", topic, offset)
            offset = res.next_begin_offset if res.next_begin_offset > offset else offset + len(res.buffers)
        return out, offset

    def load_decisions(self) -> None:
        """Read op records not seen yet (at start, and before each check round: a slave that became master
        has replicated ones)."""
        ops, self._op_loaded_to = self._scan(TRANS_OP_HALF_TOPIC, self._op_loaded_to)
        for op in ops:
            try:
                half_queue_offset = int(op.body.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                log.warning("op record with body %r ignored", op.body[:40])
                continue
            try:
                decision: Decision | None = Decision(op.properties.get(PROPERTY_DECISION, ""))
            except ValueError:
                decision = None
            self.decided.setdefault(half_queue_offset, decision)

    def load_epoch_records(self) -> None:
        """Read epoch records among the half messages not read yet (incremental; at start the whole topic)."""
        halves, self._half_indexed_to = self._scan(TRANS_HALF_TOPIC, self._half_indexed_to)
        for half in halves:
            tag = EpochTag.of(half)
            if tag is None or not tag.record:
                continue
            epochs = self.epoch_records.setdefault(tag.group, {})
            if tag.epoch not in epochs and tag.epoch > self.latest_epoch.get(tag.group, -1):
                epochs[tag.epoch] = parse_winners(bytes(half.body))
                self._record_order.append((half.queue_offset, tag.group, tag.epoch))
            elif tag.epoch not in epochs:
                log.info("epoch record %s/%d ignored: a later epoch is recorded", tag.group, tag.epoch)
            if tag.epoch > self.latest_epoch.get(tag.group, -1):
                self.latest_epoch[tag.group] = tag.epoch
            if half.queue_offset not in self.decided:
                self._write_op(half.queue_offset, Decision.ROLLBACK)

    def _prune_epoch_records(self) -> None:
        """Forget records whose epochs have no undecided half message left (every half message of an epoch's
        winners is stored before its record, so a record below ``scan_from`` decides nothing any more); the
        latest record of each group stays (it says the group moved past older epochs)."""
        order = self._record_order
        while order and order[0][0] < self.scan_from:
            _, group, epoch = order[0]
            if self.latest_epoch.get(group) == epoch:
                break
            order.popleft()
            epochs = self.epoch_records.get(group)
            if epochs is not None:
                epochs.pop(epoch, None)

    def epoch_decision(self, tag: EpochTag) -> Decision | None:
        """COMMIT / ROLLBACK of an epoch half message by the records, None while its epoch is not recorded."""
        winners = self.epoch_records.get(tag.group, {}).get(tag.epoch)
        if winners is not None:
            return Decision.COMMIT if tag.writer in winners else Decision.ROLLBACK
        if self.latest_epoch.get(tag.group, -1) > tag.epoch:
            return Decision.ROLLBACK
        return None

    def epoch_winners(self, tag: EpochTag) -> frozenset[str] | None:
        return self.epoch_records.get(tag.group, {}).get(tag.epoch)

    def _write_op(self, half_queue_offset: int, decision: Decision) -> bool:
        props = {PROPERTY_TAGS: OP_TAGS, PROPERTY_DECISION: decision.value}
        inner = MessageExtBrokerInner(
            topic=TRANS_OP_HALF_TOPIC, queue_id=0, body=str(half_queue_offset).encode("ascii"),
            properties_string=_props_text(props), tags_code=tags_hash_code(OP_TAGS),
            born_timestamp=self.clock_ms(), store_host=self.ctx.store_host, born_host=self.ctx.store_host)
        result = self.ctx.writer.put(inner)
        if result.append_result is None:
            log.error("op record for half message %d not stored: %s", half_queue_offset, result.status.name)
            return False
        self.decided[half_queue_offset] = decision
        self.check_counts.pop(half_queue_offset, None)
        return True

    # ---- END_TRANSACTION -------------------------------------------------------------------------
    def half_message(self, half_phy_offset: int, half_queue_offset: int) -> MessageExt | None:
        """The half message END_TRANSACTION names (None when the offsets do not name one)."""
        half = self.ctx.store.look_message_by_offset(half_phy_offset)
        if half is None or half.topic != TRANS_HALF_TOPIC or half.queue_offset != half_queue_offset:
            return None
        return half

    def decision_of(self, half_queue_offset: int) -> Decision | None:
        return self.decided.get(half_queue_offset)

    def end(self, producer_group: str, half_phy_offset: int, half_queue_offset: int, commit: bool,
            half: MessageExt | None = None) -> EndStatus:
        if half is None:
            half = self.half_message(half_phy_offset, half_queue_offset)
        if half is None:
            return EndStatus.NOT_FOUND
        group = half.properties.get(PROPERTY_PRODUCER_GROUP)
        if group and group != producer_group:
            return EndStatus.WRONG_GROUP
        self.load_decisions()
        tag = EpochTag.of(half)
        if tag is not None:
            self.load_epoch_records()
            if tag.record:
                return EndStatus.EPOCH_RECORDED
            by_record = self.epoch_decision(tag)
            if commit and by_record is None:
                return EndStatus.EPOCH_NOT_RECORDED
            if commit and by_record is Decision.ROLLBACK:
                if half_queue_offset not in self.decided and not self._write_op(half_queue_offset, Decision.ROLLBACK):
                    return EndStatus.STORE_FAILED
                return EndStatus.NOT_IN_EPOCH
            if not commit and by_record is Decision.COMMIT and half_queue_offset not in self.decided:
                return EndStatus.CONFLICT
        wanted = Decision.COMMIT if commit else Decision.ROLLBACK
        if half_queue_offset in self.decided:
            earlier = self.decided[half_queue_offset]
            return EndStatus.ALREADY_DECIDED if earlier in (wanted, None) else EndStatus.CONFLICT
        return self._apply(half, half_queue_offset, wanted)

    def _apply(self, half: MessageExt, half_queue_offset: int, wanted: Decision) -> EndStatus:
        if wanted is Decision.COMMIT and half.properties.get(PROPERTY_EOS_BATCH) == "1":
            result = self._put_batch_native(half)
            if result is None:
                inners = self._real_batch(half)
                if inners is None:
                    return EndStatus.STORE_FAILED
                result = self.ctx.writer.put_batch(inners)
            if result.append_result is None:
                log.error("committed batch of half %d not stored: %s", half_queue_offset, result.status.name)
                return EndStatus.STORE_FAILED
        elif wanted is Decision.COMMIT:
            result = self.ctx.writer.put(self._real_message(half))
            if result.append_result is None:
                log.error("committed message of half %d not stored: %s", half_queue_offset, result.status.name)
                return EndStatus.STORE_FAILED
        if not self._write_op(half_queue_offset, wanted):
            return EndStatus.STORE_FAILED
        return EndStatus.APPLIED

    def _real_message(self, half: MessageExt) -> MessageExtBrokerInner:
        props = dict(half.properties)
        topic = props.get(PROPERTY_REAL_TOPIC, "")
        queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, "0") or 0)
        for name in _TRANSACTION_PROPERTIES:
            props.pop(name, None)
        from ferrymq.broker.processors.send import index_keys  # (the send path's key rule)

        return MessageExtBrokerInner(
            topic=topic, queue_id=queue_id, body=bytes(half.body), flag=half.flag,
            properties_string=_props_text(props), tags_code=tags_hash_code(props.get(PROPERTY_TAGS)),
            sys_flag=(half.sys_flag & ~SYSFLAG_TRANSACTION_MASK) | SYSFLAG_TRANSACTION_COMMIT,
            born_timestamp=half.born_timestamp, born_host=half.born_host, store_host=self.ctx.store_host,
            reconsume_times=half.reconsume_times, prepared_transaction_offset=half.phy_offset,
            index_keys=index_keys(props))

    def _put_batch_native(self, half: MessageExt) -> Any:
        """The commit of an ``EOS_BATCH`` half message through the store's native SEND_BATCH put (the records
        ``_real_batch`` + ``put_batch`` would store, without ``preparedTransactionOffset``); None when it
        declines (no C extension, unusual entries): the Python path stores it."""
        props = half.properties
        group = props.get(PROPERTY_PRODUCER_GROUP)
        try:
            merge = (f"{PROPERTY_PRODUCER_GROUP}{NAME_VALUE_SEPARATOR}{group}" if group else "").encode("ascii")
            cluster = props.get(PROPERTY_CLUSTER, "").encode("ascii")
            queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, "0") or 0)
        except (UnicodeEncodeError, ValueError):
            return None
        return self.ctx.writer.put_batch_raw(
            props.get(PROPERTY_REAL_TOPIC, ""), queue_id, bytes(half.body), merge, cluster,
            half.sys_flag & ~SYSFLAG_TRANSACTION_MASK, half.born_timestamp, half.born_host, self.ctx.store_host, 0)

    def _real_batch(self, half: MessageExt) -> list[MessageExtBrokerInner] | None:
        """The messages of an ``EOS_BATCH`` half message (its body: a SEND_BATCH body), for its real queue, each
        with its own properties plus the half message's cluster and producer group; None when unreadable."""
        from ferrymq.broker.processors.send import index_keys  # (the send path's key rule)

        topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
        queue_id = int(half.properties.get(PROPERTY_REAL_QUEUE_ID, "0") or 0)
        shared = {k: half.properties[k] for k in (PROPERTY_CLUSTER, PROPERTY_PRODUCER_GROUP) if k in half.properties}
        try:
            entries = decode_batch_body(bytes(half.body))
        except (RecordFormatError, ValueError) as exc:
            log.error("half message %d: unreadable batch body (%s); not committed", half.queue_offset, exc)
            return None
        # one batch put (one append: all or none); the store's batch path takes no transaction type, so these
        # messages carry sysFlag TRANSACTION_NOT_TYPE (consumers do not look at it) and name the half message by
        # preparedTransactionOffset
        sys_flag = half.sys_flag & ~SYSFLAG_TRANSACTION_MASK
        inners = []
        for flag, body, props_text in entries:
            props = {**string_to_properties(props_text), **shared}
            inners.append(MessageExtBrokerInner(
                topic=topic, queue_id=queue_id, body=body, flag=flag, properties_string=_props_text(props),
                tags_code=tags_hash_code(props.get(PROPERTY_TAGS)), sys_flag=sys_flag,
                born_timestamp=half.born_timestamp, born_host=half.born_host, store_host=self.ctx.store_host,
                reconsume_times=0, prepared_transaction_offset=half.phy_offset, index_keys=index_keys(props)))
        return inners or None

    # ---- check-back ------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.check_interval_ms / 1000)
            try:
                self.check_once()
            except Exception:
                log.exception("transaction check round failed")

    def check_once(self) -> int:
        """One check round; the number of CHECK_TRANSACTION_STATE requests sent."""
        self.load_decisions()
        self.load_epoch_records()
        halves, _ = self._scan(TRANS_HALF_TOPIC, self.scan_from)
        now = self.clock_ms()
        sent = 0
        all_decided_below = True
        for half in halves[:MAX_CHECKS_PER_ROUND]:
            qo = half.queue_offset
            if qo in self.decided:
                if all_decided_below:
                    self.scan_from = qo + 1
                continue
            all_decided_below = False
            tag = EpochTag.of(half)
            by_record = self.epoch_decision(tag) if tag is not None else None
            if by_record is not None:
                log.debug("half message %s (queue offset %d) decided %s by the record of epoch %s/%d",
                         half.msg_id, qo, by_record.value, tag.group if tag else "", tag.epoch if tag else -1)
                self._apply(half, qo, by_record)
                continue
            immunity = half.properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
            wait_ms = self.config.timeout_ms
            if immunity and immunity.isdigit():
                wait_ms = max(wait_ms, int(immunity) * 1000)
            if now - half.store_timestamp < wait_ms:
                continue
            count = self.check_counts.get(qo, 0)
            if count >= self.config.check_max:
                log.warning("half message %s (queue offset %d, group %s) discarded after %d check-backs",
                            half.msg_id, qo, half.properties.get(PROPERTY_PRODUCER_GROUP), count)
                if self._write_op(qo, Decision.DISCARD):
                    self.discarded += 1
                continue
            self.check_counts[qo] = count + 1
            if self._send_check(half):
                sent += 1
        self.checks_sent += sent
        self._prune_epoch_records()
        return sent

    def _send_check(self, half: MessageExt) -> bool:
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        channels = [ch for ch in self.ctx.producers.channels(group) if not getattr(ch.conn, "closed", True)]
        if not channels:
            log.info("no live producer of group %r to ask about half message %s", group, half.msg_id)
            return False
        raw = self.ctx.store.select_one_message_by_offset(half.phy_offset)
        if raw is None:
            return False
        ch = channels[half.queue_offset % len(channels)]
        cmd = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {
            "tranStateTableOffset": half.queue_offset, "commitLogOffset": half.phy_offset,
            "msgId": half.msg_id, "transactionId": half.properties.get(PROPERTY_TRANSACTION_ID, half.msg_id),
            "offsetMsgId": half.offset_msg_id, "producerGroup": group}, bytes(raw))
        try:
            ch.conn.invoke_oneway(cmd)
        except Exception as exc:
            log.info("check-back to %s failed: %s", ch.client_id, exc)
            return False
        return True
