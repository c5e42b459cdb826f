"""A master whose controller connection closes is replaced once the lease of its last heartbeat has surely
ended, not after the whole heartbeat timeout (docs/decisions/0009); a master that is only silent keeps the
timeout. The table's arithmetic with a plain clock, then a single-node controller over TCP (manual clock)."""

from __future__ import annotations

import pytest
from ctl_support import HEARTBEAT_TIMEOUT_MS, BrokerFactory, FakeBroker, body

from ferrymq.controller.liveness import LEASE_END_MARGIN_MS, LivenessTable
from ferrymq.controller.raft import QUORUM_CONTACT_MS
from ferrymq.controller.server import ControllerServer
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from support.aio import wait_for
from support.clock import ManualClock

NAME = "broker-a"
LEASE_MS = 2000
#: a heartbeat's last lease ends this long after the controller heard it (+ the margin)
DEAD_AFTER_MS = LEASE_MS + LEASE_END_MARGIN_MS


class Chan:
    """A stand-in connection for the pure table."""

    closed = False


def _beat(table: LivenessTable, rid: int, now_ms: int, chan: object, lease_ms: int | None = LEASE_MS,
          floor_ms: int = 0) -> None:
    table.beat(NAME, rid, now_ms, max_phy_offset=0, epoch=1, confirm_offset=0, channel=chan, lease_ms=lease_ms,
               lease_floor_ms=floor_ms)


# ---- the table ----------------------------------------------------------------------------------------

def test_closed_connection_ends_liveness_at_the_end_of_the_lease() -> None:
    table = LivenessTable(HEARTBEAT_TIMEOUT_MS)
    chan = Chan()
    _beat(table, 1, 10_000, chan)
    assert table.channel_closed(chan, 0) == [(NAME, 1, 10_000 + DEAD_AFTER_MS)]
    assert table.alive(NAME, 1, 10_000 + DEAD_AFTER_MS - 1)
    assert not table.alive(NAME, 1, 10_000 + DEAD_AFTER_MS)
    view = table.view(NAME, 1, 10_000 + DEAD_AFTER_MS)
    assert view is not None and not view.alive and view.last_heartbeat_ago_ms == DEAD_AFTER_MS
    assert table.channels(NAME) == []  # no notices to a closed connection
    # heard again on a new connection: alive, and the old one's close is forgotten
    _beat(table, 1, 10_000 + DEAD_AFTER_MS + 5, Chan())
    assert table.alive(NAME, 1, 10_000 + DEAD_AFTER_MS + 5 + HEARTBEAT_TIMEOUT_MS - 1)


def test_silent_replica_and_replica_without_lease_keep_the_timeout() -> None:
    table = LivenessTable(HEARTBEAT_TIMEOUT_MS)
    open_chan, no_lease, too_long = Chan(), Chan(), Chan()
    _beat(table, 1, 0, open_chan)
    _beat(table, 2, 0, no_lease, lease_ms=None)
    _beat(table, 3, 0, too_long, lease_ms=HEARTBEAT_TIMEOUT_MS - LEASE_END_MARGIN_MS)
    assert table.channel_closed(no_lease, 0) == [] and table.channel_closed(too_long, 0) == []
    for rid in (1, 2, 3):
        assert table.alive(NAME, rid, HEARTBEAT_TIMEOUT_MS - 1), rid
        assert not table.alive(NAME, rid, HEARTBEAT_TIMEOUT_MS), rid


def test_the_close_of_a_connection_the_replica_left_changes_nothing() -> None:
    table = LivenessTable(HEARTBEAT_TIMEOUT_MS)
    old, new = Chan(), Chan()
    _beat(table, 1, 0, old)
    _beat(table, 1, 500, new)  # reconnected (e.g. after a controller restart) before the old one closed
    assert table.channel_closed(old, 0) == []
    assert table.alive(NAME, 1, 500 + DEAD_AFTER_MS)
    assert table.channels(NAME) == [new]


def test_a_deposed_leaders_last_renewal_bounds_the_end_of_the_lease() -> None:
    """A new leader ready at 1000 cannot rule out a lease the old leader renewed until 1000 + 500."""
    table = LivenessTable(HEARTBEAT_TIMEOUT_MS)
    chan = Chan()
    floor = 1000 + QUORUM_CONTACT_MS
    _beat(table, 1, 1100, chan, floor_ms=floor)
    assert table.channel_closed(chan, floor) == [(NAME, 1, floor + DEAD_AFTER_MS)]


def test_a_heartbeat_noted_after_its_connection_closed_is_dead_at_its_lease_end() -> None:
    table = LivenessTable(HEARTBEAT_TIMEOUT_MS)
    chan = Chan()
    chan.closed = True  # closed while the heartbeat waited for the leader: no close event comes any more
    _beat(table, 1, 0, chan)
    assert table.alive(NAME, 1, DEAD_AFTER_MS - 1) and not table.alive(NAME, 1, DEAD_AFTER_MS)


def test_grace_forgets_channels_and_closes() -> None:
    table = LivenessTable(HEARTBEAT_TIMEOUT_MS)
    chan = Chan()
    _beat(table, 1, 0, chan)
    table.grant_grace([(NAME, 1), (NAME, 2)], 10_000)
    assert table.channel_closed(chan, 0) == [] and table.channels(NAME) == []
    assert table.alive(NAME, 1, 10_000 + HEARTBEAT_TIMEOUT_MS - 1)


# ---- a controller over TCP ------------------------------------------------------------------------------

async def _group_of_three(controller: ControllerServer, fake_broker: BrokerFactory,
                          clock: ManualClock) -> tuple[FakeBroker, FakeBroker, FakeBroker]:
    """Master 1 with SyncStateSet {1, 2}, replica 3 outside it; every heartbeat declares LEASE_MS, heard
    once the new leader's floor (ready + QUORUM_CONTACT_MS) has passed."""
    clock.advance(QUORUM_CONTACT_MS)
    brokers = await fake_broker(NAME, 1), await fake_broker(NAME, 2), await fake_broker(NAME, 3)
    for b in brokers:
        resp = await b.heartbeat(leaseMs=LEASE_MS)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    resp = await brokers[0].conn.invoke(RemotingCommand.request(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
        "brokerName": NAME, "masterId": 1, "masterEpoch": 1, "syncStateSetEpoch": 1},
        jsonx.dumps({"syncStateSet": [1, 2]})))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return brokers


def _master(controller: ControllerServer) -> int:
    group = controller.raft.group(NAME)
    assert group is not None
    return group.master_id


async def test_closed_master_connection_elects_when_the_lease_ended(controller: ControllerServer,
                                                                    fake_broker: BrokerFactory,
                                                                    clock: ManualClock) -> None:
    b1, b2, b3 = await _group_of_three(controller, fake_broker, clock)
    b1.conn.close()  # what the kernel does for a SIGKILLed broker
    await wait_for(lambda: len(controller.core.liveness.channels(NAME)) == 2, what="the controller saw the close")
    clock.advance(DEAD_AFTER_MS - 1)
    await b2.heartbeat(leaseMs=LEASE_MS)
    await b3.heartbeat(leaseMs=LEASE_MS)
    await controller.core.scan_once()
    assert _master(controller) == 1  # its lease may still be running
    clock.advance(1)
    await controller.core.scan_once()
    assert _master(controller) == 2  # 2.2 s after its last heartbeat, not 3 s
    await wait_for(lambda: b2.notices and b2.notices[-1]["masterId"] == 2, what="role-change notice")


async def test_lease_end_timer_elects_without_the_scan(controller: ControllerServer, fake_broker: BrokerFactory,
                                                       clock: ManualClock) -> None:
    b1, b2, _ = await _group_of_three(controller, fake_broker, clock)
    clock.advance(DEAD_AFTER_MS)  # the lease of b1's last heartbeat is over; b1 is not yet silent for 3 s
    await b2.heartbeat(leaseMs=LEASE_MS)
    assert _master(controller) == 1
    b1.conn.close()
    await wait_for(lambda: _master(controller) == 2, what="the election at the end of the lease")


async def test_silent_master_with_an_open_connection_keeps_the_whole_timeout(controller: ControllerServer,
                                                                             fake_broker: BrokerFactory,
                                                                             clock: ManualClock) -> None:
    """SIGSTOP: the connection stays open, the master may still hold its lease; no election before the
    heartbeat timeout."""
    _, b2, b3 = await _group_of_three(controller, fake_broker, clock)
    clock.advance(HEARTBEAT_TIMEOUT_MS - 1)
    await b2.heartbeat(leaseMs=LEASE_MS)
    await b3.heartbeat(leaseMs=LEASE_MS)
    await controller.core.scan_once()
    assert _master(controller) == 1
    clock.advance(1)
    await controller.core.scan_once()
    assert _master(controller) == 2


@pytest.mark.parametrize("lease", [str(HEARTBEAT_TIMEOUT_MS), "0", "-5", "soon"])
async def test_a_lease_the_timeout_cannot_fence_is_refused(controller: ControllerServer, fake_broker: BrokerFactory,
                                                           lease: str) -> None:
    b1 = await fake_broker(NAME, 1)
    resp = await b1.heartbeat(leaseMs=lease)
    assert resp.code == ResponseCode.CONTROLLER_INVALID_REQUEST
    assert resp.remark is not None and "leaseMs" in resp.remark
    assert controller.raft.group(NAME) is None  # refused before anything was recorded
    ok = await b1.heartbeat(leaseMs=HEARTBEAT_TIMEOUT_MS - 1)
    assert ok.code == ResponseCode.SUCCESS and body(ok)["masterId"] == 1
