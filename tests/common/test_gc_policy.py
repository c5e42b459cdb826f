"""The full-collection pause histogram and the freeze policy (common/gc_policy.py), driven through the
``gc.callbacks`` entry with an injected clock, counts and freeze: no real collection decides anything here.
The last tests check, on the real interpreter, what the policy counts on: which containers are tracked, and
that a freeze inside a callback takes the survivors out of the next full pass."""

from __future__ import annotations

import gc

import pytest

from ferrymq.common import gc_policy
from ferrymq.common.gc_policy import GC_PAUSE_BUCKETS_S, GC_UNFROZEN_BUDGET_OBJECTS, GcMonitor

FULL = {"generation": 2, "collected": 0, "uncollectable": 0}
YOUNG = {"generation": 0, "collected": 0, "uncollectable": 0}
#: gc.collect() calls a real-collector test makes at most until its monitor has seen one full pass
FULL_PASS_ATTEMPTS = 100


def collect_until_seen(monitor: GcMonitor) -> None:
    """Run full collections until ``monitor`` has seen one more full pass. gc.collect() returns at once while
    another thread's collection runs (its finalizers may let this thread run), and the test suite's process has
    such threads (grpc's, servers')."""
    before = monitor.count
    for _ in range(FULL_PASS_ATTEMPTS):
        gc.collect()
        if monitor.count > before:
            return


class World:
    """The interpreter as the monitor sees it: a clock, the unfrozen survivors of the last pass, the frozen count,
    and the freezes and exact counts the monitor asked for."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.cpu_s = 0.0
        self.unfrozen = 1_000
        self.frozen = 0
        self.freezes = 0
        self.counts = 0

    def freeze(self) -> None:
        self.freezes += 1
        self.frozen += self.unfrozen
        self.unfrozen = 0

    def count(self) -> int:
        self.counts += 1
        return self.unfrozen

    def monitor(self, **kw: object) -> GcMonitor:
        """A monitor of this world; without ``unfrozen_budget`` the growth factor alone sets the freeze's need
        (the tests of the estimate, the counts and the factor), else as given."""
        kw.setdefault("unfrozen_budget", None)
        return GcMonitor(clock=lambda: self.now_s, cpu_clock=lambda: self.cpu_s, unfrozen_count=self.count,
                         freeze=self.freeze, frozen_count=lambda: self.frozen, **kw)  # type: ignore[arg-type]

    def full_pass(self, m: GcMonitor, pause_s: float, info: dict[str, int] = FULL, cpu_s: float | None = None) -> None:
        """A pass of ``pause_s``, of which ``cpu_s`` (all of it by default) on a CPU."""
        self.now_s = self.cpu_s = 0.0  # each pass timed from 0: its duration is exactly pause_s
        m("start", info)
        self.now_s = pause_s
        self.cpu_s = pause_s if cpu_s is None else cpu_s
        m("stop", info)


def calibrated(w: World, rate_s_per_object: float = 1e-6, frozen: int = 100_000, **kw: object) -> GcMonitor:
    """A monitor as after a server's start: ``frozen`` objects frozen, the rate of a pass per object measured on
    a pass over all of them."""
    m = w.monitor(**kw)
    w.frozen = m.frozen_at_freeze = frozen
    w.unfrozen = 0
    m.rate_s_per_object = rate_s_per_object
    m.pause_at_count_s = frozen * rate_s_per_object
    return m


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


def test_freezes_when_the_estimated_unfrozen_count_reaches_the_frozen_count_and_the_count_confirms() -> None:
    w = World()
    m = calibrated(w, min_pause_s=0.005, growth_factor=2.0)
    w.unfrozen = 40_000
    w.full_pass(m, 0.040)  # 40,000 estimated: below half the 100,000 needed, no count
    assert w.counts == 0 and w.freezes == 0
    w.unfrozen = 99_000
    w.full_pass(m, 0.099)  # estimated near the need: counted, 99,000 < 100,000: no freeze
    assert w.counts == 1 and w.freezes == 0
    w.unfrozen = 100_000
    w.full_pass(m, 0.100)
    assert w.counts == 2 and w.freezes == 1 and m.freezes == 1
    assert w.frozen == 200_000 and m.frozen_at_freeze == 200_000
    w.unfrozen = 90_000
    w.full_pass(m, 0.090)  # the next freeze needs 200,000 unfrozen; no count below 100,000 estimated
    assert w.counts == 2 and w.freezes == 1
    w.unfrozen = 200_000
    w.full_pass(m, 0.200)
    assert w.counts == 3 and w.freezes == 2 and w.frozen == 400_000


def test_a_short_pass_is_not_worth_a_count() -> None:
    w = World()
    m = calibrated(w, frozen=0, min_pause_s=0.005)
    w.unfrozen = 4_000
    w.full_pass(m, 0.004)
    assert w.counts == 0 and w.freezes == 0


def test_an_estimate_too_high_costs_a_count_per_long_pass_and_never_a_freeze_too_early() -> None:
    """Passes slowed down (the process waits for a CPU) look like many objects: each long pass is counted, the
    counts say otherwise and nothing is frozen until the objects are there; the rate stays the least measured."""
    w = World()
    m = calibrated(w)
    w.unfrozen = 50_000
    w.full_pass(m, 0.300)  # 300,000 estimated
    assert w.counts == 1 and w.freezes == 0
    assert m.rate_s_per_object == pytest.approx(1e-6)
    w.unfrozen = 60_000
    w.full_pass(m, 0.360)
    assert w.counts == 2 and w.freezes == 0
    w.unfrozen = 100_000
    w.full_pass(m, 0.600)
    assert w.counts == 3 and w.freezes == 1 and w.frozen == 200_000


def test_a_rate_too_slow_is_renewed_once_passes_have_doubled_since_the_last_count() -> None:
    """The rate was measured on objects 10 x as costly as the estate's: estimates are a tenth of the real count,
    and without a recount the frozen count would never be reached."""
    w = World()
    m = calibrated(w, rate_s_per_object=10e-6, frozen=100_000)
    m.pause_at_count_s = 0.050  # counted on a small heap
    w.unfrozen = 90_000
    w.full_pass(m, 0.090)  # estimate 9,000 (real 90,000): but the pass is 1.8 x the counted one's
    assert w.counts == 0 and w.freezes == 0
    w.unfrozen = 110_000
    w.full_pass(m, 0.110)  # estimate 11,000; 2.2 x the counted pass: counted, and frozen
    assert w.counts == 1 and w.freezes == 1
    assert m.rate_s_per_object == pytest.approx(1e-6) and m.pause_at_count_s == pytest.approx(0.110)
    w.unfrozen = 200_000
    w.full_pass(m, 0.200)  # estimate right now: counted, 200,000 < 210,000 needed
    assert w.counts == 2 and w.freezes == 1


def test_the_rate_is_measured_on_cpu_time_so_passes_that_waited_for_a_cpu_do_not_hide_the_survivors() -> None:
    """On a busy machine a pass of 50,000 objects took 185 ms of wall time and 20 ms on a CPU. A rate measured on
    wall time (3.7 µs per object) made later passes of 90,000 objects (35 ms) look like 10,000, and they were
    neither counted nor frozen; on CPU time the rate is 0.4 µs per object and they are."""
    w = World()
    m = w.monitor(unfrozen_budget=25_000)
    w.frozen = m.frozen_at_freeze = 1_000_000  # no rate yet: the first long pass is counted and measures it
    w.unfrozen = 50_000
    w.full_pass(m, 0.185, cpu_s=0.020)
    assert w.counts == 1 and w.freezes == 1
    assert m.rate_s_per_object == pytest.approx(0.4e-6)
    w.unfrozen = 90_000
    w.full_pass(m, 0.035, cpu_s=0.035)
    assert w.counts == 2 and w.freezes == 2


def test_collected_objects_count_as_walked_not_as_survivors() -> None:
    w = World()
    m = calibrated(w)
    w.unfrozen = 40_000
    w.full_pass(m, 0.100, {**FULL, "collected": 60_000})  # 100,000 walked, 40,000 survived: no count
    assert w.counts == 0 and w.freezes == 0
    w.unfrozen = 100_000
    w.full_pass(m, 0.120, {**FULL, "collected": 20_000})
    assert w.counts == 1 and w.freezes == 1
    assert m.rate_s_per_object == pytest.approx(1e-6)


def test_the_first_long_pass_counts_when_no_rate_is_known_and_freezes_when_nothing_is_frozen() -> None:
    w = World()
    m = w.monitor()
    w.full_pass(m, 0.050)
    assert w.counts == 1 and w.freezes == 1 and w.frozen == 1_000
    assert m.rate_s_per_object == pytest.approx(0.050 / 1_000)


def test_growth_factor_sets_how_far_the_unfrozen_part_may_grow() -> None:
    w = World()
    m = calibrated(w, growth_factor=1.25)  # freeze at a quarter of the frozen count
    w.unfrozen = 24_000
    w.full_pass(m, 0.024)
    assert w.freezes == 0
    w.unfrozen = 25_000
    w.full_pass(m, 0.025)
    assert w.freezes == 1 and w.frozen == 125_000


def test_freezes_are_logarithmic_and_passes_stay_within_the_frozen_count() -> None:
    """An estate growing from 1,000 to 1,000,000 tracked objects, a full pass at every quarter of growth (CPython's
    own trigger) taking 1 µs per object it walks: at most log2(1000) + 1 freezes, each at least doubling the frozen
    count, a few exact counts per freeze, and no pass leaves more unfrozen survivors than the frozen count and one
    step of growth."""
    w = World()
    m = w.monitor(growth_factor=2.0)
    live = 1_000
    frozen_at: list[int] = []
    largest_ratio = 0.0
    while live < 1_000_000:
        live = int(live * 1.25) + 1
        w.unfrozen = live - w.frozen
        if w.frozen:
            largest_ratio = max(largest_ratio, w.unfrozen / w.frozen)
        before = w.freezes
        w.full_pass(m, w.unfrozen * 1e-6)
        if w.freezes > before:
            frozen_at.append(w.frozen)
        assert w.frozen <= 2 * live
    assert 1 <= len(frozen_at) <= 11
    assert all(b >= 2 * a for a, b in zip(frozen_at, frozen_at[1:], strict=False))
    assert len(frozen_at) <= w.counts <= 3 * len(frozen_at)
    assert largest_ratio <= 1.5  # a quarter of a live heap of up to 2 x the frozen count


def test_the_default_monitor_caps_the_freezes_need_at_the_unfrozen_budget() -> None:
    m = GcMonitor()
    assert m.unfrozen_budget == GC_UNFROZEN_BUDGET_OBJECTS
    m.frozen_at_freeze = 10_000
    assert m.needed_to_freeze() == 10_000  # below the budget the growth factor decides
    m.frozen_at_freeze = 1_000_000
    assert m.needed_to_freeze() == GC_UNFROZEN_BUDGET_OBJECTS


def test_the_unfrozen_budget_freezes_before_the_survivors_reach_the_frozen_count() -> None:
    w = World()
    m = calibrated(w, frozen=1_000_000, unfrozen_budget=25_000)
    w.unfrozen = 10_000
    w.full_pass(m, 0.010)  # 10,000 estimated: below half the budget, no count
    assert w.counts == 0 and w.freezes == 0
    w.unfrozen = 24_000
    w.full_pass(m, 0.024)  # counted: 24,000 < 25,000
    assert w.counts == 1 and w.freezes == 0
    w.unfrozen = 25_000
    w.full_pass(m, 0.025)
    assert w.counts == 2 and w.freezes == 1 and w.frozen == 1_025_000 and w.unfrozen == 0


def test_with_the_budget_no_pass_walks_much_more_than_it_however_large_the_frozen_estate() -> None:
    """The estate of the logarithmic test (1,000 to 1,000,000 objects, a pass at every quarter of growth of the
    survivors of the last pass, CPython's own trigger, 1 µs per object): with a budget of 25,000 objects no pass
    walks more than the budget and a quarter of it, where the growth factor alone let passes walk about as many
    objects as were frozen (hundreds of thousands). The price is freezes proportional to the growth, each of at
    least the budget's live objects."""
    budget = 25_000
    w = World()
    m = w.monitor(unfrozen_budget=budget)
    live = 1_000
    survivors = 0  # CPython's long_lived_total: the survivors of the last full pass, frozen or not after it
    longest_walk = 0
    frozen_at: list[int] = []
    while live < 1_000_000:
        grown = max(survivors // 4, 100) + 1
        live += grown
        w.unfrozen += grown
        survivors = w.unfrozen
        longest_walk = max(longest_walk, w.unfrozen)
        before = w.freezes
        w.full_pass(m, w.unfrozen * 1e-6)
        if w.freezes > before:
            frozen_at.append(w.frozen)
        assert w.frozen <= live
    assert longest_walk <= budget * 1.25 + 101
    # each freeze adds at least (g - 1) x the frozen count or the budget, whichever is less, of live objects
    assert all(b - a >= min(a, budget) for a, b in zip(frozen_at, frozen_at[1:], strict=False))
    assert len(frozen_at) <= 1_000_000 // budget + 1
    # the growth factor alone, same estate: passes walk up to about the frozen count
    w2 = World()
    m2 = w2.monitor(unfrozen_budget=None)
    live, survivors, longest_walk_factor = 1_000, 0, 0
    while live < 1_000_000:
        grown = max(survivors // 4, 100) + 1
        live += grown
        w2.unfrozen += grown
        survivors = w2.unfrozen
        longest_walk_factor = max(longest_walk_factor, w2.unfrozen)
        w2.full_pass(m2, w2.unfrozen * 1e-6)
    assert longest_walk_factor > 8 * budget


def test_each_pass_logs_its_cpu_time_beside_its_wall_time(caplog: pytest.LogCaptureFixture) -> None:
    """A pass whose thread waited for a CPU: the wall time is in the histogram, the CPU time (what the walk cost)
    in the log line and the longest CPU time kept."""
    w = World()
    cpu = [0.0]
    m = GcMonitor(freeze_enable=False, clock=lambda: w.now_s, cpu_clock=lambda: cpu[0], log_passes=True)
    m("start", FULL)
    w.now_s, cpu[0] = 0.080, 0.012
    with caplog.at_level("INFO", logger="ferrymq.common.gc_policy"):
        m("stop", FULL)
    assert m.max_pause_s == pytest.approx(0.080) and m.max_pause_cpu_s == pytest.approx(0.012)
    assert "full collection: 80.0 ms (12.0 ms CPU)" in caplog.text


def test_the_unfrozen_budget_must_be_positive() -> None:
    with pytest.raises(ValueError):
        GcMonitor(unfrozen_budget=0)


def test_disabled_policy_never_freezes_but_still_measures() -> None:
    w = World()
    m = w.monitor(freeze_enable=False)
    for _ in range(5):
        w.unfrozen *= 4
        w.full_pass(m, 0.2)
    assert w.freezes == 0 and w.counts == 0 and m.count == 5


def test_the_count_and_the_freeze_are_part_of_the_recorded_pause() -> None:
    w = World()

    def slow_count() -> int:
        w.now_s += 0.002
        return w.count()

    def slow_freeze() -> None:
        w.now_s += 0.003
        w.freeze()

    m = GcMonitor(clock=lambda: w.now_s, unfrozen_count=slow_count, freeze=slow_freeze,
                  frozen_count=lambda: w.frozen)
    w.full_pass(m, 0.050)
    assert m.sum_s == pytest.approx(0.055)


def test_freeze_now_collects_measures_the_rate_and_freezes() -> None:
    w = World()
    m = GcMonitor(unfrozen_count=w.count, freeze=w.freeze, frozen_count=lambda: w.frozen)  # the real clock
    w.unfrozen = 5_000
    m.freeze_now()  # a real collection, timed; the count and the freeze are the world's
    assert w.counts == 1 and w.freezes == 1 and m.freezes == 1 and w.frozen == 5_000
    assert m.rate_s_per_object > 0.0


def test_the_frozen_count_is_read_at_a_servers_start_only_and_freezes_after_passes_add_what_they_counted() -> None:
    """gc.get_freeze_count walks every frozen object (50 ms for a million): read at a server's start, never per
    pass, freeze or scrape; a freeze after a pass adds the survivors it has just counted."""
    w = World()
    reads: list[int] = []

    def frozen_count() -> int:
        reads.append(w.frozen)
        return w.frozen

    m = GcMonitor(clock=lambda: w.now_s, cpu_clock=lambda: w.cpu_s, unfrozen_count=w.count, freeze=w.freeze,
                  frozen_count=frozen_count)
    w.unfrozen = 5_000
    m.freeze_now()  # a server's start: one real collection, the world's count, freeze and frozen count
    assert w.freezes == 1 and reads == [5_000] and m.frozen_objects() == 5_000
    w.unfrozen = 6_000
    w.full_pass(m, 0.050)  # counted: 6,000 >= the 5,000 needed (growth factor 2): frozen, nothing read
    assert w.freezes == 2 and len(reads) == 1 and m.frozen_objects() == 11_000 == w.frozen
    for n in range(5):
        w.unfrozen = 100 * n
        w.full_pass(m, 0.050)
        m.frozen_objects()
    assert w.freezes == 2 and len(reads) == 1


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


def test_freezing_turns_the_full_pass_threshold_and_its_end_restores_the_processs() -> None:
    mon = gc_policy.monitor()
    if mon in gc.callbacks:
        pytest.skip("a server of this process holds the monitor")
    before = gc.get_threshold()
    try:
        gc_policy.acquire(False)
        assert gc.get_threshold() == before  # measuring only: the process's thresholds
        gc_policy.acquire(True)
        gc_policy.acquire(True)
        assert gc.get_threshold() == (before[0], before[1], gc_policy.GC_FULL_PASS_THRESHOLD)
        gc_policy.release(True)
        assert gc.get_threshold()[2] == gc_policy.GC_FULL_PASS_THRESHOLD  # one holder still freezes
        gc_policy.release(True)
        assert gc.get_threshold() == before
    finally:
        gc_policy.release(False)
        gc.set_threshold(*before)
    assert mon not in gc.callbacks


def test_the_real_collector_times_a_full_pass() -> None:
    mon = gc_policy.acquire(False)
    try:
        before = mon.count
        collect_until_seen(mon)
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
    m = GcMonitor(min_pause_s=0.0)  # no rate known yet and nothing frozen by it: the first pass freezes
    gc.callbacks.append(m)
    try:
        collect_until_seen(m)
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
