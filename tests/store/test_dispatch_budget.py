"""A reput with a time budget (the broker's event loop dispatches in steps) stops once the budget is spent, says
so (``cut_short``), and the next step goes on where it stopped: at the end every record is dispatched once, in
order, on the native path and the pure-Python one alike."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from store_helpers import inner

from ferrymq.store import MessageStore, PutMessageStatus
from ferrymq.store import dispatch as dispatch_mod

RECORDS = 6_000
QUEUES = 300


def test_a_budgeted_reput_stops_at_its_budget_and_the_next_goes_on(open_store: Callable[..., MessageStore],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store()
    for i in range(RECORDS):  # an estate's first messages: one queue after another
        assert store.put_message(inner(topic="TopicA", queue_id=i % QUEUES, body=b"<m%d>" % i)).status \
            is PutMessageStatus.PUT_OK
    ticks = itertools.count()
    monkeypatch.setattr(dispatch_mod.time, "perf_counter", lambda: next(ticks) * 0.001)  # 1 ms per look
    steps = []
    while True:
        steps.append(store.reput(10_000, 0.0005))
        if not store.reput_cut_short:
            break
        assert len(steps) < RECORDS
    assert len(steps) > 1 and steps[0] < RECORDS and sum(steps) == RECORDS
    assert store.reput_phy_offset == store.max_phy_offset
    for q in range(QUEUES):
        assert store.get_max_offset_in_queue("TopicA", q) == RECORDS // QUEUES
    result = store.get_message("g", "TopicA", 7, 0, 32, None)
    assert [b"<m%d>" % (7 + QUEUES * k) in bytes(b) for k, b in enumerate(result.buffers)] == [True] * 20
    # without a budget nothing is cut
    assert store.reput(10_000) == 0 and not store.reput_cut_short
