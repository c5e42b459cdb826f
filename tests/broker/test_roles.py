"""SYNC_FLUSH, SYNC_MASTER (with a fake HA service) and SLAVE behaviour."""

from __future__ import annotations

import asyncio

import pytest
from broker_helpers import Client, make_config, pull, send_v1, wait_for

from ferrymq.broker.app import BrokerController
from ferrymq.broker.config import BrokerRole, FlushDiskType
from ferrymq.common.topic import TopicConfig
from ferrymq.errors import ConnectionClosedError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode as R


class FakeHA:
    """The HAService seam: is_slave_ok / wait_for_slave_ack / notify_data_appended."""

    def __init__(self, ok: bool, ack: bool) -> None:
        self.ok, self.ack = ok, ack
        self.appended = 0
        self.waits: list[tuple[int, int]] = []
        self.port = 0

    def notify_data_appended(self) -> None:
        self.appended += 1

    def is_slave_ok(self, end_phy_offset: int) -> bool:
        return self.ok

    async def wait_for_slave_ack(self, end_phy_offset: int, timeout_ms: int) -> bool:
        self.waits.append((end_phy_offset, timeout_ms))
        return self.ack

    def slave_status(self) -> list[dict]:
        return []

    async def stop(self) -> None:
        pass


async def test_sync_flush_send_waits_for_the_group_commit(tmp_path) -> None:
    cfg = make_config(str(tmp_path / "s"), flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with BrokerController(cfg) as ctl:
        c = await Client().open(ctl.broker_addr)
        resp = await c.call(10, send_v1("SF"), b"durable")
        assert resp.code == R.SUCCESS and "msgId" in resp.ext_fields
        assert ctl.store.flushed_phy_offset >= ctl.store.max_phy_offset
        # WAIT=false: answered without waiting
        resp = await c.call(10, send_v1("SF", 0, "WAIT\x01false\x02"), b"fire and forget")
        assert resp.code == R.SUCCESS
        c.close()


async def test_sync_master_status_from_the_ha_seam(tmp_path) -> None:
    cfg = make_config(str(tmp_path / "s"), broker_role=BrokerRole.SYNC_MASTER, sync_flush_timeout_ms=1234)
    async with BrokerController(cfg) as ctl:
        c = await Client().open(ctl.broker_addr)
        for ok, ack, code in ((False, True, R.SLAVE_NOT_AVAILABLE), (True, False, R.FLUSH_SLAVE_TIMEOUT),
                              (True, True, R.SUCCESS)):
            fake = FakeHA(ok, ack)
            ctl.writer.ha_service = fake
            resp = await c.call(10, send_v1("SM"), b"replicated")
            assert resp.code == code
            assert {"msgId", "queueId", "queueOffset"} <= set(resp.ext_fields)  # stored in every case
            assert fake.appended == 1
            if ok:
                assert fake.waits[0] == (ctl.store.max_phy_offset, 1234)
        ctl.writer.ha_service = None
        c.close()


class CallbackHA(FakeHA):
    """The callback form of the seam (what HAService offers): ``on_slave_ack(end, timeout_ms, fn)``.
    ``mode``: "inline" calls fn(ack) at once, "later" calls it on a later loop turn."""

    def __init__(self, ok: bool, ack: bool, mode: str) -> None:
        super().__init__(ok, ack)
        self.mode = mode

    def on_slave_ack(self, end_phy_offset: int, timeout_ms: int, fn) -> None:
        self.waits.append((end_phy_offset, timeout_ms))
        if self.mode == "inline":
            fn(self.ack)
        else:
            asyncio.get_running_loop().call_later(0.01, fn, self.ack)


async def test_sync_master_answers_from_the_ack_callback(tmp_path) -> None:
    cfg = make_config(str(tmp_path / "s"), broker_role=BrokerRole.SYNC_MASTER, sync_flush_timeout_ms=1234)
    async with BrokerController(cfg) as ctl:
        c = await Client().open(ctl.broker_addr)
        for mode in ("inline", "later"):
            for ok, ack, code in ((False, True, R.SLAVE_NOT_AVAILABLE), (True, False, R.FLUSH_SLAVE_TIMEOUT),
                                  (True, True, R.SUCCESS)):
                fake = CallbackHA(ok, ack, mode)
                ctl.writer.ha_service = fake
                resp = await c.call(10, send_v1("SM"), b"replicated")
                assert resp.code == code, (mode, ok, ack)
                assert {"msgId", "queueId", "queueOffset"} <= set(resp.ext_fields)
                assert fake.waits == ([(ctl.store.max_phy_offset, 1234)] if ok else [])
        # concurrent sends on one connection: every answer reaches its own request (opaque)
        ctl.writer.ha_service = CallbackHA(True, True, "later")
        resps = await asyncio.gather(*(c.call(10, send_v1("SM", q % 4), b"m%d" % q) for q in range(20)))
        assert all(r.code == R.SUCCESS for r in resps)
        assert len({r.ext_fields["msgId"] for r in resps}) == 20
        # a oneway send is stored but not answered; a closed connection is not written to
        assert c.conn is not None
        oneway = RemotingCommand.request(10, send_v1("SM"), b"oneway")
        before = ctl.store.max_phy_offset
        c.conn.invoke_oneway(oneway)
        await wait_for(lambda: ctl.store.max_phy_offset > before, 5, what="oneway stored")
        c.close()
        c2 = await Client().open(ctl.broker_addr)
        assert c2.conn is not None
        fut = c2.conn.invoke_future(RemotingCommand.request(10, send_v1("SM"), b"gone"))
        c2.conn.abort()
        with pytest.raises(ConnectionClosedError):
            await fut
        await asyncio.sleep(0.05)  # the late answer finds the connection closed: no error
        c3 = await Client().open(ctl.broker_addr)
        assert (await c3.call(10, send_v1("SM"), b"still serving")).code == R.SUCCESS
        c3.close()
        ctl.writer.ha_service = None


async def test_slave_refuses_sends_and_rewrites_offset_moved(tmp_path) -> None:
    cfg = make_config(str(tmp_path / "s"), broker_role=BrokerRole.SLAVE, broker_id=1)
    async with BrokerController(cfg) as ctl:
        assert ctl.schedule._task is None  # the delay service runs only on masters
        ctl.topics.update(TopicConfig("OnSlave", 4, 4))
        c = await Client().open(ctl.broker_addr)
        resp = await c.call(10, send_v1("OnSlave"), b"no")
        assert resp.code == R.SERVICE_NOT_AVAILABLE
        assert resp.remark == "service not available now, maybe disk full or the broker is a slave"
        got = await c.call(11, pull("OnSlave", offset=5, sys_flag=5))
        assert got.code == R.PULL_RETRY_IMMEDIATELY
        assert got.ext_fields["suggestWhichBrokerId"] == "0"
        assert ctl.offsets.query("cg", "OnSlave", 0) == -1  # commit flag ignored on a slave
        upd = await c.call(15, {"consumerGroup": "cg", "topic": "OnSlave", "queueId": 0, "commitOffset": 3})
        assert upd.code == R.SUCCESS and ctl.offsets.query("cg", "OnSlave", 0) == 3
        admin = await c.call(17, {"topic": "X", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6})
        assert admin.code == R.SYSTEM_ERROR and admin.remark.startswith("Can't modify topic")
        c.close()


async def test_sync_master_send_ok_is_the_plain_send_ok_frame(tmp_path) -> None:
    """SEND_OK written from the ack callback is the templated frame of a plain send: same fields, same
    opaque, byte for byte what ``encode`` writes for that SUCCESS command."""
    from types import SimpleNamespace

    from ferrymq.broker.processors.send import MSG_REGION, _SlaveAckReply
    from ferrymq.remoting.codec import FLAG_RESPONSE, encode
    from ferrymq.remoting.codes import CURRENT_VERSION

    cfg = make_config(str(tmp_path / "s"), broker_role=BrokerRole.SYNC_MASTER)
    async with BrokerController(cfg) as ctl:
        c = await Client().open(ctl.broker_addr)
        real_ha = ctl.writer.ha_service
        plain = await c.call(10, send_v1("SM", 0, "WAIT\x01false\x02"), b"plain")  # answered at once
        ctl.writer.ha_service = CallbackHA(True, True, "later")
        synced = await c.call(10, send_v1("SM"), b"synced")
        ctl.writer.ha_service = real_ha
        c.close()
    assert synced.code == plain.code == R.SUCCESS
    assert set(synced.ext_fields) == set(plain.ext_fields)
    assert synced.ext_fields["MSG_REGION"] == plain.ext_fields["MSG_REGION"] == MSG_REGION
    assert (synced.language, synced.version, synced.flag) == (plain.language, plain.version, plain.flag)

    written: list[bytes] = []
    conn = SimpleNamespace(closed=False, send=written.append)
    ar = SimpleNamespace(msg_id="7F00000100002A9F00000000000A1B2C", queue_offset=77)
    req = RemotingCommand.request(10, send_v1("SM"), b"x")
    req.opaque = 4242
    reply = _SlaveAckReply(None, conn, req, SimpleNamespace(append_result=ar), 3)  # type: ignore[arg-type]
    reply.inline = False
    reply(True)
    expected = RemotingCommand(
        R.SUCCESS, {"msgId": ar.msg_id, "queueId": "3", "queueOffset": "77", "MSG_REGION": MSG_REGION,
                    "TRACE_ON": "true"}, b"", 4242, FLAG_RESPONSE, None, "JAVA", CURRENT_VERSION, req.serialize_type)
    assert written == [encode(expected)]
