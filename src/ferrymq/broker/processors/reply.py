"""SEND_REPLY_MESSAGE (324), SEND_REPLY_MESSAGE_V2 (325) → PUSH_REPLY_MESSAGE_TO_CLIENT (326): request-reply,
as RocketMQ 4.6+ brokers do it.

A responder sends the reply (topic ``<cluster>_REPLY_TOPIC``, properties CORRELATION_ID, REPLY_TO_CLIENT,
TTL, MSG_TYPE=reply) with 324 (SEND header) or 325 (V2 header). The broker

1. pushes it to the requester: the open connection of the client whose id is the REPLY_TO_CLIENT value,
   among the producers and consumers that heartbeat here, as a 326 request whose header is the send header
   plus bornHost, storeHost and storeTimestamp, with PUSH_REPLY_TIME added to the properties;
2. stores it in the reply topic too (``storeReplyMessageEnable``, default true).

The answer is SUCCESS when the push was answered SUCCESS (msgId/queueId/queueOffset of the stored copy, or
"0"/queueId/0 when not stored), else SYSTEM_ERROR naming the cause (no REPLY_TO_CLIENT, requester not
connected here, push failed). Checks before that: slave → 14; topic name invalid → 1; topic unknown → 17;
queueId out of range → 1; body too large → 13.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from ferrymq.broker.headers import SendHeader
from ferrymq.broker.processors.send import MSG_REGION, born_host_of, index_keys
from ferrymq.broker.status_codes import SERVICE_NOT_AVAILABLE_REMARK, send_outcome
from ferrymq.common.message import (
    PROPERTY_MESSAGE_REPLY_TO_CLIENT,
    PROPERTY_PUSH_REPLY_TIME,
    PROPERTY_TAGS,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageExtBrokerInner,
    bytes_to_host,
    properties_to_string,
    string_to_properties,
    tags_hash_code,
)
from ferrymq.common.topic import validate_topic
from ferrymq.errors import FerryError, ProtocolError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.codes import ResponseCode as R
from ferrymq.store.results import PutMessageStatus

if TYPE_CHECKING:
    from ferrymq.broker.context import ReplyContext

log = logging.getLogger(__name__)

#: how long the broker waits for the requester to answer a PUSH_REPLY_MESSAGE_TO_CLIENT
PUSH_REPLY_TIMEOUT_MS = 3_000


class ReplyProcessor:
    def __init__(self, ctx: ReplyContext) -> None:
        self.ctx = ctx

    def register(self, dispatcher: Any) -> None:
        for code in (RequestCode.SEND_REPLY_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2):
            dispatcher.register(code, self.handle)

    def handle(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        ctx = self.ctx
        role = ctx.controller_role
        if ctx.config.is_slave or (role is not None and not role.can_ack()):
            return cmd.response(R.SERVICE_NOT_AVAILABLE, remark=SERVICE_NOT_AVAILABLE_REMARK)
        try:
            h = SendHeader.parse(cmd)
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        reason = validate_topic(h.topic)
        if reason is not None:
            return cmd.response(R.SYSTEM_ERROR, remark=reason)
        tc = ctx.topics.get(h.topic)
        if tc is None:
            return cmd.response(R.TOPIC_NOT_EXIST, remark=f"topic[{h.topic}] not exist, apply first please!")
        if h.queue_id >= max(tc.write_queue_nums, tc.read_queue_nums):
            return cmd.response(R.SYSTEM_ERROR, remark=f"request queueId[{h.queue_id}] is illegal, {h.topic}")
        if len(cmd.body) > ctx.config.max_message_size:
            return cmd.response(R.MESSAGE_ILLEGAL, remark=f"message body size exceeded, max "
                                                          f"{ctx.config.max_message_size}")
        queue_id = h.queue_id if h.queue_id >= 0 else ctx.topics.random_queue_id(tc)
        return self._reply(conn, cmd, h, queue_id)

    async def _reply(self, conn: Any, cmd: RemotingCommand, h: SendHeader, queue_id: int) -> RemotingCommand:
        props = string_to_properties(h.properties)
        pushed, remark = await self._push(conn, h, props, cmd.body)
        header: dict[str, Any] = {"msgId": "0", "queueId": queue_id, "queueOffset": 0,
                                  "MSG_REGION": MSG_REGION, "TRACE_ON": "true"}
        if self.ctx.config.store_reply_message_enable:
            stored = await self._store(conn, cmd, h, queue_id, props)
            if stored is not None:
                header["msgId"], header["queueOffset"] = stored
        if not pushed:
            return cmd.response(R.SYSTEM_ERROR, header, remark=remark)
        return cmd.response(R.SUCCESS, header)

    async def _push(self, conn: Any, h: SendHeader, props: dict[str, str], body: bytes) -> tuple[bool, str]:
        ctx = self.ctx
        client_id = props.get(PROPERTY_MESSAGE_REPLY_TO_CLIENT)
        if not client_id:
            return False, f"reply message properties[{PROPERTY_MESSAGE_REPLY_TO_CLIENT}] is null"
        channel = ctx.producers.find_channel(client_id) or ctx.consumers.find_channel(client_id)
        if channel is None:
            remark = f"push reply message fail, channel of <{client_id}> not found."
            log.warning("%s", remark)
            return False, remark
        pushed_props = dict(props)
        pushed_props[PROPERTY_PUSH_REPLY_TIME] = str(int(time.time() * 1000))
        ip, port = bytes_to_host(born_host_of(conn))
        push = RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, {
            "producerGroup": h.producer_group, "topic": h.topic, "defaultTopic": h.default_topic,
            "defaultTopicQueueNums": h.default_topic_queue_nums, "queueId": h.queue_id, "sysFlag": h.sys_flag,
            "bornTimestamp": h.born_timestamp, "flag": h.flag, "properties": properties_to_string(pushed_props),
            "reconsumeTimes": h.reconsume_times, "unitMode": h.unit_mode, "bornHost": f"{ip}:{port}",
            "storeHost": f"{ctx.config.broker_ip1}:{ctx.port}", "storeTimestamp": int(time.time() * 1000),
        }, body)
        try:
            answer = await channel.conn.invoke(push, PUSH_REPLY_TIMEOUT_MS)
        except FerryError as exc:
            log.warning("push reply message to <%s> failed: %s", client_id, exc)
            return False, f"push reply message to {client_id} fail."
        if answer.code != ResponseCode.SUCCESS:
            log.warning("push reply message to <%s> answered %s: %s", client_id, answer.code, answer.remark)
            return False, f"push reply message to {client_id} fail."
        return True, ""

    async def _store(self, conn: Any, cmd: RemotingCommand, h: SendHeader, queue_id: int,
                     props: dict[str, str]) -> tuple[str, int] | None:
        """Store the reply in its topic; (offset msgId, queue offset), or None when the put failed."""
        ctx = self.ctx
        wait = props.pop(PROPERTY_WAIT_STORE_MSG_OK, "true").lower() != "false"
        inner = MessageExtBrokerInner(
            topic=h.topic, queue_id=queue_id, body=cmd.body, flag=h.flag,
            properties_string=properties_to_string(props), tags_code=tags_hash_code(props.get(PROPERTY_TAGS)),
            sys_flag=h.sys_flag, born_timestamp=h.born_timestamp, born_host=born_host_of(conn),
            store_host=ctx.store_host, reconsume_times=h.reconsume_times, index_keys=index_keys(props),
            wait_store_msg_ok=wait,
        )
        result = ctx.writer.put(inner)
        status = result.status.name
        if result.status is PutMessageStatus.PUT_OK and ctx.writer.needs_wait(wait):
            status = await ctx.writer.wait_stored(result)
        if not send_outcome(status).stored or result.append_result is None:
            log.warning("reply message to %s not stored: %s", h.topic, status)
            return None
        ar = result.append_result
        return ar.msg_id, ar.queue_offset
