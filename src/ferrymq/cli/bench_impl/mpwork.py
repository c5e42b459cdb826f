"""Run client load in separate worker processes (spawned), start them together, collect their results.

A worker is ``async def fn(spec: dict, ctl: WorkerControl) -> dict``: it sets up (connects, warms up),
calls ``await ctl.ready()`` which reports readiness and waits for the common start signal, runs its
workload and returns a JSON-able dict. Exceptions are shipped back as text and raised in the parent.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing as mp
import queue
import time
import traceback
from typing import Any

#: Time a worker may take to become ready (import, connect, route lookup, warm-up).
READY_TIMEOUT_S = 60.0
#: Extra time after the planned run before a silent worker counts as stuck.
RESULT_GRACE_S = 60.0


def _failure(idx: int, payload: Any) -> str:
    """A worker's traceback, its last line (the exception) first: a row shows only the first line."""
    text = str(payload).rstrip()
    return f"worker {idx} failed: {text.splitlines()[-1] if text else '(no traceback)'}\n{text}"


class WorkerFailed(RuntimeError):
    pass


class WorkerControl:
    def __init__(self, index: int, ready_q: Any, go: Any) -> None:
        self.index = index
        self._ready_q = ready_q
        self._go = go

    async def ready(self) -> None:
        self._ready_q.put(("ready", self.index, None))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._go.wait)


def _entry(fn_path: str, index: int, spec: dict[str, Any], ready_q: Any, go: Any, result_q: Any) -> None:
    try:
        mod_name, fn_name = fn_path.rsplit(":", 1)
        fn = getattr(importlib.import_module(mod_name), fn_name)
        try:
            import uvloop

            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:  # pragma: no cover
            runner = asyncio.Runner()
        with runner:
            result = runner.run(fn(spec, WorkerControl(index, ready_q, go)))
        result_q.put(("ok", index, result))
    except BaseException:  # noqa: BLE001 - shipped to the parent
        tb = traceback.format_exc()
        ready_q.put(("error", index, tb))
        result_q.put(("error", index, tb))


def run_workers(fn_path: str, specs: list[dict[str, Any]], *, run_s: float) -> list[dict[str, Any]]:
    """Start one process per spec, release them together once all are ready, return their results."""
    ctx = mp.get_context("spawn")
    ready_q, result_q, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_entry, args=(fn_path, i, spec, ready_q, go, result_q), daemon=True)
             for i, spec in enumerate(specs)]
    for p in procs:
        p.start()
    try:
        pending = set(range(len(specs)))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while pending:
            try:
                kind, idx, payload = ready_q.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise WorkerFailed(f"workers {sorted(pending)} not ready after {READY_TIMEOUT_S}s") from None
                dead = [i for i in pending if not procs[i].is_alive()]
                if dead:
                    _drain_errors(result_q)
                    raise WorkerFailed(f"workers {dead} died before becoming ready") from None
                continue
            if kind == "error":
                raise WorkerFailed(_failure(idx, payload))
            pending.discard(idx)
        go.set()
        results: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + run_s + RESULT_GRACE_S
        while len(results) < len(specs):
            try:
                kind, idx, payload = result_q.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise WorkerFailed("workers did not report in time") from None
                if any(not p.is_alive() and p.exitcode not in (0, None) for p in procs):
                    _drain_errors(result_q)
                    raise WorkerFailed("a worker died while running") from None
                continue
            if kind == "error":
                raise WorkerFailed(_failure(idx, payload))
            results[idx] = payload
        for p in procs:
            p.join(timeout=10)
        return [results[i] for i in range(len(specs))]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def _drain_errors(result_q: Any) -> None:
    try:
        while True:
            kind, idx, payload = result_q.get_nowait()
            if kind == "error":
                raise WorkerFailed(_failure(idx, payload))
    except queue.Empty:
        return
