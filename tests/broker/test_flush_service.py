"""FlushService's ASYNC_FLUSH period follows flushIntervalCommitLog changed at runtime (it was read once, so a
broker started with a long period kept it until restarted)."""

from __future__ import annotations

import asyncio
import mmap
import os
import pathlib
import threading

import pytest

from ferrymq.broker import flush as flush_mod
from ferrymq.broker.config import BrokerConfig, FlushDiskType
from ferrymq.broker.flush import INLINE_FLUSH_MAX_MS, FlushService
from ferrymq.broker.writer import MessageWriter
from ferrymq.common.message import MessageExtBrokerInner
from ferrymq.store import MessageStore
from ferrymq.store.config import FlushDiskType as StoreFlushDiskType
from ferrymq.store.config import StoreConfig
from support.aio import wait_for
from support.fiemap import fallocate_works, unwritten_ranges


class CountingStore:
    def __init__(self) -> None:
        self.flushes = 0
        self.flushed_phy_offset = 0
        self._lock = threading.Lock()

    def flush(self) -> None:
        with self._lock:
            self.flushes += 1

    def flush_consume_queues(self) -> None:
        pass


async def test_a_shorter_period_set_at_runtime_applies_without_a_restart() -> None:
    store = CountingStore()
    service = FlushService(store, sync_flush=False, interval_ms=600_000)
    service.start(asyncio.get_running_loop())
    try:
        service.interval_ms = 10
        before = store.flushes
        await wait_for(lambda: store.flushes >= before + 5, timeout_s=10, what="five flushes at the new period")
    finally:
        await asyncio.get_running_loop().run_in_executor(None, service.stop)


# ---- SYNC_FLUSH group commit ------------------------------------------------------------------------------
class WritingStore:
    """A commit log stand-in: ``put`` advances the wrote position (loop thread), ``flush`` makes everything
    written so far durable after ``delay_s`` (the flush thread), failing while ``failing`` is set."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.wrote_phy_offset = 0
        self.flushed_phy_offset = 0
        self.delay_s = delay_s
        self.failing = False
        self.flushes = 0
        #: flush no further than this (a flush that started before the latest puts); None = all written
        self.cap: int | None = None
        self._lock = threading.Lock()

    def put(self, size: int) -> int:
        self.wrote_phy_offset += size
        return self.wrote_phy_offset

    def flush(self) -> int:
        with self._lock:
            target = self.wrote_phy_offset if self.cap is None else min(self.cap, self.wrote_phy_offset)
            if self.failing:
                raise OSError(28, "No space left on device")
            if self.delay_s:
                threading.Event().wait(self.delay_s)
            self.flushes += 1
            self.flushed_phy_offset = max(self.flushed_phy_offset, target)
            return self.flushed_phy_offset

    def flush_consume_queues(self) -> None:
        pass


@pytest.mark.parametrize("inline", [False, True])
async def test_sync_flush_waiters_under_concurrency_are_all_answered_none_lost(inline: bool) -> None:
    """Sends arrive while flushes are in flight: every waiter is answered True exactly once, only after the
    flush covered its bytes, and the flushes are shared (group commit: far fewer rounds than waiters)."""
    loop = asyncio.get_running_loop()
    store = WritingStore(delay_s=0.002)
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.inline_flush = inline  # the loop's own flush (lone sends) and the thread's group commit
    service.start(loop)
    answers: dict[int, list[tuple[bool, int]]] = {}
    try:
        async def sender(n: int, base: int) -> None:
            for i in range(n):
                end = store.put(100)
                key = base + i
                service.on_flushed(end, 10_000, lambda ok, key=key: answers.setdefault(key, []).append(
                    (ok, store.flushed_phy_offset)))
                if i % 7 == 0:
                    await asyncio.sleep(0)

        await asyncio.gather(*(sender(200, k * 1000) for k in range(16)))
        await wait_for(lambda: len(answers) == 16 * 200, timeout_s=20, what="every waiter answered")
        await asyncio.sleep(0.05)
        assert all(len(a) == 1 and a[0][0] for a in answers.values())
        assert store.flushes < 16 * 200 / 4, store.flushes
        if not inline:
            assert service.inline_flushes == 0
        assert not service._waiters and not service._deadlines and service._sweep_handle is None
    finally:
        await loop.run_in_executor(None, service.stop)


async def test_a_lone_sync_flush_wait_on_a_quick_disk_is_flushed_by_the_loop_without_the_thread() -> None:
    """One send at a time on a quick disk: the loop's commit step flushes and answers, no hand-off to the flush
    thread and back, and no timer left armed between sends."""
    loop = asyncio.get_running_loop()
    store = WritingStore()
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.start(loop)
    try:
        for _ in range(20):
            got: list[bool] = []
            service.on_flushed(store.put(1024), 5000, got.append)
            assert got == []  # answered by the commit step, once this iteration's reads are done
            await asyncio.sleep(0)
            assert got == [True]
            assert service._sweep_handle is None and not service._deadlines
        assert service.wakeups == 0 and service.inline_flushes == 20
        # already flushed: answered at once
        got2: list[bool] = []
        service.on_flushed(store.flushed_phy_offset, 5000, got2.append)
        assert got2 == [True]
    finally:
        await loop.run_in_executor(None, service.stop)


async def test_a_slow_flush_hands_later_flushes_to_the_thread_one_wakeup_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush slower than INLINE_FLUSH_MAX_MS turns the loop's own flushing off: the thread flushes, one
    hand-back per round, and no timer is left armed between sends."""
    # no wait for a CPU is left out of the flush's time (on a busy machine the thread may wait a few ms)
    monkeypatch.setattr(flush_mod, "read_run_delay_ns", lambda fd: 0)
    loop = asyncio.get_running_loop()
    store = WritingStore(delay_s=(INLINE_FLUSH_MAX_MS + 5) / 1000)
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.start(loop)
    try:
        first: list[bool] = []
        service.on_flushed(store.put(1024), 5000, first.append)
        await wait_for(lambda: first == [True], timeout_s=10, what="the first (inline, slow) flush")
        assert service.inline_flushes == 1
        for _ in range(5):
            got: list[bool] = []
            wakeups = service.wakeups
            service.on_flushed(store.put(1024), 5000, got.append)
            await wait_for(lambda got=got: got == [True], timeout_s=10, what="the flush answer")
            assert service.wakeups == wakeups + 1
            assert service._sweep_handle is None and not service._deadlines
        assert service.inline_flushes == 1
    finally:
        await loop.run_in_executor(None, service.stop)


async def test_sync_flush_waiters_on_a_failing_disk_time_out_then_later_ones_succeed_and_stop_answers_the_rest() -> None:
    loop = asyncio.get_running_loop()
    store = WritingStore()
    store.failing = True
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.start(loop)
    stopped = False
    try:
        timed_out: list[bool] = []
        for _ in range(50):
            service.on_flushed(store.put(100), 100, timed_out.append)
        await wait_for(lambda: len(timed_out) == 50, timeout_s=10, what="the waiters to time out")
        assert timed_out == [False] * 50
        store.failing = False
        ok: list[bool] = []
        service.on_flushed(store.put(100), 5000, ok.append)
        await wait_for(lambda: ok == [True], timeout_s=10, what="the flush to succeed again")
        # a waiter still waiting at stop is answered False (never left hanging)
        store.failing = True
        left: list[bool] = []
        service.on_flushed(store.put(100), 60_000, left.append)
        await loop.run_in_executor(None, service.stop)
        stopped = True
        await wait_for(lambda: left == [False], timeout_s=10, what="the waiter answered at stop")
        late: list[bool] = []
        service.on_flushed(store.put(100), 60_000, late.append)
        assert late == [False]
    finally:
        if not stopped:
            await loop.run_in_executor(None, service.stop)


async def test_a_failing_waiter_callback_does_not_keep_the_others_waiting() -> None:
    loop = asyncio.get_running_loop()
    store = WritingStore()
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.start(loop)
    try:
        got: list[bool] = []

        def boom(ok: bool) -> None:
            raise RuntimeError("answer failed")

        service.on_flushed(store.put(10), 5000, boom)
        service.on_flushed(store.put(10), 5000, got.append)
        fut = service.request_flush(store.put(10), 5000)
        assert await asyncio.wait_for(fut, 10) is True
        assert got == [True]
    finally:
        await loop.run_in_executor(None, service.stop)


async def test_a_wait_registered_after_a_later_puts_wait_is_answered_by_the_flush_that_covers_it() -> None:
    """A wait that starts a loop turn after its put (SYNC_FLUSH + SYNC_MASTER runs it in a task) can register
    behind the wait of a later put: a flush covering the earlier put answers it, without waiting for the later."""
    loop = asyncio.get_running_loop()
    store = WritingStore()
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.start(loop)
    try:
        early_end = store.put(100)
        late_end = store.put(100)
        store.cap = early_end  # this flush reaches the earlier put only
        late: list[bool] = []
        early: list[bool] = []
        service.on_flushed(late_end, 5000, late.append)
        service.on_flushed(early_end, 5000, early.append)
        await wait_for(lambda: early == [True], timeout_s=10, what="the earlier put's waiter answered")
        assert late == []
        store.cap = None
        service.on_flushed(store.put(10), 5000, lambda ok: None)  # a later send's flush covers the rest
        await wait_for(lambda: late == [True], timeout_s=10, what="the later put's waiter answered")
    finally:
        await loop.run_in_executor(None, service.stop)


async def test_a_lone_sync_flush_wait_flushed_by_the_loop_arms_no_deadline_timer() -> None:
    """A send the loop flushes itself in the commit step costs no deadline heap entry and no timer (it armed
    and cancelled one per send): the deadline enters the heap only for a waiter the step leaves waiting."""
    loop = asyncio.get_running_loop()
    store = WritingStore()
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.start(loop)
    try:
        for _ in range(5):
            got: list[bool] = []
            service.on_flushed(store.put(1024), 5000, got.append)
            assert service._sweep_handle is None and not service._deadlines  # registered: nothing armed
            await asyncio.sleep(0)
            assert got == [True] and service._sweep_handle is None and not service._deadlines
        # a waiter the step hands to the thread gets its deadline: answered False when no flush comes in time
        service.inline_flush = False
        store.failing = True
        late: list[bool] = []
        service.on_flushed(store.put(10), 50, late.append)
        assert service._sweep_handle is None
        await asyncio.sleep(0)
        assert service._sweep_handle is not None and len(service._deadlines) == 1
        await wait_for(lambda: late == [False], timeout_s=10, what="the waiter timed out")
    finally:
        store.failing = False
        await loop.run_in_executor(None, service.stop)


async def test_commit_now_flushes_and_answers_at_once_and_the_scheduled_step_does_nothing_more() -> None:
    loop = asyncio.get_running_loop()
    store = WritingStore()
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.start(loop)
    try:
        service.commit_now()  # nothing scheduled: nothing happens
        assert store.flushes == 0
        got: list[bool] = []
        service.on_flushed(store.put(1024), 5000, got.append)
        service.commit_now()
        assert got == [True] and store.flushes == 1 and service.inline_flushes == 1
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert got == [True] and store.flushes == 1 and service.inline_flushes == 1
    finally:
        await loop.run_in_executor(None, service.stop)


class DispatchingStore(WritingStore):
    """WritingStore with the dispatch a writer runs after puts (``reput``), recording the order of events."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events
        self.reput_phy_offset = 0
        self.dispatch_behind_bytes = 0

    def flush(self) -> int:
        self.events.append("flush")
        return super().flush()

    def reput(self, max_records: int, budget_s: float | None = None) -> int:
        self.events.append("reput")
        self.reput_phy_offset = self.wrote_phy_offset
        return 0


async def test_a_lone_sync_flush_send_is_flushed_and_answered_before_its_put_is_dispatched() -> None:
    """The send path schedules the dispatch (reput) at the put, before the send registers its flush wait; the
    reput runs the iteration's commit step first, so the send's fdatasync and answer do not wait behind the
    consume queue and index updates (they came after them)."""

    loop = asyncio.get_running_loop()
    events: list[str] = []
    store = DispatchingStore(events)
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.start(loop)
    writer = MessageWriter(store, BrokerConfig(flush_disk_type=FlushDiskType.SYNC_FLUSH), service,
                           lambda keys: events.append("dispatched"))
    writer.bind(loop)
    try:
        for _ in range(3):
            events.clear()
            end = store.put(1024)
            writer.schedule_reput()  # what a put does
            writer._pending_keys.add(("T", 0))
            service.on_flushed(end, 5000, lambda ok: events.append(f"answer {ok}"))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert events == ["flush", "answer True", "reput", "dispatched"]
    finally:
        await loop.run_in_executor(None, service.stop)


def test_disk_ms_leaves_out_the_wait_for_a_cpu_of_a_long_flush_only(tmp_path: pathlib.Path) -> None:
    stat = tmp_path / "schedstat"
    stat.write_text("1000 2000000 5\n")  # on cpu, waited on a run queue (ns), time slices
    fd = os.open(stat, os.O_RDONLY)
    try:
        before = flush_mod.read_run_delay_ns(fd)
        assert before == 2_000_000
        stat.write_text("1000 62000000 5\n")  # 60 ms more waiting for a CPU
        assert flush_mod.disk_ms(INLINE_FLUSH_MAX_MS + 20, fd, before) == pytest.approx(10.0)
        assert flush_mod.disk_ms(INLINE_FLUSH_MAX_MS - 1, fd, before) == INLINE_FLUSH_MAX_MS - 1  # not looked at
        assert flush_mod.disk_ms(INLINE_FLUSH_MAX_MS + 20, fd, -1) == INLINE_FLUSH_MAX_MS + 20  # unknown: all of it
        stat.write_text("garbage\n")
        assert flush_mod.read_run_delay_ns(fd) == -1
        assert flush_mod.disk_ms(INLINE_FLUSH_MAX_MS + 20, fd, before) == INLINE_FLUSH_MAX_MS + 20
    finally:
        os.close(fd)
    assert flush_mod.read_run_delay_ns(-1) == -1


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="no scheduler statistics here")
def test_the_threads_own_run_queue_wait_is_readable() -> None:
    fd = flush_mod.open_run_delay()
    assert fd >= 0
    try:
        first = flush_mod.read_run_delay_ns(fd)
        assert first >= 0 and flush_mod.read_run_delay_ns(fd) >= first
    finally:
        os.close(fd)


async def test_a_flush_slow_only_for_waiting_on_a_cpu_keeps_the_loop_flushing(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a busy machine a flush can take longer than INLINE_FLUSH_MAX_MS because its thread waited for a CPU
    after the disk was done; that says nothing about the disk (and the loop would have waited as long without
    the flush): the loop keeps flushing lone sends itself instead of handing them to the thread for
    INLINE_FLUSH_BACKOFF_S (every one then paying two wake-ups on that busy machine)."""
    run_delay_ns = [0]
    monkeypatch.setattr(flush_mod, "read_run_delay_ns", lambda fd: run_delay_ns[0])
    loop = asyncio.get_running_loop()

    class StarvedStore(WritingStore):
        def flush(self) -> int:
            run_delay_ns[0] += int((INLINE_FLUSH_MAX_MS + 10) * 1e6)  # waited this long for a CPU ...
            threading.Event().wait((INLINE_FLUSH_MAX_MS + 15) / 1000)  # ... of a flush this long
            return super().flush()

    store = StarvedStore()
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.start(loop)
    try:
        for _ in range(3):
            got: list[bool] = []
            service.on_flushed(store.put(1024), 5000, got.append)
            await wait_for(lambda got=got: got == [True], timeout_s=10, what="the flush answer")
        assert service.inline_flushes == 3 and service.wakeups == 0
    finally:
        await loop.run_in_executor(None, service.stop)


async def test_the_loops_own_flushes_keep_the_commit_logs_blocks_written_ahead_and_recovery_reads_through(
        tmp_path: pathlib.Path) -> None:
    """A SYNC_FLUSH commit log's segment is reserved with fallocate: its blocks are unwritten extents, and the
    fdatasync after an append into a new page also committed the journal to mark the block written (about
    every 4th 1 KiB send). The loop's commit step now writes the pages ahead of the writes (ZERO_AHEAD_BYTES)
    before its flush, so the blocks the next sends go to are already written. The zeros ahead read as the
    end of the log: a restart recovers every message and nothing more."""
    page = mmap.PAGESIZE
    config = StoreConfig(store_path_root_dir=str(tmp_path), mapped_file_size_commit_log=4 << 20,
                         flush_disk_type=StoreFlushDiskType.SYNC_FLUSH)
    store = MessageStore(config)
    store.load()
    loop = asyncio.get_running_loop()
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.start(loop)
    try:
        for i in range(40):
            result = store.put_message(MessageExtBrokerInner(topic="T", queue_id=0, body=b"%04d" % i * 256))
            ar = result.append_result
            assert ar is not None
            got: list[bool] = []
            service.on_flushed(ar.wrote_offset + ar.wrote_bytes, 5000, got.append)
            await asyncio.sleep(0)
            assert got == [True]
        assert service.inline_flushes == 40
        wrote = store.max_phy_offset
        segment = store.commit_log.mfq.last()
        assert segment is not None
        boundary = -(-wrote // page) * page
        ahead = unwritten_ranges(segment._fd, boundary, 4 * page)  # the next sends' pages
        if ahead is None or not fallocate_works(tmp_path):
            pytest.skip("this file system does not report unwritten extents")
        assert ahead == [], ahead  # the next sends' blocks are written already
    finally:
        await loop.run_in_executor(None, service.stop)
        store.shutdown()
    again = MessageStore(config)
    again.load()
    service = FlushService(again, sync_flush=True, interval_ms=500)
    service.start(loop)
    try:
        assert again.max_phy_offset == wrote
        assert again.get_max_offset_in_queue("T", 0) == 40
        res = again.get_message("g", "T", 0, 39, 1, None)
        assert res.message_count == 1 and b"0039" * 256 in res.buffers[0]
        # after the restart the open segment (every block allocated) is written ahead as well: past what was
        # written ahead before it
        for i in range(40, 40 + 2 * flush_mod.ZERO_AHEAD_BYTES // 1024):
            ar = again.put_message(MessageExtBrokerInner(topic="T", queue_id=0, body=b"%04d" % i * 256)).append_result
            assert ar is not None
            got: list[bool] = []
            service.on_flushed(ar.wrote_offset + ar.wrote_bytes, 5000, got.append)
            await asyncio.sleep(0)
            assert got == [True]
        segment = again.commit_log.mfq.last()
        assert segment is not None
        boundary = -(-again.max_phy_offset // page) * page
        assert unwritten_ranges(segment._fd, boundary, 4 * page) == []
        wrote = again.max_phy_offset
    finally:
        await loop.run_in_executor(None, service.stop)
        again.shutdown()
    third = MessageStore(config)
    third.load()
    try:
        assert third.max_phy_offset == wrote
        assert third.get_max_offset_in_queue("T", 0) == 40 + 2 * flush_mod.ZERO_AHEAD_BYTES // 1024
    finally:
        third.shutdown()




async def test_a_long_consume_queue_flush_round_does_not_hold_back_sync_flush_sends() -> None:
    """The consume queues are flushed on their own thread: while a round over many queues is in progress (here:
    blocked), a SYNC_FLUSH send is still flushed and answered (the commit log's flush thread used to run that
    round itself, and every send waited for it)."""
    loop = asyncio.get_running_loop()

    class SlowQueuesStore(WritingStore):
        def __init__(self) -> None:
            super().__init__()
            self.in_round = threading.Event()
            self.release = threading.Event()

        def flush_consume_queues(self) -> None:
            self.in_round.set()
            self.release.wait(30)

    store = SlowQueuesStore()
    service = FlushService(store, sync_flush=True, interval_ms=500)
    service.inline_flush = False  # the thread's path, the one the round shared
    service.start(loop)
    answers: list[bool] = []
    try:
        await loop.run_in_executor(None, store.in_round.wait, 10)
        assert store.in_round.is_set()
        for _ in range(3):
            end = store.put(100)
            service.on_flushed(end, 20_000, answers.append)
        await wait_for(lambda: len(answers) == 3, timeout_s=5, what="the sends answered during the round")
        assert answers == [True, True, True]
    finally:
        store.release.set()
        await loop.run_in_executor(None, service.stop)
