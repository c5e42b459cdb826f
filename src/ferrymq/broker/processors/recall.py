"""RECALL_MESSAGE (370, RocketMQ 5) and GET_TIMER_CHECK_POINT (60): recalling a pending timer message, and the
timer checkpoint a slave copies (broker/timer.py, docs/timers.md).

RECALL_MESSAGE request header:

| field          | meaning                                                   |
|----------------|-----------------------------------------------------------|
| producerGroup  | the recalling producer's group (kept on the marker: PGROUP) |
| topic          | the message's topic (must be the handle's)                |
| recallHandle   | the handle the send answered (common/timer.py)            |

Response header: ``msgId`` (the recalled message's id). Outcomes: broker/status_codes.py RECALL_STATUS_TABLE.
Checks in order: slave → 11; controller-mode lease lost → 14; unknown topic → 17; handle unreadable, of another
topic, of another broker, or with a delivery time past or beyond timerMaxDelaySec → 604; the timer service still
loading → 14; no pending, not recalled message with that id → 22; else a recall marker is stored in the timer
topic (persistent: the message is not delivered after a restart either) and the answer is 0.

GET_TIMER_CHECK_POINT answers the timer checkpoint file's object as the JSON body (``timerCheckpoint.json``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ferrymq.broker.processors.send import born_host_of
from ferrymq.broker.status_codes import RECALL_STATUS_TABLE, RecallStatus
from ferrymq.common.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    MessageExtBrokerInner,
    properties_to_string,
)
from ferrymq.common.timer import (
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_OUT_MS,
    TIMER_QUEUE_ID,
    TIMER_TOPIC,
    RecallHandle,
    delete_key,
)
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import RecallContext

#: body of a recall marker record (RocketMQ stores "0")
RECALL_MARKER_BODY = b"0"


class RecallProcessor:
    def __init__(self, ctx: RecallContext) -> None:
        self.ctx = ctx

    def register(self, d: Any) -> None:
        d.register(RequestCode.RECALL_MESSAGE, self.recall)
        d.register(RequestCode.GET_TIMER_CHECK_POINT, self.checkpoint)

    def checkpoint(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(R.SUCCESS, body=jsonx.dumps(self.ctx.timer.encode()))

    def _answer(self, cmd: RemotingCommand, status: RecallStatus, detail: str = "",
                msg_id: str | None = None) -> RemotingCommand:
        outcome = RECALL_STATUS_TABLE[status]
        remark = outcome.remark
        if remark is not None and detail:
            remark = f"{remark}: {detail}"
        fields = {"msgId": msg_id} if msg_id is not None else None
        return cmd.response(outcome.code, fields, remark=remark)

    def recall(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        ctx = self.ctx
        ext = cmd.ext_fields
        if ctx.config.is_slave:
            return self._answer(cmd, RecallStatus.SLAVE)
        role = ctx.controller_role
        if role is not None and not role.can_ack():
            return self._answer(cmd, RecallStatus.NOT_SERVING, role.refusal_remark())
        topic = ext.get("topic") or ""
        if ctx.topics.get(topic) is None:
            return self._answer(cmd, RecallStatus.TOPIC_NOT_EXIST, topic)
        try:
            handle = RecallHandle.decode(ext.get("recallHandle") or "")
        except ValueError as exc:
            return self._answer(cmd, RecallStatus.HANDLE_INVALID, str(exc))
        if handle.topic != topic:
            return self._answer(cmd, RecallStatus.TOPIC_MISMATCH, f"the handle is of topic {handle.topic}")
        if handle.broker_name != ctx.config.broker_name:
            return self._answer(cmd, RecallStatus.OTHER_BROKER, handle.broker_name)
        time_left_ms = handle.deliver_ms - ctx.clock_ms()
        if time_left_ms <= 0 or time_left_ms > ctx.config.timer_max_delay_sec * 1000:
            return self._answer(cmd, RecallStatus.TIMESTAMP_INVALID, f"{time_left_ms} ms ahead")
        timer = ctx.timer
        timer.scan()  # units dispatched since its last turn
        if not timer.caught_up:
            return self._answer(cmd, RecallStatus.NOT_SERVING)
        key = delete_key(topic, handle.message_id)
        deliver_ms = timer.pending_deliver_ms(key)
        if deliver_ms is None:
            return self._answer(cmd, RecallStatus.NOT_PENDING, f"message {handle.message_id} of topic {topic}")
        props = {
            PROPERTY_TIMER_DEL_UNIQKEY: key,
            PROPERTY_TIMER_OUT_MS: str(deliver_ms),
            PROPERTY_REAL_TOPIC: topic,
            PROPERTY_REAL_QUEUE_ID: "0",
            PROPERTY_PRODUCER_GROUP: ext.get("producerGroup") or "",
        }
        born_host = born_host_of(conn)
        marker = MessageExtBrokerInner(
            topic=TIMER_TOPIC, queue_id=TIMER_QUEUE_ID, body=RECALL_MARKER_BODY,
            properties_string=properties_to_string(props), born_timestamp=ctx.clock_ms(), born_host=born_host,
            store_host=ctx.store_host, wait_store_msg_ok=False)
        result = ctx.writer.put(marker)
        if result.append_result is None:
            return self._answer(cmd, RecallStatus.STORE_FAILED, str(getattr(result.status, "name", result.status)))
        timer.recalled(key, deliver_ms)
        return self._answer(cmd, RecallStatus.RECALLED, msg_id=handle.message_id)
