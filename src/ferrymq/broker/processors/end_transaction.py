"""END_TRANSACTION (37): a producer's commit / rollback of a half message (broker/transaction.py).

Header (RocketMQ names): ``producerGroup``, ``tranStateTableOffset`` (the half message's queue offset),
``commitLogOffset`` (its phy offset), ``commitOrRollback`` (0 = not type / unknown, 8 = commit,
12 = rollback), ``fromTransactionCheck``, ``msgId``, ``transactionId``.

| outcome                         | response (when not oneway)                                   |
|---------------------------------|--------------------------------------------------------------|
| applied / the same decision again | SUCCESS                                                    |
| a different decision than before | TRANSACTION_FAILED (4) "... was already committed/rolled back/discarded" |
| 0 (unknown)                     | SUCCESS, nothing done (a check-back asks again)              |
| ACL: no PUB on the real topic   | NO_PERMISSION (16) naming the topic                          |
| not a master                    | SLAVE_NOT_AVAILABLE (11) (controller mode: SERVICE_NOT_AVAILABLE) |
| bad header                      | SYSTEM_ERROR naming the field                                |
| half message not found          | SYSTEM_ERROR "the half message ... was not found"            |
| an epoch record (decision 0006) | SUCCESS, ext field ``eosWinners``: the epoch's winning tokens, comma-separated |
| COMMIT of an epoch half message not named by its record | TRANSACTION_FAILED "... not among the winners ...", rolled back |
| COMMIT of an epoch half message before its record | TRANSACTION_FAILED "... has no record ...", nothing decided |
| producer group differs (or none given for a half message that names one) | SYSTEM_ERROR "the producer group ... differs" |
| store refused the records       | SYSTEM_ERROR                                                 |
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ferrymq.broker.transaction import EndStatus, EpochTag
from ferrymq.common.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_ROLLBACK,
)
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import EndTransactionContext

log = logging.getLogger(__name__)

#: how a refusal names the earlier decision (broker/transaction.py Decision values)
_DONE = {"commit": "committed", "rollback": "rolled back", "discard": "discarded after its last check-back"}


class EndTransactionProcessor:
    def __init__(self, ctx: EndTransactionContext) -> None:
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
        txs = ctx.transactions
        half = txs.half_message(phy, qo)
        guard = ctx.acl_guard
        if half is not None and guard is not None:
            real_topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
            denial = guard.end_transaction_denial(conn, cmd, real_topic,
                                                  half.properties.get(PROPERTY_PRODUCER_GROUP) or group)
            if denial is not None:
                log.info("END_TRANSACTION refused: %s", denial)
                return cmd.response(R.NO_PERMISSION, remark=denial)
        status = txs.end(group, phy, qo, kind == SYSFLAG_TRANSACTION_COMMIT, half) if half is not None \
            else EndStatus.NOT_FOUND
        if status in (EndStatus.APPLIED, EndStatus.ALREADY_DECIDED):
            return cmd.response(R.SUCCESS)
        tag = EpochTag.of(half) if half is not None else None
        if status is EndStatus.EPOCH_RECORDED and tag is not None:
            winners = txs.epoch_winners(tag)
            return cmd.response(R.SUCCESS, {"eosWinners": ",".join(sorted(winners)) if winners is not None else "",
                                            "eosEpochRecorded": "true" if winners is not None else "false"})
        if status in (EndStatus.NOT_IN_EPOCH, EndStatus.EPOCH_NOT_RECORDED) and tag is not None:
            remark = (f"writer {tag.writer} is not among the winners recorded for epoch {tag.epoch} of {tag.group}; "
                      "the half message was rolled back" if status is EndStatus.NOT_IN_EPOCH else
                      f"epoch {tag.epoch} of {tag.group} has no record on this broker; write the record first")
            return cmd.response(R.TRANSACTION_FAILED, remark=remark)
        if status is EndStatus.CONFLICT:
            earlier = txs.decision_of(qo)
            remark = (f"the half message at tranStateTableOffset {qo} was already "
                      f"{_DONE.get(earlier.value if earlier else '', 'decided')}; a different decision is refused")
            log.info("END_TRANSACTION refused: %s", remark)
            return cmd.response(R.TRANSACTION_FAILED, remark=remark)
        remark = {
            EndStatus.NOT_FOUND: f"the half message at commitLogOffset {phy} / tranStateTableOffset {qo} was not found",
            EndStatus.WRONG_GROUP: f"the producer group {group!r} differs from the half message's",
            EndStatus.STORE_FAILED: "the decision could not be stored",
        }[status]
        log.info("END_TRANSACTION refused: %s", remark)
        return cmd.response(R.SYSTEM_ERROR, remark=remark)
