"""Controller mode serves consumers only confirmed records (docs/failover.md, "What consumers see in
controller mode"): the store dispatches up to the confirm offset (``Dispatcher.reput_end``), so pulls, max
offsets and long polls on the master and on slaves never show a record a failover could take back.

Store level: the bound stops the dispatch at the last record that ends at or below it, on the native path and
both pure-Python paths (pending metas, parsed bytes). Broker level, against the scripted controller of
test_controller_mode: a master whose writes one SyncStateSet member has not acked serves neither them nor a max
offset past them, nor does the slave that holds them; a long poll wakes when the ack arrives; readUnCommitted
serves them at once; a one-replica set serves at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from broker_helpers import Client, make_config, pull, records, send_v1, wait_for
from test_controller_mode import ScriptedController

from ferrymq.broker import writer as writer_module
from ferrymq.broker.app import BrokerController
from ferrymq.broker.writer import MessageWriter
from ferrymq.common.message import MessageExtBrokerInner
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.store import MessageStore, StoreConfig
from support.native import require_extension

TOPIC = "ConfirmedTopic"
#: the long-poll check that runs without any dispatch: out of the way, so a wake-up is the dispatch's
NO_PERIODIC_CHECK_MS = 3_600_000


# ---- store: the dispatch bound -------------------------------------------------------------------------

def _store(root: Path, mode: str) -> MessageStore:
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=64 * 1024,
                      mapped_file_size_consume_queue=20 * 100, index_hash_slot_num=64, index_max_num=256,
                      total_memory_bytes=1 << 30)
    store = MessageStore(cfg)
    store.load()
    native = require_extension() if mode == "native" else None
    store.dispatcher.native = native
    store.commit_log.queue_metas = native is None
    store.commit_log.native = native
    return store


@pytest.mark.parametrize("mode", ["native", "pure_pending", "pure_parse"])
def test_dispatch_stops_at_the_last_record_ending_at_or_below_reput_end(tmp_path: Path, mode: str) -> None:
    store = _store(tmp_path, mode)
    try:
        bound = [0]
        store.dispatcher.reput_end = lambda: bound[0]
        ends = []
        for i in range(9):  # 15 kB bodies: four to a 64 kB segment, then a BLANK filler and the next segment
            inner = MessageExtBrokerInner(topic=TOPIC, queue_id=0, body=bytes([i]) * 15_000,
                                          born_host=b"\x7f\x00\x00\x01\x00\x00\x30\x39",
                                          store_host=b"\x7f\x00\x00\x01\x00\x00\x51\xaf")
            ar = store.put_message(inner).append_result
            assert ar is not None
            ends.append(ar.wrote_offset + ar.wrote_bytes)
        assert store.reput() == 0 and store.get_max_offset_in_queue(TOPIC, 0) == 0
        previous_end = 0
        for k, end in enumerate(ends):
            for partial in (previous_end + 4, end - 1):  # in a record's (or the filler's) header, at its last byte
                if mode == "pure_parse":
                    store.commit_log.pending.clear()
                bound[0] = partial
                store.reput()
                assert store.get_max_offset_in_queue(TOPIC, 0) == k, (k, partial)
                assert store.dispatch_behind_bytes == 0
            bound[0] = end
            store.reput()
            assert store.get_max_offset_in_queue(TOPIC, 0) == k + 1
            assert store.reput_phy_offset == end
            previous_end = end
        result = store.get_message("g", TOPIC, 0, 0, 32, None)
        assert [bytes(b[-15_000:-14_999]) for b in result.buffers][:4] == [b"\x00", b"\x01", b"\x02", b"\x03"]
    finally:
        store.shutdown()


# ---- writer: long polls woken by the dispatch of a put, not by the put -------------------------------------

class _ConfirmBoundStore:
    """Puts of 100 bytes at the log's end; a reput dispatches up to ``confirmed``."""

    dispatch_behind_bytes = 0

    def __init__(self) -> None:
        self.max_phy_offset = 0
        self.confirmed = 0
        self.reput_phy_offset = 0
        self.reputs = 0

    def put_message(self, inner: Any) -> Any:
        ar = SimpleNamespace(wrote_offset=self.max_phy_offset, wrote_bytes=100, msg_num=1)
        self.max_phy_offset += 100
        return SimpleNamespace(append_result=ar)

    def reput(self, max_records: int, budget_s: float | None = None) -> int:
        self.reputs += 1
        self.reput_phy_offset = self.confirmed
        return 0

    def reput_can_advance(self) -> bool:
        return min(self.confirmed, self.max_phy_offset) > self.reput_phy_offset


async def test_held_queues_are_woken_by_the_reput_that_dispatches_them(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    store = _ConfirmBoundStore()
    woken: list[set[tuple[str, int]] | None] = []
    writer = MessageWriter(store, make_config(str(tmp_path)), None, woken.append)  # type: ignore[arg-type]
    writer.bind(asyncio.get_running_loop())
    writer.hold_keys = True

    async def settle() -> None:  # the reput a put or an ack scheduled (call_soon) runs
        for _ in range(3):
            await asyncio.sleep(0)

    for topic, qid in (("A", 0), ("B", 1), ("A", 0)):
        writer.put(SimpleNamespace(topic=topic, queue_id=qid))
    await settle()
    assert woken == []  # stored, not confirmed: nobody is told
    store.confirmed = 200
    writer.schedule_reput()  # (what the master's confirm-offset change does)
    await settle()
    assert woken == [{("A", 0), ("B", 1)}]
    store.confirmed = 300
    writer.schedule_reput()
    await settle()
    assert woken[1:] == [{("A", 0)}]
    # past HELD_KEYS_MAX waiting puts the queues are forgotten: one wake-up of all once the last is dispatched
    monkeypatch.setattr(writer_module, "HELD_KEYS_MAX", 2)
    for qid in range(3):
        writer.put(SimpleNamespace(topic="C", queue_id=qid))
    store.confirmed = 500
    writer.schedule_reput()
    await settle()
    assert woken[2:] == []
    store.confirmed = 600
    writer.schedule_reput()
    await settle()
    assert woken[2:] == [None]


async def test_a_put_beyond_the_confirm_offset_schedules_no_reput(tmp_path: Path) -> None:
    """A SYNC put in controller mode waits for the replicas' ack: a reput scheduled by the put itself would
    dispatch nothing (one wasted loop callback per send burst); the ack's move of the confirm offset does it."""
    store = _ConfirmBoundStore()
    woken: list[set[tuple[str, int]] | None] = []
    writer = MessageWriter(store, make_config(str(tmp_path)), None, woken.append)  # type: ignore[arg-type]
    writer.bind(asyncio.get_running_loop())
    writer.hold_keys = True
    for qid in range(3):
        writer.put(SimpleNamespace(topic="A", queue_id=qid))
        for _ in range(3):
            await asyncio.sleep(0)
    assert store.reputs == 0 and woken == []
    store.confirmed = 300  # the ack
    writer.schedule_reput()
    for _ in range(3):
        await asyncio.sleep(0)
    assert store.reputs == 1 and woken == [{("A", 0), ("A", 1), ("A", 2)}]
    # a bound the new record is within (a one-member SyncStateSet: the confirm offset is the log's end)
    store.confirmed = 1 << 62
    writer.put(SimpleNamespace(topic="B", queue_id=0))
    for _ in range(3):
        await asyncio.sleep(0)
    assert store.reputs == 2 and woken[1:] == [{("B", 0)}]


# ---- broker: master and slaves in controller mode --------------------------------------------------------

def _broker(tmp_path: Path, name: str, replica_id: int, controller: str, **overrides: object) -> BrokerController:
    cfg = make_config(str(tmp_path / name), None, enable_controller_mode=True, controller_addr=[controller],
                      listen_host="127.0.0.1", broker_id=replica_id, listen_port=0, ha_listen_port=0,
                      fast_listen_enable=False, controller_heartbeat_period_ms=100, controller_lease_ms=600,
                      # a replica that stops acking stays in the SyncStateSet for the whole test
                      ha_max_time_slave_not_catchup_ms=60_000, ha_send_heartbeat_interval_ms=200,
                      sync_flush_timeout_ms=30_000, **overrides)
    broker = BrokerController(cfg)
    broker.long_polling.check_interval_ms = NO_PERIODIC_CHECK_MS
    return broker


async def _call(broker: BrokerController, code: int, fields: dict[str, object], body: bytes = b"",
                timeout_ms: int = 5000) -> RemotingCommand:
    client = await Client().open(broker.broker_addr)
    try:
        return await client.call(code, fields, body, timeout_ms=timeout_ms)
    finally:
        client.close()


async def _send(broker: BrokerController, body: bytes) -> RemotingCommand:
    return await _call(broker, RequestCode.SEND_MESSAGE, send_v1(TOPIC), body, timeout_ms=40_000)


async def _max_offset(broker: BrokerController) -> int:
    resp = await _call(broker, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 0})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return int(resp.ext_fields["offset"])


async def _pull_now(broker: BrokerController, queue_offset: int) -> RemotingCommand:
    return await _call(broker, RequestCode.PULL_MESSAGE, pull(TOPIC, offset=queue_offset, sys_flag=4))


async def test_unacked_writes_are_served_by_neither_master_nor_slave_until_confirmed(tmp_path: Path) -> None:
    ctl = ScriptedController()
    await ctl.server.start()
    brokers = [_broker(tmp_path, f"b{i}", i, ctl.addr) for i in (1, 2, 3)]
    b1, b2, b3 = brokers
    sends: list[asyncio.Task[RemotingCommand]] = []
    try:
        for b in brokers:
            await b.start()
        await wait_for(lambda: {1, 2, 3} <= set(ctl.reports))
        ctl.elect(1)
        r1, r2, r3 = b1.controller_role, b2.controller_role, b3.controller_role
        assert r1 is not None and r2 is not None and r3 is not None
        await wait_for(lambda: r1.can_ack() and r1.ha_master.sync_state_set == {1, 2, 3},
                       what="SyncStateSet {1, 2, 3}")
        for i in range(5):
            assert (await _send(b1, b"confirmed-%d" % i)).code == ResponseCode.SUCCESS
        confirmed_end = int(b1.store.max_phy_offset)
        await wait_for(lambda: all(b.store.get_max_offset_in_queue(TOPIC, 0) == 5 for b in brokers),
                       what="the confirmed messages dispatched everywhere")

        # replica 3 stops acking: the master and replica 2 hold three more messages that the set has not confirmed
        await r3.ha_client.stop()
        await wait_for(lambda: not r3.ha_client.connected)
        sends = [asyncio.create_task(_send(b1, b"unconfirmed-%d" % i)) for i in range(3)]
        await wait_for(lambda: b1.store.commit_log.max_offset > confirmed_end and r2.ha_master.store is not None
                       and b2.store.max_phy_offset == b1.store.max_phy_offset
                       and r1.ha_master.slave_status()[0]["ackPhyOffset"] == b1.store.max_phy_offset,
                       what="replica 2 holds them and acked them")
        unconfirmed_end = int(b1.store.max_phy_offset)
        await wait_for(lambda: b2.store.dispatch_behind_bytes == 0 and b1.store.dispatch_behind_bytes == 0)
        assert r1.confirm_offset == confirmed_end and r2.confirm_offset == confirmed_end
        for b in (b1, b2):
            assert b.store.get_max_offset_in_queue(TOPIC, 0) == 5
            assert await _max_offset(b) == 5
            resp = await _pull_now(b, 5)
            assert resp.code == ResponseCode.PULL_NOT_FOUND and int(resp.ext_fields["maxOffset"]) == 5
            resp = await _pull_now(b, 0)
            assert resp.code == ResponseCode.SUCCESS
            assert [m.body for m in records(resp.body)] == [b"confirmed-%d" % i for i in range(5)]
            assert int(resp.ext_fields["maxOffset"]) == 5 and int(resp.ext_fields["nextBeginOffset"]) == 5
        assert not any(s.done() for s in sends)

        # a long poll at the confirmed end stays parked ...
        parked = asyncio.create_task(_call(b1, RequestCode.PULL_MESSAGE, pull(TOPIC, offset=5, suspend_ms=20_000),
                                           timeout_ms=30_000))
        await wait_for(lambda: b1.long_polling.parked_count == 1)
        # ... until replica 3 acks: the master's confirm offset moves, the dispatch wakes it (no periodic check)
        await r3.ha_client.start()
        resp = await asyncio.wait_for(parked, 10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [m.body for m in records(resp.body)] == [b"unconfirmed-%d" % i for i in range(3)]
        assert r1.confirm_offset == unconfirmed_end
        assert [s.code for s in await asyncio.gather(*sends)] == [ResponseCode.SUCCESS] * 3
        assert await _max_offset(b1) == 8
        # the slaves serve them once their master's next transfer header carries the new confirm offset
        await wait_for(lambda: all(b.store.get_max_offset_in_queue(TOPIC, 0) == 8 for b in (b2, b3)))
        assert await _max_offset(b2) == 8
    finally:
        for s in sends:
            s.cancel()
        for b in reversed(brokers):
            await b.stop()
        await ctl.server.stop()


async def test_read_uncommitted_serves_what_the_master_holds_and_a_lone_master_serves_at_once(
        tmp_path: Path) -> None:
    ctl = ScriptedController()
    await ctl.server.start()
    b1 = _broker(tmp_path, "b1", 1, ctl.addr, read_uncommitted=True)
    b2 = _broker(tmp_path, "b2", 2, ctl.addr)
    sends: list[asyncio.Task[RemotingCommand]] = []
    try:
        await b1.start()
        await wait_for(lambda: 1 in ctl.reports)
        ctl.elect(1)
        r1 = b1.controller_role
        assert r1 is not None
        await wait_for(r1.can_ack)
        # the set is {1}: the confirm offset is the master's own end, a send is served as soon as it is stored
        assert (await _send(b1, b"alone")).code == ResponseCode.SUCCESS
        assert r1.confirm_offset == b1.store.max_phy_offset
        assert await _max_offset(b1) == 1
        await b2.start()
        r2 = b2.controller_role
        assert r2 is not None
        await wait_for(lambda: r1.ha_master.sync_state_set == {1, 2}, what="SyncStateSet {1, 2}")
        await r2.ha_client.stop()
        sends = [asyncio.create_task(_send(b1, b"uncommitted-%d" % i)) for i in range(2)]
        await wait_for(lambda: b1.store.get_max_offset_in_queue(TOPIC, 0) == 3)
        assert r1.confirm_offset < b1.store.max_phy_offset
        resp = await _pull_now(b1, 1)  # readUnCommitted=true: as in classic mode
        assert resp.code == ResponseCode.SUCCESS
        assert [m.body for m in records(resp.body)] == [b"uncommitted-0", b"uncommitted-1"]
        await r2.ha_client.start()
        assert [s.code for s in await asyncio.gather(*sends)] == [ResponseCode.SUCCESS] * 2
    finally:
        for s in sends:
            s.cancel()
        await b2.stop()
        await b1.stop()
        await ctl.server.stop()
