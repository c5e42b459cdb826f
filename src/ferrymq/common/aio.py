"""asyncio helpers shared by every layer.

``asyncio.wait_for`` on Python 3.11 can lose a cancellation: when the awaited operation finishes (an event
set, a connect refused) at the moment the waiting task is cancelled, it returns or raises the operation's
outcome and drops the cancel (CPython gh-86296, fixed in 3.12). A background loop stopped with
``task.cancel()`` then runs on, and whoever awaits it (a ``stop()``) waits forever. ferrymq code uses
``wait_for`` and ``wait_event`` below instead: they bound the wait with ``asyncio.timeout`` in the caller's own
task, so a cancellation always propagates.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout_s: float | None) -> T:
    """``asyncio.wait_for(aw, timeout_s)`` (TimeoutError when the time is up, the operation cancelled) that
    never loses a cancellation of the caller. None: no time limit."""
    async with asyncio.timeout(timeout_s):
        return await aw


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` seconds pass; True when it is set. A cancellation of the
    caller always propagates (the wait runs in the caller's task, bounded by ``asyncio.timeout``)."""
    if event.is_set():
        await asyncio.sleep(0)  # yield like a wait that finds the event set, so a loop never starves the others
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


#: period of the event-loop lag probe's sleep
LOOP_LAG_PROBE_INTERVAL_S = 0.010
#: upper bounds of the lag histogram's buckets, in seconds (ferrymq_event_loop_lag_seconds)
LOOP_LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


#: a server started with this variable set to a number of milliseconds logs, for each event-loop stall at least
#: that long, where the loop spent it (``StallTracer``); unset or 0: off
STALL_TRACE_ENV = "FERRYMQ_STALL_TRACE_MS"
#: stacks of the loop thread a StallTracer takes per stall threshold (its sampling period is threshold / this)
STALL_TRACE_SAMPLES_PER_THRESHOLD = 5
#: the most frequent stacks of one stall a StallTracer logs
STALL_TRACE_TOP_STACKS = 3


class StallTracer:
    """Diagnostics: a thread that watches the lag probe's ticks and, while the loop has not ticked for
    ``threshold_s``, samples the loop thread's Python stack; when the stall ends it logs one WARNING with its
    length and its most frequent stacks. Meant for finding what holds a loop (opt-in: ``STALL_TRACE_ENV``); the
    thread wakes ``STALL_TRACE_SAMPLES_PER_THRESHOLD`` times per threshold."""

    def __init__(self, threshold_s: float, loop_thread_id: int) -> None:
        self.threshold_s = threshold_s
        self.loop_thread_id = loop_thread_id
        self.last_tick = time.monotonic()
        self.stalls_logged = 0
        #: a stall is being sampled (set by the tracer's thread); stalls the probe saw that no sample caught
        self._sampling = False
        self._unsampled: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ferrymq-stall-tracer", daemon=True)

    @classmethod
    def from_env(cls) -> StallTracer | None:
        try:
            ms = float(os.environ.get(STALL_TRACE_ENV, "0") or 0)
        except ValueError:
            log.warning("%s=%r is not a number of milliseconds: stall tracing is off", STALL_TRACE_ENV,
                        os.environ.get(STALL_TRACE_ENV))
            return None
        return cls(ms / 1000, threading.get_ident()) if ms > 0 else None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def tick(self, lag_s: float) -> None:
        """The probe ran again, ``lag_s`` late (loop thread). A lag past the threshold that the tracer's thread
        did not sample (it could not run: another thread held the GIL, or the process got no CPU) is logged
        without stacks."""
        self.last_tick = time.monotonic()
        if lag_s >= self.threshold_s and not self._sampling:
            self._unsampled.append(lag_s)

    def _run(self) -> None:
        period = self.threshold_s / STALL_TRACE_SAMPLES_PER_THRESHOLD
        stacks: collections.Counter[str] = collections.Counter()
        stalled_tick = -1.0
        while not self._stop.wait(period):
            tick = self.last_tick
            now = time.monotonic()
            if now - tick >= self.threshold_s:
                self._sampling = True
                frame = sys._current_frames().get(self.loop_thread_id)
                if frame is not None:
                    stacks["".join(traceback.format_stack(frame))] += 1
                stalled_tick = tick
                continue
            if stalled_tick >= 0 and tick != stalled_tick:
                self._report(tick - stalled_tick, stacks)
                stacks = collections.Counter()
                stalled_tick = -1.0
                self._sampling = False
            unsampled, self._unsampled = self._unsampled, []
            for lag_s in unsampled:
                self.stalls_logged += 1
                log.warning("the event loop stalled for about %.0f ms; no sample of it (another thread held the "
                            "GIL, or the process got no CPU)", lag_s * 1000)

    def _report(self, stall_s: float, stacks: collections.Counter[str]) -> None:
        self.stalls_logged += 1
        total = sum(stacks.values())
        parts = [f"{n} of {total} samples:\n{stack}" for stack, n in stacks.most_common(STALL_TRACE_TOP_STACKS)]
        log.warning("the event loop stalled for about %.0f ms; where it was:\n%s", stall_s * 1000,
                    "\n".join(parts) or "(no sample)")


class LoopLagProbe:
    """Measures how late the event loop runs a task: a task sleeps LOOP_LAG_PROBE_INTERVAL_S again and again
    and records each overshoot (the time the loop was held by something else) in a histogram of
    LOOP_LAG_BUCKETS_S (``cumulative()``, ``sum_s``, ``count``: a Prometheus histogram's parts);
    ``max_lag_s`` is the longest since ``reset_max``; ``on_sample(lag_s)`` gets every overshoot."""

    def __init__(self, on_sample: Callable[[float], None] | None = None,
                 interval_s: float = LOOP_LAG_PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.on_sample = on_sample
        self.max_lag_s = 0.0
        self.last_lag_s = 0.0
        self.count = 0
        self.sum_s = 0.0
        self.counts = [0] * (len(LOOP_LAG_BUCKETS_S) + 1)
        self._task: asyncio.Task[None] | None = None
        #: set when the process runs with STALL_TRACE_ENV (started with the probe, on the loop's thread)
        self.tracer: StallTracer | None = None

    def start(self) -> None:
        if self._task is None:
            self.tracer = StallTracer.from_env()
            if self.tracer is not None:
                self.tracer.start()
            self._task = asyncio.ensure_future(self._run())

    def reset_max(self) -> float:
        """The longest lag since the last reset; starts a new maximum."""
        value, self.max_lag_s = self.max_lag_s, 0.0
        return value

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.interval_s)
            lag_s = max(0.0, loop.time() - before - self.interval_s)
            if self.tracer is not None:
                self.tracer.tick(lag_s)
            self.last_lag_s = lag_s
            self.count += 1
            self.sum_s += lag_s
            self.counts[bisect.bisect_left(LOOP_LAG_BUCKETS_S, lag_s)] += 1
            if lag_s > self.max_lag_s:
                self.max_lag_s = lag_s
            if self.on_sample is not None:
                self.on_sample(lag_s)

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, samples at or below it) per bucket, the last one "+Inf"."""
        out: list[tuple[str, int]] = []
        acc = 0
        for bound, n in zip((*(str(b) for b in LOOP_LAG_BUCKETS_S), "+Inf"), self.counts, strict=True):
            acc += n
            out.append((bound, acc))
        return out

    async def stop(self) -> None:
        if self.tracer is not None:
            self.tracer.stop()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
