"""The freeze policy on the real collector: a process builds an estate of tracked objects step by step, as a
broker does while clients create topics and queues, and the passes it sees stay within the frozen count.

It runs in a child interpreter (this file as a script): the freezes are real ``gc.freeze()`` calls, which would
otherwise take the test runner's own objects out of its collector. The monitor's clock is virtual: a pass lasts
1 µs per object it walks (counted when the pass starts), so what the policy estimates and decides depends on
counts only, never on how busy the machine is.
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
    from ferrymq.common.gc_policy import GcMonitor

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
        passes.append({"walked": now["walked"], "survivors": len(gc.get_objects(2)),
                       "frozen": gc.get_freeze_count()})

    ballast = [str(i) * 3 for i in range(BALLAST_STRINGS)]
    monitor = GcMonitor(clock=lambda: now["s"])
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
                      "built": sum(len(step) for step in estate), "ballast": len(ballast)}))


def test_passes_stay_within_the_frozen_count_while_an_estate_is_built() -> None:
    out = subprocess.run([sys.executable, str(Path(__file__))], capture_output=True, text=True,
                         timeout=CHILD_TIMEOUT_S, check=True)
    r = json.loads(out.stdout)
    passes = r["passes"]
    assert r["built"] == ESTATE_OBJECTS and len(passes) >= 4
    # the estate was frozen as it grew: most of it is out of the passes at the end
    assert r["final_frozen"] >= ESTATE_OBJECTS // 2
    assert r["final_unfrozen"] <= r["final_frozen"]
    # log2 bound on freezes (the start's freeze + one per doubling), each at least doubling the frozen count
    assert 2 <= r["freezes"] <= math.log2(r["final_frozen"] / r["first_frozen"]) + 2
    sizes = [r["first_frozen"], *r["frozen_after"]]
    assert all(b >= 2 * a for a, b in zip(sizes, sizes[1:], strict=False))
    # an exact count confirms each freeze (the start's included); others only when a pass doubled since a count
    assert r["freezes"] <= r["exact_counts"] <= 2 * r["freezes"]
    # no pass left more unfrozen survivors than the frozen count before it and a quarter (CPython starts a full
    # pass when the survivors of younger passes exceed a quarter of the last one's), or than CPython lets
    # through between two full passes anyway (it considers one only every threshold0 x threshold1 x threshold2
    # allocations: 70,000 by default)
    t0, t1, t2 = gc.get_threshold()
    between_passes = 1.5 * t0 * t1 * t2 + 2 * STEP_OBJECTS
    frozen_before = r["first_frozen"]
    for p in passes:
        assert p["survivors"] <= max(1.25 * frozen_before, frozen_before + between_passes), (p, frozen_before)
        frozen_before = p["frozen"]
    # without the freezes, the last passes would have walked the whole estate
    assert max(p["walked"] for p in passes) < 0.75 * (ESTATE_OBJECTS + r["first_frozen"])


if __name__ == "__main__":
    _child()
