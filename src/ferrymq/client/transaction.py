"""Transactional producer (RocketMQ 4.x ``TransactionMQProducer`` semantics).

``send_in_transaction(msg, arg)`` sends ``msg`` as a half message (``TRAN_MSG=true``, ``PGROUP`` = the
group), runs the local transaction (``execute_local(msg, arg)``, plain or async) and reports its answer to
the broker that stored the half message with END_TRANSACTION (oneway, as RocketMQ clients do): COMMIT makes
the message visible to consumers, ROLLBACK drops it, UNKNOW leaves it to the broker's check-back. A check-back
(CHECK_TRANSACTION_STATE from the broker, about a half message of this group that is still undecided) calls
``check_local(msg)`` and answers with END_TRANSACTION ``fromTransactionCheck=true`` on the same connection.
An exception in either callback counts as UNKNOW.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ferrymq.client.producer import DEFAULT_TOPIC, Producer
from ferrymq.client.values import SendResult, SendStatus
from ferrymq.common.message import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_NOT_TYPE,
    SYSFLAG_TRANSACTION_ROLLBACK,
    Message,
    MessageExt,
    decode_offset_msg_id,
)
from ferrymq.common.message_codec import RecordFormatError, decode_record
from ferrymq.errors import ClientError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

log = logging.getLogger(__name__)

__all__ = ["LocalTransactionState", "TransactionProducer", "TransactionSendResult"]


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"


_END_KIND = {
    LocalTransactionState.COMMIT_MESSAGE: SYSFLAG_TRANSACTION_COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: SYSFLAG_TRANSACTION_ROLLBACK,
    LocalTransactionState.UNKNOW: SYSFLAG_TRANSACTION_NOT_TYPE,
}

LocalCallback = Callable[..., LocalTransactionState | Awaitable[LocalTransactionState]]


@dataclass(frozen=True)
class TransactionSendResult:
    send_result: SendResult
    local_state: LocalTransactionState


async def _call(fn: LocalCallback, *args: Any) -> LocalTransactionState:
    try:
        state = fn(*args)
        if inspect.isawaitable(state):
            state = await state
    except Exception:
        log.exception("local transaction callback failed; answering UNKNOW")
        return LocalTransactionState.UNKNOW
    if not isinstance(state, LocalTransactionState):
        log.warning("local transaction callback returned %r; answering UNKNOW", state)
        return LocalTransactionState.UNKNOW
    return state


def _end_command(group: str, half_queue_offset: int, half_phy_offset: int, state: LocalTransactionState,
                 msg_id: str, from_check: bool) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": half_queue_offset, "commitLogOffset": half_phy_offset,
        "commitOrRollback": _END_KIND[state], "fromTransactionCheck": "true" if from_check else "false",
        "msgId": msg_id, "transactionId": msg_id})


class TransactionProducer(Producer):
    def __init__(self, namesrv: str | list[str], group: str, *, execute_local: LocalCallback,
                 check_local: LocalCallback, **kwargs: Any) -> None:
        super().__init__(namesrv, group, **kwargs)
        #: the brokers' transaction checks find the producer by group in its instance: one instance each
        self._share_instance = False
        self.execute_local = execute_local
        self.check_local = check_local
        self._checks: set[asyncio.Task[None]] = set()
        self._heartbeated: set[str] = set()

    async def start(self) -> None:
        await super().start()
        inst = self.instance
        checkers = inst.transaction_checkers
        checkers[self.group] = self
        # the brokers ask a live producer of the group about undecided half messages, also half messages of a
        # producer that died: be known to every broker now (as RocketMQ producers are, through TBW102's route)
        try:
            await inst.get_route(DEFAULT_TOPIC)
        except Exception as exc:
            log.debug("no route of %s to find the brokers: %s", DEFAULT_TOPIC, exc)
        await inst.send_heartbeats()
        inst.pool.dispatcher.register(RequestCode.CHECK_TRANSACTION_STATE,
                                      lambda conn, cmd: _on_check(checkers, conn, cmd))

    async def close(self) -> None:
        for task in list(self._checks):
            task.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)
        await super().close()

    async def send_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        if msg.delay_level > 0:
            raise ClientError("transactional messages cannot be delayed")
        msg.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        msg.properties[PROPERTY_PRODUCER_GROUP] = self.group
        result = await self.send(msg)
        if result.status is not SendStatus.SEND_OK:
            state = LocalTransactionState.ROLLBACK_MESSAGE  # the half message is not safely stored
        else:
            state = await _call(self.execute_local, msg, arg)
        ip, port, phy = decode_offset_msg_id(result.offset_msg_id)
        addr = f"{ip}:{port}"
        if addr not in self._heartbeated:
            # the broker asks a live producer of the group about undecided half messages: be known there now,
            # not at the next periodic heartbeat
            await self.instance.send_heartbeats()
            self._heartbeated.add(addr)
        cmd = _end_command(self.group, result.queue_offset, phy, state, result.msg_id, False)
        try:
            await self.instance.invoke_oneway(addr, cmd)
        except Exception as exc:  # the broker's check-back settles it
            log.warning("END_TRANSACTION for %s not sent: %s", result.msg_id, exc)
        return TransactionSendResult(result, state)

    def _checked(self, conn: Any, cmd: RemotingCommand) -> None:
        task = asyncio.ensure_future(self._answer_check(conn, cmd))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _answer_check(self, conn: Any, cmd: RemotingCommand) -> None:
        try:
            half: MessageExt = decode_record(cmd.body)
        except RecordFormatError as exc:
            log.warning("CHECK_TRANSACTION_STATE with an unreadable message: %s", exc)
            return
        state = await _call(self.check_local, half)
        f = cmd.ext_fields
        try:
            end = _end_command(self.group, int(f.get("tranStateTableOffset", half.queue_offset)),
                               int(f.get("commitLogOffset", half.phy_offset)), state, half.msg_id, True)
        except ValueError:
            return
        if not getattr(conn, "closed", True):
            conn.invoke_oneway(self.instance._stamp(end))


def _on_check(checkers: dict[str, TransactionProducer], conn: Any, cmd: RemotingCommand) -> None:
    group = cmd.ext_fields.get("producerGroup", "")
    producer = checkers.get(group)
    if producer is None:
        try:
            half = decode_record(cmd.body)
            producer = checkers.get(half.properties.get(PROPERTY_PRODUCER_GROUP, ""))
        except RecordFormatError:
            producer = None
    if producer is None:
        log.warning("check-back for unknown producer group %r ignored", group)
        return None
    producer._checked(conn, cmd)
    return None
