"""What the store's whole-table work costs at estate size (issue 24): ``--queues`` consume queues (100,000 by
default: 12,500 topics x 8 queues) holding one message each, in a temporary directory.

The broker calls the store on its event-loop thread (docs/decisions/0003), so any store call that walks every
queue at once is a stall of the whole broker. This script builds the estate through the store's own API (no
broker process) and times, one call at a time, each path that runs per timer, per request or at start:

| row                    | what the broker does                                                            | where        |
|------------------------|---------------------------------------------------------------------------------|--------------|
| fill                   | put + reput of one message per queue (creates every queue)                      | loop         |
| cq flush (all dirty)   | ``flush_consume_queues`` right after the fill: every queue written              | flush thread |
| cq flush (one dirty)   | ``flush_consume_queues`` after one more put: the steady state, every second     | flush thread |
| cq flush (idle)        | ``flush_consume_queues`` with nothing written                                   | flush thread |
| queue_count            | ``queue_count(topic)``: a slave's look-up of a topic it has no config of        | loop, request |
| delete_topic           | ``delete_topic`` of one 8-queue topic (DELETE_TOPIC_IN_BROKER)                 | loop, request |
| expire step            | ``delete_expired_files`` once a commit log segment expired (the cleanup timer)  | loop, timer  |
| expire round           | the calls (and the sum of them) until the consume queues are trimmed            | loop, timer  |
| clean restart          | ``MessageStore.load`` after ``shutdown`` (and how many queues it opened)        | start        |
| heap per queue         | Python heap the loaded store holds per queue (``tracemalloc``, a second load)   | start        |
| first use of a queue   | the first pull of a queue not opened since the start (loaded then; 100 queues) | loop, request |
| crash restart          | ``MessageStore.load`` after a crash (abort file left)                           | start        |
| unconsumed floor step  | the broker's ``UnconsumedFloor`` over one committed offset per queue: a step     | loop, cleanup |
| unconsumed floor pass  | ... and the sum of the steps of one whole pass                                  | loop, steps  |

Consume queue files are made small (``--cq-file-bytes``, 4,000 B by default) so the estate costs ~4 KiB of disk
per queue instead of a 64 KiB reserved chunk; the per-queue costs (an open, a map, a read per file) are the
same. Run it on an otherwise idle machine; figures are wall-clock milliseconds.

    python benchmarks/store_estate.py --queues 100000 [--restarts 3]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from ferrymq.common.message import MessageExtBrokerInner, properties_to_string
from ferrymq.store import MessageStore, StoreConfig

QUEUES_PER_TOPIC = 8
CL_SEGMENT_BYTES = 1 << 20
#: queues whose first pull after the restart is timed
FIRST_USE_SAMPLES = 100
#: a clock far enough ahead that every segment but the newest has expired
EXPIRED_NOW_MS = 4_000_000_000_000


def _inner(topic: str, queue_id: int, n: int) -> MessageExtBrokerInner:
    return MessageExtBrokerInner(
        topic=topic, queue_id=queue_id, body=b"x" * 64,
        properties_string=properties_to_string({"UNIQ_KEY": f"U{n:010d}", "KEYS": f"k{n}"}),
        born_timestamp=1_600_000_000_000, born_host=b"\x7f\x00\x00\x01\x00\x00\x30\x39",
        store_host=b"\x7f\x00\x00\x01\x00\x00\x51\xaf")


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return (time.perf_counter() - t0) * 1000, result


def _row(name: str, ms: float, note: str = "") -> None:
    print(f"{name:<24} {ms:>10.1f} ms  {note}", flush=True)


def _config(root: str, cq_file_bytes: int) -> StoreConfig:
    return StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=CL_SEGMENT_BYTES,
                       mapped_file_size_consume_queue=cq_file_bytes, commit_log_preallocation="sparse",
                       index_hash_slot_num=100_000, index_max_num=400_000, total_memory_bytes=1 << 30)


def _expire_round(store: MessageStore) -> tuple[float, float, int]:
    """Drive the cleanup timer until the consume queues are trimmed: (longest call ms, sum ms, calls)."""
    longest = total = 0.0
    calls = 0
    pending = getattr(store, "expire_pending", None)
    while True:
        ms, _ = _timed(lambda: store.delete_expired_files(EXPIRED_NOW_MS))
        longest, total, calls = max(longest, ms), total + ms, calls + 1
        if pending is None or not pending() or calls > 10_000:
            return longest, total, calls


def _opened(store: MessageStore) -> str:
    """Consume queues loaded (files opened) so far; every queue for a store that loads them all at start."""
    count = getattr(store.queues, "loaded_count", None)
    return str(count) if count is not None else "all"


def _floor(store: MessageStore, topics: list[str]) -> tuple[float, float, int]:
    """The broker's unconsumed floor over one committed offset (0: nothing consumed) per queue: (longest step ms,
    sum ms, steps) of one whole pass."""
    from ferrymq.broker.unconsumed_floor import UnconsumedFloor

    table = {f"{t}@G": dict.fromkeys(range(QUEUES_PER_TOPIC), 0) for t in topics}
    floor = UnconsumedFloor(lambda: table, lambda group: group == "G", store.unconsumed_phy_of)
    floor._pass = floor._walk()  # what the cleanup's first call starts; each step as the loop would run it
    longest = total = 0.0
    steps = 0
    done = False
    while not done:
        ms, done = _timed(floor.step)
        longest, total, steps = max(longest, ms), total + ms, steps + 1
    return longest, total, steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=100_000)
    ap.add_argument("--cq-file-bytes", type=int, default=4_000)
    ap.add_argument("--dir", default=None, help="parent of the temporary store directory")
    ap.add_argument("--restarts", type=int, default=1,
                    help="clean and crash restarts to time (each row, then the median of the rows)")
    args = ap.parse_args()
    topics = [f"T{i:06d}" for i in range(-(-args.queues // QUEUES_PER_TOPIC))]
    root = tempfile.mkdtemp(prefix="store-estate-", dir=args.dir)
    print(f"{args.queues} queues ({len(topics)} topics x {QUEUES_PER_TOPIC}), cq file {args.cq_file_bytes} B, "
          f"store in {root}", flush=True)
    try:
        store = MessageStore(_config(root, args.cq_file_bytes))
        store.load()

        def fill() -> None:
            n = 0
            for topic in topics:
                for queue_id in range(QUEUES_PER_TOPIC):
                    if n >= args.queues:
                        return
                    store.put_message(_inner(topic, queue_id, n))
                    n += 1
                    if n % 10_000 == 0:
                        store.reput()
            store.reput()

        ms, _ = _timed(fill)
        _row("fill", ms, f"{len(store.queues.queues)} queues, {ms * 1000 / args.queues:.1f} us per queue")
        store.flush()
        ms, _ = _timed(store.flush_consume_queues)
        _row("cq flush (all dirty)", ms)
        store.put_message(_inner(topics[0], 0, -1))
        store.reput()
        store.flush()
        ms, _ = _timed(store.flush_consume_queues)
        _row("cq flush (one dirty)", ms)
        ms, _ = _timed(store.flush_consume_queues)
        _row("cq flush (idle)", ms)
        ms, _ = _timed(lambda: store.queue_count(topics[len(topics) // 2]))
        _row("queue_count", ms)
        ms, _ = _timed(lambda: store.delete_topic(topics[-1]))
        _row("delete_topic", ms)
        del topics[-1]

        clean_ms: list[float] = []
        for _ in range(args.restarts):
            store.shutdown()
            store = MessageStore(_config(root, args.cq_file_bytes))
            ms, _ = _timed(store.load)
            clean_ms.append(ms)
            _row("clean restart", ms, f"{ms * 1000 / args.queues:.1f} us per queue, {_opened(store)} queues opened")
        if args.restarts > 1:
            _row("clean restart (median)", statistics.median(clean_ms), f"of {args.restarts}")
        store.shutdown()
        store = MessageStore(_config(root, args.cq_file_bytes))
        gc.collect()
        tracemalloc.start()
        heap_before = tracemalloc.get_traced_memory()[0]
        store.load()
        gc.collect()
        heap = tracemalloc.get_traced_memory()[0] - heap_before
        tracemalloc.stop()
        print(f"{'heap per queue':<24} {heap / args.queues:>10.0f} B   {heap / 1e6:.1f} MB for the store", flush=True)
        first_use: list[float] = []
        for topic in topics[::max(1, len(topics) // FIRST_USE_SAMPLES)][:FIRST_USE_SAMPLES]:
            t0 = time.perf_counter()
            store.get_message("G", topic, 1, 0, 32, None)
            first_use.append((time.perf_counter() - t0) * 1000)
        first_use.sort()
        _row("first use of a queue", statistics.median(first_use),
             f"median of {len(first_use)} queues' first pulls; longest {first_use[-1]:.1f} ms")
        crash_ms: list[float] = []
        for _ in range(args.restarts):
            store.flush()
            store.flush_consume_queues()
            store.close_abruptly()
            store = MessageStore(_config(root, args.cq_file_bytes))
            ms, _ = _timed(store.load)
            crash_ms.append(ms)
            _row("crash restart", ms, f"abnormal={store.last_start_was_abnormal}, {_opened(store)} queues opened")
        if args.restarts > 1:
            _row("crash restart (median)", statistics.median(crash_ms), f"of {args.restarts}")

        longest, total, steps = _floor(store, topics)
        _row("unconsumed floor step", longest, "longest step")
        _row("unconsumed floor pass", total, f"{steps} step(s)")

        segments = len(store.commit_log.mfq.files)
        longest, total, calls = _expire_round(store)
        _row("expire step", longest, f"longest call; {segments} segments before, "
                                     f"{len(store.commit_log.mfq.files)} after")
        _row("expire round", total, f"{calls} call(s)")
        store.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
