"""The native pull scan (``_speedups.pull_scan``, used by ``StoreReader._scan`` for pulls without a filter)
answers every pull exactly as the pure-Python loop does: same status, records, queue offsets, next offset,
sizes, slave hint and corrupt-record count, across segment ends, damaged records, IPv6 records, the
in-memory and on-disk caps and a commit log whose head was cut."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from dispatch_streams import RecordSpec, build_stream
from store_helpers import CL_SEGMENT, flip_byte, scan_records

from ferrymq.store import GetMessageResult, MessageStore
from ferrymq.store.consume_queue import BLANK_SIZE, UNIT
from support.native import require_extension

Opener = Callable[..., MessageStore]
QUEUES = 3
MAX_MSG_NUMS = (1, 3, 32, 1000)
# (name, config overrides): default caps; small caps with every read "on disk" (no memory for hot data)
CONFIGS = [
    ("default caps", {}),
    ("small caps, on disk", {"max_transfer_count_on_message_in_memory": 5,
                             "max_transfer_bytes_on_message_in_memory": 1500,
                             "max_transfer_count_on_message_in_disk": 4,
                             "max_transfer_bytes_on_message_in_disk": 900,
                             "total_memory_bytes": 1}),
    ("small caps, in memory", {"max_transfer_count_on_message_in_memory": 7,
                               "max_transfer_bytes_on_message_in_memory": 2000}),
]  # fmt: skip


def _fill(store: MessageStore, rng: random.Random, n: int) -> list[int]:
    """n records over QUEUES queues (bodies 0..600 B, every 9th with IPv6 hosts), laid into the commit log as
    a slave receives them; their phy offsets in order."""
    specs = [
        RecordSpec("TopicA", i % QUEUES, i // QUEUES, 0, f"KEYS\x01k{i}", rng.randbytes(rng.randint(0, 600)),
                   1_700_000_000_000 + i, born_v6=i % 9 == 4, store_v6=i % 18 == 4)
        for i in range(n)
    ]  # fmt: skip
    assert store.append_at(0, build_stream(specs, CL_SEGMENT))
    store.reput()
    phys = [phy for phy, *_ in scan_records(store)]
    assert len(phys) == n
    return phys


def _answer(store: MessageStore, queue_id: int, queue_offset: int, max_msg_nums: int) -> tuple[object, ...]:
    before = store.reader.corrupt_record_total
    r: GetMessageResult = store.get_message("g", "TopicA", queue_id, queue_offset, max_msg_nums, None)
    return (r.status, r.next_begin_offset, r.min_offset, r.max_offset, r.message_count, r.buffer_total_size,
            r.suggest_pulling_from_slave, r.queue_offsets, r.body(), store.reader.corrupt_record_total - before)


def _compare_every_pull(store: MessageStore) -> int:
    native = require_extension().pull_scan
    compared = 0
    for queue_id in range(QUEUES):
        top = store.get_max_offset_in_queue("TopicA", queue_id)
        for queue_offset in range(0, top + 2):
            for max_msg_nums in MAX_MSG_NUMS:
                store.reader.native_scan = None
                want = _answer(store, queue_id, queue_offset, max_msg_nums)
                store.reader.native_scan = native
                got = _answer(store, queue_id, queue_offset, max_msg_nums)
                assert got == want, (queue_id, queue_offset, max_msg_nums)
                compared += 1
    return compared


@pytest.mark.parametrize("name,overrides", CONFIGS, ids=[c[0] for c in CONFIGS])
@pytest.mark.parametrize("seed", [1, 2])
def test_native_pull_scan_answers_as_the_python_loop(
    open_store: Opener, name: str, overrides: dict[str, object], seed: int
) -> None:
    rng = random.Random(seed)
    store = open_store(**overrides)
    phys = _fill(store, rng, 240)  # ~70 KiB: a few 64 KiB segments
    assert len(store.commit_log.mfq.files) >= 2
    # damaged body, BODYCRC, magic, TOTALSIZE, PHYSICALOFFSET, BODYLENGTH of a few records
    for rel in (88 + 1, 8, 4, 0, 30, 86):
        victim = rng.randrange(len(phys))
        if victim % 9 != 4:
            flip_byte(store, phys[victim], rel)
    assert _compare_every_pull(store) > 200
    # the head of the commit log cut off (as retention does): records before it are gone for both loops
    store.commit_log.data_start_phy_offset = phys[len(phys) // 3]
    _compare_every_pull(store)


def test_pull_scan_skips_blank_units_and_stops_outside_its_segment(open_store: Opener) -> None:
    ext = require_extension()
    store = open_store()
    phys = _fill(store, random.Random(3), 12)
    mf = store.commit_log.mfq.find(phys[0])
    assert mf is not None
    sizes = [(phys[i + 1] - phys[i]) for i in range(11)]
    units = b"".join(
        [UNIT.pack(0, BLANK_SIZE, 0), UNIT.pack(phys[0], sizes[0], 0), UNIT.pack(0, BLANK_SIZE, 0)]
        + [UNIT.pack(phys[1], sizes[1], 0), UNIT.pack(mf.file_from_offset + mf.file_size, 100, 0)]
    )
    buffers: list[bytes] = []
    offsets: list[int] = []
    args = (mf.mm, mf.file_from_offset, mf.wrote_position, 0, 50, 32, 32, 1 << 20, 32, 1 << 20, 0, 1 << 40)
    i, total, last_phy = ext.pull_scan(units, 0, *args, 0, buffers, offsets)
    # served both records, skipped both BLANK units, stopped at the unit beyond the segment
    assert (i, total, last_phy) == (4 * 20, sizes[0] + sizes[1], phys[1])
    assert offsets == [51, 53]
    assert buffers == [mf.mm[phys[0] : phys[0] + sizes[0]], mf.mm[phys[1] : phys[1] + sizes[1]]]
    assert ext.pull_scan(units, 80, *args, total, buffers, offsets) == (80, total, -1)
    with pytest.raises(ValueError, match="unit boundary"):
        ext.pull_scan(units, 7, *args, 0, [], [])

