"""The cyclic garbage collector's full passes at estate size: measured, and bounded by freezing survivors.

CPython's full collection (generation 2) walks every GC-tracked object of the process in one block, on
whichever thread allocated last: on a server, on the event loop. With an estate of 10,000 topics and
100,000 queues that is hundreds of thousands of objects and a pause of 50-130 ms, longer than any request may
hold the loop. ``gc.freeze()`` moves every tracked object to a permanent generation that no pass walks.

``GcMonitor`` is installed once per process (``acquire``/``release``; a broker and a name server in one process
share it) as a ``gc.callbacks`` entry:

| what                  | when                                        | effect                                       |
|-----------------------|---------------------------------------------|----------------------------------------------|
| pause histogram       | every generation-2 pass (start -> stop)     | ``ferrymq_gc_pause_seconds`` (GC_PAUSE_BUCKETS_S) |
| freeze at start       | ``freeze_now()``, a server's start          | collect, count, then freeze what survived     |
| freeze after a pass   | a gen-2 pass took >= GC_FREEZE_MIN_PAUSE_S  | freeze its survivors (they are live)          |
|                       | and its unfrozen survivors are at least     |                                              |
|                       | the need: (GC_FREEZE_GROWTH_FACTOR - 1) x   |                                              |
|                       | the frozen count, at most                   |                                              |
|                       | GC_UNFROZEN_BUDGET_OBJECTS                  |                                              |
| full-pass threshold   | while freezing is on                        | ``gc.set_threshold``'s third value is         |
|                       |                                             | GC_FULL_PASS_THRESHOLD; the process's again   |
|                       |                                             | when freezing ends                           |

**The trigger.** A full pass walks the unfrozen tracked objects, so its duration estimates their number: the
monitor keeps the time per walked object measured at the exact counts (``rate_s_per_object``; thread CPU
seconds of the pass / (survivors + collected)), the least of them. CPU time, not wall time: a pass whose thread
waited for a CPU is not slower on it (a wall-time rate measured on such passes made estimates several times too
low), and the least rate is the nearest to the cost of the walk itself. After a pass of at least
``GC_FREEZE_MIN_PAUSE_S`` whose estimate of unfrozen survivors (CPU time / rate - collected) reaches
``GC_COUNT_AT_ESTIMATE_SHARE`` of the need, it confirms with one exact count (``len(gc.get_objects(2))``: after
a full pass every survivor is in the oldest generation; a listing costs a fifth to a third of the pass) and
freezes when the count reaches the need. The exact count also measures the rate again. A server's start
measures the first rate (``freeze_now``: a collection timed, one count). An estimate too high (a busy machine)
costs an exact count per long pass until the freeze. One too low delays the freeze: the objects of an estate
(slotted instances with a few references) cost less to walk than the interpreter's own (modules, classes,
functions) the start measured, by up to about half, hence the share; and a pass ``GC_RECOUNT_PAUSE_FACTOR``
times as long as the pass of the last exact count is counted whatever its estimate, so the passes of a growing
heap measure the rate again at least every doubling of their duration. Before the first rate is known, every
pass that is long enough is counted. The frozen count is read (``gc.get_freeze_count()``, a walk of every frozen
object: 20 ms for 400,000) at a server's start only; a freeze after a pass adds the survivors it counted.

**The pause (decision 0010).** A pass walks the unfrozen survivors of the last pass plus what survived the
younger passes since. The first are below the need (else they would have been frozen), so at most
``GC_UNFROZEN_BUDGET_OBJECTS`` (N) however large the frozen estate; the second are bounded by the full-pass
threshold: a full pass runs after GC_FULL_PASS_THRESHOLD + 1 generation-1 passes (about 7,700 net allocations
each at CPython's other thresholds) once they are a quarter of the last pass's survivors. While an estate is
built nearly every new object survives, and the broker's passes walked about 26,000-40,000 objects at
N = 25,000 and threshold 1, 9 ms of CPU at the median and 17-30 ms at the longest on the 2-core test machine,
against up to 200,000 objects and 73-76 ms with the growth factor alone (docs/sizing.md). Passes shorter than GC_FREEZE_MIN_PAUSE_S never freeze:
whatever they walk is cheap.

**The cost: frozen garbage.** Garbage without a cycle is freed by reference counting, frozen or not; a frozen
object that later becomes garbage in a reference cycle is never reclaimed. Every freeze takes at least the need
in objects that have just survived a full pass, so were live. While the frozen count is below N / (g - 1)
(g = ``GC_FREEZE_GROWTH_FACTOR``), the need is (g - 1) F and, as before decision 0010, the frozen objects stay
within g / (g - 1) (2x) the largest live heap. Past it, each freeze takes at least N live objects: at most one
freeze per N objects by which the long-lived heap grows or is replaced, and the frozen count is bounded by what
the process kept long enough to be frozen, not by a multiple of its live heap. What leaks is the part of those
that later dies in a cycle: objects in flight at a freeze (requests, futures) and long-lived ones dropped in a
cycle. benchmarks/gc_frozen_garbage.py measures it (unfreeze and collect after a run of churn; RESULTS.md, "Full
GC pauses", third round). ``gcFreezeEnable=false`` (broker.conf, namesrv.conf) turns both freezes and the
threshold off; the histogram stays. ``FERRYMQ_GC_STATS=1`` in a server's environment also logs every full pass
with its wall and CPU time (benchmarks/gc_pauses.py reads the longest from there).
"""

from __future__ import annotations

import bisect
import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: upper bounds of the pause histogram's buckets, in seconds (ferrymq_gc_pause_seconds)
GC_PAUSE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: a full pass at least this long is worth freezing its survivors (a shorter one walks too little to matter)
GC_FREEZE_MIN_PAUSE_S = 0.005
#: g: freeze when the unfrozen survivors of a full pass are at least (g - 1) x the frozen count, i.e. when freezing
#: them makes the frozen count g times what it was (at most log_g(growth) freezes; frozen <= g / (g - 1) x live)
GC_FREEZE_GROWTH_FACTOR = 2.0
#: N: freeze when the unfrozen survivors of a full pass reach this many objects even when they are fewer than
#: (g - 1) x the frozen count, so a pass never walks much more than N unfrozen objects however large the frozen
#: estate (decision 0010: a broker's objects cost 0.3-0.5 µs of CPU each to walk on the 2-core test machine)
GC_UNFROZEN_BUDGET_OBJECTS = 25_000
#: generation-1 passes between two full passes while freezing is on (``gc.set_threshold``'s third value; CPython's
#: default is 10): what survives between two full passes is walked by the second, unfrozen, on top of the budget,
#: and during an estate's build nearly every new object survives: 10 let 50,000 pile up, 1 about 25,000
GC_FULL_PASS_THRESHOLD = 1
#: share of the freeze's need an estimate must reach for an exact count: estimates err low by up to its inverse
#: (the objects of an estate cost less per object to walk than the interpreter's own the start measured)
GC_COUNT_AT_ESTIMATE_SHARE = 0.5
#: a long pass at least this many times as long as the pass of the last exact count is counted exactly even when
#: its estimate is below the freeze's need: renews a rate that no longer holds (one measured slow, on a small heap)
GC_RECOUNT_PAUSE_FACTOR = 2.0
#: help texts of the metrics both servers export from the monitor
GC_PAUSE_DOC = ("Full (generation 2) garbage-collection passes of the process: how long each held its thread "
                "(the event loop), freeze included")
GC_FROZEN_DOC = ("Objects frozen out of the garbage collector's full passes, counted at the last freeze (those freed "
                 "since included; gcFreezeEnable)")
#: environment variable: "1" logs every full pass of the process (duration, objects collected) at INFO
GC_STATS_ENV = "FERRYMQ_GC_STATS"
#: the generation ``gc.collect()`` and the interpreter's full passes report in ``gc.callbacks``
FULL_GENERATION = 2


def _unfrozen_survivors() -> int:
    """Objects in the oldest generation: after a full pass, every unfrozen survivor (a listing of them all)."""
    return len(gc.get_objects(FULL_GENERATION))


class GcMonitor:
    """A ``gc.callbacks`` entry: times every full pass and, when ``freeze_enable``, freezes survivors under the
    policy of the module docstring. ``clock``, ``unfrozen_count``, ``freeze`` and ``frozen_count`` are the
    interpreter's by default (tests drive ``__call__`` with their own)."""

    def __init__(self, *, freeze_enable: bool = True, min_pause_s: float = GC_FREEZE_MIN_PAUSE_S,
                 growth_factor: float = GC_FREEZE_GROWTH_FACTOR, recount_factor: float = GC_RECOUNT_PAUSE_FACTOR,
                 unfrozen_budget: int | None = GC_UNFROZEN_BUDGET_OBJECTS,
                 clock: Callable[[], float] = time.perf_counter, cpu_clock: Callable[[], float] = time.thread_time,
                 unfrozen_count: Callable[[], int] = _unfrozen_survivors,
                 freeze: Callable[[], None] = gc.freeze,
                 frozen_count: Callable[[], int] = gc.get_freeze_count, log_passes: bool = False) -> None:
        if growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be above 1, got {growth_factor}")
        if unfrozen_budget is not None and unfrozen_budget <= 0:
            raise ValueError(f"unfrozen_budget must be positive or None, got {unfrozen_budget}")
        self.freeze_enable = freeze_enable
        self.min_pause_s = min_pause_s
        self.growth_factor = growth_factor
        self.recount_factor = recount_factor
        #: None: the growth factor alone sets the freeze's need (the policy before decision 0010)
        self.unfrozen_budget = unfrozen_budget
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._unfrozen_count = unfrozen_count
        self._freeze = freeze
        self._frozen_count = frozen_count
        self.log_passes = log_passes
        #: histogram parts of the full passes: per-bucket counts (not cumulative), sum and count
        self.counts = [0] * (len(GC_PAUSE_BUCKETS_S) + 1)
        self.sum_s = 0.0
        self.count = 0
        #: the longest pass since ``reset_max`` (seconds)
        self.max_pause_s = 0.0
        #: the thread CPU time of the longest pass of the process (seconds): what the walk cost, without the time
        #: the thread waited for a CPU (on a busy machine the wall time is several times this)
        self.max_pause_cpu_s = 0.0
        #: thread CPU seconds a full pass took per object it walked: the least of the exact counts' (0.0: not
        #: measured yet). CPU time, not wall time: a pass whose thread waited for a CPU (a busy machine) looks slow
        #: in wall time, and a rate measured on such passes made estimates several times too low
        self.rate_s_per_object = 0.0
        #: the thread CPU time of the pass the last exact count followed
        self.pause_at_count_s = 0.0
        #: freezes done (at start and after passes), exact counts of the unfrozen objects taken, and the frozen
        #: count right after the last freeze (0: none yet; ``acquire`` reads the process's). Frozen objects freed
        #: since by reference counting are still in it: the freeze's need is measured against at least the true
        #: count, which keeps the bounds, and the count (a walk of every frozen object) is read once per freeze
        self.freezes = 0
        self.exact_counts = 0
        self.frozen_at_freeze = 0
        self._started_s: float | None = None
        self._started_cpu_s = 0.0

    # ---- gc.callbacks -------------------------------------------------------------------------------
    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != FULL_GENERATION:
            return
        if phase == "start":
            self._started_cpu_s = self._cpu_clock()
            self._started_s = self._clock()
            return
        started_s, self._started_s = self._started_s, None
        if started_s is None:  # installed during a pass
            return
        pause_s = self._clock() - started_s
        if self.freeze_enable and pause_s >= self.min_pause_s:
            self._after_long_pass(pause_s, self._cpu_clock() - self._started_cpu_s, int(info.get("collected", 0)))
            pause_s = self._clock() - started_s  # the count and the freeze held the same thread
        cpu_s = self._cpu_clock() - self._started_cpu_s
        self._observe(pause_s)
        if cpu_s > self.max_pause_cpu_s:
            self.max_pause_cpu_s = cpu_s
        if self.log_passes:
            log.info("full collection: %.1f ms (%.1f ms CPU), %d collected, %d frozen", pause_s * 1000, cpu_s * 1000,
                     info.get("collected", 0), self.frozen_at_freeze)

    def needed_to_freeze(self) -> float:
        """Unfrozen survivors a pass must leave for a freeze: (growth factor - 1) x the frozen count, at most the
        unfrozen budget."""
        need = (self.growth_factor - 1.0) * self.frozen_at_freeze
        return need if self.unfrozen_budget is None else min(need, float(self.unfrozen_budget))

    def estimate_unfrozen(self, cpu_s: float, collected: int) -> float | None:
        """Unfrozen survivors of a pass of ``cpu_s`` of CPU time that collected ``collected`` objects, at the last
        measured rate; None before a rate is known."""
        if self.rate_s_per_object <= 0.0:
            return None
        return cpu_s / self.rate_s_per_object - collected

    def _after_long_pass(self, pause_s: float, cpu_s: float, collected: int) -> None:
        needed = self.needed_to_freeze()
        estimate = self.estimate_unfrozen(cpu_s, collected)
        if (estimate is not None and estimate < GC_COUNT_AT_ESTIMATE_SHARE * needed
                and cpu_s < self.recount_factor * self.pause_at_count_s):
            return
        unfrozen = self._unfrozen_count()
        self.exact_counts += 1
        self._measure_rate(cpu_s, unfrozen + collected)
        if unfrozen >= needed:
            est = "no rate yet" if estimate is None else f"estimated {estimate:.0f}"
            self._freeze_survivors(f"a full collection took {pause_s * 1000:.1f} ms and left {unfrozen} unfrozen "
                                   f"objects ({est}; {needed:.0f} needed)", unfrozen)

    def _measure_rate(self, cpu_s: float, walked: int) -> None:
        self.pause_at_count_s = cpu_s
        if walked > 0 and cpu_s > 0.0:
            rate = cpu_s / walked
            if self.rate_s_per_object <= 0.0 or rate < self.rate_s_per_object:
                self.rate_s_per_object = rate

    def _observe(self, pause_s: float) -> None:
        self.counts[bisect.bisect_left(GC_PAUSE_BUCKETS_S, pause_s)] += 1
        self.sum_s += pause_s
        self.count += 1
        if pause_s > self.max_pause_s:
            self.max_pause_s = pause_s

    def _freeze_survivors(self, why: str, counted: int | None = None) -> None:
        """Freeze; the frozen count becomes the last one plus ``counted`` (the survivors just counted), or, when
        None (a server's start), ``gc.get_freeze_count()``: one walk of every frozen object, 20 ms for 400,000,
        which at every freeze would cost more than the walk of the survivors it saves."""
        self._freeze()
        self.freezes += 1
        if counted is None:
            self.frozen_at_freeze = self._frozen_count()
        else:
            self.frozen_at_freeze += counted
        frozen = self.frozen_at_freeze
        log.info("%s: %d live objects frozen out of the garbage collector's full passes (freeze %d; next freeze "
                 "from %d unfrozen survivors)", why, frozen, self.freezes, int(self.needed_to_freeze()))

    # ---- server start ---------------------------------------------------------------------------------
    def freeze_now(self) -> None:
        """Collect (timed like any full pass while installed), count the survivors to measure the rate of the pass
        per object, and freeze them: a server's start with gcFreezeEnable, before it serves, so the loaded estate
        and the interpreter's own objects stay out of later passes. The first time, the pass is timed on a second
        collection: the first pass of a process also faults its heap in (173 ms against 48 ms for 27,000 objects)."""
        if self.rate_s_per_object <= 0.0:
            gc.collect()
        started_s, started_cpu_s = self._clock(), self._cpu_clock()
        collected = gc.collect()
        pause_s, cpu_s = self._clock() - started_s, self._cpu_clock() - started_cpu_s
        unfrozen = self._unfrozen_count()
        self.exact_counts += 1
        self._measure_rate(cpu_s, unfrozen + collected)
        self._freeze_survivors(f"server start (a full collection of {pause_s * 1000:.1f} ms, {cpu_s * 1000:.1f} ms CPU, "
                               f"left {unfrozen} objects)")

    # ---- reading ----------------------------------------------------------------------------------------
    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, passes at or below it) per bucket, the last one "+Inf"."""
        out: list[tuple[str, int]] = []
        acc = 0
        for bound, n in zip((*(str(b) for b in GC_PAUSE_BUCKETS_S), "+Inf"), self.counts, strict=True):
            acc += n
            out.append((bound, acc))
        return out

    def frozen_objects(self) -> int:
        """The frozen count at the last freeze (``gc.get_freeze_count`` walks every frozen object: 50 ms for a
        million, not for a metrics scrape)."""
        return self.frozen_at_freeze

    def reset_max(self) -> float:
        """The longest pass since the last reset; starts a new maximum."""
        value, self.max_pause_s = self.max_pause_s, 0.0
        return value


_lock = threading.Lock()
#: the process's monitor (one process, one collector); in ``gc.callbacks`` while it has holders
_monitor = GcMonitor(freeze_enable=False, log_passes=os.environ.get(GC_STATS_ENV) == "1")
#: holders of the monitor, and how many of them asked for freezing
_holders = 0
_freeze_holders = 0
#: the process's collection thresholds before freezing turned them to GC_FULL_PASS_THRESHOLD (None: not turned)
_saved_threshold: tuple[int, int, int] | None = None


def _follow_freezing() -> None:
    """Freezing on: the monitor freezes and full passes wait GC_FULL_PASS_THRESHOLD generation-1 passes; off: the
    thresholds the process had. Under ``_lock``."""
    global _saved_threshold
    _monitor.freeze_enable = _freeze_holders > 0
    if _monitor.freeze_enable and _saved_threshold is None:
        threshold = gc.get_threshold()
        _saved_threshold = (threshold[0], threshold[1], threshold[2])
        gc.set_threshold(threshold[0], threshold[1], GC_FULL_PASS_THRESHOLD)
    elif not _monitor.freeze_enable and _saved_threshold is not None:
        gc.set_threshold(*_saved_threshold)
        _saved_threshold = None


def monitor() -> GcMonitor:
    """The process's monitor (its histogram counts the passes seen while some server held it)."""
    return _monitor


def acquire(freeze_enable: bool) -> GcMonitor:
    """Install the process's monitor in ``gc.callbacks`` (its first holder does); freezing is on while any
    holder asked for it. Each ``acquire`` is paired with one ``release`` of the same ``freeze_enable``."""
    global _holders, _freeze_holders
    with _lock:
        if _holders == 0 and _monitor not in gc.callbacks:
            gc.callbacks.append(_monitor)
        if _holders == 0:
            _monitor.frozen_at_freeze = gc.get_freeze_count()  # what the process froze before (one walk)
        _holders += 1
        _freeze_holders += int(freeze_enable)
        _follow_freezing()
        return _monitor


def release(freeze_enable: bool) -> None:
    """A holder is done (its server stopped); the last one removes the callback. Frozen objects stay frozen."""
    global _holders, _freeze_holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        _freeze_holders = max(0, _freeze_holders - int(freeze_enable))
        _follow_freezing()
        if _holders == 0 and _monitor in gc.callbacks:
            gc.callbacks.remove(_monitor)
