"""Runtime broker configuration codes (broker/runtime_config.py says which keys may change).

| code | request              | answer                                                                    |
|------|----------------------|---------------------------------------------------------------------------|
| 26   | GET_BROKER_CONFIG    | body: every key as ``key=value`` lines; header ``version`` (DataVersion JSON) |
| 25   | UPDATE_BROKER_CONFIG | body: ``key=value`` lines; SUCCESS (header ``persisted``: the config file or "") |
|      |                      | or SYSTEM_ERROR, the remark naming the refused keys; nothing changed then |

The DataVersion counts accepted updates since start (RocketMQ's tools show it, none rely on it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ferrymq.broker.runtime_config import apply_update, config_properties, properties_text
from ferrymq.common.properties import parse_properties
from ferrymq.common.topic import DataVersion
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.app import BrokerController


class BrokerConfigProcessor:
    def __init__(self, ctx: BrokerController) -> None:
        self.ctx = ctx
        self.data_version = DataVersion()

    def register(self, d: Any) -> None:
        d.register(RequestCode.GET_BROKER_CONFIG, self.get_config)
        d.register(RequestCode.UPDATE_BROKER_CONFIG, self.update_config)

    def get_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        body = properties_text(config_properties(self.ctx.config)).encode()
        version = jsonx.dumps(self.data_version.to_json()).decode()
        return cmd.response(R.SUCCESS, {"version": version}, body=body)

    def update_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            text = cmd.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=f"the config body is not UTF-8 text: {exc}")
        props = parse_properties(text)
        if not props:
            return cmd.response(R.SYSTEM_ERROR, remark="no key=value line in the request body")
        result = apply_update(self.ctx, props)
        if result.refused is not None:
            return cmd.response(R.SYSTEM_ERROR, remark=result.refused)
        self.data_version.next_version(self.ctx.clock_ms())
        return cmd.response(R.SUCCESS, {"persisted": result.persisted_to})
