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
| freeze at start       | ``freeze_now()``, a server's start          | collect once, then freeze what survived       |
| freeze after a pass   | a gen-2 pass took >= GC_FREEZE_MIN_PAUSE_S  | freeze its survivors (they are live)          |
|                       | and the heap grew GC_FREEZE_GROWTH_FACTOR x |                                              |
|                       | since the last freeze                       |                                              |

The heap is measured as ``sys.getallocatedblocks()`` (the interpreter's small-object blocks: cheap to read,
unlike the oldest generation's object count, whose listing costs a third of a full pass).

**The cost.** A frozen object that later becomes garbage in a reference cycle is never reclaimed (garbage
without a cycle is freed by reference counting as usual, frozen or not). The growth condition bounds it: a
freeze needs the heap to have doubled since the previous one, and every object then not frozen has just
survived a full pass, so it was live; the frozen objects are therefore never more than twice the largest
live heap the process had, and freezes happen at most log2(peak heap / heap at the first freeze) + 1 times.
The pause bound is partial in the same way: between freezes the unfrozen part of the heap can grow to about
half of it, so a pass can still take up to half of an unfrozen pass while the estate keeps growing; once it
stops growing, passes walk only what changed since the last freeze. ``gcFreezeEnable=false`` (broker.conf,
namesrv.conf) turns both freezes off; the histogram stays. ``FERRYMQ_GC_STATS=1`` in a server's environment
also logs every full pass (benchmarks/gc_pauses.py reads the longest from there).
"""

from __future__ import annotations

import bisect
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: upper bounds of the pause histogram's buckets, in seconds (ferrymq_gc_pause_seconds)
GC_PAUSE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: a full pass at least this long is worth freezing its survivors (a shorter one walks too little to matter)
GC_FREEZE_MIN_PAUSE_S = 0.005
#: ... provided the heap (allocated blocks) is at least this many times its size at the last freeze
GC_FREEZE_GROWTH_FACTOR = 2.0
#: help texts of the metrics both servers export from the monitor
GC_PAUSE_DOC = ("Full (generation 2) garbage-collection passes of the process: how long each held its thread "
                "(the event loop), freeze included")
GC_FROZEN_DOC = "Objects frozen out of the garbage collector's full passes (gc.get_freeze_count; gcFreezeEnable)"
#: environment variable: "1" logs every full pass of the process (duration, objects collected) at INFO
GC_STATS_ENV = "FERRYMQ_GC_STATS"
#: the generation ``gc.collect()`` and the interpreter's full passes report in ``gc.callbacks``
FULL_GENERATION = 2


class GcMonitor:
    """A ``gc.callbacks`` entry: times every full pass and, when ``freeze_enable``, freezes survivors under the
    policy of the module docstring. ``clock``, ``heap_blocks``, ``freeze`` and ``frozen_count`` are the
    interpreter's by default (tests drive ``__call__`` with their own)."""

    def __init__(self, *, freeze_enable: bool = True, min_pause_s: float = GC_FREEZE_MIN_PAUSE_S,
                 growth_factor: float = GC_FREEZE_GROWTH_FACTOR,
                 clock: Callable[[], float] = time.perf_counter,
                 heap_blocks: Callable[[], int] = sys.getallocatedblocks,
                 freeze: Callable[[], None] = gc.freeze,
                 frozen_count: Callable[[], int] = gc.get_freeze_count, log_passes: bool = False) -> None:
        if growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be above 1, got {growth_factor}")
        self.freeze_enable = freeze_enable
        self.min_pause_s = min_pause_s
        self.growth_factor = growth_factor
        self._clock = clock
        self._heap_blocks = heap_blocks
        self._freeze = freeze
        self._frozen_count = frozen_count
        self.log_passes = log_passes
        #: histogram parts of the full passes: per-bucket counts (not cumulative), sum and count
        self.counts = [0] * (len(GC_PAUSE_BUCKETS_S) + 1)
        self.sum_s = 0.0
        self.count = 0
        #: the longest pass since ``reset_max`` (seconds)
        self.max_pause_s = 0.0
        #: freezes done (at start and after passes) and the heap blocks at the last one (0: none yet)
        self.freezes = 0
        self.heap_blocks_at_freeze = 0
        self._started_s: float | None = None

    # ---- gc.callbacks -------------------------------------------------------------------------------
    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != FULL_GENERATION:
            return
        if phase == "start":
            self._started_s = self._clock()
            return
        started_s, self._started_s = self._started_s, None
        if started_s is None:  # installed during a pass
            return
        pause_s = self._clock() - started_s
        if self.freeze_enable and pause_s >= self.min_pause_s:
            blocks = self._heap_blocks()
            if blocks >= self.growth_factor * self.heap_blocks_at_freeze:
                self._freeze_survivors(blocks, f"a full collection took {pause_s * 1000:.1f} ms")
                pause_s = self._clock() - started_s  # the check and the freeze held the same thread
        self._observe(pause_s)
        if self.log_passes:
            log.info("full collection: %.1f ms, %d collected, %d frozen", pause_s * 1000, info.get("collected", 0),
                     self._frozen_count())

    def _observe(self, pause_s: float) -> None:
        self.counts[bisect.bisect_left(GC_PAUSE_BUCKETS_S, pause_s)] += 1
        self.sum_s += pause_s
        self.count += 1
        if pause_s > self.max_pause_s:
            self.max_pause_s = pause_s

    def _freeze_survivors(self, blocks: int, why: str) -> None:
        self._freeze()
        self.freezes += 1
        self.heap_blocks_at_freeze = blocks
        log.info("%s: %d live objects frozen out of the garbage collector's full passes (freeze %d, heap %d "
                 "blocks; next freeze from %d blocks)", why, self._frozen_count(), self.freezes, blocks,
                 int(self.growth_factor * blocks))

    # ---- server start ---------------------------------------------------------------------------------
    def freeze_now(self) -> None:
        """Collect once (timed like any full pass while installed) and freeze what survived: a server's start
        with gcFreezeEnable, before it serves, so the loaded estate and the interpreter's own objects stay out
        of later passes."""
        gc.collect()
        self._freeze_survivors(self._heap_blocks(), "server start")

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
        return self._frozen_count()

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
        _holders += 1
        _freeze_holders += int(freeze_enable)
        _monitor.freeze_enable = _freeze_holders > 0
        return _monitor


def release(freeze_enable: bool) -> None:
    """A holder is done (its server stopped); the last one removes the callback. Frozen objects stay frozen."""
    global _holders, _freeze_holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        _freeze_holders = max(0, _freeze_holders - int(freeze_enable))
        _monitor.freeze_enable = _freeze_holders > 0
        if _holders == 0 and _monitor in gc.callbacks:
            gc.callbacks.remove(_monitor)
