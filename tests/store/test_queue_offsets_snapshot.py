"""The flush thread's snapshot of every queue's reach (``MessageStore._queue_offsets``, taken when it compacts the
``queueoffsets`` file) while the loop thread creates and deletes queues. The thread that holds the GIL gives it up
inside any collection that runs Python code (a ``gc.callbacks`` entry, the servers' pause monitor, is one), and a
collection can start at any allocation of a tracked object: a walk of the queue table that allocates per entry
is not atomic. A broker under topic churn logged "dictionary changed size during iteration" from the flush
thread at every compaction."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from store_helpers import inner

from ferrymq.store import MessageStore, PutMessageStatus

Opener = Callable[..., MessageStore]
#: queues the "other thread" creates at most, one per collection
CREATED_AT_COLLECTIONS = 500
#: empty queues in the table besides those written: more entries than the interpreter keeps free 2-tuples (2,000),
#: so the walk allocates tracked tuples, and a collection can start inside it
IDLE_QUEUES = 5_000


def test_the_snapshot_of_queue_reaches_holds_while_queues_are_created_at_every_collection(
        open_store: Opener) -> None:
    store = open_store()
    for t in range(20):
        assert store.put_message(inner(topic=f"T{t}", queue_id=t % 4, body=b"m")).status is PutMessageStatus.PUT_OK
    store.reput()
    for n in range(IDLE_QUEUES):
        store.queues.get_or_create("Idle", n)
    created: list[int] = []

    def create_a_queue(phase: str, info: dict[str, Any]) -> None:  # the loop thread, at a switch of the GIL
        if phase == "start" and len(created) < CREATED_AT_COLLECTIONS:
            store.queues.get_or_create("Churn", len(created))
            created.append(1)

    threshold = gc.get_threshold()
    gc.callbacks.append(create_a_queue)
    gc.set_threshold(1)  # a collection at nearly every allocation of a tracked object
    try:
        marks = store._queue_offsets()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(create_a_queue)
    assert created, "no collection ran while the snapshot was taken"
    assert {key for key in marks if key[0] != "Churn"} == {(f"T{t}", t % 4) for t in range(20)}
