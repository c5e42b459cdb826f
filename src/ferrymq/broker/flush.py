"""Commit log flushing on a dedicated thread (protocol §6.5 "Flush").

* ASYNC_FLUSH: every ``flushIntervalCommitLog`` ms the thread calls ``store.flush()``; sends never
  wait and never fsync per message.
* SYNC_FLUSH (group commit): a send registers ``(end_phy_offset, callback)`` on the event loop thread; once
  per loop iteration (one ``call_soon``, after the iteration's reads, so every send of the iteration is in)
  the commit step decides who flushes:

  - a lone waiter, no flush in flight and a disk whose flushes have kept within the loop's stall budget
    (none slower than ``INLINE_FLUSH_MAX_MS`` for ``INLINE_FLUSH_BACKOFF_S``, none failed): the loop flushes
    itself and answers at once. The send costs one read, one ``fdatasync`` and one write, with no thread
    hand-off and no wake-up to wait for (the scheduler is not asked twice on a busy machine). The loop is
    held for that one ``fdatasync`` (docs/decisions/0007); a slow or failing flush turns this off. A flush's
    time is judged without the time its thread then waited for a CPU (``/proc/thread-self/schedstat``, read
    before each flush and after a long one): on a busy machine a flush that waited tens of ms for the
    scheduler says nothing about the disk, and the loop would have waited as long without it. Before its flush
    the loop writes the commit log's pages ahead of the writes (``ZERO_AHEAD_BYTES``, topped up when half is
    used; ``MappedFile.zero_ahead``): the segment's blocks are reserved unwritten, and the ``fdatasync`` after
    an append into a new page also committed the journal to mark its block written;
  - otherwise the flush thread, blocked on a binary semaphore (no polling period on the path), is
    signalled; it flushes once for everything written so far and hands the flushed offset back with one
    ``loop.call_soon_threadsafe``. Sends arriving while its flush is in flight are taken by its next flush
    (all of them together), so concurrent producers share flushes.

  On the loop every waiter at or below the flushed offset is answered in that one callback: no timer, no
  future, no task per send.

  The writer runs a pending commit step before the iteration's dispatch (``commit_now``, from the reput), so
  a lone send's ``fdatasync`` and answer do not wait behind the consume queue and index updates of its put.

Waiters live on the loop thread only (the thread never touches them). Their deadlines
(``syncFlushTimeout``) share one timer, armed for the earliest; an expired waiter is answered False
(FLUSH_DISK_TIMEOUT). A waiter's deadline enters the deadline heap (and may arm the timer) only when the commit
step leaves it waiting: a send the loop flushes itself costs no heap entry and no timer. A failing flush (full
disk, I/O error) is retried every ``SYNC_FLUSH_RETRY_MS`` while waiters wait; they are answered True once a
flush covers them, or False at their deadline or at ``stop()``.

Consume queues, the index and the checkpoint are flushed on a second thread every
``FLUSH_CONSUME_QUEUE_INTERVAL_MS`` (RocketMQ's FlushConsumeQueueService): a round over the thousands of queues an
estate writes at once takes as long as it takes without holding back the commit log flushes sends wait for.

The store's ``flush()`` and ``flush_consume_queues()`` are safe to call concurrently with puts on the event loop
thread and with each other.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ferrymq.store.errors import StoreError

log = logging.getLogger(__name__)

#: SYNC_FLUSH: a failing flush is tried again this often while waiters wait
SYNC_FLUSH_RETRY_MS = 10
#: SYNC_FLUSH: the loop flushes a lone waiter's bytes itself while no flush took longer than this (the event
#: loop's stall budget) ...
INLINE_FLUSH_MAX_MS = 50.0
#: ... within this many seconds (a slower or failing flush hands every flush to the thread for that long)
INLINE_FLUSH_BACKOFF_S = 10.0
#: where a thread reads the nanoseconds it has waited on a run queue (the second field; Linux). Without it a
#: flush's whole time counts against INLINE_FLUSH_MAX_MS
SCHEDSTAT_PATH = "/proc/thread-self/schedstat"
#: SYNC_FLUSH: the loop keeps this many bytes of the commit log's reserved blocks written (with zeros) ahead of
#: the writes, topped up when half is used (MappedFile.zero_ahead: the flushes of appends into them then
#: commit no journal)
ZERO_AHEAD_BYTES = 128 * 1024
#: SYNC_FLUSH: at most this many waiters of one loop iteration are flushed by the loop itself
INLINE_FLUSH_MAX_WAITERS = 1
#: consume queues are flushed this often (flushIntervalConsumeQueue)
FLUSH_CONSUME_QUEUE_INTERVAL_MS = 1000
#: waiters queued at once before new waits resolve as timed out
MAX_SYNC_FLUSH_WAITERS = 100_000
#: a deadline timer may fire up to the loop clock's resolution early: deadlines this close count as reached
DEADLINE_EARLY_S = 0.001

FlushCallback = Callable[[bool], None]


def open_run_delay() -> int:
    """A descriptor of the calling thread's scheduler statistics (``SCHEDSTAT_PATH``), or -1 when there are
    none to read."""
    try:
        fd = os.open(SCHEDSTAT_PATH, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    if read_run_delay_ns(fd) < 0:
        os.close(fd)
        return -1
    return fd


def read_run_delay_ns(fd: int) -> int:
    """Nanoseconds the thread of ``fd`` (``open_run_delay``) has waited for a CPU so far; -1 if unknown."""
    if fd < 0:
        return -1
    try:
        return int(os.pread(fd, 96, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def disk_ms(took_ms: float, fd: int, run_delay_before_ns: int) -> float:
    """A flush's time without the time its thread waited for a CPU meanwhile, when that is known and the
    flush took longer than INLINE_FLUSH_MAX_MS (a quick one is not looked at further)."""
    if took_ms <= INLINE_FLUSH_MAX_MS or run_delay_before_ns < 0:
        return took_ms
    after = read_run_delay_ns(fd)
    if after < run_delay_before_ns:
        return took_ms
    return max(0.0, took_ms - (after - run_delay_before_ns) / 1e6)


def _log_failure_once(what: str, exc: BaseException, failing: str | None) -> str:
    """The cause of a failed flush round (logged when it is not ``failing``, the cause already logged: a full disk
    fails every round, one line is enough); returns it."""
    cause = f"{type(exc).__name__}: {exc}"
    if cause != failing:
        log.error("%s failed (retried every round until it succeeds): %s", what, cause)
    return cause


class _Waiter:
    """One SYNC_FLUSH wait: answered once (True: flushed; False: timed out, refused or stopped)."""

    __slots__ = ("end_phy_offset", "fn", "done", "deadline")

    def __init__(self, end_phy_offset: int, fn: FlushCallback, deadline: float) -> None:
        self.end_phy_offset = end_phy_offset
        self.fn = fn
        self.done = False
        #: loop.time() at which it is answered False (syncFlushTimeout after it registered)
        self.deadline = deadline

    def resolve(self, ok: bool) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.fn(ok)
        except Exception:  # one failing answer must not keep the others waiting
            log.exception("SYNC_FLUSH waiter callback failed")


class FlushService:
    def __init__(self, store: Any, *, sync_flush: bool, interval_ms: int) -> None:
        self._store = store
        self.sync_flush = sync_flush
        self._interval_ms = interval_ms
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the flush thread's wake-up: released = "flush now" pending (a binary semaphore; one futex each way)
        self._signal = threading.Lock()
        self._signal.acquire()
        self._signalled = False
        #: loop thread only: waiters in offset order, and their deadlines
        self._waiters: deque[_Waiter] = deque()
        self._deadlines: list[tuple[float, int, _Waiter]] = []
        #: waiters registered since the last commit step (their deadlines are not in the heap yet)
        self._fresh: list[_Waiter] = []
        self._seq = itertools.count()
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        #: the thread's last flushed offset as seen by the loop (answers waiters registered at or below it)
        self._flushed_phy_offset = -1
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: the consume queues' flush thread (its own: a round over thousands of queues never delays a commit
        #: log flush that SYNC_FLUSH sends wait for), stopped by setting ``_cq_stop``
        self._cq_thread: threading.Thread | None = None
        self._cq_stop = threading.Event()
        #: consume queue flush rounds completed (tests and metrics)
        self.cq_rounds = 0
        #: the once-per-iteration commit step, when scheduled
        self._commit_handle: asyncio.Handle | None = None
        #: the thread is flushing (set and cleared by the thread; read by the commit step)
        self._in_flight = False
        #: no inline flush before this time (time.monotonic(); a slow or failing flush sets it)
        self._inline_off_until = 0.0
        #: the loop thread's and the flush thread's scheduler statistics (open_run_delay; opened by each thread)
        self._loop_run_delay_fd: int | None = None
        #: the commit log's last segment (``MappedFileQueue.last``), whose pages the loop writes ahead before its
        #: flushes; None for a store without one or once writing ahead failed
        commit_log = getattr(store, "commit_log", None)
        self._last_segment: Callable[[], Any] | None = getattr(getattr(commit_log, "mfq", None), "last", None)
        #: the segment written ahead, and the position its pages are written to
        self._ahead_file: Any = None
        self._ahead_to = 0
        #: whether the loop may flush a lone waiter itself (tests turn it off to exercise the thread)
        self.inline_flush = True
        #: counters for tests and metrics: flush rounds that answered waiters, loop wake-ups asked for,
        #: flushes done by the loop itself
        self.rounds = 0
        self.wakeups = 0
        self.inline_flushes = 0

    @property
    def interval_ms(self) -> int:
        """ASYNC_FLUSH period (flushIntervalCommitLog); a change at runtime applies from the next round."""
        return self._interval_ms

    @interval_ms.setter
    def interval_ms(self, value: int) -> None:
        self._interval_ms = value
        self._wake()  # a thread waiting out the old, longer period starts the new one now

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="ferrymq-flush", daemon=True)
        self._thread.start()
        self._cq_thread = threading.Thread(target=self._run_cq_flushes, name="ferrymq-flush-cq", daemon=True)
        self._cq_thread.start()

    def _wake(self) -> None:
        if self._signalled:
            return  # a wake-up is pending: the next round flushes whatever is written by then
        self._signalled = True
        try:
            self._signal.release()
        except RuntimeError:  # released by a concurrent waker (another thread) meanwhile
            pass

    # ---- waiting (event loop thread) -----------------------------------------------------------------
    def on_flushed(self, end_phy_offset: int, timeout_ms: int, fn: FlushCallback) -> None:
        """SYNC_FLUSH, callback form: ``fn(True)`` once the commit log is flushed up to ``end_phy_offset``,
        ``fn(False)`` after ``timeout_ms``, when too many wait, or at stop. Runs on the event loop thread;
        ``fn`` runs there too (inline in the flush round's one callback: keep it short). May call ``fn`` at
        once."""
        loop = self._loop
        if loop is None or self._stopping:
            fn(False)
            return
        if end_phy_offset <= self._flushed_phy_offset:
            fn(True)
            return
        if len(self._waiters) >= MAX_SYNC_FLUSH_WAITERS or timeout_ms <= 0:
            fn(False)
            return
        waiter = _Waiter(end_phy_offset, fn, loop.time() + timeout_ms / 1000)
        waiters = self._waiters
        if waiters and end_phy_offset < waiters[-1].end_phy_offset:
            # a wait that began a loop turn after its put (a task), behind a later put's: keep offset order,
            # so a flush answers every waiter it covers (the walk back passes only the few later waiters)
            i = len(waiters)
            while i > 0 and waiters[i - 1].end_phy_offset > end_phy_offset:
                i -= 1
            waiters.insert(i, waiter)
        else:
            waiters.append(waiter)
        self._fresh.append(waiter)
        if self._commit_handle is None:
            self._commit_handle = loop.call_soon(self._commit)

    def commit_now(self) -> None:
        """Run a scheduled commit step at once (loop thread; the writer calls it before dispatching). Once
        the iteration's reads are done every send of the iteration has registered, so grouping is the same
        as at the step's own turn; nothing happens when none is scheduled."""
        handle = self._commit_handle
        if handle is not None:
            handle.cancel()
            self._commit()

    def _commit(self) -> None:
        """Once per loop iteration with new waiters: flush a lone waiter here, or signal the thread; then
        enter the deadlines of the waiters left waiting."""
        self._commit_handle = None
        waiters = self._waiters
        if not waiters:
            self._fresh.clear()
            return
        if (self.inline_flush and not self._in_flight and len(waiters) <= INLINE_FLUSH_MAX_WAITERS
                and not self._stopping and time.monotonic() >= self._inline_off_until):
            fd = self._loop_run_delay_fd
            if fd is None:
                fd = self._loop_run_delay_fd = open_run_delay()
            delay_ns = read_run_delay_ns(fd)
            started = time.perf_counter()
            if self._last_segment is not None:
                self._zero_ahead()
            try:
                self._store.flush()
            except Exception:  # the thread retries and logs it; the loop stops flushing for a while
                self._inline_off_until = time.monotonic() + INLINE_FLUSH_BACKOFF_S
            else:
                self.inline_flushes += 1
                self._took(disk_ms((time.perf_counter() - started) * 1000, fd, delay_ns))
                self._settle(self._store.flushed_phy_offset)
                if not self._waiters:
                    self._fresh.clear()
                    return
        self._enter_deadlines()
        self._wake()

    def _enter_deadlines(self) -> None:
        """Put the deadlines of the waiters registered since the last commit step (and still waiting) into the
        heap; arm the timer when one is earlier than the armed one."""
        fresh = self._fresh
        if not fresh:
            return
        self._fresh = []
        deadlines = self._deadlines
        seq = self._seq
        earliest = math.inf
        for w in fresh:
            if not w.done:
                heapq.heappush(deadlines, (w.deadline, next(seq), w))
                if w.deadline < earliest:
                    earliest = w.deadline
        loop = self._loop
        if loop is not None and earliest < self._sweep_at:
            self._arm_sweep(loop, earliest)

    def _zero_ahead(self) -> None:
        """Loop thread, before the loop's own flush: keep the pages ahead of the commit log's writes written
        (ZERO_AHEAD_BYTES; the flush then covers them with the appended bytes)."""
        assert self._last_segment is not None
        mf = self._last_segment()
        if mf is None:
            return
        if mf is not self._ahead_file:
            self._ahead_file = mf
            self._ahead_to = 0
        elif self._ahead_to - mf.wrote_position >= ZERO_AHEAD_BYTES // 2:
            return
        try:
            self._ahead_to = mf.zero_ahead(self._ahead_to, ZERO_AHEAD_BYTES)
        except OSError as exc:
            self._last_segment = None
            log.warning("writing the commit log's pages ahead of the writes failed, not tried again: %s", exc)

    def _took(self, flush_ms: float) -> None:
        """A flush took ``flush_ms`` (without waits for a CPU): a slow one turns the loop's flushing off."""
        if flush_ms > INLINE_FLUSH_MAX_MS:
            self._inline_off_until = time.monotonic() + INLINE_FLUSH_BACKOFF_S

    def request_flush(self, end_phy_offset: int, timeout_ms: int = 0) -> asyncio.Future[bool]:
        """SYNC_FLUSH: a future resolving True once the commit log is flushed up to ``end_phy_offset`` (False
        when too many wait, at stop, or after ``timeout_ms`` when given; 0: the caller bounds the wait)."""
        assert self._loop is not None, "flush service not started"
        fut: asyncio.Future[bool] = self._loop.create_future()

        def settle(ok: bool) -> None:
            if not fut.done():
                fut.set_result(ok)

        self.on_flushed(end_phy_offset, timeout_ms if timeout_ms > 0 else 2**31, settle)
        return fut

    def _arm_sweep(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._sweep_at = when
        self._sweep_handle = loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """The deadline timer: answer False to every waiter whose deadline passed; re-arm for the next."""
        self._sweep_handle = None
        self._sweep_at = math.inf
        loop = self._loop
        if loop is None:
            return
        due = loop.time() + DEADLINE_EARLY_S
        deadlines = self._deadlines
        while deadlines and (deadlines[0][0] <= due or deadlines[0][2].done):
            _t, _seq, waiter = heapq.heappop(deadlines)
            waiter.resolve(False)
        waiters = self._waiters
        while waiters and waiters[0].done:
            waiters.popleft()
        if len(waiters) > 2 * (len(deadlines) + 16):  # answered waiters left behind an earlier live one
            self._waiters = deque(w for w in waiters if not w.done)
        if deadlines:
            self._arm_sweep(loop, deadlines[0][0])

    def _settle(self, flushed_phy_offset: int | None) -> None:
        """On the loop (one callback per flush round): answer the waiters the flush covered; None = stopping,
        answer all False."""
        self.rounds += 1
        waiters = self._waiters
        if flushed_phy_offset is None:
            self._waiters = deque()
            self._fresh = []
            for w in waiters:
                w.resolve(False)
            self._deadlines = []
            if self._sweep_handle is not None:
                self._sweep_handle.cancel()
                self._sweep_handle = None
            self._sweep_at = math.inf
            return
        if flushed_phy_offset > self._flushed_phy_offset:
            self._flushed_phy_offset = flushed_phy_offset
        while waiters and waiters[0].end_phy_offset <= flushed_phy_offset:
            waiters.popleft().resolve(True)
        deadlines = self._deadlines
        if not waiters and deadlines:
            # every deadline belongs to an answered waiter: drop them and the timer at once
            self._deadlines = []
            if self._sweep_handle is not None:
                self._sweep_handle.cancel()
                self._sweep_handle = None
            self._sweep_at = math.inf
        elif len(deadlines) > 2 * (len(waiters) + 16):
            self._deadlines = [d for d in deadlines if not d[2].done]
            heapq.heapify(self._deadlines)

    def _hand_back(self, flushed_phy_offset: int | None) -> None:
        """Flush thread: one ``call_soon_threadsafe`` for the whole round."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        self.wakeups += 1
        try:
            loop.call_soon_threadsafe(self._settle, flushed_phy_offset)
        except RuntimeError:  # the loop closed meanwhile (shutdown)
            pass

    # ---- the flush thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        signal = self._signal
        run_delay_fd = open_run_delay() if self.sync_flush else -1
        try:
            self._loop_flushes(signal, run_delay_fd)
        finally:
            if run_delay_fd >= 0:
                os.close(run_delay_fd)

    def _run_cq_flushes(self) -> None:
        """Every FLUSH_CONSUME_QUEUE_INTERVAL_MS: the consume queues and index written since the last round, then
        the checkpoint. A failing round is logged once and retried at the next."""
        failing: str | None = None
        while not self._cq_stop.wait(FLUSH_CONSUME_QUEUE_INTERVAL_MS / 1000):
            try:
                self._store.flush_consume_queues()
            except (OSError, StoreError) as exc:
                failing = _log_failure_once("consume queue flush", exc, failing)
                continue
            except Exception:
                if failing is None:
                    log.exception("consume queue flush failed")
                failing = failing or "unexpected error"
                continue
            self.cq_rounds += 1
            if failing is not None:
                failing = None
                log.warning("consume queue flush succeeded again")

    def _loop_flushes(self, signal: threading.Lock, run_delay_fd: int) -> None:
        failing: str | None = None  # the cause of the failing flushes, logged once (a full disk: every round)
        handed_back = -1  # the flushed offset last handed to the loop
        while not self._stopping:
            if self.sync_flush:
                # blocked on the signal; woken by a send (or to retry a failed flush, or once a period to look)
                wait_ms = SYNC_FLUSH_RETRY_MS if failing is not None else FLUSH_CONSUME_QUEUE_INTERVAL_MS
            else:
                wait_ms = self._interval_ms
            signal.acquire(timeout=wait_ms / 1000)
            self._signalled = False  # before the flush: a send registered after this point signals again
            if self._stopping:
                break
            self._in_flight = True
            try:
                delay_ns = read_run_delay_ns(run_delay_fd)
                started = time.perf_counter()
                self._store.flush()
                if self.sync_flush:
                    self._took(disk_ms((time.perf_counter() - started) * 1000, run_delay_fd, delay_ns))
            except (OSError, StoreError) as exc:  # the disk refused (full, I/O error): one line, not a traceback
                self._in_flight = False
                self._inline_off_until = time.monotonic() + INLINE_FLUSH_BACKOFF_S
                failing = _log_failure_once("flush", exc, failing)
                continue
            except Exception:
                self._in_flight = False
                self._inline_off_until = time.monotonic() + INLINE_FLUSH_BACKOFF_S
                log.exception("flush failed")
                failing = failing or "unexpected error"
                continue
            self._in_flight = False
            if failing is not None:
                failing = None
                log.warning("flush succeeded again")
            if self.sync_flush:
                # a waiter registered before this flush is at or below it: answered by this hand-back, or by
                # an earlier one still queued, or at once (on_flushed) when it registers after that ran
                flushed = self._store.flushed_phy_offset
                if flushed > handed_back:
                    handed_back = flushed
                    self._hand_back(flushed)
        self._hand_back(None)

    def stop(self) -> None:
        """Stop the thread after a final flush (blocking; call from a thread or at shutdown). Waiters still
        waiting are answered False."""
        self._stopping = True
        self._wake()
        self._cq_stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._cq_thread is not None:
            self._cq_thread.join(timeout=10)
            self._cq_thread = None
        fd = self._loop_run_delay_fd
        if fd is not None and fd >= 0:
            self._loop_run_delay_fd = -1  # the commit step does not flush once stopping
            os.close(fd)
        try:
            self._store.flush()
            self._store.flush_consume_queues()
        except Exception:
            log.exception("final flush failed")
