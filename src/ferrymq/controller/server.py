"""A running controller: Raft node + remoting server on controllerListenPort + the leader's scan.

``await start()`` binds both ports (controllerListenPort 0 picks a free one, see ``.port``), ``await
stop()`` ends everything. Runs in any event loop, alone (``ferry controller``) or beside a name server
(``enableControllerInNamesrv``).

How a follower knows the leader's remoting address (for 2007's ``leaderAddr``): every controller, once
started, writes ``setControllerAddr(its Raft address -> its listen address)`` through Raft (followers'
commands are forwarded to the leader by pysyncobj); the map is part of the replicated state, so it survives
restarts, and a follower looks the current Raft leader up in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ferrymq.controller.config import ControllerConfig
from ferrymq.controller.core import ClockMs, ControllerCore, monotonic_ms
from ferrymq.controller.processors import ControllerProcessors
from ferrymq.controller.raft import RaftNode, RaftSettings
from ferrymq.remoting.connection import Connection, Dispatcher
from ferrymq.remoting.server import RemotingServer

log = logging.getLogger(__name__)


class ControllerServer:
    def __init__(self, cfg: ControllerConfig, *, clock_ms: ClockMs = monotonic_ms) -> None:
        self.cfg = cfg
        self.raft = RaftNode(RaftSettings(cfg.self_raft_addr, cfg.other_raft_addrs, cfg.store_path,
                                          cfg.heartbeat_timeout_ms), on_role_changed=self._role_changed)
        self.core = ControllerCore(cfg, self.raft, clock_ms=clock_ms)
        self.processors = ControllerProcessors(self.core)
        self.dispatcher = Dispatcher()
        self.processors.register_all(self.dispatcher)
        self._server: RemotingServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ready_tasks: set[asyncio.Task[None]] = set()
        self._port = cfg.listen_port

    @property
    def port(self) -> int:
        return self._port

    @property
    def addr(self) -> str:
        """The advertised remoting address (what 2007 redirects point at)."""
        return f"{self.cfg.advertised_host()}:{self.port}"

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("controller already started")
        server = RemotingServer(self.dispatcher, self.cfg.listen_host, self.cfg.listen_port,
                                on_connection_closed=self._on_closed, tls=self.cfg.tls)
        await server.start()
        self._server = server
        self._port = server.port
        self.core.listen_addr = self.addr
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.raft.start, asyncio.get_running_loop())
        except BaseException:
            await server.stop()
            self._server = None
            raise
        self._tasks = [asyncio.ensure_future(self.core.scan_loop()),
                       asyncio.ensure_future(self.core.publish_addr_loop())]
        log.info("controller %s listening on %s (raft %s)", self.cfg.self_id, self.addr, self.raft.self_addr)

    async def stop(self) -> None:
        for task in [*self._tasks, *self._ready_tasks]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._server is not None:
            await self._server.stop()
            self._server = None
        self.core.close()  # after the connections closed (each close may have set a timer)
        await asyncio.get_running_loop().run_in_executor(None, self.raft.stop)
        log.info("controller %s stopped", self.cfg.self_id)

    async def __aenter__(self) -> ControllerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _on_closed(self, conn: Connection) -> None:
        self.core.channel_closed(conn)

    def _role_changed(self) -> None:
        """Event loop: a Raft role change; a new leader gets ready (no-op commit, grace) right away."""
        if self.raft.is_leader and self._server is not None:
            task = asyncio.ensure_future(self._get_ready())
            self._ready_tasks.add(task)
            task.add_done_callback(self._ready_tasks.discard)

    async def _get_ready(self) -> None:
        with contextlib.suppress(Exception):
            await self.core.ensure_leader()
