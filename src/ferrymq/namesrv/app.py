"""NameServer: a RemotingServer wired to the route table, KV config and the broker-expiry scan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from ferrymq.acl.checker import NAMESRV_GUARDED_CODES
from ferrymq.acl.guard import AclGuard
from ferrymq.common.tls import TlsServerSettings
from ferrymq.namesrv.config_processor import NamesrvConfigProcessor
from ferrymq.namesrv.kv_config import KVConfigManager
from ferrymq.namesrv.metrics import namesrv_metrics_server
from ferrymq.namesrv.processors import NamesrvProcessors
from ferrymq.namesrv.route_table import (
    BROKER_CHANNEL_EXPIRED_MS,
    SCAN_NOT_ACTIVE_BROKER_FIRST_DELAY_MS,
    SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS,
    ClockMs,
    RemovedBroker,
    RouteTable,
    wall_clock_ms,
)
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
        self.routes = RouteTable(clock_ms or wall_clock_ms, broker_expired_ms)
        self.kv = KVConfigManager(kv_config_path)
        self.processors = NamesrvProcessors(self.routes, self.kv)
        self.dispatcher = Dispatcher()
        self.processors.register_all(self.dispatcher)
        NamesrvConfigProcessor(self).register(self.dispatcher)
        if acl_path is not None:  # aclEnable: the write operations need a signed admin account (acl/guard.py)
            AclGuard(acl_path).install(self.dispatcher, only=NAMESRV_GUARDED_CODES)
        #: ms between broker-expiry scans (scanNotActiveBrokerInterval, runtime-safe)
        self.scan_interval_ms = scan_interval_ms
        self._scan_first_delay_ms = scan_first_delay_ms
        self._server: RemotingServer | None = None
        self._scan_task: asyncio.Task[None] | None = None
        #: Prometheus endpoint on host:metrics_port (-1 = off)
        self.metrics_server = namesrv_metrics_server(self.routes, host, metrics_port)

    @property
    def port(self) -> int:
        return self._port

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("name server already started")
        server = RemotingServer(self.dispatcher, self.host, self._port, on_connection_closed=self._on_closed,
                                tls=self.tls)
        await server.start()
        self._server = server
        self._port = server.port
        self._scan_task = asyncio.ensure_future(self._scan_loop())
        if self.metrics_server is not None:
            await self.metrics_server.start()
        log.info("name server listening on %s", self.addr)

    async def stop(self) -> None:
        if self._scan_task is not None:
            self._scan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scan_task
            self._scan_task = None
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

    def _on_closed(self, conn: Connection) -> None:
        self.routes.on_channel_closed(conn)

    def scan_not_active_brokers(self) -> list[RemovedBroker]:
        """Expire silent brokers now and close their connections (the periodic scan calls this)."""
        expired = self.routes.scan_not_active_brokers()
        for gone in expired:
            if isinstance(gone.channel, Connection):
                gone.channel.close()
        return expired

    async def _scan_loop(self) -> None:
        await asyncio.sleep(self._scan_first_delay_ms / 1000)
        while True:
            try:
                self.scan_not_active_brokers()
            except Exception:  # the scan must keep running
                log.exception("broker expiry scan failed")
            await asyncio.sleep(self.scan_interval_ms / 1000)
