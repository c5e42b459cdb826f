"""Controller-mode HA: codec round trips, and AutoSwitchHAMaster + AutoSwitchHAClient with real stores over
real sockets on 127.0.0.1 (replication, SYNC acks, a diverged replica cut back to the common point, stale
epochs and a wrong HMAC refused)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from ha_store_support import commit_log_bytes, open_store, put_n
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import ProtocolError
from ferrymq.ha import auto_codec as codec
from ferrymq.ha.auto_client import AutoSwitchHAClient
from ferrymq.ha.auto_master import AutoSwitchHAMaster
from ferrymq.ha.epoch import EpochFile
from ferrymq.store.config import BrokerRole
from ferrymq.store.message_store import MessageStore
from support.aio import wait_for

I64 = st.integers(0, (1 << 63) - 1)
ENTRIES = st.lists(st.tuples(I64, I64), max_size=20).map(tuple)


# --- codec -------------------------------------------------------------------------------------------

@given(st.integers(1, 1 << 40), st.text(min_size=1, max_size=60).filter(lambda s: len(s.encode()) <= 255), I64,
       ENTRIES, st.one_of(st.none(), st.binary(min_size=1, max_size=40)), st.binary(min_size=16, max_size=16))
def test_handshake_round_trip(replica_id: int, name: str, max_phy: int, entries: tuple[tuple[int, int], ...],
                              secret: bytes | None, nonce: bytes) -> None:
    data = codec.encode_handshake(replica_id, name, max_phy, entries, secret, nonce)
    assert codec.handshake_rest_size(data[: codec.HANDSHAKE_FIXED]) == len(data) - codec.HANDSHAKE_FIXED
    version, hs = codec.decode_handshake(data)
    assert (version, hs.replica_id, hs.broker_name, hs.max_phy_offset, hs.entries) == (
        codec.VERSION, replica_id, name, max_phy, entries)
    if secret:
        assert codec.verify_mac(secret, nonce, hs)
        assert not codec.verify_mac(secret + b"x", nonce, hs)
        assert not codec.verify_mac(secret, bytes(16) if nonce != bytes(16) else b"\x01" * 16, hs)
    else:
        assert hs.mac == b""


@given(st.sampled_from(list(codec.HandshakeStatus)), I64, st.integers(-1, 1 << 62), I64, ENTRIES)
def test_answer_round_trip(status: codec.HandshakeStatus, epoch: int, cut: int, master_max: int,
                           entries: tuple[tuple[int, int], ...]) -> None:
    data = codec.encode_answer(status, epoch, cut, master_max, entries)
    assert codec.answer_rest_size(data[: codec.ANSWER_FIXED]) == len(data) - codec.ANSWER_FIXED
    assert codec.decode_answer(data) == codec.Answer(status, epoch, cut, master_max, entries)


@given(st.integers(1, 1 << 40), st.integers(0, 1 << 40), I64, I64, st.integers(0, codec.MAX_TRANSFER_BODY_SIZE))
def test_transfer_header_round_trip(master_epoch: int, back: int, phy: int, confirm: int, size: int) -> None:
    data_epoch = max(1, master_epoch - back)
    start = phy // 2
    data = codec.encode_transfer_header(master_epoch, data_epoch, start, phy, confirm, size)
    assert len(data) == codec.TRANSFER_HEADER_SIZE
    assert codec.decode_transfer_header(data) == codec.TransferHeader(master_epoch, data_epoch, start, phy, confirm,
                                                                      size)


def test_codec_rejects_hostile_values() -> None:
    with pytest.raises(ProtocolError):
        codec.decode_hello(b"XXXX" + bytes(18))
    fixed = bytearray(codec.encode_handshake(2, "b", 0, [], None, bytes(16))[: codec.HANDSHAKE_FIXED])
    fixed[24:28] = (10**9).to_bytes(4, "big")  # entry count
    with pytest.raises(ProtocolError):
        codec.handshake_rest_size(bytes(fixed))
    header = bytearray(codec.encode_transfer_header(3, 2, 0, 100, 0, 10))
    header[40:44] = (codec.MAX_TRANSFER_BODY_SIZE + 1).to_bytes(4, "big")
    with pytest.raises(ProtocolError):
        codec.decode_transfer_header(bytes(header))
    with pytest.raises(ProtocolError):  # data from a newer epoch than the sender's
        codec.decode_transfer_header(codec.encode_transfer_header(3, 4, 0, 100, 0, 10))


# --- master + client over sockets --------------------------------------------------------------------

class Group:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.stores: list[MessageStore] = []
        self.masters: list[AutoSwitchHAMaster] = []
        self.clients: list[AutoSwitchHAClient] = []

    def store(self, name: str) -> tuple[MessageStore, EpochFile]:
        store = open_store(self.tmp / name, BrokerRole.ASYNC_MASTER)
        self.stores.append(store)
        return store, EpochFile.in_store(str(self.tmp / name))

    async def master(self, store: MessageStore, epochs: EpochFile, **kw: object) -> AutoSwitchHAMaster:
        m = AutoSwitchHAMaster(store, epochs, "127.0.0.1", 0, broker_name="b", replica_id=1, **kw)  # type: ignore[arg-type]
        await m.start()
        self.masters.append(m)
        return m

    async def client(self, store: MessageStore, epochs: EpochFile, master: AutoSwitchHAMaster | None, epoch: int,
                     replica_id: int = 2, **kw: object) -> AutoSwitchHAClient:
        c = AutoSwitchHAClient(store, epochs, replica_id, "b", on_appended=store.reput,
                               reconnect_interval_ms=100, **kw)  # type: ignore[arg-type]
        await c.start()
        if master is not None:
            c.set_master(f"127.0.0.1:{master.port}", epoch)
        self.clients.append(c)
        return c

    async def close(self) -> None:
        for c in self.clients:
            await c.stop()
        for m in self.masters:
            await m.stop()
        for s in self.stores:
            if s.running:
                s.shutdown()


@pytest.fixture
async def group(tmp_path: Path) -> AsyncIterator[Group]:
    g = Group(tmp_path)
    try:
        yield g
    finally:
        await g.close()


def same_log(a: MessageStore, b: MessageStore) -> bool:
    return a.max_phy_offset == b.max_phy_offset and \
        commit_log_bytes(a, 0, a.max_phy_offset) == commit_log_bytes(b, 0, b.max_phy_offset)


async def test_replication_and_sync_acks(group: Group) -> None:
    ms, me = group.store("m")
    me.append(1, 0)
    put_n(ms, 0, 3000)  # several 1 MiB segments
    lagging: list[int] = []
    master = await group.master(ms, me, ha_max_time_slave_not_catchup_ms=300, on_slave_lagging=lagging.append)
    ss, se = group.store("s")
    client = await group.client(ss, se, master, 1)
    await wait_for(lambda: ss.max_phy_offset == ms.max_phy_offset, what="catch-up")
    assert same_log(ms, ss)
    assert se.entries() == [(1, 0)]
    # SYNC: the SyncStateSet {1, 2} needs replica 2's ack
    master.set_sync_state_set({1, 2}, 1)
    ends = put_n(ms, 3000, 20)
    master.notify_data_appended()
    assert await master.wait_for_ack(ends[-1], 5000)
    assert master.confirm_offset == ends[-1]
    await wait_for(lambda: client.status()["confirmOffset"] == ends[-1], what="confirm offset reaches the slave")
    assert [s["replicaId"] for s in master.slave_status()] == [2]
    # the slave gone: waits time out, and after haMaxTimeSlaveNotCatchup the master reports it lagging
    await client.stop()
    ends = put_n(ms, 3020, 5)
    master.notify_data_appended()
    assert not await master.wait_for_ack(ends[-1], 200)
    await wait_for(lambda: lagging == [2], what="lagging callback")
    # a set smaller than minInSyncReplicas fails at once; without allAckInSyncStateSet one ack of two is enough
    master.set_sync_state_set({1}, 2)
    master.min_in_sync_replicas = 2
    assert not await master.wait_for_ack(ends[-1], 5000)
    master.min_in_sync_replicas = 1
    assert await master.wait_for_ack(ends[-1], 10)  # the master alone


async def test_caught_up_callback_for_a_slave_outside_the_set(group: Group) -> None:
    ms, me = group.store("m")
    me.append(1, 0)
    put_n(ms, 0, 200)
    caught: list[int] = []
    master = await group.master(ms, me, on_slave_caught_up=caught.append)
    ss, se = group.store("s")
    await group.client(ss, se, master, 1)
    await wait_for(lambda: caught == [2], what="caught-up callback")


async def test_diverged_replica_is_cut_to_the_common_point(group: Group) -> None:
    # replica 2 was master of epoch 1; replica 1 copied part of it, then became master of epoch 2
    old, old_epochs = group.store("old")
    old_epochs.append(1, 0)
    put_n(old, 0, 1500)
    new, new_epochs = group.store("new")
    common = old.max_phy_offset
    assert new.append_at(0, commit_log_bytes(old, 0, common))
    new.reput()
    new_epochs.append(1, 0)
    put_n(old, 1500, 700)  # acknowledged by nobody else: lost in the failover
    diverged_end = old.max_phy_offset
    new_epochs.append(2, new.max_phy_offset)
    put_n(new, 5000, 400)  # the new master's epoch 2 records, at the same offsets as the old tail
    master = await group.master(new, new_epochs)
    client = await group.client(old, old_epochs, master, 2)
    await wait_for(lambda: old.max_phy_offset == new.max_phy_offset and client.truncations == 1,
                   what="old master catches up after the cut")
    assert diverged_end > common
    assert same_log(old, new)
    assert old_epochs.entries() == new_epochs.entries() == [(1, 0), (2, common)]
    # consume queues follow the new log: 400 + 1500 records, 4 queues
    assert sum(old.get_max_offset_in_queue("HaTopic", q) for q in range(4)) == 1900
    # and new writes in epoch 2 keep flowing
    put_n(new, 6000, 50)
    master.notify_data_appended()
    await wait_for(lambda: same_log(old, new), what="epoch 2 replication")


async def test_stale_master_is_refused(group: Group) -> None:
    ms, me = group.store("m")
    me.append(3, 0)
    put_n(ms, 0, 50)
    master = await group.master(ms, me)
    ss, se = group.store("s")
    client = await group.client(ss, se, master, 5)  # the replica knows epoch 5 already
    await wait_for(lambda: "StaleEpochError" in client.status()["lastError"], what="stale master refused")
    assert ss.max_phy_offset == 0 and se.entries() == []


async def test_stale_epoch_transfer_is_refused(group: Group) -> None:
    """A peer that answers for epoch 5 and then sends a transfer stamped with epoch 4."""
    got: list[bytes] = []

    async def fake_master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(codec.encode_hello(bytes(16)))
        fixed = await reader.readexactly(codec.HANDSHAKE_FIXED)
        await reader.readexactly(codec.handshake_rest_size(fixed))
        writer.write(codec.encode_answer(codec.HandshakeStatus.OK, 5, 0, 1000, [(5, 0)]))
        got.append(await reader.readexactly(codec.REPORT_SIZE))
        writer.write(codec.encode_transfer_header(4, 4, 0, 0, 0, 100) + bytes(100))
        await writer.drain()
        await reader.read()  # until the client hangs up
        writer.close()

    server = await asyncio.start_server(fake_master, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        ss, se = group.store("s")
        client = await group.client(ss, se, None, 0)
        client.set_master(f"127.0.0.1:{port}", 5)
        await wait_for(lambda: client.refused_transfers >= 1, what="stale transfer refused")
        assert ss.max_phy_offset == 0 and se.entries() == []
    finally:
        server.close()
        await client.stop()
        await server.wait_closed()


@pytest.mark.parametrize("slave_secret", ["wrong", None])
async def test_wrong_hmac_is_refused_and_never_acks(group: Group, slave_secret: str | None) -> None:
    ms, me = group.store("m")
    me.append(1, 0)
    ends = put_n(ms, 0, 50)
    master = await group.master(ms, me, ha_secret="right")
    master.set_sync_state_set({1, 2}, 1)
    ss, se = group.store("s")
    client = await group.client(ss, se, master, 1, ha_secret=slave_secret)
    await wait_for(lambda: master.rejected_handshakes >= 2, what="two refused handshakes")
    assert "AUTH_FAILED" in client.status()["lastError"]
    assert not await master.wait_for_ack(ends[-1], 100)
    assert ss.max_phy_offset == 0 and master.slave_status()[0]["ackPhyOffset"] == 0
    # the right secret works
    good_store, good_epochs = group.store("good")
    await group.client(good_store, good_epochs, master, 1, replica_id=2, ha_secret="right")
    assert await master.wait_for_ack(ends[-1], 10_000)


async def test_empty_replica_starts_at_the_masters_oldest_byte(group: Group) -> None:
    ms, me = group.store("m")
    donor, _ = group.store("donor")
    put_n(donor, 0, 6000)  # more than 2 segments
    start = 2 * 1024 * 1024
    assert ms.append_at(start, commit_log_bytes(donor, start, donor.max_phy_offset))  # retention took the rest
    ms.reput()
    me.append(1, 0)
    master = await group.master(ms, me)
    ss, se = group.store("s")
    await group.client(ss, se, master, 1)
    await wait_for(lambda: ss.max_phy_offset == ms.max_phy_offset, what="catch-up from the master's min offset")
    assert ss.min_phy_offset == start
    assert commit_log_bytes(ss, start, ss.max_phy_offset) == commit_log_bytes(ms, start, ms.max_phy_offset)
    assert se.entries() == [(1, 0)]


async def test_an_ack_beyond_what_was_sent_never_counts(group: Group) -> None:
    """A peer that passes the handshake (no secret configured) but acknowledges bytes it never received."""
    ms, me = group.store("m")
    me.append(1, 0)
    put_n(ms, 0, 20)
    master = await group.master(ms, me)
    master.set_sync_state_set({1, 2}, 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", master.port)
    try:
        nonce = codec.decode_hello(await reader.readexactly(codec.HELLO_SIZE))
        writer.write(codec.encode_handshake(2, "b", 0, [], None, nonce))
        fixed = await reader.readexactly(codec.ANSWER_FIXED)
        await reader.readexactly(codec.answer_rest_size(fixed))
        writer.write(codec.encode_report(0) + codec.encode_report(1 << 40))
        await writer.drain()
        ends = put_n(ms, 20, 1)
        master.notify_data_appended()
        assert not await master.wait_for_ack(ends[-1], 300)
        assert master.confirm_offset == 0
    finally:
        writer.close()


async def test_idle_replica_answers_heartbeats_and_stays_connected(group: Group) -> None:
    """With no new data the master only sends heartbeats; the replica answers each with a report, so the
    master never drops it as silent (it used to reconnect every housekeeping interval), and an idle replica
    outside the SyncStateSet is still reported caught up."""
    ms, me = group.store("m")
    me.append(1, 0)
    caught: list[int] = []
    master = await group.master(ms, me, heartbeat_interval_ms=50, housekeeping_interval_ms=400,
                                on_slave_caught_up=caught.append)
    ss, se = group.store("s")
    client = await group.client(ss, se, master, 1)
    await wait_for(lambda: client.connected, what="connected")
    await wait_for(lambda: caught == [2], what="caught-up signal of an idle replica")
    drops = 0
    was = True
    for _ in range(150):  # 1.5 s: almost four housekeeping intervals
        await asyncio.sleep(0.01)
        now = any(s["connected"] for s in master.slave_status())
        drops += was and not now
        was = now
    assert drops == 0 and client.connected


async def test_callback_waiters_answer_on_ack_timeout_and_role_change(group: Group) -> None:
    """on_slave_ack (the SYNC send path's waiter): True once the SyncStateSet acked, False after its timeout,
    False for every waiter when the master is deactivated (a role change)."""
    ms, me = group.store("m")
    me.append(1, 0)
    master = await group.master(ms, me)
    ss, se = group.store("s")
    await group.client(ss, se, master, 1)
    master.set_sync_state_set({1, 2}, 1)
    got: list[tuple[str, bool]] = []
    ends = put_n(ms, 0, 5)
    master.on_slave_ack(ends[-1], 5000, lambda ok: got.append(("acked", ok)))
    master.notify_data_appended()
    await wait_for(lambda: got == [("acked", True)], what="the callback after the ack")
    master.on_slave_ack(ends[-1] + 10**9, 50, lambda ok: got.append(("never", ok)))  # beyond anything sent
    await wait_for(lambda: ("never", False) in got, what="the timeout")
    master.on_slave_ack(ends[-1] + 10**9, 60_000, lambda ok: got.append(("deposed", ok)))
    await master.deactivate()
    assert ("deposed", False) in got
    master.on_slave_ack(ends[-1], 5000, lambda ok: got.append(("inactive", ok)))
    assert got[-1] == ("inactive", False)


def test_confirm_callback_runs_only_when_the_least_other_ack_moves(tmp_path: Path) -> None:
    """The broker dispatches on every ``on_confirm_changed``: an ack that leaves the least ack of the other
    SyncStateSet members where it was (another member is behind, a repeated report) must not schedule one."""
    store = SimpleNamespace(max_phy_offset=1000)
    seen: list[int] = []
    master = AutoSwitchHAMaster(store, EpochFile.in_store(str(tmp_path)), "127.0.0.1", 0,  # type: ignore[arg-type]
                                broker_name="b", replica_id=1, on_confirm_changed=lambda: seen.append(
                                    master.confirm_offset))
    assert master.confirm_offset == 1000  # alone: the log's end
    master.set_sync_state_set({1, 2, 3}, 1)
    assert seen == [0]
    master._acks[2] = 500
    master._recompute()  # replica 3 has acked nothing: the confirm offset stays
    assert seen == [0]
    master._acks[3] = 400
    master._recompute()
    master._recompute()
    assert seen == [0, 400]
    master.set_sync_state_set({1, 2}, 2)
    assert seen == [0, 400, 500] and master.confirm_offset == 500
    store.max_phy_offset = 450  # (a cut log) the confirm offset never passes the log's end
    assert master.confirm_offset == 450


async def test_answered_callback_waiters_leave_the_deadline_heap_at_the_ack(tmp_path: Path) -> None:
    """A SYNC send's callback waiter is answered by the ack; its deadline entry must go with it, not stay for
    the whole wait: at 18,000 sends/s and a 3 s wait that was 50,000+ live entries (and their replies) that
    the collector's full passes walked and froze."""
    store = SimpleNamespace(max_phy_offset=10_000)
    master = AutoSwitchHAMaster(store, EpochFile.in_store(str(tmp_path)), "127.0.0.1", 0,  # type: ignore[arg-type]
                                broker_name="b", replica_id=1)
    master.set_sync_state_set({1, 2}, 1)
    answers: list[bool] = []
    try:
        for end in range(100, 10_100, 100):
            master.on_slave_ack(end, 3000, answers.append)
        assert answers == [] and len(master._deadlines) == 100
        master._acks[2] = 5_000
        master._recompute()
        assert answers == [True] * 50 and len(master._deadlines) == 50
        master._acks[2] = 10_000
        master._recompute()
        assert answers == [True] * 100 and master._deadlines == []
    finally:
        master._fail_waiters()


async def test_a_lone_send_is_pushed_inside_its_put_and_an_iterations_sends_share_a_transfer(group: Group) -> None:
    """Nothing in flight to the replica: the transfer is written inside ``notify_data_appended`` (no loop turn
    before the push); behind an unacked transfer the iteration's sends wait for its one push."""
    ms, me = group.store("m")
    me.append(1, 0)
    put_n(ms, 0, 5)
    master = await group.master(ms, me)
    master.set_sync_state_set({1, 2}, 1)
    ss, se = group.store("s")
    await group.client(ss, se, master, 1)
    await wait_for(lambda: master._acks.get(2) == ms.max_phy_offset, what="replica caught up")
    slave = master._slaves[2]
    writes: list[int] = []
    write = slave.writer.write

    def spy(data: bytes) -> None:
        writes.append(len(data))
        write(data)

    slave.writer.write = spy  # type: ignore[method-assign]
    start = ms.max_phy_offset
    ends = put_n(ms, 5, 1)
    master.notify_data_appended()
    assert writes == [codec.TRANSFER_HEADER_SIZE + ends[-1] - start]
    assert slave.next_phy_offset == ends[-1]
    ends2 = put_n(ms, 6, 1)  # same iteration: left to the iteration's push
    master.notify_data_appended()
    assert len(writes) == 1
    await asyncio.sleep(0)
    assert len(writes) == 2 and slave.next_phy_offset == ends2[-1]
    assert await master.wait_for_ack(ends2[-1], 5000)
    # behind an unacked transfer: no push inside the put, one push for the iteration's sends
    await asyncio.sleep(0)
    put_n(ms, 7, 1)
    writes.clear()
    # the replica answers within a few loop iterations of this same loop: hold its ack back by hand, as if
    # the last transfer were still on its way
    slave.ack_phy_offset -= 1
    ends3 = put_n(ms, 8, 2)
    master.notify_data_appended()
    master.notify_data_appended()
    assert writes == []
    await asyncio.sleep(0)
    assert len(writes) == 1 and slave.next_phy_offset == ends3[-1]
    # after an iteration of several puts (producers sending together) the next one waits for its iteration's
    # push, nothing in flight or not; after a single-put iteration the push is inside the put again
    assert await master.wait_for_ack(ends3[-1], 5000)
    put_n(ms, 10, 1)
    master.notify_data_appended()
    assert len(writes) == 1
    await asyncio.sleep(0)
    assert len(writes) == 2
    assert await master.wait_for_ack(ms.max_phy_offset, 5000)
    put_n(ms, 11, 1)
    master.notify_data_appended()
    assert len(writes) == 3


@pytest.mark.parametrize("error", [OSError("broken pipe"), RuntimeError("transport in a bad state")])
async def test_a_failing_push_inside_the_put_never_reaches_the_send(group: Group, error: Exception) -> None:
    ms, me = group.store("m")
    me.append(1, 0)
    put_n(ms, 0, 5)
    master = await group.master(ms, me)
    ss, se = group.store("s")
    await group.client(ss, se, master, 1)
    await wait_for(lambda: master._acks.get(2) == ms.max_phy_offset, what="replica caught up")
    slave = master._slaves[2]

    def fail(data: bytes) -> None:
        raise error

    slave.writer.write = fail  # type: ignore[method-assign]
    put_n(ms, 5, 1)
    master.notify_data_appended()  # returns: the put's caller (the send handler) never sees the push fail
    assert (2 in master._slaves) is not isinstance(error, OSError)  # an OSError drops the replica, as the pump does
