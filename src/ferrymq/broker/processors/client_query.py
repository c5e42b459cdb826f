"""Questions an operator asks the broker about its clients, some answered by the clients themselves.

| code | request                              | header in                              | answer                                   |
|------|--------------------------------------|----------------------------------------|------------------------------------------|
| 307  | GET_CONSUMER_RUNNING_INFO            | consumerGroup, clientId, jstackEnable  | the client's own answer (ConsumerRunningInfo JSON), forwarded |
| 223  | INVOKE_BROKER_TO_GET_CONSUMER_STATUS | topic, group, clientAddr (optional)    | {"consumerTable": {clientId: {"messageQueueTable": {MQ: offset}}}}: each live consumer of the group asked with 221 |
| 221  | GET_CONSUMER_STATUS_FROM_CLIENT      | topic, group, clientAddr               | (broker -> client) the client's offsets of the topic |
| 328  | GET_ALL_PRODUCER_INFO                |                                        | {"data": {group: [{clientId, remoteIP, language, version, lastUpdateTimestamp}]}} |

A client that does not answer within ``CLIENT_QUERY_TIMEOUT_MS`` is left out of 223's table (logged); for 307 it
is a SYSTEM_ERROR naming the client. An unknown client or group is a SYSTEM_ERROR naming it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ferrymq.broker.headers import get_str
from ferrymq.errors import FerryError, ProtocolError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import ClientQueryContext

log = logging.getLogger(__name__)

#: how long the broker waits for a client's own answer
CLIENT_QUERY_TIMEOUT_MS = 5_000


class ClientQueryProcessor:
    def __init__(self, ctx: ClientQueryContext) -> None:
        self.ctx = ctx

    def register(self, d: Any) -> None:
        C = RequestCode
        d.register(C.GET_CONSUMER_RUNNING_INFO, self.running_info)
        d.register(C.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, self.consumer_status)
        d.register(C.GET_ALL_PRODUCER_INFO, self.all_producers)

    def _channels(self, group: str) -> list[Any]:
        info = self.ctx.consumers.get(group)
        if info is None:
            return []
        return [ch for ch in info.channels.values() if not getattr(ch.conn, "closed", False)]

    async def running_info(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            group = get_str(cmd, "consumerGroup")
            client_id = get_str(cmd, "clientId")
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        channel = next((ch for ch in self._channels(group) if ch.client_id == client_id), None)
        if channel is None:
            return cmd.response(R.SYSTEM_ERROR, remark=f"consumer {client_id} of group {group} is not online here")
        ask = RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO, dict(cmd.ext_fields))
        try:
            answer = await channel.conn.invoke(ask, CLIENT_QUERY_TIMEOUT_MS)
        except (FerryError, OSError) as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=f"consumer {client_id} did not answer: {exc}")
        return cmd.response(answer.code, remark=answer.remark, body=answer.body)

    async def consumer_status(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            topic = get_str(cmd, "topic")
            group = get_str(cmd, "group")
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        only_addr = cmd.ext_fields.get("clientAddr") or ""
        channels = [ch for ch in self._channels(group) if not only_addr or ch.conn.peer_addr == only_addr]
        if not channels:
            return cmd.response(R.SYSTEM_ERROR, remark=f"no consumer of group {group} is online here")

        async def ask(ch: Any) -> tuple[str, Any]:
            req = RemotingCommand.request(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT,
                                          {"topic": topic, "group": group, "clientAddr": ch.conn.peer_addr})
            try:
                answer = await ch.conn.invoke(req, CLIENT_QUERY_TIMEOUT_MS)
            except (FerryError, OSError) as exc:
                log.info("consumer %s did not answer GET_CONSUMER_STATUS_FROM_CLIENT: %s", ch.client_id, exc)
                return ch.client_id, None
            if answer.code != R.SUCCESS or not answer.body:
                log.info("consumer %s answered GET_CONSUMER_STATUS_FROM_CLIENT with %d %s", ch.client_id,
                         answer.code, answer.remark)
                return ch.client_id, None
            return ch.client_id, jsonx.loads(answer.body)

        results = await asyncio.gather(*(ask(ch) for ch in channels))
        table = {client_id: status for client_id, status in results if status is not None}
        return cmd.response(R.SUCCESS, body=jsonx.dumps({"consumerTable": table}))

    def all_producers(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        data: dict[str, list[dict[str, Any]]] = {}
        for group, chans in sorted(self.ctx.producers.groups.items()):
            data[group] = [{"clientId": ch.client_id, "remoteIP": getattr(ch.conn, "peer_addr", ""),
                            "language": ch.language, "version": ch.version,
                            "lastUpdateTimestamp": ch.last_update_ms} for ch in chans.values()]
        return cmd.response(R.SUCCESS, body=jsonx.dumps({"data": data}))
