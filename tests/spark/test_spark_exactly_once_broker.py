"""The broker's epoch rules behind the exactly-once sink (decision 0006), on an in-process broker over raw
remoting: the first record of an epoch wins, a COMMIT is held to the record (a token it does not name is
rolled back, a COMMIT before the record decides nothing), the check-back decides by the record without asking
anyone, a later epoch's record rolls back an unrecorded epoch, records are never visible, all also after a
restart (records rebuilt from the half topic)."""

from __future__ import annotations

from pathlib import Path

from ferrymq.broker.app import BrokerController
from ferrymq.common.message import decode_offset_msg_id
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from support.inproc import broker_config
from support.wire import Client, pull, records, send_v1

GROUP = "spark-eos-q1"
COMMIT, ROLLBACK = 8, 12


def _config(data_dir: Path) -> object:
    return broker_config(str(data_dir), None, broker_name="broker-t", mapped_file_size_commit_log=4 * 1024 * 1024,
                         mapped_file_size_consume_queue=20 * 1000, transaction_timeout_ms=1)


def _props(epoch: int, writer: str = "", record: bool = False) -> str:
    text = f"TRAN_MSG\x01true\x02PGROUP\x01{GROUP}\x02EOS_GROUP\x01q1\x02EOS_EPOCH\x01{epoch}\x02"
    text += "EOS_RECORD\x011\x02" if record else f"EOS_WRITER\x01{writer}\x02"
    return text


async def _half(client: Client, body: bytes, props: str) -> tuple[int, int]:
    resp = await client.call(RequestCode.SEND_MESSAGE, send_v1("EosT", 1, properties=props, producerGroup=GROUP),
                             body)
    assert resp.code == R.SUCCESS, resp.remark
    _, _, phy = decode_offset_msg_id(resp.ext_fields["msgId"])
    return phy, int(resp.ext_fields["queueOffset"])


async def _end(client: Client, handle: tuple[int, int], kind: int) -> tuple[int, str, dict[str, str]]:
    phy, qo = handle
    resp = await client.call(RequestCode.END_TRANSACTION, {
        "producerGroup": GROUP, "tranStateTableOffset": qo, "commitLogOffset": phy, "commitOrRollback": kind,
        "fromTransactionCheck": "false", "msgId": "x", "transactionId": "x"})
    return resp.code, resp.remark or "", dict(resp.ext_fields)


async def _visible(broker: BrokerController, client: Client) -> list[bytes]:
    broker.writer.reput_now()
    resp = await client.call(RequestCode.PULL_MESSAGE, pull("EosT", queue_id=1, suspend_ms=0, sys_flag=4,
                                                             max_msgs=64))
    return sorted(m.body for m in records(resp.body)) if resp.code == R.SUCCESS else []


async def test_epoch_records_decide_half_messages(tmp_path: Path) -> None:
    broker = BrokerController(_config(tmp_path / "s"))
    await broker.start()
    client = await Client().open(broker.broker_addr)
    try:
        won = await _half(client, b"won", _props(0, "w1"))
        won_late = await _half(client, b"won-late", _props(0, "w1"))
        lost = await _half(client, b"lost", _props(0, "w0"))  # a failed attempt of the same partition
        code, remark, _ = await _end(client, won, COMMIT)
        assert code == R.TRANSACTION_FAILED and "no record" in remark  # nothing decided yet
        first = await _half(client, b"w1\nw2\n", _props(0, record=True))
        code, _, fields = await _end(client, first, COMMIT)
        assert code == R.SUCCESS and fields["eosWinners"] == "w1,w2"
        second = await _half(client, b"w9\n", _props(0, record=True))  # a re-run's record: the first one wins
        code, _, fields = await _end(client, second, COMMIT)
        assert code == R.SUCCESS and fields["eosWinners"] == "w1,w2"
        assert (await _end(client, won, COMMIT))[0] == R.SUCCESS
        code, remark, _ = await _end(client, lost, COMMIT)
        assert code == R.TRANSACTION_FAILED and "not among the winners" in remark
        assert (await _end(client, won_late, ROLLBACK))[0] == R.TRANSACTION_FAILED  # the record says commit
        # an epoch without a record, then a later epoch recorded: the first is rolled back by the check-back
        orphan = await _half(client, b"orphan", _props(1, "w5"))
        await _half(client, b"w6\n", _props(2, record=True))
        assert broker.transactions.check_once() == 0  # decided by the records: nobody asked
        assert await _visible(broker, client) == [b"won", b"won-late"]
        assert broker.transactions.decision_of(orphan[1]) is not None
    finally:
        client.close()
        await broker.stop()
    # a restart rebuilds the records from the half topic: the same answers
    broker = BrokerController(_config(tmp_path / "s"))
    await broker.start()
    client = await Client().open(broker.broker_addr)
    try:
        code, _, fields = await _end(client, second, COMMIT)
        assert code == R.SUCCESS and fields["eosWinners"] == "w1,w2"
        late = await _half(client, b"late-loser", _props(0, "w7"))
        assert (await _end(client, late, COMMIT))[0] == R.TRANSACTION_FAILED
        assert await _visible(broker, client) == [b"won", b"won-late"]
    finally:
        client.close()
        await broker.stop()


async def test_check_back_commits_a_recorded_winner_left_by_a_dead_driver(tmp_path: Path) -> None:
    broker = BrokerController(_config(tmp_path / "s"))
    await broker.start()
    client = await Client().open(broker.broker_addr)
    try:
        handles = [await _half(client, f"row{i}".encode(), _props(7, "w1")) for i in range(3)]
        record = await _half(client, b"w1\n", _props(7, record=True))
        assert (await _end(client, record, COMMIT))[0] == R.SUCCESS
        assert (await _end(client, handles[0], COMMIT))[0] == R.SUCCESS  # the driver died after one END
        broker.transactions.check_once()
        assert await _visible(broker, client) == [b"row0", b"row1", b"row2"]
        broker.transactions.check_once()
        assert await _visible(broker, client) == [b"row0", b"row1", b"row2"]  # once
    finally:
        client.close()
        await broker.stop()


async def test_a_batch_half_message_commits_every_row_of_it(tmp_path: Path) -> None:
    from ferrymq.common.message_codec import encode_batch_columns

    broker = BrokerController(_config(tmp_path / "s"))
    await broker.start()
    client = await Client().open(broker.broker_addr)
    try:
        body = encode_batch_columns([0, 0, 0], [b"r1", b"r2", b"r3"],
                                    [b"KEYS\x01k1\x02UNIQ_KEY\x01u1", b"UNIQ_KEY\x01u2", b"TAGS\x01t\x02UNIQ_KEY\x01u3"])
        won = await _half(client, body, _props(3, "w1") + "EOS_BATCH\x011\x02")
        lost = await _half(client, body, _props(3, "w0") + "EOS_BATCH\x011\x02")
        record = await _half(client, b"w1\n", _props(3, record=True))
        assert (await _end(client, record, COMMIT))[0] == R.SUCCESS
        assert (await _end(client, won, COMMIT))[0] == R.SUCCESS
        assert (await _end(client, lost, COMMIT))[0] == R.TRANSACTION_FAILED
        assert await _visible(broker, client) == [b"r1", b"r2", b"r3"]
        broker.writer.reput_now()
        resp = await client.call(RequestCode.PULL_MESSAGE, pull("EosT", queue_id=1, suspend_ms=0, sys_flag=4))
        rows = records(resp.body)
        assert [m.properties.get("UNIQ_KEY") for m in rows] == ["u1", "u2", "u3"]
        assert rows[0].properties.get("KEYS") == "k1" and rows[2].properties.get("TAGS") == "t"
        assert not any(k.startswith("EOS_") or k == "TRAN_MSG" for m in rows for k in m.properties)
    finally:
        client.close()
        await broker.stop()
