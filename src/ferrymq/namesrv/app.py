"""NameServer: a RemotingServer wired to the route table, KV config and the broker-expiry scan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from ferrymq.acl.checker import NAMESRV_GUARDED_CODES
from ferrymq.acl.guard import AclGuard
from ferrymq.common import gc_policy
from ferrymq.common.aio import LoopLagProbe
from ferrymq.common.tls import TlsServerSettings
from ferrymq.namesrv.config_processor import NamesrvConfigProcessor
from ferrymq.namesrv.kv_config import KVConfigManager
from ferrymq.namesrv.metrics import namesrv_metrics_server
from ferrymq.namesrv.processors import NamesrvProcessors
from ferrymq.namesrv.route_table import (
    BROKER_CHANNEL_EXPIRED_MS,
    EXPIRY_SCAN_BATCH,
    REMOVE_STEP_TOPICS,
    SCAN_NOT_ACTIVE_BROKER_FIRST_DELAY_MS,
    SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS,
    ClockMs,
    RemovedBroker,
    RouteTable,
    wall_clock_ms,
)
from ferrymq.remoting import signature
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.connection import Connection, Dispatcher
from ferrymq.remoting.server import RemotingServer

log = logging.getLogger(__name__)


class NameServer:
    """``await start()`` binds ``host:port`` (port 0 picks a free one, see ``.port``); ``await stop()``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        clock_ms: ClockMs | None = None,
        *,
        broker_expired_ms: int = BROKER_CHANNEL_EXPIRED_MS,
        scan_interval_ms: int = SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS,
        scan_first_delay_ms: int = SCAN_NOT_ACTIVE_BROKER_FIRST_DELAY_MS,
        kv_config_path: str | Path | None = None,
        metrics_port: int = -1,
        tls: TlsServerSettings | None = None,
        acl_path: str | None = None,
        config_path: str | None = None,
        file_props: dict[str, str] | None = None,
        gc_freeze_enable: bool = True,
    ) -> None:
        self.host = host
        #: the namesrv.conf it was started with (UPDATE_NAMESRV_CONFIG writes accepted keys back) and its keys
        self.config_path = config_path
        self.file_props = dict(file_props or {})
        self.kv_config_path = kv_config_path
        #: TLS of the remoting port (common/tls.py); certificates load now, a bad path is a ConfigError
        self.tls = tls or TlsServerSettings()
        self.tls.context()
        self._port = port
        self.routes = RouteTable(clock_ms or wall_clock_ms, broker_expired_ms, on_retire=self._schedule_drain)
        self._drain_task: asyncio.Task[None] | None = None
        self.kv = KVConfigManager(kv_config_path)
        #: aclEnable: the write operations need a signed admin account (acl/guard.py); None when off
        self.acl_guard = AclGuard(acl_path) if acl_path is not None else None
        self.processors = NamesrvProcessors(self.routes, self.kv,
                                            admin_check=self.is_admin if self.acl_guard is not None else None)
        self.dispatcher = Dispatcher()
        self.processors.register_all(self.dispatcher)
        NamesrvConfigProcessor(self).register(self.dispatcher)
        if self.acl_guard is not None:
            self.acl_guard.install(self.dispatcher, only=NAMESRV_GUARDED_CODES)
        #: ms between broker-expiry scans (scanNotActiveBrokerInterval, runtime-safe)
        self.scan_interval_ms = scan_interval_ms
        self._scan_first_delay_ms = scan_first_delay_ms
        self._server: RemotingServer | None = None
        self._scan_task: asyncio.Task[None] | None = None
        #: the event loop's lateness (ferrymq_event_loop_lag_seconds)
        self.loop_lag = LoopLagProbe()
        #: gcFreezeEnable: freeze at start and as the route table grows (common/gc_policy.py)
        self.gc_freeze_enable = gc_freeze_enable
        self._gc_held = False
        #: Prometheus endpoint on host:metrics_port (-1 = off)
        self.metrics_server = namesrv_metrics_server(self.routes, host, metrics_port, self.loop_lag,
                                                     gc_policy.monitor())

    @property
    def port(self) -> int:
        return self._port

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("name server already started")
        if self.gc_freeze_enable:  # what is loaded now lives as long as the process: out of the full passes
            gc_policy.monitor().freeze_now()
        server = RemotingServer(self.dispatcher, self.host, self._port, on_connection_closed=self._on_closed,
                                tls=self.tls)
        await server.start()
        self._server = server
        self._port = server.port
        self._scan_task = asyncio.ensure_future(self._scan_loop())
        self.loop_lag.start()
        if self.metrics_server is not None:
            await self.metrics_server.start()
        gc_policy.acquire(self.gc_freeze_enable)
        self._gc_held = True
        log.info("name server listening on %s", self.addr)

    async def stop(self) -> None:
        if self._drain_task is not None and not self._drain_task.done():
            self._drain_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain_task
        if self._scan_task is not None:
            self._scan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scan_task
            self._scan_task = None
        await self.loop_lag.stop()
        if self._gc_held:
            self._gc_held = False
            gc_policy.release(self.gc_freeze_enable)
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self._server is not None:
            await self._server.stop()
            self._server = None  # .port stays readable after stop
            log.info("name server on %s stopped", self.addr)

    async def __aenter__(self) -> NameServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def is_admin(self, conn: Connection, cmd: RemotingCommand) -> bool:
        """With aclEnable: ``cmd`` is correctly signed by an admin account (or comes from a globally
        white-listed address, or an admin account's white address). Without ACL nobody is: False."""
        guard = self.acl_guard
        if guard is None or guard.denial(conn, cmd) is not None:
            return False
        access_key = cmd.ext_fields.get(signature.ACCESS_KEY)
        account = guard.acl.accounts.get(access_key) if access_key else None
        return account is None or bool(account.admin)  # no account: the peer passed the global white list

    def _schedule_drain(self) -> None:
        """A large broker group was removed: drop its QueueData in steps, yielding to the loop between them."""
        if self._drain_task is None or self._drain_task.done():
            try:
                self._drain_task = asyncio.ensure_future(self._drain_retired())
            except RuntimeError:  # no running loop: drain now
                while self.routes.drain_retired(REMOVE_STEP_TOPICS):
                    pass

    async def _drain_retired(self) -> None:
        while self.routes.drain_retired(REMOVE_STEP_TOPICS):
            await asyncio.sleep(0)

    def _on_closed(self, conn: Connection) -> None:
        self.routes.on_channel_closed(conn)

    def scan_not_active_brokers(self, max_count: int | None = None) -> list[RemovedBroker]:
        """Expire silent brokers now (at most ``max_count``) and close their connections."""
        expired = self.routes.scan_not_active_brokers(max_count)
        for gone in expired:
            if isinstance(gone.channel, Connection):
                gone.channel.close()
        return expired

    async def _scan_loop(self) -> None:
        await asyncio.sleep(self._scan_first_delay_ms / 1000)
        while True:
            try:
                # bounded steps: many brokers expiring at once (after a partition) never hold the loop long
                while len(self.scan_not_active_brokers(EXPIRY_SCAN_BATCH)) >= EXPIRY_SCAN_BATCH:
                    await asyncio.sleep(0)
            except Exception:  # the scan must keep running
                log.exception("broker expiry scan failed")
            await asyncio.sleep(self.scan_interval_ms / 1000)
