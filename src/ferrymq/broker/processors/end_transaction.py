"""END_TRANSACTION (37): a producer's commit / rollback of a half message (broker/transaction.py).

Header (RocketMQ names): ``producerGroup``, ``tranStateTableOffset`` (the half message's queue offset),
``commitLogOffset`` (its phy offset), ``commitOrRollback`` (0 = not type / unknown, 8 = commit,
12 = rollback), ``fromTransactionCheck``, ``msgId``, ``transactionId``.

| outcome                         | response (when not oneway)                                   |
|---------------------------------|--------------------------------------------------------------|
| applied / already decided       | SUCCESS                                                      |
| 0 (unknown)                     | SUCCESS, nothing done (a check-back asks again)              |
| not a master                    | SLAVE_NOT_AVAILABLE (11) (controller mode: SERVICE_NOT_AVAILABLE) |
| bad header                      | SYSTEM_ERROR naming the field                                |
| half message not found          | SYSTEM_ERROR "the half message ... was not found"            |
| producer group differs          | SYSTEM_ERROR "the producer group ... differs"               |
| store refused the records       | SYSTEM_ERROR                                                 |
"""

from __future__ import annotations

import logging
from typing import Any

from ferrymq.broker.transaction import EndStatus
from ferrymq.common.message import SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

log = logging.getLogger(__name__)


class EndTransactionProcessor:
    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def register(self, dispatcher: Any) -> None:
        dispatcher.register(RequestCode.END_TRANSACTION, self.handle)

    def handle(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        ctx = self.ctx
        if ctx.config.is_slave:
            return cmd.response(R.SLAVE_NOT_AVAILABLE, remark="END_TRANSACTION goes to the master")
        role = ctx.controller_role
        if role is not None and not role.can_ack():
            return cmd.response(R.SERVICE_NOT_AVAILABLE, remark=role.refusal_remark())
        try:
            kind = int(cmd.ext_fields.get("commitOrRollback", ""))
            phy = int(cmd.ext_fields.get("commitLogOffset", ""))
            qo = int(cmd.ext_fields.get("tranStateTableOffset", ""))
        except ValueError:
            return cmd.response(R.SYSTEM_ERROR, remark="END_TRANSACTION needs integer commitOrRollback, "
                                                      "commitLogOffset and tranStateTableOffset")
        if kind not in (SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK):
            return cmd.response(R.SUCCESS)  # unknown: the check-back asks again later
        group = cmd.ext_fields.get("producerGroup", "")
        status = ctx.transactions.end(group, phy, qo, kind == SYSFLAG_TRANSACTION_COMMIT)
        if status in (EndStatus.APPLIED, EndStatus.ALREADY_DECIDED):
            return cmd.response(R.SUCCESS)
        remark = {
            EndStatus.NOT_FOUND: f"the half message at commitLogOffset {phy} / tranStateTableOffset {qo} was not found",
            EndStatus.WRONG_GROUP: f"the producer group {group!r} differs from the half message's",
            EndStatus.STORE_FAILED: "the decision could not be stored",
        }[status]
        log.info("END_TRANSACTION refused: %s", remark)
        return cmd.response(R.SYSTEM_ERROR, remark=remark)
