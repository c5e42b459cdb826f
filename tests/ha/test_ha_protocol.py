"""Sans-IO HA protocol objects joined over an in-memory wire with an injected clock."""

from __future__ import annotations

import os

import pytest
from ha_fakes import T0_MS, FakeCommitLog, Wire, random_chunker
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ferrymq.ha.codec import HEADER_SIZE, TransferDecoder, encode_report, encode_transfer
from ferrymq.ha.config import HAConfig
from ferrymq.ha.master_conn import (
    AckReceived,
    CloseConnection,
    MasterConnection,
    MasterState,
    ProtocolStateError,
    SendBytes,
)
from ferrymq.ha.slave_conn import Appended, SlaveConnection, SlaveState
from support.clock import ManualClock

SEG = 4096
BATCH = 1000
CFG = HAConfig(heartbeat_interval_ms=5000, housekeeping_interval_ms=20000, transfer_batch_size=BATCH)


def make(master_bytes: bytes, slave: FakeCommitLog | None = None, chunker=None, report_on_connect=True):
    clock = ManualClock(T0_MS)
    mlog = FakeCommitLog(SEG, data=master_bytes)
    slog = slave if slave is not None else FakeCommitLog(SEG)
    m = MasterConnection(mlog, segment_size=SEG, now_ms=clock(), config=CFG)
    s = SlaveConnection(slog, now_ms=clock(), config=CFG, report_on_connect=report_on_connect)
    w = Wire(m, s, clock, chunker) if chunker else Wire(m, s, clock)
    return clock, mlog, slog, m, s, w


def test_fresh_slave_starts_at_masters_last_segment() -> None:
    data = os.urandom(2 * SEG + 1500)
    clock, mlog, slog, m, s, w = make(data)
    w.connect()
    w.pump()
    assert w.acks[0] == AckReceived(0, True)
    assert m.request_offset == 0
    frames = w.frames_sent_to_slave()
    assert frames[0][0] == 2 * SEG
    assert slog.base == 2 * SEG
    assert slog.max_phy_offset() == mlog.max_phy_offset()
    assert slog.bytes_between(2 * SEG, mlog.max_phy_offset()) == data[2 * SEG :]
    # the slave acked the master's max
    assert w.acks[-1].ack_phy_offset == mlog.max_phy_offset()
    assert w.master_closed is None and w.slave_closed is None


def test_fresh_slave_on_segment_boundary_and_empty_master() -> None:
    clock, mlog, slog, m, s, w = make(b"")
    w.connect()
    w.pump()
    assert m.next_transfer_offset == 0 and not w.frames_sent_to_slave()
    # data arrives later; it flows from 0
    mlog.write(b"x" * 10)
    w.pump()
    assert slog.max_phy_offset() == 10 and slog.base == 0


def test_returning_slave_resumes_from_its_offset() -> None:
    data = os.urandom(3 * SEG)
    have = 5000  # mid-segment, not record aligned
    slog = FakeCommitLog(SEG, base=0, data=data[:have])
    clock, mlog, slog, m, s, w = make(data, slave=slog)
    w.connect()
    w.pump()
    assert m.request_offset == have
    assert w.frames_sent_to_slave()[0][0] == have
    assert bytes(slog.data) == data
    assert slog.appends[0][0] == have


def test_live_appends_flow_and_acks_grow() -> None:
    clock, mlog, slog, m, s, w = make(b"a" * 100)
    w.connect()
    w.pump()
    for i in range(20):
        mlog.write(bytes([i]) * 333)
        w.pump()
        assert w.acks[-1].ack_phy_offset == mlog.max_phy_offset()
    assert bytes(slog.data) == bytes(mlog.data)
    assert sum(a.to_phy_offset - a.from_phy_offset for a in w.appended) == mlog.max_phy_offset()


def test_transfers_never_cross_a_segment_and_never_exceed_batch() -> None:
    data = os.urandom(5 * SEG + 123)
    slog = FakeCommitLog(SEG, base=0, data=data[:7])  # odd start offset
    clock, mlog, slog, m, s, w = make(data, slave=slog)
    w.connect()
    w.pump()
    frames = w.frames_sent_to_slave()
    assert frames
    for off, size in frames:
        assert 0 < size <= BATCH
        assert off // SEG == (off + size - 1) // SEG
    # contiguous
    for (o1, s1), (o2, _) in zip(frames, frames[1:], strict=False):
        assert o1 + s1 == o2
    assert bytes(slog.data) == data


def test_master_trims_an_overdelivering_source_to_the_segment() -> None:
    class Greedy(FakeCommitLog):
        def read_from(self, phy_offset: int, max_bytes: int) -> bytes:
            return bytes(self.data[phy_offset : phy_offset + 10 * SEG])

    clock = ManualClock(T0_MS)
    mlog = Greedy(SEG, data=os.urandom(2 * SEG))
    m = MasterConnection(mlog, segment_size=SEG, now_ms=clock(), config=CFG)
    m.receive_data(encode_report(SEG - 10), clock())
    (out,) = m.data_available(clock())
    assert isinstance(out, SendBytes)
    assert len(out.data) == HEADER_SIZE + 10


def test_slave_disconnects_on_offset_mismatch() -> None:
    clock = ManualClock(T0_MS)
    slog = FakeCommitLog(SEG, base=0, data=b"z" * 100)
    s = SlaveConnection(slog, now_ms=clock(), config=CFG)
    s.connection_made(clock())
    outs = s.receive_data(encode_transfer(200, b"abc"), clock())
    assert isinstance(outs[-1], CloseConnection)
    assert "200" in outs[-1].reason
    assert s.state is SlaveState.CLOSED
    assert slog.max_phy_offset() == 100  # nothing appended
    # heartbeat with a mismatched offset also disconnects
    s2 = SlaveConnection(FakeCommitLog(SEG, base=0, data=b"z" * 100), now_ms=clock(), config=CFG)
    s2.connection_made(clock())
    assert isinstance(s2.receive_data(encode_transfer(99, b""), clock())[-1], CloseConnection)


def test_empty_slave_accepts_any_pushed_offset() -> None:
    clock = ManualClock(T0_MS)
    slog = FakeCommitLog(SEG)
    s = SlaveConnection(slog, now_ms=clock(), config=CFG)
    s.connection_made(clock())
    outs = s.receive_data(encode_transfer(3 * SEG + 5, b"hello"), clock())
    assert not any(isinstance(o, CloseConnection) for o in outs)
    assert slog.max_phy_offset() == 3 * SEG + 10
    # the new offset is reported first, then the driver is told to dispatch (Appended)
    assert outs == [SendBytes(encode_report(3 * SEG + 10)), Appended(3 * SEG + 5, 3 * SEG + 10)]


def test_slave_closes_when_store_refuses_append() -> None:
    class Refusing(FakeCommitLog):
        def append_at(self, phy_offset: int, chunk: bytes) -> bool:
            return False

    clock = ManualClock(T0_MS)
    s = SlaveConnection(Refusing(SEG), now_ms=clock(), config=CFG)
    s.connection_made(clock())
    assert isinstance(s.receive_data(encode_transfer(0, b"x"), clock())[-1], CloseConnection)


def test_master_drops_ack_beyond_its_max() -> None:
    clock = ManualClock(T0_MS)
    mlog = FakeCommitLog(SEG, data=b"q" * 500)
    m = MasterConnection(mlog, segment_size=SEG, now_ms=clock(), config=CFG)
    assert m.receive_data(encode_report(100), clock()) == [AckReceived(100, True)]
    assert m.receive_data(encode_report(500), clock()) == [AckReceived(500, False)]
    outs = m.receive_data(encode_report(501), clock())
    assert isinstance(outs[-1], CloseConnection) and m.state is MasterState.CLOSED
    # a request beyond the max is refused too
    m2 = MasterConnection(mlog, segment_size=SEG, now_ms=clock(), config=CFG)
    assert isinstance(m2.receive_data(encode_report(10_000), clock())[-1], CloseConnection)


def test_master_uses_only_last_complete_report() -> None:
    clock = ManualClock(T0_MS)
    mlog = FakeCommitLog(SEG, data=b"q" * 500)
    m = MasterConnection(mlog, segment_size=SEG, now_ms=clock(), config=CFG)
    blob = encode_report(10) + encode_report(20) + encode_report(30)[:5]
    assert m.receive_data(blob, clock()) == [AckReceived(20, True)]
    assert m.receive_data(encode_report(30)[5:], clock()) == [AckReceived(30, False)]
    assert m.request_offset == 20 and m.next_transfer_offset == 20


def test_heartbeat_every_interval_when_idle() -> None:
    clock, mlog, slog, m, s, w = make(b"h" * 50)
    w.connect()
    w.pump()
    before = len(w.frames_sent_to_slave())
    clock.advance(4999)
    w._from_master(m.tick(clock()))
    assert len(w.frames_sent_to_slave()) == before
    for k in range(1, 4):
        clock.advance(1 if k == 1 else 5000)
        w._from_master(m.tick(clock()))
        frames = w.frames_sent_to_slave()
        assert len(frames) == before + k
        assert frames[-1] == (50, 0)  # size-0 header at the next transfer offset
        w.deliver()
        w._from_slave(s.tick(clock()))  # slave reports every 5 s too
        w.deliver()
    assert s.heartbeats_received == 3
    assert w.master_closed is None and w.slave_closed is None
    # the heartbeat timer is exposed for the driver
    assert m.next_timer_ms() == clock() + 5000


def test_data_resets_the_heartbeat_clock() -> None:
    clock, mlog, slog, m, s, w = make(b"")
    w.connect()
    w.pump()
    clock.advance(4000)
    mlog.write(b"d" * 10)
    w.pump()
    clock.advance(4000)
    assert m.tick(clock()) == []  # 4 s since the last transfer


def test_master_housekeeping_drops_a_silent_slave() -> None:
    clock, mlog, slog, m, s, w = make(b"x" * 10)
    w.connect()
    w.pump()
    clock.advance(20000)
    w._from_master(m.tick(clock()))
    assert w.master_closed is None
    clock.advance(1)
    w._from_master(m.tick(clock()))
    assert w.master_closed and "housekeeping" in w.master_closed
    # a connection that never sends a request is dropped too
    m2 = MasterConnection(mlog, segment_size=SEG, now_ms=clock(), config=CFG)
    assert m2.tick(clock() + 20001)[-1] == CloseConnection(m2.close_reason or "")


def test_no_housekeeping_while_both_sides_heartbeat() -> None:
    clock, mlog, slog, m, s, w = make(b"x" * 10)
    w.connect()
    w.pump()
    for _ in range(40):  # 200 s of idle time, 5 s steps
        clock.advance(5000)
        w.tick()
        w.deliver()
    assert w.master_closed is None and w.slave_closed is None
    assert s.heartbeats_received >= 39


def test_slave_housekeeping_closes_on_a_silent_master() -> None:
    clock = ManualClock(T0_MS)
    s = SlaveConnection(FakeCommitLog(SEG), now_ms=clock(), config=CFG)
    s.connection_made(clock())
    closed = None
    for _ in range(5):
        clock.advance(5000)
        for o in s.tick(clock()):
            if isinstance(o, CloseConnection):
                closed = o
    assert closed is not None and "silent" in closed.reason
    assert s.state is SlaveState.CLOSED


def test_slave_reports_periodically() -> None:
    clock = ManualClock(T0_MS)
    slog = FakeCommitLog(SEG, base=0, data=b"y" * 7)
    s = SlaveConnection(slog, now_ms=clock(), config=CFG)
    assert s.connection_made(clock()) == [SendBytes(encode_report(7))]
    clock.advance(4999)
    assert s.tick(clock()) == []
    clock.advance(1)
    assert s.tick(clock()) == [SendBytes(encode_report(7))]


def test_rocketmq_mode_first_report_after_heartbeat_interval() -> None:
    clock = ManualClock(T0_MS)
    slog = FakeCommitLog(SEG, base=0, data=b"y" * 7)
    s = SlaveConnection(slog, now_ms=clock(), config=CFG, report_on_connect=False)
    assert s.connection_made(clock()) == []
    assert s.state is SlaveState.AWAIT_REPORT
    clock.advance(5000)
    assert s.tick(clock()) == [SendBytes(encode_report(7))]
    assert s.state is SlaveState.STREAMING


def test_unknown_transition_is_an_error_and_closed_ignores_input() -> None:
    clock = ManualClock(T0_MS)
    s = SlaveConnection(FakeCommitLog(SEG), now_ms=clock(), config=CFG)
    with pytest.raises(ProtocolStateError):
        s.receive_data(b"x", clock())  # before connection_made
    s.connection_made(clock())
    with pytest.raises(ProtocolStateError):
        s.connection_made(clock())
    s.close("bye")
    assert s.receive_data(b"abc", clock()) == []
    assert s.tick(clock() + 10**9) == []
    m = MasterConnection(FakeCommitLog(SEG), segment_size=SEG, now_ms=clock(), config=CFG)
    m.close("bye")
    assert m.receive_data(encode_report(0), clock()) == [] and m.data_available(clock()) == []
    assert m.next_timer_ms() is None


def test_bad_transfer_header_closes_the_slave() -> None:
    clock = ManualClock(T0_MS)
    s = SlaveConnection(FakeCommitLog(SEG), now_ms=clock(), config=CFG, max_body_size=1024)
    s.connection_made(clock())
    import struct

    outs = s.receive_data(struct.pack(">qi", 0, 4096), clock())
    assert isinstance(outs[-1], CloseConnection)


@settings(max_examples=40, deadline=None)
@example(seed=1, size=2 * SEG, have=0, max_piece=5)
@example(seed=2, size=SEG + 1, have=0, max_piece=1)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(0, 3 * SEG),
    have=st.integers(0, 3 * SEG),
    max_piece=st.integers(1, 64),
)
def test_arbitrary_chunking_gives_identical_logs(seed: int, size: int, have: int, max_piece: int) -> None:
    data = os.urandom(size)
    have = min(have, size)
    slog = FakeCommitLog(SEG, base=0, data=data[:have]) if have else FakeCommitLog(SEG)
    clock, mlog, slog, m, s, w = make(data, slave=slog, chunker=random_chunker(seed, max_piece))
    w.connect()
    w.pump()
    start = have if have else size - size % SEG
    expected_max = size if (have or size > start) else 0
    assert slog.max_phy_offset() == expected_max
    if size > start:
        assert slog.bytes_between(start, size) == data[start:]
    assert w.master_closed is None and w.slave_closed is None
    assert m.ack_offset == expected_max


@given(values=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=20), seed=st.integers(0, 1000))
def test_report_decoder_any_split(values: list[int], seed: int) -> None:
    from ferrymq.ha.codec import ReportDecoder

    blob = b"".join(encode_report(v) for v in values)
    dec = ReportDecoder()
    last = None
    for piece in random_chunker(seed, 11)(blob):
        got = dec.feed(piece)
        if got is not None:
            last = got
    assert last == values[-1] and dec.buffered == 0


@given(
    frames=st.lists(st.tuples(st.integers(0, 2**62), st.binary(max_size=300)), max_size=10),
    seed=st.integers(0, 1000),
)
def test_transfer_decoder_any_split(frames: list[tuple[int, bytes]], seed: int) -> None:
    blob = b"".join(encode_transfer(o, b) for o, b in frames)
    dec = TransferDecoder()
    got = []
    for piece in random_chunker(seed, 23)(blob):
        got.extend((t.phy_offset, t.body) for t in dec.feed(piece))
    assert got == frames and dec.buffered == 0
