"""The freeze policy on the real collector: a process builds an estate of tracked objects step by step, as a
broker does while clients create topics and queues, and the passes it sees stay within the unfrozen budget
(decision 0010), whatever the size of the estate.

It runs in a child interpreter (this file as a script): the freezes are real ``gc.freeze()`` calls, which would
otherwise take the test runner's own objects out of its collector. The monitor's clocks (wall and CPU) are virtual: a
pass lasts 1 µs per object it walks (counted when the pass starts), so what the policy estimates and decides
depends on counts only, never on how busy the machine is. The child sets the full-pass threshold as
``gc_policy.acquire`` does while freezing is on.
"""

from __future__ import annotations

import gc
import json
import math
import subprocess
import sys
from pathlib import Path

#: tracked objects the child builds, in steps of ``STEP_OBJECTS`` (lists, each tracked)
ESTATE_OBJECTS = 400_000
STEP_OBJECTS = 1_000
#: untracked objects (strings) the child holds before its start's freeze: a server's heap holds far more bytes
#: than tracked objects (names, bodies, code), so its size in blocks says little about what a pass walks
BALLAST_STRINGS = 300_000
#: virtual seconds a pass takes per object it walks
RATE_S_PER_OBJECT = 1e-6
CHILD_TIMEOUT_S = 120


def _child() -> None:
    from ferrymq.common.gc_policy import GC_FULL_PASS_THRESHOLD, GcMonitor

    now = {"s": 0.0, "walked": 0}
    passes: list[dict[str, int]] = []

    def recorder(phase: str, info: dict[str, int]) -> None:
        """Before the monitor in ``gc.callbacks``: what a pass walks, and what it leaves unfrozen."""
        if info.get("generation") != 2:
            return
        if phase == "start":
            now["walked"] = len(gc.get_objects())  # every unfrozen tracked object, all generations
            return
        now["s"] += now["walked"] * RATE_S_PER_OBJECT
        passes.append({"walked": int(now["walked"]), "survivors": len(gc.get_objects(2)),
                       "frozen": gc.get_freeze_count()})

    ballast = [str(i) * 3 for i in range(BALLAST_STRINGS)]
    monitor = GcMonitor(clock=lambda: now["s"], cpu_clock=lambda: now["s"])
    t0, t1, _ = gc.get_threshold()
    gc.set_threshold(t0, t1, GC_FULL_PASS_THRESHOLD)
    gc.callbacks.extend([recorder, monitor])
    monitor.freeze_now()  # as a server's start
    first_frozen = gc.get_freeze_count()
    frozen_after: list[int] = []
    estate: list[list[list[int]]] = []
    for _ in range(ESTATE_OBJECTS // STEP_OBJECTS):
        freezes = monitor.freezes
        estate.append([[i] for i in range(STEP_OBJECTS)])
        if monitor.freezes > freezes:
            frozen_after.append(gc.get_freeze_count())
    gc.callbacks.remove(monitor)
    gc.callbacks.remove(recorder)
    print(json.dumps({"passes": passes, "first_frozen": first_frozen, "frozen_after": frozen_after,
                      "freezes": monitor.freezes, "exact_counts": monitor.exact_counts,
                      "final_frozen": gc.get_freeze_count(), "final_unfrozen": len(gc.get_objects()),
                      "built": sum(len(step) for step in estate), "ballast": len(ballast),
                      "budget": monitor.unfrozen_budget, "threshold": gc.get_threshold()}))


def test_passes_stay_within_the_unfrozen_budget_while_an_estate_is_built() -> None:
    out = subprocess.run([sys.executable, str(Path(__file__))], capture_output=True, text=True,
                         timeout=CHILD_TIMEOUT_S, check=True)
    r = json.loads(out.stdout)
    passes, budget = r["passes"], r["budget"]
    assert r["built"] == ESTATE_OBJECTS and len(passes) >= 4
    # the estate was frozen as it grew: nearly all of it is out of the passes at the end
    assert r["final_frozen"] >= ESTATE_OBJECTS * 3 // 4
    assert r["final_unfrozen"] <= 2 * budget
    # each freeze after the start adds at least the lesser of the frozen count (growth factor 2) and the budget:
    # log2 of the budget over the start's count, then at most one freeze per budget of growth
    sizes = [r["first_frozen"], *r["frozen_after"]]
    assert all(b - a >= min(a, budget) for a, b in zip(sizes, sizes[1:], strict=False))
    assert 2 <= r["freezes"] <= math.log2(budget / r["first_frozen"]) + r["final_frozen"] / budget + 2
    # an exact count confirms each freeze (the start's included); other long passes may be counted too
    assert r["freezes"] <= r["exact_counts"] <= len(passes) + 1
    # no pass left more unfrozen survivors than the need before it (the lesser of the frozen count and the
    # budget) and what CPython lets through between two full passes (it considers one only every threshold0 x
    # threshold1 x (threshold2 + 1) net allocations: 14,000 with the full-pass threshold)
    t0, t1, t2 = r["threshold"]
    between_passes = 1.5 * t0 * t1 * (t2 + 1) + 2 * STEP_OBJECTS
    frozen_before = r["first_frozen"]
    for p in passes:
        assert p["survivors"] <= min(frozen_before, budget) + between_passes, (p, frozen_before)
        frozen_before = p["frozen"]
    # what a pass walks stays near the budget however far the estate grows (before decision 0010, about as
    # many objects as were frozen: half the estate at the end)
    assert max(p["walked"] for p in passes) <= budget + between_passes + 2 * STEP_OBJECTS
    assert budget + between_passes < ESTATE_OBJECTS // 8


if __name__ == "__main__":
    _child()
