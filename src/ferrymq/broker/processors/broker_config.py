"""Runtime broker configuration codes (broker/runtime_config.py says which keys may change).

| code | request              | answer                                                                    |
|------|----------------------|---------------------------------------------------------------------------|
| 26   | GET_BROKER_CONFIG    | body: every key as ``key=value`` lines; header ``version`` (DataVersion JSON) |
| 25   | UPDATE_BROKER_CONFIG | body: ``key=value`` lines; SUCCESS (header ``persisted``: the config file or "") |
|      |                      | or SYSTEM_ERROR, the remark naming the refused keys; nothing changed then |

The DataVersion counts accepted updates since start (RocketMQ's tools show it, none rely on it).

GET_BROKER_CONFIG never answers a secret, to anyone (admin accounts included): the value of a key marked
``secret`` in broker/config.py, or whose name contains secret, password, passwd, token, credential or
basicAuth (``haSecret``, ``metricsAuthToken``, ...), is answered as ``SECRET_MASK`` when it is set (empty
when not). UPDATE_BROKER_CONFIG refuses ``SECRET_MASK`` as the new value of such a key (a tool that writes
back what it read would otherwise set the secret to the mask).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ferrymq.broker.config import FIELDS
from ferrymq.broker.runtime_config import apply_update, config_properties, properties_text
from ferrymq.common.properties import parse_properties
from ferrymq.common.topic import DataVersion
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import RuntimeConfigContext


#: what GET_BROKER_CONFIG answers in place of a secret value
SECRET_MASK = "******"
SECRET_KEY_NAME = re.compile(r"secret|password|passwd|token|credential|basicauth", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    field_ = FIELDS.get(key)
    return bool(field_ is not None and field_.metadata.get("secret")) or SECRET_KEY_NAME.search(key) is not None


def masked(props: dict[str, str]) -> dict[str, str]:
    return {k: (SECRET_MASK if v and is_secret_key(k) else v) for k, v in props.items()}


class BrokerConfigProcessor:
    def __init__(self, ctx: RuntimeConfigContext) -> None:
        self.ctx = ctx
        self.data_version = DataVersion()

    def register(self, d: Any) -> None:
        d.register(RequestCode.GET_BROKER_CONFIG, self.get_config)
        d.register(RequestCode.UPDATE_BROKER_CONFIG, self.update_config)

    def get_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        body = properties_text(masked(config_properties(self.ctx.config))).encode()
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
        echoed = sorted(k for k, v in props.items() if v == SECRET_MASK and is_secret_key(k))
        if echoed:
            return cmd.response(R.SYSTEM_ERROR, remark=f"{', '.join(echoed)}: {SECRET_MASK} is the mask "
                                                      "GET_BROKER_CONFIG answers for a secret, not a new value")
        result = apply_update(self.ctx, props)
        if result.refused is not None:
            return cmd.response(R.SYSTEM_ERROR, remark=result.refused)
        self.data_version.next_version(self.ctx.clock_ms())
        return cmd.response(R.SUCCESS, {"persisted": result.persisted_to})
