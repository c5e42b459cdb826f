"""QueueFileGate (broker/queue_files.py): a send to a new queue waits while its first consume queue file is made on
a thread, the event loop serves everything else meanwhile, the sends to that queue run in arrival order once it is
made, and a file the thread cannot make leaves the decision to the send's own preparation on the loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from broker_helpers import Client, pull, records, send_v1

from ferrymq.broker.app import BrokerController
from ferrymq.broker.queue_files import QueueFileGate, stored_in_named_queue
from ferrymq.remoting.codes import ResponseCode as R


class SlowFiles:
    """The store's two calls, the making held until ``release`` is set."""

    def __init__(self, result: bool = True, fail: bool = False) -> None:
        self.release = threading.Event()
        self.made: list[str] = []
        self.result = result
        self.fail = fail

    def consume_queue_file_to_make(self, topic: str, queue_id: int) -> str | None:
        return f"/cq/{topic}/{queue_id}/00000000000000000000"

    def make_consume_queue_file(self, path: str) -> bool:
        self.release.wait(20)
        if self.fail:
            raise OSError(5, "Input/output error")
        self.made.append(path)
        return self.result


async def test_sends_to_a_queue_in_the_making_wait_in_order_and_others_do_not() -> None:
    loop = asyncio.get_running_loop()
    store = SlowFiles()
    existing: dict[tuple[str, int], Any] = {("Old", 0): object()}
    gate = QueueFileGate(store, existing)
    gate.start(loop)
    ran: list[str] = []
    try:
        assert not gate.may_defer("Old", 0)
        assert gate.defer("Old", 0, lambda: ran.append("old")) is None  # an existing queue: send now
        a = gate.defer("New", 1, lambda: ran.append("a") or "answer a")
        b = gate.defer("New", 1, lambda: ran.append("b") or "answer b")
        c = gate.defer("Other", 0, lambda: ran.append("c") or "answer c")
        assert a is not None and b is not None and c is not None
        assert gate.in_the_making == 2
        for _ in range(5):  # the loop runs on while the thread is held
            await asyncio.sleep(0.01)
        assert ran == [] and not a.done()
        store.release.set()
        assert await asyncio.wait_for(asyncio.gather(a, b, c), 10) == ["answer a", "answer b", "answer c"]
        assert ran.index("a") < ran.index("b")
        assert gate.made_total == 2 and gate.in_the_making == 0
        existing[("New", 1)] = object()  # the sends created the queue
        assert gate.defer("New", 1, lambda: None) is None
    finally:
        store.release.set()
        gate.stop()


async def test_a_file_the_thread_cannot_make_still_runs_the_sends() -> None:
    """The send's own preparation on the loop decides then (it refuses with its status if it cannot make the file
    either): no send is lost or answered without running."""
    for store in (SlowFiles(result=False), SlowFiles(fail=True)):
        gate = QueueFileGate(store, {})
        gate.start(asyncio.get_running_loop())
        try:
            store.release.set()
            fut = gate.defer("T", 0, lambda: "ran")
            assert fut is not None
            assert await asyncio.wait_for(fut, 10) == "ran"
            assert gate.made_total == 0
        finally:
            gate.stop()


async def test_a_send_whose_connection_went_is_not_run() -> None:
    store = SlowFiles()
    gate = QueueFileGate(store, {})
    gate.start(asyncio.get_running_loop())
    ran: list[str] = []
    try:
        gone = gate.defer("T", 0, lambda: ran.append("gone"))
        kept = gate.defer("T", 0, lambda: ran.append("kept") or "ok")
        assert gone is not None and kept is not None
        gone.cancel()
        store.release.set()
        assert await asyncio.wait_for(kept, 10) == "ok"
        assert ran == ["kept"]
    finally:
        gate.stop()


def test_messages_stored_elsewhere_are_not_gated() -> None:
    assert stored_in_named_queue("TAGS\x01a\x02KEYS\x01k\x02")
    for props in ("DELAY\x013\x02", "TRAN_MSG\x01true\x02", "TIMER_DELAY_SEC\x015\x02", "__STARTDELIVERTIME\x011\x02"):
        assert not stored_in_named_queue(props)


async def test_a_broker_makes_new_queue_files_on_its_thread_and_keeps_each_queue_in_order(
        broker: BrokerController, client: Client) -> None:
    """Pipelined sends over one connection to many new queues, three to each: every send is answered SUCCESS, the
    queue offsets of each queue follow the order of its sends, and the files were made by the gate's thread."""
    topics = [f"Gate{i}" for i in range(40)]
    calls = [client.call(10, send_v1(topic, queue_id), f"{topic}/{queue_id}/{n}".encode())
             for topic in topics for queue_id in (0, 1) for n in range(3)]
    answers = await asyncio.gather(*calls)
    assert all(a.code == R.SUCCESS for a in answers), {a.remark for a in answers if a.code != R.SUCCESS}
    assert broker.queue_files.made_total >= len(topics) * 2 - 1
    for topic in topics:
        for queue_id in (0, 1):
            got = await client.call(11, pull(topic, queue_id=queue_id, sys_flag=4))
            assert got.code == R.SUCCESS, got.remark
            bodies = [m.body for m in records(got.body)]
            assert bodies == [f"{topic}/{queue_id}/{n}".encode() for n in range(3)]
