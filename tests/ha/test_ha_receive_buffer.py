"""The slave's zero-copy receive path (``TransferDecoder.get_buffer`` / ``take_frames``,
``SlaveConnection.get_buffer`` / ``buffer_updated``) and its report policy while catching up."""

from __future__ import annotations

import os
import random

from ha_fakes import T0_MS, FakeCommitLog
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.ha.codec import HEADER_SIZE, TransferDecoder, encode_report, encode_transfer
from ferrymq.ha.config import HAConfig
from ferrymq.ha.slave_conn import Appended, CloseConnection, SendBytes, SlaveConnection, SlaveState
from support.clock import ManualClock

SEG = 1 << 20
CFG = HAConfig(heartbeat_interval_ms=5000, housekeeping_interval_ms=20000)


class ViewRecordingLog(FakeCommitLog):
    """Records the type of every appended buffer (the zero-copy path passes views)."""

    def __init__(self) -> None:
        super().__init__(SEG)
        self.types: list[type] = []

    def append_at(self, phy_offset: int, chunk: bytes) -> bool:
        self.types.append(type(chunk))
        return super().append_at(phy_offset, chunk)


def deliver(s: SlaveConnection, data: bytes, now_ms: int, read_sizes: list[int]) -> list[object]:
    """Feed ``data`` like a BufferedProtocol: each read fills at most the region handed out."""
    outs: list[object] = []
    pos = 0
    for want in read_sizes:
        if pos >= len(data):
            break
        region = s.get_buffer(-1)
        n = min(len(region), want, len(data) - pos)
        region[:n] = data[pos : pos + n]
        pos += n
        outs.extend(s.buffer_updated(n, now_ms))
    assert pos == len(data)
    return outs


def reports(outs: list[object]) -> list[bytes]:
    return [o.data for o in outs if isinstance(o, SendBytes)]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=25),
    seed=st.integers(0, 2**32 - 1),
    read_chunk=st.sampled_from([1, 7, 100, 4096, 65536]),
)
def test_get_buffer_take_frames_any_read_sizes(sizes: list[int], seed: int, read_chunk: int) -> None:
    rng = random.Random(seed)
    frames = []
    off = 1000
    for n in sizes:
        frames.append((off, rng.randbytes(n)))
        off += n
    blob = b"".join(encode_transfer(o, b) for o, b in frames)
    # a small buffer: compaction of the unfinished frame and growth for frames above the capacity
    dec = TransferDecoder(8192, read_chunk=read_chunk, capacity=read_chunk + HEADER_SIZE)
    got: list[tuple[int, bytes]] = []
    pos = 0
    while pos < len(blob):
        region = dec.get_buffer()
        assert 0 < len(region) <= read_chunk
        n = min(len(region), rng.randint(1, 2 * read_chunk), len(blob) - pos)
        region[:n] = blob[pos : pos + n]
        pos += n
        got.extend((o, bytes(b)) for o, b in dec.take_frames(n))
        assert dec.buffered <= HEADER_SIZE + max(sizes)
    assert got == frames and dec.buffered == 0


def test_bodies_reach_the_store_as_views_in_stream_order() -> None:
    clock = ManualClock(T0_MS)
    slog = ViewRecordingLog()
    s = SlaveConnection(slog, now_ms=clock(), config=CFG)
    s.connection_made(clock())
    data = os.urandom(200_000)
    blob = b"".join(encode_transfer(i, data[i : i + 32768]) for i in range(0, len(data), 32768))
    outs = deliver(s, blob, clock(), [65536] * 100)
    assert bytes(slog.data) == data and slog.base == 0
    assert set(slog.types) == {memoryview}
    assert [o for o in outs if isinstance(o, CloseConnection)] == []
    # every byte was announced for dispatch, in order and without gaps
    appended = [o for o in outs if isinstance(o, Appended)]
    assert appended[0].from_phy_offset == 0 and appended[-1].to_phy_offset == len(data)
    assert all(a.to_phy_offset == b.from_phy_offset for a, b in zip(appended, appended[1:], strict=False))


def test_a_read_ending_on_a_frame_boundary_reports_at_once() -> None:
    """The SYNC_MASTER path: every push is whole frames; the slave reports inside that receive,
    before Appended."""
    clock = ManualClock(T0_MS)
    slog = FakeCommitLog(SEG, base=0, data=b"s" * 10)
    s = SlaveConnection(slog, now_ms=clock(), config=CFG)
    s.connection_made(clock())
    for i in range(5):
        outs = deliver(s, encode_transfer(10 + i * 3, b"abc"), clock(), [1 << 20])
        assert outs == [SendBytes(encode_report(13 + i * 3)), Appended(10 + i * 3, 13 + i * 3)]
    # several frames in one read: one report of the last offset
    blob = encode_transfer(25, b"x" * 5) + encode_transfer(30, b"") + encode_transfer(30, b"y")
    assert deliver(s, blob, clock(), [1 << 20]) == [SendBytes(encode_report(31)), Appended(25, 31)]


def test_catch_up_reads_ending_inside_a_frame_defer_the_report() -> None:
    clock = ManualClock(T0_MS)
    slog = FakeCommitLog(SEG)
    s = SlaveConnection(slog, now_ms=clock(), config=CFG, report_every_bytes=100_000, report_max_delay_ms=10)
    s.connection_made(clock())
    body = b"b" * 30_000
    f = [encode_transfer(i * 30_000, body) for i in range(8)]
    # frame 0 + half of frame 1: appended, dispatched, report deferred (the rest is in flight)
    outs = deliver(s, f[0] + f[1][:100], clock(), [1 << 20])
    assert reports(outs) == [] and outs == [Appended(0, 30_000)]
    # the rest of frame 1 + all of frame 2 + part of 3: still under 100_000 unreported bytes
    outs = deliver(s, f[1][100:] + f[2] + f[3][:5], clock(), [1 << 20])
    assert reports(outs) == [] and outs == [Appended(30_000, 90_000)]
    # over report_every_bytes: report although the read ends inside frame 4
    outs = deliver(s, f[3][5:] + f[4][:7], clock(), [1 << 20])
    assert reports(outs) == [encode_report(120_000)]
    # report_max_delay_ms since the last report: report although under the byte threshold
    clock.advance(10)
    outs = deliver(s, f[4][7:] + f[5][:9], clock(), [1 << 20])
    assert reports(outs) == [encode_report(150_000)]
    # a deferred report goes out with the read that ends the stream on a boundary
    outs = deliver(s, f[5][9:], clock(), [1 << 20])
    assert reports(outs) == [encode_report(180_000)]
    # the tick's periodic report still works
    clock.advance(5000)
    assert s.tick(clock()) == [SendBytes(encode_report(180_000))]


def test_deferred_report_is_sent_with_a_trailing_heartbeat() -> None:
    clock = ManualClock(T0_MS)
    slog = FakeCommitLog(SEG)
    s = SlaveConnection(slog, now_ms=clock(), config=CFG)
    s.connection_made(clock())
    frame = encode_transfer(0, b"z" * 50)
    hb = encode_transfer(50, b"")
    assert reports(deliver(s, frame + hb[:3], clock(), [1 << 20])) == []
    assert deliver(s, hb[3:], clock(), [1 << 20]) == [SendBytes(encode_report(50))]
    assert s.heartbeats_received == 1


def test_mismatch_after_appends_in_one_read_dispatches_then_closes() -> None:
    clock = ManualClock(T0_MS)
    slog = FakeCommitLog(SEG)
    s = SlaveConnection(slog, now_ms=clock(), config=CFG)
    s.connection_made(clock())
    blob = encode_transfer(0, b"a" * 10) + encode_transfer(99, b"b" * 10)
    outs = deliver(s, blob, clock(), [1 << 20])
    assert outs[0] == Appended(0, 10)
    assert isinstance(outs[-1], CloseConnection) and "99" in outs[-1].reason
    assert slog.max_phy_offset() == 10 and s.state is SlaveState.CLOSED
    # late bytes after close: a buffer is still handed out, and they are dropped
    for _ in range(3):
        region = s.get_buffer(-1)
        assert len(region) > 0
        region[:4] = b"junk"
        assert s.buffer_updated(4, clock()) == []
    assert s._decoder.buffered == 0


def test_receive_data_larger_than_the_buffer() -> None:
    clock = ManualClock(T0_MS)
    slog = FakeCommitLog(SEG)
    s = SlaveConnection(slog, now_ms=clock(), config=CFG, read_chunk=1000)
    s.connection_made(clock())
    data = os.urandom(50_000)
    blob = b"".join(encode_transfer(i, data[i : i + 3000]) for i in range(0, len(data), 3000))
    outs = s.receive_data(blob, clock())
    assert bytes(slog.data) == data
    assert reports(outs)[-1] == encode_report(len(data))
