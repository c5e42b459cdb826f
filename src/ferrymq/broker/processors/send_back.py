"""CONSUMER_SEND_MSG_BACK (36) — protocol §2.7.

The message at commit log ``offset`` is re-stored to ``%RETRY%<group>`` with delay level
``delayLevel`` (0 → 3 + reconsumeTimes), or to ``%DLQ%<group>`` once reconsumeTimes reaches
maxReconsumeTimes (header, else the group's retryMaxTimes; at most the broker's maxReconsumeTimes) or when
delayLevel < 0.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ferrymq.broker.headers import get_int, get_str
from ferrymq.broker.processors.send import index_keys, max_reconsume_times
from ferrymq.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageExtBrokerInner,
    properties_to_string,
    tags_hash_code,
)
from ferrymq.common.topic import PERM_READ, PERM_WRITE, SCHEDULE_TOPIC, dlq_topic, retry_topic
from ferrymq.errors import ProtocolError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import SendBackContext

log = logging.getLogger(__name__)

#: delay level of the first retry is 3 + reconsumeTimes when the client leaves it to the broker
RETRY_BASE_DELAY_LEVEL = 3


class SendBackProcessor:
    def __init__(self, ctx: SendBackContext) -> None:
        self.ctx = ctx

    def register(self, dispatcher: Any) -> None:
        dispatcher.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.handle)

    def handle(self, conn: Any, cmd: RemotingCommand) -> Any:
        ctx = self.ctx
        if ctx.config.is_slave:
            return cmd.response(R.SYSTEM_ERROR, remark="SERVICE_NOT_AVAILABLE")
        try:
            phy_offset = get_int(cmd, "offset")
            group = get_str(cmd, "group")
            delay_level = get_int(cmd, "delayLevel", 0)
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        sg = ctx.groups.find(group)
        if sg is None:
            return cmd.response(R.SUBSCRIPTION_GROUP_NOT_EXIST, remark=f"subscription group not exist, {group}")
        msg = ctx.store.look_message_by_offset(phy_offset)
        if msg is None:
            return cmd.response(R.SYSTEM_ERROR, remark=f"look message by offset failed, {phy_offset}")
        props = dict(msg.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
        raw_max = cmd.ext_fields.get("maxReconsumeTimes")
        try:
            header_max = get_int(cmd, "maxReconsumeTimes") if raw_max not in (None, "") else None
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        max_rt = max_reconsume_times(sg.retry_max_times, cmd.version, header_max, ctx.config.max_reconsume_times)
        reconsume = msg.reconsume_times
        if reconsume >= max_rt or delay_level < 0:
            topic = dlq_topic(group)
            ctx.topics.create_sys_group_topic(topic, 1, PERM_READ | PERM_WRITE)
            queue_id = 0
            props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        else:
            topic = retry_topic(group)
            ctx.topics.create_sys_group_topic(topic, max(1, sg.retry_queue_nums), PERM_READ | PERM_WRITE)
            queue_id = 0
            level = delay_level if delay_level > 0 else RETRY_BASE_DELAY_LEVEL + reconsume
            level = min(level, ctx.schedule_max_level)
            props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
        if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
            props[PROPERTY_ORIGIN_MESSAGE_ID] = msg.offset_msg_id
        store_topic, store_qid = topic, queue_id
        if PROPERTY_DELAY_TIME_LEVEL in props:
            props[PROPERTY_REAL_TOPIC] = topic
            props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
            store_topic, store_qid = SCHEDULE_TOPIC, int(props[PROPERTY_DELAY_TIME_LEVEL]) - 1
        props.pop(PROPERTY_WAIT_STORE_MSG_OK, None)
        inner = MessageExtBrokerInner(
            topic=store_topic, queue_id=store_qid, body=msg.body, flag=msg.flag,
            properties_string=properties_to_string(props), tags_code=tags_hash_code(props.get("TAGS")),
            sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
            store_host=msg.store_host, reconsume_times=reconsume + 1, index_keys=index_keys(props),
            wait_store_msg_ok=False,
        )
        result = ctx.writer.put(inner)
        if result.append_result is None:
            return cmd.response(R.SYSTEM_ERROR, remark=result.status.name)
        if store_topic == SCHEDULE_TOPIC:
            ctx.wake_schedule()
        ctx.stats.on_send_back(props.get(PROPERTY_RETRY_TOPIC, msg.topic), group)
        return cmd.response(R.SUCCESS)
