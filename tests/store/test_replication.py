from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import CL_SEGMENT, assert_cqs_match_commit_log, inner

from ferrymq.common.message import SYSFLAG_TRANSACTION_PREPARED
from ferrymq.common.message_codec import iter_records
from ferrymq.store import MessageStore

Opener = Callable[..., MessageStore]
_RUNS = itertools.count()


def _populate(store: MessageStore, n: int, seed: int = 7) -> None:
    rnd = random.Random(seed)
    for i in range(n):
        if i % 50 == 49:
            batch = [
                inner(topic="B", queue_id=1, body=b"b" * rnd.randint(1, 400), uniq=f"U{i}-{j}")
                for j in range(4)
            ]
            store.put_messages(batch)
            continue
        flag = SYSFLAG_TRANSACTION_PREPARED if i % 37 == 0 else 0
        extra = {"DELAY": "3"} if i % 11 == 0 else None
        topic = "SCHEDULE_TOPIC_XXXX" if extra else "A"
        store.put_message(
            inner(
                topic=topic,
                queue_id=i % 4,
                body=bytes(rnd.randint(0, 1500)),
                tags=f"t{i % 5}",
                keys=f"k{i}",
                extra=extra,
                sys_flag=flag,
            )  # fmt: skip
        )
    store.reput()


def _replicate(src: MessageStore, dst: MessageStore, start: int, chunks: list[int]) -> None:
    offset = start
    i = 0
    while offset < src.max_phy_offset:
        size = chunks[i % len(chunks)] if chunks else 32 * 1024
        i += 1
        data = src.read_from(offset, size)
        if not data:  # a full segment: continue at the next one
            offset = src.segment_start_of(offset) + CL_SEGMENT
            continue
        assert len(data) <= size
        assert src.segment_start_of(offset) == src.segment_start_of(offset + len(data) - 1)
        assert dst.append_at(offset, data)
        offset += len(data)
        dst.reput()


def _cq_bytes(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    out = {}
    for topic, qids in store.topic_queue_ids().items():
        for qid in qids:
            lo = store.get_min_offset_in_queue(topic, qid)
            hi = store.get_max_offset_in_queue(topic, qid)
            out[(topic, qid)] = store.get_consume_queue_units(topic, qid, lo, hi - lo)
    return out


def _assert_identical(a: MessageStore, b: MessageStore, start: int = 0) -> None:
    assert a.max_phy_offset == b.max_phy_offset
    offset = start
    while offset < a.max_phy_offset:
        x = a.read_from(offset, 1 << 20)
        y = b.read_from(offset, 1 << 20)
        assert x == y
        offset = offset + len(x) if x else a.segment_start_of(offset) + CL_SEGMENT
    assert b.reput_phy_offset == a.reput_phy_offset
    if start == 0:
        assert _cq_bytes(a) == _cq_bytes(b)
        return
    for (topic, qid), units in _cq_bytes(b).items():  # B's queues begin later
        lo = b.get_min_offset_in_queue(topic, qid)
        assert lo == a.get_max_offset_in_queue(topic, qid) - len(units)
        assert units == a.get_consume_queue_units(topic, qid, lo, len(units))
        assert units[0][0] >= start


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(st.integers(1, 9000), min_size=1, max_size=8))
def test_replicate_byte_identical_with_arbitrary_chunks(tmp_path: Path, chunks: list[int]) -> None:
    from store_helpers import FakeClock, make_config

    root = tmp_path / f"run{next(_RUNS)}"
    a = MessageStore(make_config(root / "a"), FakeClock())
    b = MessageStore(make_config(root / "b", broker_role="SLAVE"), FakeClock())
    a.load()
    b.load()
    try:
        _populate(a, 150)
        _replicate(a, b, 0, chunks)
        _assert_identical(a, b)
        assert_cqs_match_commit_log(b)
    finally:
        a.shutdown()
        b.shutdown()


def test_slave_cqs_equal_master_including_delay_and_index(open_store: Opener) -> None:
    a = open_store("a")
    b = open_store("b", broker_role="SLAVE")
    _populate(a, 400)
    assert len(a.commit_log.mfq.files) > 3
    _replicate(a, b, 0, [4096, 777, 12345])
    _assert_identical(a, b)
    # delay queue units carry the delivery time, identical on both sides
    units = b.get_consume_queue_units("SCHEDULE_TOPIC_XXXX", 0, 0, 5)
    assert units and units == a.get_consume_queue_units("SCHEDULE_TOPIC_XXXX", 0, 0, 5)
    for phy, _size, tags_code in units:
        ext = b.look_message_by_offset(phy)
        assert ext is not None and tags_code == ext.store_timestamp + 10_000
    assert len(b.query_message("A", "k10", 5, 0, 1 << 62).buffers) == 1
    assert len(b.query_message("B", "U49-2", 5, 0, 1 << 62).buffers) == 1
    # the slave survives a restart with the same state
    b.shutdown()
    b2 = open_store("b", broker_role="SLAVE")
    _assert_identical(a, b2)


def test_empty_slave_accepts_any_start_offset(open_store: Opener, tmp_path: Path) -> None:
    b = open_store("b", broker_role="SLAVE")
    assert b.append_at(3 * CL_SEGMENT + 100, b"xyz")
    assert b.min_phy_offset == 3 * CL_SEGMENT + 100 and b.max_phy_offset == 3 * CL_SEGMENT + 103
    assert (tmp_path / "b" / "commitlog" / f"{3 * CL_SEGMENT:020d}").exists()
    assert b.segment_start_of(3 * CL_SEGMENT + 100) == 3 * CL_SEGMENT


def test_slave_starting_mid_log(open_store: Opener) -> None:
    a = open_store("a")
    b = open_store("b", broker_role="SLAVE")
    _populate(a, 300)
    start = a.segment_start_of(a.max_phy_offset)
    _replicate(a, b, start, [5000])
    assert b.min_phy_offset == start
    _assert_identical(a, b, start)
    # B's queues begin at non-zero offsets, with blank leading units
    cq = b.queues.find("A", 0)
    assert cq is not None and cq.min_offset_in_queue > 0
    first = cq.mfq.first()
    assert first is not None and first.mm[:20] == b"\x00" * 8 + b"\x7f\xff\xff\xff" + b"\x00" * 8
    res = b.get_message("g", "A", 0, b.get_min_offset_in_queue("A", 0), 32, None)
    assert res.message_count > 0
    assert [m.queue_offset for m in iter_records(res.body())] == res.queue_offsets
    # more data arrives, then a restart
    _populate(a, 40, seed=9)
    _replicate(a, b, b.max_phy_offset, [333])
    b.shutdown()
    b2 = open_store("b", broker_role="SLAVE")
    _assert_identical(a, b2, start)


def test_slave_unaligned_first_append_survives_restart(open_store: Opener) -> None:
    a = open_store("a")
    b = open_store("b", broker_role="SLAVE")
    _populate(a, 200)
    # start at a record boundary inside the last segment
    last = a.commit_log.mfq.last()
    assert last is not None
    start = last.file_from_offset + int.from_bytes(last.mm[0:4], "big")
    assert start % CL_SEGMENT != 0
    _replicate(a, b, start, [1000])
    assert b.min_phy_offset == start
    b.close_abruptly()
    b2 = open_store("b", broker_role="SLAVE")
    assert b2.min_phy_offset == start and b2.max_phy_offset == a.max_phy_offset
    assert_cqs_match_commit_log(b2)


def test_append_at_rejects_mismatch_and_read_from_bounds(open_store: Opener) -> None:
    a = open_store("a")
    b = open_store("b", broker_role="SLAVE")
    _populate(a, 20)
    assert a.read_from(a.max_phy_offset, 100) == b""
    assert a.read_from(0, 0) == b""
    data = a.read_from(0, 100)
    assert b.append_at(0, data)
    assert not b.append_at(0, data)
    assert not b.append_at(len(data) + 1, data)
    assert b.reput() == 0  # partial record: waits for the rest
    assert b.append_at(len(data), a.read_from(len(data), 10_000))
    assert b.reput() > 0


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("damage_at", [88 + 3, 8, 30])  # a body byte, BODYCRC, PHYSICALOFFSET
def test_slave_refuses_a_damaged_replicated_record(tmp_path: Path, native: bool, damage_at: int) -> None:
    """The slave checks every replicated record before anything reads or dispatches it: a damaged one is cut
    off (with what follows it in the transfer), append_at answers False (the slave reconnects), and the
    intact bytes sent again are taken."""
    from store_helpers import FakeClock, inner, make_config

    from ferrymq.store import MessageStore
    from ferrymq.store import speedups as sp
    from ferrymq.store.config import BrokerRole

    if native and sp.NATIVE is None:
        pytest.skip("the C extension is not built")
    master = MessageStore(make_config(tmp_path / "m"), FakeClock())
    master.load()
    slave = MessageStore(make_config(tmp_path / "s", broker_role=BrokerRole.SLAVE), FakeClock())
    slave.load()
    if not native:
        slave.commit_log.native = None
        slave.dispatcher.native = None
    try:
        offsets = []
        for i in range(20):
            r = master.put_message(inner(queue_id=0, body=bytes([i]) * 200))
            assert r.append_result is not None
            offsets.append(r.append_result.wrote_offset)
        stream = bytes(master.commit_log.read_from(0, 1 << 20))
        damaged = bytearray(stream)
        damaged[offsets[12] + damage_at] ^= 0x01
        assert not slave.append_at(0, bytes(damaged))
        assert slave.max_phy_offset == offsets[12], "kept exactly the intact records before the damaged one"
        slave.reput()
        assert slave.get_max_offset_in_queue("TopicA", 0) == 12
        assert slave.append_at(offsets[12], stream[offsets[12]:])
        slave.reput()
        assert slave.max_phy_offset == master.max_phy_offset
        assert slave.get_max_offset_in_queue("TopicA", 0) == 20
        assert bytes(slave.commit_log.read_from(0, 1 << 20)) == stream
    finally:
        master.shutdown()
        slave.shutdown()
