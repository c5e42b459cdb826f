"""Parked pulls (protocol §2.7 PULL "Long polling").

A pull that finds nothing (19) with the suspend flag is parked under ``(topic, queue_id)``. It is
re-run (without suspend) when a dispatch for that queue moves the queue's max offset past the request
offset, by the periodic check, or when its deadline passes; the last run answers whatever it finds
(19 at the deadline). Deadlines are capped below the clients' 30 s call timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode

log = logging.getLogger(__name__)

#: clients time out a pull after 30 s; never hold one longer than this
MAX_SUSPEND_MS = 25_000
#: re-check every parked pull this often (Java's PullRequestHoldService: 5 s)
CHECK_INTERVAL_MS = 5_000
#: parked pulls per broker before new ones are answered at once
MAX_PARKED_PULLS = 100_000

QueueKey = tuple[str, int]
#: (conn, cmd) -> response, run without the right to suspend again
Rerun = Callable[[Any, RemotingCommand], RemotingCommand | None]


@dataclass(slots=True, eq=False)
class ParkedPull:
    conn: Any
    cmd: RemotingCommand
    key: QueueKey
    queue_offset: int
    deadline: float
    future: asyncio.Future[RemotingCommand | None]
    timer: asyncio.TimerHandle | None = None


class PullRequestHoldService:
    def __init__(self, rerun: Rerun, max_offset: Callable[[str, int], int]) -> None:
        self._rerun = rerun
        self._max_offset = max_offset
        self._parked: dict[QueueKey, list[ParkedPull]] = {}
        self._count = 0
        self._task: asyncio.Task[None] | None = None
        self.check_interval_ms = CHECK_INTERVAL_MS

    @property
    def parked_count(self) -> int:
        return self._count

    def can_park(self) -> bool:
        return self._count < MAX_PARKED_PULLS

    def park(self, conn: Any, cmd: RemotingCommand, topic: str, queue_id: int, queue_offset: int,
             timeout_ms: int) -> asyncio.Future[RemotingCommand | None]:
        loop = asyncio.get_running_loop()
        timeout_ms = max(0, min(timeout_ms, MAX_SUSPEND_MS))
        fut: asyncio.Future[RemotingCommand | None] = loop.create_future()
        req = ParkedPull(conn, cmd, (topic, queue_id), queue_offset, loop.time() + timeout_ms / 1000, fut)
        req.timer = loop.call_later(timeout_ms / 1000, self._expire, req)
        self._parked.setdefault(req.key, []).append(req)
        self._count += 1
        return fut

    # ---- wake-ups --------------------------------------------------------------------------
    def notify(self, keys: Iterable[QueueKey]) -> None:
        """New messages were dispatched to these queues."""
        for key in keys:
            reqs = self._parked.get(key)
            if reqs:
                self._check_key(key, reqs)

    def notify_all(self) -> None:
        for key, reqs in list(self._parked.items()):
            self._check_key(key, reqs)

    def _check_key(self, key: QueueKey, reqs: list[ParkedPull]) -> None:
        max_offset = self._max_offset(*key)
        ready = [r for r in reqs if max_offset > r.queue_offset or getattr(r.conn, "closed", False)]
        for r in ready:
            self._answer(r, final=False)

    def _expire(self, req: ParkedPull) -> None:
        req.timer = None
        self._answer(req, final=True)

    def _answer(self, req: ParkedPull, *, final: bool) -> None:
        if req.future.done():
            self._remove(req)
            return
        if getattr(req.conn, "closed", False):
            self._remove(req)
            req.future.set_result(None)
            return
        try:
            response = self._rerun(req.conn, req.cmd)
        except Exception as exc:
            log.exception("re-running a parked pull failed")
            response = req.cmd.response(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")
        if not final and response is not None and response.code == ResponseCode.PULL_NOT_FOUND:
            return  # nothing new for this filter yet; stay parked until the deadline
        self._remove(req)
        req.future.set_result(response)

    def _remove(self, req: ParkedPull) -> None:
        if req.timer is not None:
            req.timer.cancel()
            req.timer = None
        reqs = self._parked.get(req.key)
        if reqs is not None and req in reqs:
            reqs.remove(req)
            self._count -= 1
            if not reqs:
                del self._parked[req.key]

    # ---- lifecycle -------------------------------------------------------------------------
    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_ms / 1000)
            self.notify_all()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._check_loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for reqs in list(self._parked.values()):
            for r in list(reqs):
                self._remove(r)
                if not r.future.done():
                    r.future.set_result(None)
