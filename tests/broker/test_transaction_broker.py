"""Transactional half messages on an in-process broker over raw remoting (broker/transaction.py,
processors/end_transaction.py): invisible until decided, each decided once (the same answer again is
acknowledged, a different one refused, also after a restart), checks of group and offsets, a discarded half message after the last check-back."""

from __future__ import annotations

from pathlib import Path

from broker_helpers import Client, make_config, pull, records, send_v1

from ferrymq.broker.app import BrokerController
from ferrymq.common.message import decode_offset_msg_id
from ferrymq.common.topic import TRANS_HALF_TOPIC
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

HALF = "TRAN_MSG\x01true\x02PGROUP\x01pg\x02"


def end(phy: int, qo: int, kind: int, group: str = "pg") -> dict[str, object]:
    return {"producerGroup": group, "tranStateTableOffset": qo, "commitLogOffset": phy, "commitOrRollback": kind,
            "fromTransactionCheck": "false", "msgId": "x", "transactionId": "x"}


async def _half(client: Client, body: bytes) -> tuple[int, int]:
    # as a Java TransactionMQProducer sends it: the property and sysFlag TRANSACTION_PREPARED (4)
    resp = await client.call(RequestCode.SEND_MESSAGE, send_v1("TxT", 1, properties=HALF, sysFlag=4), body)
    assert resp.code == R.SUCCESS, resp.remark
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    return phy, int(resp.ext_fields["queueOffset"])


async def _visible(client: Client) -> list[bytes]:
    resp = await client.call(RequestCode.PULL_MESSAGE, pull("TxT", queue_id=1, suspend_ms=0, sys_flag=4))
    return [m.body for m in records(resp.body)] if resp.code == R.SUCCESS else []


async def test_decided_once_and_only_by_the_right_group(tmp_path: Path) -> None:
    broker = BrokerController(make_config(str(tmp_path / "s"), None))
    await broker.start()
    client = await Client().open(broker.broker_addr)
    try:
        phy_c, qo_c = await _half(client, b"commit-me")
        phy_r, qo_r = await _half(client, b"roll-me")
        assert await _visible(client) == []
        assert broker.store.get_max_offset_in_queue(TRANS_HALF_TOPIC, 0) == 2
        wrong = await client.call(RequestCode.END_TRANSACTION, end(phy_c, qo_c, 8, group="other"))
        assert wrong.code == R.SYSTEM_ERROR and "producer group" in (wrong.remark or "")
        missing = await client.call(RequestCode.END_TRANSACTION, end(phy_c, qo_c + 5, 8))
        assert missing.code == R.SYSTEM_ERROR and "not found" in (missing.remark or "")
        for _ in range(2):  # the producer's answer and a check-back answer: applied once
            assert (await client.call(RequestCode.END_TRANSACTION, end(phy_c, qo_c, 8))).code == R.SUCCESS
        assert (await client.call(RequestCode.END_TRANSACTION, end(phy_r, qo_r, 12))).code == R.SUCCESS
        broker.writer.reput_now()
        assert await _visible(client) == [b"commit-me"]
        real = records((await client.call(RequestCode.PULL_MESSAGE, pull("TxT", queue_id=1, suspend_ms=0,
                                                                          sys_flag=4))).body)[0]
        assert "TRAN_MSG" not in real.properties and real.prepared_transaction_offset == phy_c
    finally:
        client.close()
        await broker.stop()
    # after a restart the op records still say what was decided
    broker = BrokerController(make_config(str(tmp_path / "s"), None))
    await broker.start()
    client = await Client().open(broker.broker_addr)
    try:
        late = await client.call(RequestCode.END_TRANSACTION, end(phy_r, qo_r, 8))
        assert late.code == R.TRANSACTION_FAILED and "already rolled back" in (late.remark or "")
        assert (await client.call(RequestCode.END_TRANSACTION, end(phy_r, qo_r, 12))).code == R.SUCCESS
        late = await client.call(RequestCode.END_TRANSACTION, end(phy_c, qo_c, 12))
        assert late.code == R.TRANSACTION_FAILED and "already committed" in (late.remark or "")
        broker.writer.reput_now()
        assert await _visible(client) == [b"commit-me"]  # the late commit of a rolled-back one is refused
    finally:
        client.close()
        await broker.stop()


async def test_unanswered_half_message_is_discarded_after_the_last_check(tmp_path: Path) -> None:
    broker = BrokerController(make_config(str(tmp_path / "s"), None, transaction_timeout_ms=1,
                                          transaction_check_max=2))
    await broker.start()
    client = await Client().open(broker.broker_addr)
    try:
        await _half(client, b"orphan")
        broker.writer.reput_now()
        svc = broker.transactions
        real_clock = svc.clock_ms
        # the half message is older than transactionTimeOut whatever the clock's resolution (a check in the
        # same millisecond as the store would skip it and make the counts below off by one)
        svc.clock_ms = lambda: real_clock() + 60_000
        for _ in range(2):
            svc.check_once()  # no live producer of group pg: nothing sent, but counted
        assert svc.discarded == 0
        svc.check_once()
        assert svc.discarded == 1 and 0 in svc.decided
        svc.check_once()
        assert svc.discarded == 1  # once
    finally:
        client.close()
        await broker.stop()
