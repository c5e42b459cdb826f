"""The lowest commit log phy offset some subscribed group has not consumed, for the store's forced cleanup
(``MessageStore.unconsumed_phy_floor``), computed in bounded steps.

One pass looks at every committed offset (topic@group -> queue id -> queue offset) of a group in the subscription
group table: 100,000 of them cost seconds (each asks the store for the unit at the offset, mapping its consume
queue file), far beyond the event loop's 50 ms budget. So a pass runs ``STEP_BUDGET_S`` at a time: the first
step when the cleanup asks, the rest on the loop every ``STEP_GAP_S`` until it completes. Until a pass has
completed the answer is 0 (nothing may be deleted); a completed pass's answer is reused for ``REUSE_S``, the
cleanup's round, and a fresh pass starts when the cleanup asks after that.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

#: longest a step of a pass runs (one slice of the event loop)
STEP_BUDGET_S = 0.010
#: pause between two steps of a pass in progress (the loop serves requests meanwhile)
STEP_GAP_S = 0.020
#: a completed pass's answer serves the cleanup this long before a new pass is started
REUSE_S = 10.0
#: committed offsets looked at between two looks at the clock (each may map a consume queue file)
_CLOCK_EVERY = 4

#: (topic, queue id, queue offset) -> the phy offset of the first unconsumed message there, None if none
UnconsumedPhyOf = Callable[[str, int, int], "int | None"]


class UnconsumedFloor:
    """Callable provider: ``floor()`` -> the lowest unconsumed phy offset, None when every subscribed group has
    consumed everything, 0 while no pass has completed (keep everything)."""

    def __init__(self, offsets_table: Callable[[], dict[str, dict[int, int]]],
                 subscribed: Callable[[str], bool], unconsumed_phy_of: UnconsumedPhyOf,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self._offsets_table = offsets_table
        self._subscribed = subscribed
        self._unconsumed_phy_of = unconsumed_phy_of
        self._clock_s = clock_s
        self._pass: Iterator[int | None] | None = None
        self._floor: int | None = None
        self._answer: int | None = 0
        self._answered_at_s: float | None = None
        self._scheduled = False
        #: passes completed (for tests and logs)
        self.passes_total = 0

    def __call__(self) -> int | None:
        now_s = self._clock_s()
        if self._answered_at_s is not None and now_s - self._answered_at_s < REUSE_S:
            return self._answer
        if self._pass is None:
            self._pass = self._walk()
            self._floor = None
        if self.step():
            return self._answer
        self._schedule()
        return self._answer if self._pass is None else 0  # finished at once without a loop; else keep all

    def step(self, budget_s: float | None = None) -> bool:
        """Run the pass in progress for about ``budget_s`` (``STEP_BUDGET_S``); True once it has completed (the
        answer is set)."""
        walk = self._pass
        if walk is None:
            return True
        deadline = self._clock_s() + (STEP_BUDGET_S if budget_s is None else budget_s)
        for seen, _ in enumerate(walk, 1):
            if seen % _CLOCK_EVERY == 0 and self._clock_s() >= deadline:
                return False
        self._pass = None
        self._answer = self._floor
        self._answered_at_s = self._clock_s()
        self.passes_total += 1
        return True

    def _walk(self) -> Iterator[int | None]:
        for key, queue_offsets in list(self._offsets_table().items()):
            topic, _sep, group = key.partition("@")
            if not self._subscribed(group):
                continue
            for queue_id, queue_offset in list(queue_offsets.items()):
                phy = self._unconsumed_phy_of(topic, queue_id, queue_offset)
                if phy is not None and (self._floor is None or phy < self._floor):
                    self._floor = phy
                yield phy

    def _schedule(self) -> None:
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a tool, a test): finish the pass now
            while not self.step():
                pass
            return
        self._scheduled = True
        loop.call_later(STEP_GAP_S, self._continue)

    def _continue(self) -> None:
        self._scheduled = False
        if not self.step():
            self._schedule()
