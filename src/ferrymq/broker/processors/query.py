"""VIEW_MESSAGE_BY_ID (33) and QUERY_MESSAGE (12) — protocol §2.4, §5.2.

VIEW: header ``offset`` = commit log offset decoded from the offset msgId; body = the raw record.
QUERY: by ``topic`` + ``key`` within [beginTimestamp, endTimestamp]; ``_UNIQUE_KEY_QUERY=true`` forces
maxNum to 32. Body = concatenated raw records; header indexLastUpdateTimestamp/indexLastUpdatePhyoffset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ferrymq.broker.headers import get_int, get_str
from ferrymq.errors import ProtocolError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import QueryContext

DEFAULT_QUERY_MAX_NUM = 32


class QueryProcessor:
    def __init__(self, ctx: QueryContext) -> None:
        self.ctx = ctx

    def register(self, dispatcher: Any) -> None:
        dispatcher.register(RequestCode.VIEW_MESSAGE_BY_ID, self.view_by_id)
        dispatcher.register(RequestCode.QUERY_MESSAGE, self.query_message)

    def view_by_id(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            offset = get_int(cmd, "offset")
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        record = self.ctx.store.select_one_message_by_offset(offset) if offset >= 0 else None
        if record is None:
            return cmd.response(R.SYSTEM_ERROR, remark=f"can not find message by the offset, {offset}")
        return cmd.response(R.SUCCESS, body=bytes(record))

    def query_message(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            topic, key = get_str(cmd, "topic"), get_str(cmd, "key")
            max_num = get_int(cmd, "maxNum", DEFAULT_QUERY_MAX_NUM)
            begin = get_int(cmd, "beginTimestamp", 0)
            end = get_int(cmd, "endTimestamp", 2**62)
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        if (cmd.ext_fields.get("_UNIQUE_KEY_QUERY") or "").lower() == "true":
            max_num = DEFAULT_QUERY_MAX_NUM
        result = self.ctx.store.query_message(topic, key, max_num, begin, end)
        header = {"indexLastUpdateTimestamp": result.index_last_update_timestamp,
                  "indexLastUpdatePhyoffset": result.index_last_update_phy_offset}
        if not result.buffers:
            return cmd.response(R.QUERY_NOT_FOUND, header,
                                remark="can not find message, maybe time range not correct")
        return cmd.response(R.SUCCESS, header, body=result.body())
