"""What the broker's timer service (broker/timer.py) holds the event loop for, with ``--messages`` pending timer
messages (100,000 by default), in a temporary directory, in process (a manual clock; no network).

| row              | what                                                                                  |
|------------------|---------------------------------------------------------------------------------------|
| put              | storing the timer messages (send path's rewrite and put, per message)                 |
| rebuild          | a restart's rebuild of the pending set from the timer queue: the whole, and its loop turns |
| roll             | every pending record older than the roll window written again: the whole, and its loop turns |
| checkpoint copy  | what a checkpoint save copies on the loop: the done-units bitmap, at its cap           |
| deliver          | every message due at once: the whole, and its loop turns                             |
| heap per pending | Python heap the pending set holds per message (``tracemalloc``)                       |

The event loop's budget is 50 ms per turn (CONTRIBUTING.md); each turn reads SCAN_UNITS_PER_STEP units or
re-stores DELIVER_PER_STEP messages or rolls ROLL_PER_STEP records.

    python benchmarks/timer_messages.py [--messages 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import tracemalloc
from typing import Any

from ferrymq.broker.app import BrokerController
from ferrymq.broker.config import BrokerConfig
from ferrymq.broker.timer import CHECKPOINT_DONE_SPAN, TimerMessageService
from ferrymq.common.message import MessageExtBrokerInner, properties_to_string
from ferrymq.common.timer import TIMER_QUEUE_ID, TIMER_TOPIC

START_MS = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now_ms = START_MS

    def __call__(self) -> int:
        return self.now_ms


#: the roll window here: the messages (due 60 s after the start) are rolled once when the clock moves 40 s
ROLL_WINDOW_SEC = 30


def _config(root: str) -> BrokerConfig:
    return BrokerConfig(listen_port=0, listen_host="127.0.0.1", broker_ip1="127.0.0.1", store_path_root_dir=root,
                        namesrv_addr=[], fast_listen_enable=False, metrics_port=-1,
                        timer_roll_window_sec=ROLL_WINDOW_SEC)


def checkpoint_copy() -> None:
    """The bounded copy a save makes on the loop, with done units every other offset over twice the cap."""
    svc = TimerMessageService(store=None, put=lambda inner: None, config_dir=tempfile.gettempdir(), clock_ms=Clock())
    for queue_offset in range(1, 2 * CHECKPOINT_DONE_SPAN, 2):
        svc._mark_done(queue_offset)
    runs = []
    for _ in range(50):
        t0 = time.perf_counter()
        _, bits = svc._done_bitmap()
        runs.append(time.perf_counter() - t0)
    runs.sort()
    print(f"checkpoint copy  {runs[len(runs) // 2] * 1e6:8.1f} us median, max {runs[-1] * 1e6:.1f} us "
          f"({len(bits)} bytes: {CHECKPOINT_DONE_SPAN} units, {CHECKPOINT_DONE_SPAN // 2} of them done)")


def _turns_text(turns: list[float]) -> str:
    ordered = sorted(turns)
    p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)]
    return f"{len(turns)} turns, turn p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms"


async def _timed_steps(ctl: BrokerController) -> tuple[float, list[float]]:
    """Run the timer service's loop turns until it is idle: (total s, each turn's s)."""
    timer = ctl.timer
    step = timer._step
    turns: list[float] = []

    def measured() -> None:
        t0 = time.perf_counter()
        step()
        turns.append(time.perf_counter() - t0)

    timer._step = measured  # type: ignore[method-assign]
    t0 = time.perf_counter()
    timer.wake()
    while True:
        await asyncio.sleep(0)
        if timer._soon is None and timer.caught_up:
            break
    return time.perf_counter() - t0, turns


async def run(messages: int) -> None:
    clock = Clock()
    with tempfile.TemporaryDirectory() as root:
        ctl = BrokerController(_config(root), clock_ms=clock)
        await ctl.start()
        t0 = time.perf_counter()
        for i in range(messages):
            props = {"UNIQ_KEY": f"ID{i}", "TIMER_OUT_MS": str(START_MS + 60_000 + i % 1000),
                     "REAL_TOPIC": "Bench", "REAL_QID": "0"}
            ctl.writer.put(MessageExtBrokerInner(TIMER_TOPIC, TIMER_QUEUE_ID, b"x" * 100,
                                                 properties_string=properties_to_string(props)))
            if i % 1000 == 999:
                await asyncio.sleep(0)
        ctl.writer.reput_now()
        put_s = time.perf_counter() - t0
        await _timed_steps(ctl)
        await ctl.stop()
        print(f"put              {put_s * 1e6 / messages:8.1f} us per message ({messages} messages)")

        ctl = BrokerController(_config(root), clock_ms=clock)
        await ctl.start()
        total, turns = await _timed_steps(ctl)
        assert ctl.timer.pending_count == messages, ctl.timer.pending_count
        print(f"rebuild          {total * 1000:8.1f} ms in {_turns_text(turns)}")
        clock.now_ms += 40_000
        total, turns = await _timed_steps(ctl)
        ctl.writer.reput_now()
        await _timed_steps(ctl)
        assert ctl.timer.rolled_total == messages and ctl.timer.pending_count == messages, (
            ctl.timer.rolled_total, ctl.timer.pending_count)
        print(f"roll             {total * 1000:8.1f} ms ({total * 1e6 / messages:.1f} us each) in {_turns_text(turns)}")
        await ctl.stop()

        ctl = BrokerController(_config(root), clock_ms=clock)
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        await ctl.start()
        await _timed_steps(ctl)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename")
                    if s.traceback and "broker/timer.py" in s.traceback[0].filename)
        print(f"heap per pending {grown / messages:8.0f} B")
        clock.now_ms += 120_000
        total, turns = await _timed_steps(ctl)
        assert ctl.timer.pending_count == 0
        ctl.writer.reput_now()
        delivered = ctl.store.get_max_offset_in_queue("Bench", 0)
        print(f"deliver          {total * 1000:8.1f} ms ({delivered} delivered, {total * 1e6 / max(1, delivered):.1f} us "
              f"each) in {_turns_text(turns)}")
        await ctl.stop()


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args(argv)
    asyncio.run(run(args.messages))
    checkpoint_copy()


if __name__ == "__main__":
    main()
