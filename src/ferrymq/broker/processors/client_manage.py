"""HEART_BEAT (34), UNREGISTER_CLIENT (35), CHECK_CLIENT_CONFIG (46) — protocol §2.7, §3.4.

CHECK_CLIENT_CONFIG is what a Java push consumer asks at start for a non-TAG subscription: SQL92 needs
``enablePropertyFilter`` (else 1) and a selector that compiles (else 23, the remark naming the position).
A heartbeat's SQL92 subscription is compiled (and cached) when it arrives; one that does not compile is
logged, and pulls that rely on it get 27 (FILTER_DATA_NOT_EXIST).

Heartbeat bodies differ by client: C++ sends enums as ints, subVersion as a string, omits empty sets
and ends with ``\\n``; ali-ons sends names and numbers. Each consumer group gets its config and its
``%RETRY%<group>`` topic (1 queue, perm 6) auto-created; a new retry topic is registered soon (coalesced,
registration.py).

A heartbeat declaring more than HEARTBEAT_STEP_GROUPS groups is served in steps of that many groups, yielding
to the event loop between steps, so one client declaring thousands of groups does not hold the broker; each
group costs O(its subscriptions) (journaled config and retry topic, config_file.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ferrymq.broker.consumer_manager import ConsumerData
from ferrymq.common.sql92 import (
    EXPRESSION_TYPE_SQL92,
    EXPRESSION_TYPE_TAG,
    SqlParseError,
    compile_selector,
    is_tag_type,
)
from ferrymq.common.topic import PERM_READ, PERM_WRITE, retry_topic
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import ClientManageContext

log = logging.getLogger(__name__)

#: consumer groups of one heartbeat served between two yields to the event loop
HEARTBEAT_STEP_GROUPS = 64


class ClientManageProcessor:
    def __init__(self, ctx: ClientManageContext) -> None:
        self.ctx = ctx

    def register(self, dispatcher: Any) -> None:
        dispatcher.register(RequestCode.HEART_BEAT, self.heart_beat)
        dispatcher.register(RequestCode.UNREGISTER_CLIENT, self.unregister_client)
        dispatcher.register(RequestCode.CHECK_CLIENT_CONFIG, self.check_client_config)

    def heart_beat(self, conn: Any, cmd: RemotingCommand) -> Any:
        try:
            data = jsonx.loads(cmd.body) if cmd.body.strip() else {}
        except ValueError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=f"bad heartbeat body: {exc}")
        if not isinstance(data, dict):
            return cmd.response(R.SYSTEM_ERROR, remark="heartbeat body is not an object")
        client_id = str(data.get("clientID") or data.get("clientId") or conn.peer_addr)
        consumers = data.get("consumerDataSet") or []
        producers = data.get("producerDataSet") or []
        for name, value in (("consumerDataSet", consumers), ("producerDataSet", producers)):
            if not isinstance(value, list):
                return cmd.response(R.SYSTEM_ERROR, remark=f"bad heartbeat body: {name} is not a list")
        if len(consumers) + len(producers) > HEARTBEAT_STEP_GROUPS:
            return self._heart_beat_in_steps(conn, cmd, client_id, consumers, producers)
        for raw in consumers:
            self._consumer(conn, cmd, client_id, raw)
        for raw in producers:
            self._producer(conn, cmd, client_id, raw)
        return cmd.response(R.SUCCESS)

    async def _heart_beat_in_steps(self, conn: Any, cmd: RemotingCommand, client_id: str, consumers: list[Any],
                                   producers: list[Any]) -> RemotingCommand:
        items = [(True, raw) for raw in consumers] + [(False, raw) for raw in producers]
        for start in range(0, len(items), HEARTBEAT_STEP_GROUPS):
            if start:
                await asyncio.sleep(0)
                if getattr(conn, "closed", False):  # its channels were dropped: register nothing more
                    return cmd.response(R.SYSTEM_ERROR, remark="connection closed")
            for is_consumer, raw in items[start:start + HEARTBEAT_STEP_GROUPS]:
                if is_consumer:
                    self._consumer(conn, cmd, client_id, raw)
                else:
                    self._producer(conn, cmd, client_id, raw)
        return cmd.response(R.SUCCESS)

    def _consumer(self, conn: Any, cmd: RemotingCommand, client_id: str, raw: Any) -> None:
        if not isinstance(raw, dict):
            return
        ctx = self.ctx
        cd = ConsumerData.from_json(raw)
        if not cd.group:
            return
        sg = ctx.groups.find(cd.group)
        if sg is not None:
            ctx.topics.create_sys_group_topic(retry_topic(cd.group), max(1, sg.retry_queue_nums),
                                              PERM_READ | PERM_WRITE)
        if ctx.config.enable_property_filter:
            self._check_sql_subscriptions(cd)
        ctx.consumers.register(conn, client_id, cmd.language, cmd.version, cd)

    def _producer(self, conn: Any, cmd: RemotingCommand, client_id: str, raw: Any) -> None:
        if isinstance(raw, dict) and raw.get("groupName"):
            self.ctx.producers.register(conn, str(raw["groupName"]), client_id, cmd.language, cmd.version)

    def unregister_client(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        producer_group = cmd.ext_fields.get("producerGroup") or ""
        consumer_group = cmd.ext_fields.get("consumerGroup") or ""
        if producer_group:
            self.ctx.producers.unregister(conn, producer_group)
        if consumer_group:
            self.ctx.consumers.unregister(conn, consumer_group)
        return cmd.response(R.SUCCESS)

    def check_client_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            body = jsonx.loads(cmd.body) if cmd.body.strip() else {}
        except ValueError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=f"bad CHECK_CLIENT_CONFIG body: {exc}")
        sub = body.get("subscriptionData") if isinstance(body, dict) else None
        if not isinstance(sub, dict):
            return cmd.response(R.SUCCESS)
        expression_type = str(sub.get("expressionType") or EXPRESSION_TYPE_TAG)
        if is_tag_type(expression_type):
            return cmd.response(R.SUCCESS)
        if expression_type.upper() != EXPRESSION_TYPE_SQL92 or not self.ctx.config.enable_property_filter:
            return cmd.response(R.SYSTEM_ERROR, remark="The broker does not support consumer to filter message by "
                                                       f"{expression_type}")
        try:
            compile_selector(str(sub.get("subString") or ""))
        except SqlParseError as exc:
            return cmd.response(R.SUBSCRIPTION_PARSE_FAILED, remark=str(exc))
        return cmd.response(R.SUCCESS)

    def _check_sql_subscriptions(self, cd: ConsumerData) -> None:
        for sub in cd.subscriptions:
            if is_tag_type(sub.expression_type):
                continue
            try:
                compile_selector(sub.sub_string)
            except SqlParseError as exc:
                log.warning("consumer group %s: the %s subscription of %s does not compile: %s", cd.group,
                            sub.expression_type, sub.topic, exc)
