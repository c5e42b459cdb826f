"""GET_BROKER_EPOCH_CACHE (1007, RocketMQ 5; mqadmin getBrokerEpoch): a controller-mode broker's epoch entries.

| field (JSON body)  | meaning                                                                          |
|--------------------|----------------------------------------------------------------------------------|
| clusterName        | brokerClusterName                                                                 |
| brokerName         | the broker group                                                                  |
| brokerId           | this replica's id (the controller's replica id in controller mode)               |
| epochList          | ``[{"epoch", "startOffset", "endOffset"}]``: the commit-log range each master epoch wrote; the last entry ends at the log's max offset |
| maxOffset          | the commit log's max phy offset                                                   |

A broker not in controller mode keeps no epochs: SYSTEM_ERROR saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import EpochContext

NOT_CONTROLLER_MODE_REMARK = "this broker is not in controller mode: it keeps no epochs"


class EpochProcessor:
    def __init__(self, ctx: EpochContext) -> None:
        self.ctx = ctx

    def register(self, d: Any) -> None:
        d.register(RequestCode.GET_BROKER_EPOCH_CACHE, self.epoch_cache)

    def epoch_cache(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        role = self.ctx.controller_role
        if role is None:
            return cmd.response(R.SYSTEM_ERROR, remark=NOT_CONTROLLER_MODE_REMARK)
        max_offset = int(self.ctx.store.max_phy_offset)
        entries = role.epoch_file.entries()
        epoch_list = [{"epoch": epoch, "startOffset": start,
                       "endOffset": entries[i + 1][1] if i + 1 < len(entries) else max_offset}
                      for i, (epoch, start) in enumerate(entries)]
        cfg = self.ctx.config
        body = {"clusterName": cfg.broker_cluster_name, "brokerName": cfg.broker_name, "brokerId": cfg.broker_id,
                "epochList": epoch_list, "maxOffset": max_offset}
        return cmd.response(R.SUCCESS, body=jsonx.dumps(body))
