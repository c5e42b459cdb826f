"""The writer dispatches in time-bounded steps (``REPUT_STEP_BUDGET_S``): a reput cut short by its budget is
followed by another at the loop's next turn, without waiting for another send, until nothing is left."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from broker_helpers import make_config

from ferrymq.broker import writer as writer_module
from ferrymq.broker.writer import MessageWriter


class _SteppedStore:
    """Three budgeted steps' worth of records: each reput takes one step."""

    dispatch_behind_bytes = 0

    def __init__(self) -> None:
        self.steps_left = 3
        self.calls: list[tuple[Any, ...]] = []
        self.reput_cut_short = False

    def reput(self, max_records: int, budget_s: float | None = None) -> int:
        self.calls.append((max_records, budget_s))
        self.steps_left -= 1
        self.reput_cut_short = self.steps_left > 0
        return 7


async def test_a_reput_cut_short_by_its_budget_goes_on_by_itself(tmp_path: Path) -> None:
    store = _SteppedStore()
    woken: list[Any] = []
    writer = MessageWriter(store, make_config(str(tmp_path)), None, woken.append)  # type: ignore[arg-type]
    writer.bind(asyncio.get_running_loop())
    writer.schedule_reput()
    for _ in range(10):
        await asyncio.sleep(0)
    assert store.calls == [(writer_module.REPUT_BATCH_RECORDS, writer_module.REPUT_STEP_BUDGET_S)] * 3
    assert store.steps_left == 0
