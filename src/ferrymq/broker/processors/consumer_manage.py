"""QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_CONSUMER_LIST_BY_GROUP (38) — §2.7."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ferrymq.broker.headers import get_int, get_str
from ferrymq.errors import ProtocolError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import ConsumerManageContext

QUERY_NOT_FOUND_REMARK = "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"


class ConsumerManageProcessor:
    def __init__(self, ctx: ConsumerManageContext) -> None:
        self.ctx = ctx

    def register(self, dispatcher: Any) -> None:
        dispatcher.register(RequestCode.QUERY_CONSUMER_OFFSET, self.query_offset)
        dispatcher.register(RequestCode.UPDATE_CONSUMER_OFFSET, self.update_offset)
        dispatcher.register(RequestCode.GET_CONSUMER_LIST_BY_GROUP, self.consumer_list)

    def consumer_list(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.ext_fields.get("consumerGroup") or ""
        info = self.ctx.consumers.get(group)
        ids = info.client_ids() if info is not None else []
        if not ids:
            return cmd.response(R.SYSTEM_ERROR, remark=f"no consumer for this group, {group}")
        return cmd.response(R.SUCCESS, body=jsonx.dumps({"consumerIdList": ids}))

    def query_offset(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            group, topic = get_str(cmd, "consumerGroup"), get_str(cmd, "topic")
            queue_id = get_int(cmd, "queueId")
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        offset = self.ctx.offsets.query(group, topic, queue_id)
        if offset >= 0:
            return cmd.response(R.SUCCESS, {"offset": offset})
        store = self.ctx.store
        min_offset = store.get_min_offset_in_queue(topic, queue_id)
        if min_offset <= 0 and not self._first_message_in_disk(topic, queue_id):
            return cmd.response(R.SUCCESS, {"offset": 0})
        return cmd.response(R.QUERY_NOT_FOUND, {"offset": -1}, remark=QUERY_NOT_FOUND_REMARK)

    def _first_message_in_disk(self, topic: str, queue_id: int) -> bool:
        store = self.ctx.store
        units = store.get_consume_queue_units(topic, queue_id, 0, 1)
        if not units:
            return False
        return store.max_phy_offset - units[0][0] > self.ctx.hot_data_bytes

    def update_offset(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            group, topic = get_str(cmd, "consumerGroup"), get_str(cmd, "topic")
            queue_id = get_int(cmd, "queueId")
            offset = get_int(cmd, "commitOffset")
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        self.ctx.offsets.commit(group, topic, queue_id, offset)
        return cmd.response(R.SUCCESS)
