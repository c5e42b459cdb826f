"""PULL_MESSAGE (11) — protocol §2.7 PULL, §6.8, §6.9.

Checks: broker not readable → 16; group unknown (no auto-create) → 26; group consume disabled → 16;
topic unknown → 17; topic not readable → 16; queueId out of range → 1; subscription from the request
(flag 4) or the heartbeat (none → 24, older subVersion → 25). Expression type SQL92: refused with 1 unless
``enablePropertyFilter``; a selector that does not compile → 23 from the request's subscription, 27 from
the heartbeat's (its remark names the error position). Store status → code via
``status_codes.pull_code``; a slave rewrites 21 to 20. 19 + suspend flag → parked (long polling).
The response header always carries suggestWhichBrokerId, nextBeginOffset, minOffset, maxOffset.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ferrymq.broker.headers import PullHeader
from ferrymq.broker.status_codes import pull_code
from ferrymq.common.sql92 import EXPRESSION_TYPE_SQL92, SqlParseError, compile_selector, is_tag_type
from ferrymq.common.topic import is_readable
from ferrymq.errors import ProtocolError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from ferrymq.store.filter import MessageFilter, SqlFilter, TagFilter, parse_subscription

if TYPE_CHECKING:
    from ferrymq.broker.context import PullContext

log = logging.getLogger(__name__)

MASTER_ID = 0


class PullProcessor:
    def __init__(self, ctx: PullContext) -> None:
        self.ctx = ctx

    def register(self, dispatcher: Any) -> None:
        dispatcher.register(RequestCode.PULL_MESSAGE, self.handle)

    def handle(self, conn: Any, cmd: RemotingCommand) -> Any:
        return self.process(conn, cmd, allow_suspend=True)

    def rerun(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | None:
        result = self.process(conn, cmd, allow_suspend=False)
        assert result is None or isinstance(result, RemotingCommand)
        return result

    def process(self, conn: Any, cmd: RemotingCommand, *, allow_suspend: bool) -> Any:
        ctx = self.ctx
        try:
            h = PullHeader.parse(cmd)
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        if not is_readable(ctx.config.broker_permission):
            return cmd.response(R.NO_PERMISSION, remark=f"the broker[{ctx.config.broker_ip1}] pulling message is "
                                                        "forbidden")
        sg = ctx.groups.find(h.consumer_group)
        if sg is None:
            return cmd.response(R.SUBSCRIPTION_GROUP_NOT_EXIST,
                                remark=f"subscription group [{h.consumer_group}] does not exist")
        if not sg.consume_enable:
            return cmd.response(R.NO_PERMISSION, remark=f"subscription group no permission, {h.consumer_group}")
        tc = ctx.topics.get(h.topic)
        if tc is None:
            return cmd.response(R.TOPIC_NOT_EXIST, remark=f"topic[{h.topic}] not exist, apply first please!")
        if not is_readable(tc.perm):
            return cmd.response(R.NO_PERMISSION, remark=f"the topic[{h.topic}] pulling message is forbidden")
        if h.queue_id < 0 or h.queue_id >= tc.read_queue_nums:
            return cmd.response(R.SYSTEM_ERROR, remark=f"queueId[{h.queue_id}] is illegal, topic:[{h.topic}] "
                                                       f"topicConfig.readQueueNums:[{tc.read_queue_nums}] "
                                                       f"consumer:[{conn.peer_addr if conn else ''}]")
        if h.has_subscription:
            built = self._build_filter(h.expression_type, h.subscription, R.SUBSCRIPTION_PARSE_FAILED,
                                       "parse the consumer's subscription failed")
        else:
            sub = ctx.consumers.subscription(h.consumer_group, h.topic)
            if sub is None:
                return cmd.response(R.SUBSCRIPTION_NOT_EXIST,
                                    remark=f"the consumer's subscription not exist, group: {h.consumer_group}")
            if sub.sub_version < h.sub_version:
                return cmd.response(R.SUBSCRIPTION_NOT_LATEST, remark="the consumer's subscription not latest")
            built = self._build_filter(sub.expression_type, sub.sub_string, R.FILTER_DATA_NOT_EXIST,
                                       "The broker's consumer filter data is not exist!Your expression may be wrong!")
        if isinstance(built, tuple):
            return cmd.response(built[0], remark=built[1])
        message_filter = built

        result = ctx.store.get_message(h.consumer_group, h.topic, h.queue_id, h.queue_offset, h.max_msg_nums,
                                       message_filter)
        code = pull_code(result.status, h.queue_offset)
        next_begin = result.next_begin_offset
        if ctx.config.is_slave and code == R.PULL_OFFSET_MOVED:
            code = R.PULL_RETRY_IMMEDIATELY
        if ctx.config.slave_read_enable:
            suggest = sg.which_broker_when_consume_slowly if result.suggest_pulling_from_slave else sg.broker_id
        else:
            suggest = MASTER_ID
        header = {
            "suggestWhichBrokerId": suggest,
            "nextBeginOffset": next_begin,
            "minOffset": result.min_offset,
            "maxOffset": result.max_offset,
        }
        if code == R.PULL_NOT_FOUND and allow_suspend and h.has_suspend:
            hold = ctx.long_polling
            if hold.can_park():
                timeout_ms = h.suspend_timeout_ms if ctx.config.long_polling_enable else \
                    ctx.config.short_polling_time_ms
                self._commit(h, allow_suspend)
                return hold.park(conn, cmd, h.topic, h.queue_id, h.queue_offset, timeout_ms)
        self._commit(h, allow_suspend)
        stats = ctx.stats
        stats.pull_requests_total += 1
        if code == R.SUCCESS:
            stats.on_get(h.topic, result.message_count, result.buffer_total_size, h.consumer_group)
        else:
            stats.pull_misses_total += 1
        body = result.body() if code == R.SUCCESS else b""
        return cmd.response(code, header, body, remark=result.status.name)

    def _build_filter(self, expression_type: str, expression: str | None, parse_failed: R,
                      parse_failed_remark: str) -> MessageFilter | None | tuple[R, str]:
        """The filter of a subscription (None: it takes every message, e.g. "*"), or (code, remark) when it
        cannot be served."""
        if is_tag_type(expression_type):
            return None if parse_subscription(expression) is None else TagFilter(expression)
        if expression_type.upper() != EXPRESSION_TYPE_SQL92 or not self.ctx.config.enable_property_filter:
            return R.SYSTEM_ERROR, (f"The broker does not support consumer to filter message by {expression_type}"
                                    + ("" if expression_type.upper() != EXPRESSION_TYPE_SQL92 else
                                       " (set enablePropertyFilter=true in the broker config)"))
        try:
            return SqlFilter(compile_selector(expression or ""))
        except SqlParseError as exc:
            return parse_failed, f"{parse_failed_remark} {exc}"

    def _commit(self, h: PullHeader, allow_suspend: bool) -> None:
        """Commit the consumer's offset: only with the flag, not on re-runs, not on a slave (§2.7)."""
        if allow_suspend and h.has_commit_offset and not self.ctx.config.is_slave and h.commit_offset >= 0:
            self.ctx.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
