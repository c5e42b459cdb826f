"""The full-collection pause histogram and the freeze policy (common/gc_policy.py), driven through the
``gc.callbacks`` entry with an injected clock, heap size and freeze: no real collection decides anything here.
The last tests check, on the real interpreter, what the policy counts on: which containers are tracked, and
that a freeze inside a callback takes the survivors out of the next full pass."""

from __future__ import annotations

import gc

import pytest

from ferrymq.common import gc_policy
from ferrymq.common.gc_policy import GC_PAUSE_BUCKETS_S, GcMonitor

FULL = {"generation": 2, "collected": 0, "uncollectable": 0}
YOUNG = {"generation": 0, "collected": 0, "uncollectable": 0}


class World:
    """The interpreter as the monitor sees it: a clock, the heap's blocks, and a count of freezes."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.blocks = 1_000
        self.frozen = 0
        self.freezes = 0

    def freeze(self) -> None:
        self.freezes += 1
        self.frozen = self.blocks

    def monitor(self, **kw: object) -> GcMonitor:
        return GcMonitor(clock=lambda: self.now_s, heap_blocks=lambda: self.blocks, freeze=self.freeze,
                         frozen_count=lambda: self.frozen, **kw)  # type: ignore[arg-type]

    def full_pass(self, m: GcMonitor, pause_s: float, info: dict[str, int] = FULL) -> None:
        m("start", info)
        self.now_s += pause_s
        m("stop", info)


def test_each_full_pass_lands_in_the_histogram_and_young_ones_do_not() -> None:
    w = World()
    m = w.monitor(freeze_enable=False)
    w.full_pass(m, 0.0004)
    w.full_pass(m, 0.030)
    w.full_pass(m, 0.120)
    w.full_pass(m, 0.5, YOUNG)  # generation 0: not a full pass
    assert m.count == 3 and m.sum_s == pytest.approx(0.1504)
    cumulative = dict(m.cumulative())
    assert cumulative["0.001"] == 1 and cumulative["0.025"] == 1 and cumulative["0.05"] == 2
    assert cumulative["0.1"] == 2 and cumulative["0.25"] == 3 and cumulative["+Inf"] == 3
    assert len(m.cumulative()) == len(GC_PAUSE_BUCKETS_S) + 1
    assert m.reset_max() == pytest.approx(0.120) and m.max_pause_s == 0.0


def test_a_stop_without_its_start_is_ignored() -> None:
    """Installed while a pass ran: its stop has no start time and is not counted."""
    w = World()
    m = w.monitor()
    m("stop", FULL)
    assert m.count == 0 and w.freezes == 0


def test_freezes_when_a_long_pass_follows_a_doubled_heap() -> None:
    w = World()
    m = w.monitor(min_pause_s=0.005, growth_factor=2.0)
    m.heap_blocks_at_freeze = 1_000  # as after a freeze at start
    w.blocks = 1_900
    w.full_pass(m, 0.080)  # long, but the heap has not doubled
    assert w.freezes == 0
    w.blocks = 2_000
    w.full_pass(m, 0.001)  # doubled, but the pass was short: nothing worth freezing
    assert w.freezes == 0
    w.full_pass(m, 0.080)
    assert w.freezes == 1 and m.freezes == 1 and m.heap_blocks_at_freeze == 2_000
    w.blocks = 3_999
    w.full_pass(m, 0.080)  # the next freeze needs 2 x 2,000
    assert w.freezes == 1
    w.blocks = 4_000
    w.full_pass(m, 0.080)
    assert w.freezes == 2 and m.heap_blocks_at_freeze == 4_000


def test_the_first_long_pass_freezes_when_nothing_was_frozen_yet() -> None:
    w = World()
    m = w.monitor()
    w.full_pass(m, 0.050)
    assert w.freezes == 1 and m.heap_blocks_at_freeze == w.blocks


def test_freezes_are_logarithmic_in_the_heap() -> None:
    """A heap growing from 1,000 to 1,000,000 blocks with a long pass at every 1 % step is frozen at most
    log2(1000) + 1 times, and each freeze happens at twice the heap of the one before."""
    w = World()
    m = w.monitor(growth_factor=2.0)
    at: list[int] = []
    while w.blocks < 1_000_000:
        w.blocks = int(w.blocks * 1.01) + 1
        before = w.freezes
        w.full_pass(m, 0.060)
        if w.freezes > before:
            at.append(w.blocks)
    assert 1 <= len(at) <= 11
    assert all(b >= 2 * a for a, b in zip(at, at[1:], strict=False))


def test_disabled_policy_never_freezes_but_still_measures() -> None:
    w = World()
    m = w.monitor(freeze_enable=False)
    for _ in range(5):
        w.blocks *= 4
        w.full_pass(m, 0.2)
    assert w.freezes == 0 and m.count == 5


def test_the_freeze_is_part_of_the_recorded_pause() -> None:
    w = World()

    def slow_freeze() -> None:
        w.now_s += 0.003
        w.freeze()

    m = GcMonitor(clock=lambda: w.now_s, heap_blocks=lambda: w.blocks, freeze=slow_freeze,
                  frozen_count=lambda: w.frozen)
    w.full_pass(m, 0.050)
    assert m.sum_s == pytest.approx(0.053)


def test_growth_factor_must_be_above_one() -> None:
    with pytest.raises(ValueError):
        GcMonitor(growth_factor=1.0)


def test_acquire_installs_once_and_freezing_follows_the_holders() -> None:
    mon = gc_policy.monitor()
    if mon in gc.callbacks:
        pytest.skip("a server of this process holds the monitor")
    try:
        assert gc_policy.acquire(False) is mon
        assert gc.callbacks.count(mon) == 1 and not mon.freeze_enable
        gc_policy.acquire(True)
        assert gc.callbacks.count(mon) == 1 and mon.freeze_enable
        gc_policy.release(True)
        assert not mon.freeze_enable and mon in gc.callbacks
    finally:
        gc_policy.release(False)
    assert mon not in gc.callbacks
    gc_policy.release(False)  # one release too many changes nothing
    assert mon not in gc.callbacks


def test_the_real_collector_times_a_full_pass() -> None:
    mon = gc_policy.acquire(False)
    try:
        before = mon.count
        gc.collect()
        assert mon.count == before + 1
    finally:
        gc_policy.release(False)


def test_what_is_tracked() -> None:
    """Dicts of atomic keys and values (an offset table's queue id -> offset) are not tracked until a tracked
    value goes in; sets and slotted dataclass instances always are."""
    queues: dict[int, int] = {}
    queues[0] = 123
    queues[7] = 45
    assert not gc.is_tracked(queues)
    names: dict[str, None] = {"T@g": None}
    assert not gc.is_tracked(names)
    names["x"] = [1]  # type: ignore[assignment]
    assert gc.is_tracked(names)
    assert gc.is_tracked({"g"})
    from ferrymq.common.topic import TopicConfig

    assert gc.is_tracked(TopicConfig("T"))


def test_a_freeze_in_the_stop_callback_keeps_the_survivors_out_of_the_next_pass() -> None:
    """Real collector, real freeze: what survived the pass is frozen, the next pass walks none of it."""
    survivors = [[i] for i in range(1000)]
    frozen_before = gc.get_freeze_count()
    m = GcMonitor(min_pause_s=0.0, heap_blocks=lambda: 10**12)  # any pass, any heap: freeze
    gc.callbacks.append(m)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(m)
        frozen_after = gc.get_freeze_count()
        gc.unfreeze()  # the test process's heap goes back to the collector
    assert m.freezes == 1
    assert frozen_after >= frozen_before + len(survivors)


def test_committed_offsets_add_no_tracked_object_per_topic_or_group(tmp_path: object) -> None:
    """The offset table (queue id -> offset) and its topic/group indexes hold only strings and ints: none of
    their inner containers is walked by a full pass, however many topics and groups commit."""
    from ferrymq.broker.offset_manager import ConsumerOffsetManager

    om = ConsumerOffsetManager(str(tmp_path))
    for n in range(200):
        om.commit(f"g{n % 7}", f"T{n % 13}", n % 8, n)
    inner = [*om.table.values(), *om._groups_by_topic.values(), *om._topics_by_group.values()]
    assert len(inner) == 91 + 13 + 7
    assert [c for c in inner if gc.is_tracked(c)] == []
    om.remove_topic("T0")
    assert "T0" not in om._groups_by_topic and om.groups_of_topic("T0") == set()
    assert all("T0" not in topics for topics in om._topics_by_group.values())
    assert om.topics_of_group("g1") == {f"T{t}" for t in range(1, 13)}
