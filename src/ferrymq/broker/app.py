"""``BrokerController``: wires the store, the managers and the processors into one Dispatcher served on
listenPort and listenPort-2 (the "fast" port), runs the timers and the HA pieces; ``start``/``stop``.

Timers (all on the event loop):

| what                                   | period                        |
|----------------------------------------|-------------------------------|
| name server registration               | registerNameServerPeriod      |
| consumer offsets persist               | flushConsumerOffsetInterval   |
| topics / groups snapshot (journal fold)| METADATA_SNAPSHOT_INTERVAL_MS |
| event-loop lag probe                   | 10 ms (common/aio.py)         |
| delay offsets persist                  | flushDelayOffsetInterval      |
| timer checkpoint persist               | flushDelayOffsetInterval      |
| client channel expiry scan             | 10 s (expiry 120 s)           |
| expired commit log files               | 10 s                          |
| disk space check (full disk, cleanup)  | 1 s                           |
| parked pulls re-check                  | 5 s (long_polling)            |
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import logging
import os
import ssl
import time
from collections.abc import Callable
from typing import Any

from ferrymq.acl.guard import AclGuard
from ferrymq.broker.config import (
    FAST_PORT_OFFSET,
    MASTER_ID,
    BrokerConfig,
    BrokerRole,
    FlushDiskType,
    parse_delay_levels,
)
from ferrymq.broker.consumer_manager import ClientChannel, ConsumerManager
from ferrymq.broker.controller_mode import ControllerRole
from ferrymq.broker.flush import FlushService
from ferrymq.broker.long_polling import PullRequestHoldService
from ferrymq.broker.metrics import broker_metrics_server
from ferrymq.broker.offset_manager import ConsumerOffsetManager
from ferrymq.broker.processors.acl_admin import AclAdminProcessor
from ferrymq.broker.processors.admin import AdminProcessor
from ferrymq.broker.processors.broker_config import BrokerConfigProcessor
from ferrymq.broker.processors.client_manage import ClientManageProcessor
from ferrymq.broker.processors.client_query import ClientQueryProcessor
from ferrymq.broker.processors.consumer_manage import ConsumerManageProcessor
from ferrymq.broker.processors.end_transaction import EndTransactionProcessor
from ferrymq.broker.processors.epoch import EpochProcessor
from ferrymq.broker.processors.lock import LockProcessor
from ferrymq.broker.processors.ops import OpsProcessor
from ferrymq.broker.processors.pull import PullProcessor
from ferrymq.broker.processors.query import QueryProcessor
from ferrymq.broker.processors.recall import RecallProcessor
from ferrymq.broker.processors.reply import ReplyProcessor
from ferrymq.broker.processors.send import SendProcessor
from ferrymq.broker.processors.send_back import SendBackProcessor
from ferrymq.broker.producer_manager import ProducerManager
from ferrymq.broker.queue_files import QueueFileGate
from ferrymq.broker.registration import NameServerRegistrar
from ferrymq.broker.schedule import ScheduleMessageService
from ferrymq.broker.stats import SAMPLE_INTERVAL_MS, BrokerStats
from ferrymq.broker.subscription_manager import SubscriptionGroupManager
from ferrymq.broker.timer import TimerMessageService, retention_warning
from ferrymq.broker.topic_manager import TopicManager
from ferrymq.broker.transaction import TransactionConfig, TransactionService
from ferrymq.broker.unconsumed_floor import UnconsumedFloor
from ferrymq.broker.writer import MessageWriter
from ferrymq.common import gc_policy
from ferrymq.common.aio import LoopLagProbe
from ferrymq.common.message import host_to_bytes
from ferrymq.common.timer import TIMER_QUEUE_ID, TIMER_TOPIC
from ferrymq.common.tls import TlsServerSettings
from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.connection import Connection, Dispatcher
from ferrymq.remoting.pool import ConnectionPool
from ferrymq.remoting.server import RemotingServer
from ferrymq.store.config import BrokerRole as StoreBrokerRole
from ferrymq.store.config import FlushDiskType as StoreFlushDiskType
from ferrymq.store.config import StoreConfig
from ferrymq.store.message_store import MessageStore
from ferrymq.store.queue_table import process_fds

log = logging.getLogger(__name__)

BROKER_VERSION = "V4_9_7"
CLIENT_SCAN_INTERVAL_MS = 10_000
DELETE_EXPIRED_INTERVAL_MS = 10_000
#: period of the store's disk space check (refuses sends on a full disk, forced cleanup)
DISK_CHECK_INTERVAL_MS = 1_000
#: a slave dispatches replicated bytes within this delay (transfers arriving meanwhile go in one reput)
SLAVE_REPUT_DELAY_S = 0.001
#: period of the topics.json / subscriptionGroup.json snapshots (changes are journaled meanwhile)
METADATA_SNAPSHOT_INTERVAL_MS = 5_000


#: the timer topic's queue: its new units wake the timer service (broker/timer.py)
_TIMER_KEY = (TIMER_TOPIC, TIMER_QUEUE_ID)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def store_config_of(cfg: BrokerConfig) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=cfg.root_dir,
        store_path_commit_log=cfg.commit_log_dir,
        mapped_file_size_commit_log=cfg.mapped_file_size_commit_log,
        mapped_file_size_consume_queue=cfg.mapped_file_size_consume_queue,
        max_open_segment_files=cfg.max_open_segment_files,
        commit_log_preallocation=cfg.commit_log_preallocation,
        disk_max_used_space_ratio=cfg.disk_max_used_space_ratio,
        disk_space_clean_forcibly_ratio=cfg.disk_space_clean_forcibly_ratio,
        clean_file_forcibly_enable=cfg.clean_file_forcibly_enable,
        disk_space_warning_level_ratio=cfg.disk_space_warning_level_ratio,
        flush_disk_type=StoreFlushDiskType(cfg.flush_disk_type.value),
        broker_role=StoreBrokerRole(cfg.broker_role.value),
        flush_interval_commit_log_ms=cfg.flush_interval_commit_log_ms,
        sync_flush_timeout_ms=cfg.sync_flush_timeout_ms,
        file_reserved_time_hours=cfg.file_reserved_time_hours,
        max_message_size=cfg.max_message_size,
        access_message_in_memory_max_ratio=cfg.access_message_in_memory_max_ratio,
        message_delay_level=cfg.message_delay_level,
        max_transfer_count_on_message_in_memory=cfg.max_transfer_count_on_message_in_memory,
        max_transfer_bytes_on_message_in_memory=cfg.max_transfer_bytes_on_message_in_memory,
        max_transfer_count_on_message_in_disk=cfg.max_transfer_count_on_message_in_disk,
        max_transfer_bytes_on_message_in_disk=cfg.max_transfer_bytes_on_message_in_disk,
    )


class BrokerController:
    def __init__(self, config: BrokerConfig, *, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        config.validate()
        self.config = config
        self.clock_ms = clock_ms
        #: controller mode: SYNC (or ASYNC_MASTER) replication while master; the role itself starts as a
        #: read-only replica until the controller names this broker master
        self.controller_sync_replication = config.controller_sync_replication
        if config.enable_controller_mode:
            config.broker_role = BrokerRole.SLAVE
        os.makedirs(config.config_dir, exist_ok=True)
        self.store_config = store_config_of(config)
        self.store = MessageStore(self.store_config, clock_ms)
        cdir = config.config_dir
        self.topics = TopicManager(cdir, cluster_name=config.broker_cluster_name, broker_name=config.broker_name,
                                   auto_create_topic_enable=config.auto_create_topic_enable,
                                   default_topic_queue_nums=config.default_topic_queue_nums, clock_ms=clock_ms)
        if config.is_slave:
            self.topics.replica_queue_count = self.store.queue_count
        self.offsets = ConsumerOffsetManager(cdir)
        if config.is_slave:
            self.offsets.local_commits = {}
        self.groups = SubscriptionGroupManager(cdir, auto_create=config.auto_create_subscription_group,
                                               clock_ms=clock_ms)
        self.consumers = ConsumerManager(clock_ms=clock_ms, channel_expired_ms=config.channel_expired_timeout_ms)
        self.consumers.on_ids_changed = self._notify_consumer_ids_changed
        self.producers = ProducerManager(clock_ms=clock_ms, channel_expired_ms=config.channel_expired_timeout_ms)
        self.flush_service = FlushService(self.store, sync_flush=config.flush_disk_type is FlushDiskType.SYNC_FLUSH,
                                          interval_ms=config.flush_interval_commit_log_ms)
        self.writer = MessageWriter(self.store, config, self.flush_service, self._on_dispatched)
        #: a send to a new queue has its first consume queue file made on a thread first (broker/queue_files.py)
        self.queue_files = QueueFileGate(self.store, self.store.queues.queues)
        self.stats = self.writer.stats = BrokerStats(clock_ms)
        self.delay_levels_ms = parse_delay_levels(config.message_delay_level)
        self.schedule = ScheduleMessageService(self.store, self.writer.put, cdir, self.delay_levels_ms, clock_ms)
        self.timer = TimerMessageService(self.store, self.writer.put, cdir, clock_ms,
                                         roll_window_ms=config.timer_roll_window_sec * 1000)
        #: pending timer messages' records outlive retention and forced cleanups (docs/timers.md)
        self.store.retained_phy_floor = self.timer.retained_phy_floor
        if (warning := retention_warning(config.timer_roll_window_sec, config.file_reserved_time_hours)) is not None:
            log.warning("%s", warning)
        self.transactions = TransactionService(self, TransactionConfig(
            config.transaction_timeout_ms, config.transaction_check_interval_ms, config.transaction_check_max),
            clock_ms)
        self.hot_data_bytes = self.store_config.memory_for_hot_data_bytes
        #: the forced cleanup spares what subscribed groups have not consumed (found in bounded steps)
        self.unconsumed_floor = UnconsumedFloor(lambda: self.offsets.table, lambda group: group in self.groups.table,
                                                self.store.unconsumed_phy_of)
        self.store.unconsumed_phy_floor = self.unconsumed_floor
        #: the event loop's lateness (ferrymq_event_loop_lag_seconds)
        self.loop_lag = LoopLagProbe()
        #: the process's full-collection pauses and freezes (ferrymq_gc_pause_seconds; common/gc_policy.py)
        self.gc_monitor = gc_policy.monitor()

        self.dispatcher = Dispatcher()
        self.pull_processor = PullProcessor(self)
        lock_processor = LockProcessor(self)
        self.consumers.on_client_left = lock_processor.locks.release_client
        for proc in (SendProcessor(self), self.pull_processor, ClientManageProcessor(self),
                     ConsumerManageProcessor(self), AdminProcessor(self), QueryProcessor(self), lock_processor,
                     SendBackProcessor(self), EndTransactionProcessor(self)):
            proc.register(self.dispatcher)
        ReplyProcessor(self).register(self.dispatcher)
        AclAdminProcessor(self).register(self.dispatcher)
        OpsProcessor(self).register(self.dispatcher)
        ClientQueryProcessor(self).register(self.dispatcher)
        BrokerConfigProcessor(self).register(self.dispatcher)
        EpochProcessor(self).register(self.dispatcher)
        RecallProcessor(self).register(self.dispatcher)
        self.long_polling: PullRequestHoldService = PullRequestHoldService(self.pull_processor.rerun,
                                                                           self.store.get_max_offset_in_queue)
        self.metrics_server = broker_metrics_server(self)  # None when metricsPort = -1
        #: the ACL check (None when aclEnable is false); every request passes it first, nothing is wrapped when off
        self.acl_guard: AclGuard | None = None
        if config.acl_enable:
            self.acl_guard = AclGuard(config.acl_path)
            self.acl_guard.install(self.dispatcher)

        # TLS (common/tls.py): certificates are loaded now, so a bad path stops the start with its key
        self.tls_server: TlsServerSettings = config.tls_server
        self.tls_server.context()
        tls_client = config.tls_client
        self.tls_client_context: ssl.SSLContext | None = tls_client.context() if tls_client is not None else None
        self.pool = ConnectionPool(Dispatcher(), ssl_context=self.tls_client_context)
        self.server: RemotingServer | None = None
        self.fast_server: RemotingServer | None = None
        self.registrar: NameServerRegistrar | None = None
        self.ha_service: Any = None
        self.ha_client: Any = None
        self.slave_sync: Any = None
        #: controller mode (broker/controller_mode.py); None in classic mode
        self.controller_role: ControllerRole | None = None
        #: learnt from the name server (slaves): the master's main and HA addresses
        self.master_addr: str | None = None
        self.master_ha_addr: str | None = config.ha_master_address or None
        self.store_host: bytes = host_to_bytes(config.broker_ip1, config.listen_port)
        self._timers: list[asyncio.Task[None]] = []
        self._started = False
        self.start_ms = 0

    # ---- addresses ------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.server.port if self.server is not None else self.config.listen_port

    @property
    def broker_addr(self) -> str:
        return f"{self.config.broker_ip1}:{self.port}"

    @property
    def bind_addr(self) -> str:
        """host:port the remoting server is bound to (``listenHost``, 0.0.0.0 = every interface)."""
        return f"{self.config.listen_host}:{self.port}"

    @property
    def ha_port(self) -> int:
        if self.controller_role is not None:
            return self.controller_role.ha_port
        if self.ha_service is not None:
            return int(self.ha_service.port)
        return self.config.effective_ha_listen_port

    @property
    def ha_server_addr(self) -> str:
        return f"{self.config.broker_ip1}:{self.ha_port}"

    @property
    def schedule_max_level(self) -> int:
        return len(self.delay_levels_ms)

    # ---- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        self.topics.load()
        self.offsets.load()
        self.groups.load()
        self.schedule.load()
        self.timer.load()
        self.store.load()
        self.writer.bind(loop)
        self.queue_files.start(loop)
        if cfg.enable_controller_mode and not cfg.read_uncommitted:
            # consumers see only records every SyncStateSet member holds (docs/failover.md)
            self.store.dispatcher.reput_end = self._controller_reput_end
            self.writer.hold_keys = True
        self.writer.reput_now()
        self.start_ms = self.clock_ms()
        if cfg.gc_freeze_enable:
            # the loaded estate is long-lived: collected once now, before serving, then kept out of the cyclic
            # collector's full passes, which otherwise walk it all in one block (~90 ms at 10,000 topics)
            gc_policy.monitor().freeze_now()

        limits = cfg.server_limits()
        self.server = RemotingServer(self.dispatcher, cfg.listen_host, cfg.listen_port, limits=limits,
                                     on_connection_closed=self._on_connection_closed, tls=self.tls_server)
        await self.server.start()
        self.store_host = host_to_bytes(cfg.broker_ip1, self.server.port)
        if cfg.fast_listen_enable:
            fast_port = self.server.port - FAST_PORT_OFFSET if cfg.listen_port > FAST_PORT_OFFSET else 0
            self.fast_server = RemotingServer(self.dispatcher, cfg.listen_host, fast_port, limits=limits,
                                              on_connection_closed=self._on_connection_closed, tls=self.tls_server)
            try:
                await self.fast_server.start()
            except OSError as exc:
                log.warning("fast port %d unavailable: %s", fast_port, exc)
                self.fast_server = None

        self.flush_service.start(loop)
        self.long_polling.start()
        if self.metrics_server is not None:
            await self.metrics_server.start()
        if cfg.enable_controller_mode:
            self.controller_role = ControllerRole(self)
        else:
            await self._start_ha()

        self.registrar = NameServerRegistrar(
            self.pool, cfg.namesrv_addr, cluster_name=cfg.broker_cluster_name, broker_name=cfg.broker_name,
            broker_id=cfg.broker_id, broker_addr=lambda: self.broker_addr, ha_server_addr=lambda: self.ha_server_addr,
            topic_wrapper=self.topics.wrapper_json, period_ms=cfg.register_period_ms,
            on_master_info=self._on_master_info, topic_table=self._topic_table_copy,
            compressed=cfg.compressed_register)
        self.topics.on_change = self.registrar.trigger
        self.topics.on_topic_put = self.registrar.register_topic
        if self.controller_role is not None:
            role = self.controller_role
            # never advertised as the master once the lease lapsed (a paused old master that resumes must not
            # take the route back from the new one before it learns it was deposed)
            self.registrar.broker_id_of = lambda: MASTER_ID if role.can_ack() else cfg.broker_id
        await self.registrar.register_all()
        self.registrar.start_periodic()

        if not cfg.is_slave:
            self.schedule.start()
            self.timer.start()
            self.transactions.start()
        if self.controller_role is not None:
            await self.controller_role.start()
        self.loop_lag.start()
        self._timers = [
            asyncio.ensure_future(self._every(cfg.flush_consumer_offset_interval_ms, self.offsets.snapshot_if_dirty)),
            asyncio.ensure_future(self._every(METADATA_SNAPSHOT_INTERVAL_MS, self.topics.snapshot_if_dirty)),
            asyncio.ensure_future(self._every(METADATA_SNAPSHOT_INTERVAL_MS, self.groups.snapshot_if_dirty)),
            asyncio.ensure_future(self._every(cfg.flush_delay_offset_interval_ms, self.schedule.persist_if_dirty)),
            asyncio.ensure_future(self._every(cfg.flush_delay_offset_interval_ms, self.timer.persist_async)),
            asyncio.ensure_future(self._every(CLIENT_SCAN_INTERVAL_MS, self._scan_channels)),
            asyncio.ensure_future(self._every(DELETE_EXPIRED_INTERVAL_MS, self._delete_expired)),
            asyncio.ensure_future(self._every(DISK_CHECK_INTERVAL_MS, self.store.check_disk_space)),
            asyncio.ensure_future(self._every(SAMPLE_INTERVAL_MS, self.stats.sample)),
        ]
        gc_policy.acquire(cfg.gc_freeze_enable)  # the pause metric; with gcFreezeEnable, freezes as the estate grows
        self._started = True
        log.info("broker %s (id %d, %s) serving on %s (registered as %s)", cfg.broker_name, cfg.broker_id,
                 cfg.broker_role.value, self.bind_addr, self.broker_addr)

    async def _start_ha(self) -> None:
        cfg = self.config
        if importlib.util.find_spec("ferrymq.ha.service") is None:
            log.warning("ferrymq.ha is not available; running without replication")
            return
        if not cfg.is_slave:
            service_mod = importlib.import_module("ferrymq.ha.service")
            self.ha_service = service_mod.HAService(
                self.store, listen_host=cfg.listen_host, listen_port=cfg.effective_ha_listen_port,
                housekeeping_interval_ms=cfg.ha_housekeeping_interval_ms,
                heartbeat_interval_ms=cfg.ha_send_heartbeat_interval_ms,
                transfer_batch_size=cfg.ha_transfer_batch_size, slave_fallbehind_max=cfg.ha_slave_fallbehind_max,
                ha_secret=cfg.ha_secret, broker_name=cfg.broker_name, tls=self.tls_server)
            await self.ha_service.start()
            self.writer.ha_service = self.ha_service
            return
        client_mod = importlib.import_module("ferrymq.ha.client")
        self.ha_client = client_mod.HAClient(
            self.store, master_ha_addr=self.master_ha_addr, heartbeat_interval_ms=cfg.ha_send_heartbeat_interval_ms,
            housekeeping_interval_ms=cfg.ha_housekeeping_interval_ms,
            on_appended=lambda *_: self.writer.schedule_reput_within(SLAVE_REPUT_DELAY_S),
            ha_secret=cfg.ha_secret, broker_name=cfg.broker_name, ssl_context=self.tls_client_context)
        await self.ha_client.start()
        if importlib.util.find_spec("ferrymq.broker.slave_sync") is not None:
            sync_mod = importlib.import_module("ferrymq.broker.slave_sync")
            self.slave_sync = sync_mod.SlaveSynchronize(self)
            self.slave_sync.master_addr = self.master_addr
            await self.slave_sync.start()

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        for t in self._timers:
            t.cancel()
        for t in self._timers:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._timers = []
        await self.loop_lag.stop()
        gc_policy.release(self.config.gc_freeze_enable)
        if self.registrar is not None:
            await self.registrar.stop()
            await self.registrar.unregister_all()
        await self.schedule.stop()
        await self.timer.stop()
        await self.transactions.stop()
        self.long_polling.stop()
        for part in (self.controller_role, self.slave_sync, self.ha_client, self.ha_service):
            if part is not None:
                try:
                    await part.stop()
                except Exception:
                    log.exception("stopping %s failed", type(part).__name__)
        for srv in (self.fast_server, self.server, self.metrics_server):
            if srv is not None:
                await srv.stop()
        await self.pool.close()
        self.offsets.persist()
        for table in (self.topics, self.groups):
            table.persist_if_dirty()
            table.close_journal()
        self.queue_files.stop()
        self.writer.reput_now()
        await asyncio.get_running_loop().run_in_executor(None, self.flush_service.stop)
        self.store.shutdown()
        log.info("broker %s stopped", self.config.broker_name)

    async def __aenter__(self) -> BrokerController:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- hooks --------------------------------------------------------------------------------------
    def _on_dispatched(self, keys: set[tuple[str, int]] | None) -> None:
        if keys is None:
            self.long_polling.notify_all()
            self.schedule.wake()
            self.timer.wake()
        else:
            self.long_polling.notify(keys)
            if _TIMER_KEY in keys:
                self.timer.wake()

    def wake_schedule(self) -> None:
        self.schedule.wake()

    def _on_connection_closed(self, conn: Connection) -> None:
        self.consumers.channel_closed(conn)
        self.producers.channel_closed(conn)

    def _notify_consumer_ids_changed(self, group: str, channels: list[ClientChannel]) -> None:
        sg = self.groups.table.get(group)
        if sg is not None and not sg.notify_consumer_ids_changed_enable:
            return
        for ch in channels:
            conn = ch.conn
            if getattr(conn, "closed", True):
                continue
            try:
                conn.invoke_oneway(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                           {"consumerGroup": group}))
            except Exception as exc:
                log.debug("notify %s failed: %s", ch.client_id, exc)

    # ---- controller mode --------------------------------------------------------------------------
    def _controller_reput_end(self) -> int:
        """The dispatch bound in controller mode: the confirm offset; nothing new before the role is known."""
        role = self.controller_role
        return role.reput_end_phy_offset() if role is not None else int(self.store.reput_phy_offset)

    def set_store_writable(self, writable: bool) -> None:
        role = BrokerRole.SLAVE
        if writable:
            role = BrokerRole.SYNC_MASTER if self.controller_sync_replication else BrokerRole.ASYNC_MASTER
        self.store_config.broker_role = StoreBrokerRole(role.value)

    async def on_role_changed(self, *, master: bool, master_addr: str | None) -> None:
        """Controller mode: this broker became master (``master``) or a slave of ``master_addr``."""
        cfg = self.config
        role = self.controller_role
        assert role is not None and self.registrar is not None
        if master:
            cfg.broker_role = BrokerRole.SYNC_MASTER if self.controller_sync_replication else BrokerRole.ASYNC_MASTER
            self.set_store_writable(True)
            self.writer.sync_master = self.controller_sync_replication
            self.writer.ha_service = role.ha_master
            self.topics.adopt_replicated(self.store.queues.topic_queue_ids())
            self.topics.replica_queue_count = None
            self.offsets.local_commits = None
            if self.slave_sync is not None:
                await self.slave_sync.stop()
                self.slave_sync = None
            self.master_addr = None
            self.master_ha_addr = None
            self.schedule.start()
            self.timer.start()
            self.transactions.start()
        else:
            cfg.broker_role = BrokerRole.SLAVE
            self.set_store_writable(False)
            self.writer.ha_service = None
            self.writer.sync_master = False
            self.topics.replica_queue_count = self.store.queue_count
            if self.offsets.local_commits is None:
                self.offsets.local_commits = {}
            await self.schedule.stop()
            await self.timer.stop()
            await self.transactions.stop()
            self.master_addr = master_addr
            self.master_ha_addr = role.state.master_ha_addr if role.state is not None else None
            if self.slave_sync is None:
                from ferrymq.broker.slave_sync import SlaveSynchronize
                self.slave_sync = SlaveSynchronize(self)
                await self.slave_sync.start()
            self.slave_sync.master_addr = master_addr
        self.long_polling.notify_all()
        self.registrar.trigger()

    def _on_master_info(self, ha_server_addr: str | None, master_addr: str | None) -> None:
        """A slave's registration answer: where the master is (§6.7)."""
        if self.controller_role is not None:
            return  # controller mode: the controller says where the master is
        self.master_addr = master_addr
        if self.slave_sync is not None:
            self.slave_sync.master_addr = master_addr
        if not self.config.ha_master_address and ha_server_addr and ha_server_addr != self.master_ha_addr:
            self.master_ha_addr = ha_server_addr
            if self.ha_client is not None:
                self.ha_client.update_master_address(ha_server_addr)

    async def _every(self, period_ms: int, fn: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(period_ms / 1000)
            try:
                result = fn()
                if inspect.isawaitable(result):
                    await result
            except OSError as exc:  # a full disk, a missing descriptor: the cause in one line, retried next period
                log.error("periodic task %s failed: %s (retried every %d ms)", getattr(fn, "__qualname__", fn), exc,
                          period_ms)
            except Exception:
                log.exception("periodic task %s failed", getattr(fn, "__name__", fn))

    def _topic_table_copy(self) -> tuple[DataVersion, list[TopicConfig]]:
        """The compressed registration's input: a copy the worker thread encodes while the loop goes on."""
        version = self.topics.data_version
        return DataVersion(version.counter, version.timestamp), list(self.topics.table.values())

    def _scan_channels(self) -> None:
        self.consumers.scan_expired()
        self.producers.scan_expired()

    def _delete_expired(self) -> None:
        self.store.delete_expired_files()

    # ---- info ---------------------------------------------------------------------------------------
    def runtime_info(self) -> dict[str, str]:
        info = {k: str(v) for k, v in self.store.runtime_info().items()}
        info.update({
            "brokerVersion": "407",
            "brokerVersionDesc": BROKER_VERSION,
            "brokerRole": self.config.broker_role.value,
            "controllerMode": str(self.controller_role is not None).lower(),
            "brokerName": self.config.broker_name,
            "brokerId": str(self.config.broker_id),
            "brokerAddr": self.broker_addr,
            "haServerAddr": self.ha_server_addr,
            "dispatchBehindBytes": str(self.store.dispatch_behind_bytes),
            "pullHoldCount": str(self.long_polling.parked_count),
            "bootTimestamp": str(self.start_ms),
        })
        if self.ha_service is not None:
            try:
                slaves = self.ha_service.slave_status()
                info["haSlaveCount"] = str(len(slaves))
                info["haSlaves"] = jsonx.dumps(slaves).decode()
            except Exception:
                pass
        if self.controller_role is not None and self.controller_role.is_master:
            links = self.controller_role.ha_master.link_table()
            info["haSlaveCount"] = str(len(links))
            info["haSlaves"] = jsonx.dumps(links).decode()
        if self.controller_role is not None:
            info["controllerRole"] = jsonx.dumps(self.controller_role.status()).decode()
            info["masterEpoch"] = str(self.controller_role.master_epoch)
        if self.config.is_slave:
            info["masterAddr"] = self.master_addr or ""
            info["masterHaAddr"] = self.master_ha_addr or ""
        open_fds, max_fds = process_fds()  # descriptors vs the limit, beside the store's open files
        info["processOpenFds"], info["processMaxFds"] = str(open_fds), str(max_fds)
        info.update(self.stats.runtime_info())
        info.setdefault("earliestMessageTimeStamp", "0")
        info.update(_exporter_fixed_keys(self.start_ms, self.clock_ms()))
        return info


#: RocketMQ's put-latency buckets of putMessageDistributeTime
PUT_LATENCY_BUCKETS = ("<=0ms", "0~10ms", "10~50ms", "50~100ms", "100~200ms", "200~500ms", "500ms~1s", "1~2s",
                       "2~3s", "3~4s", "4~5s", "5~10s", "10s~")
#: runtime-info keys about Java's thread pools, page-cache lock and transient store pool, which this broker does
#: not have: always 0, so tools that parse every key (rocketmq-exporter) keep working
NO_JAVA_PARTS_KEYS = ("sendThreadPoolQueueSize", "sendThreadPoolQueueCapacity", "sendThreadPoolQueueHeadWaitTimeMills",
                      "pullThreadPoolQueueSize", "pullThreadPoolQueueCapacity", "pullThreadPoolQueueHeadWaitTimeMills",
                      "queryThreadPoolQueueSize", "queryThreadPoolQueueCapacity",
                      "queryThreadPoolQueueHeadWaitTimeMills", "pageCacheLockTimeMills",
                      "remainTransientStoreBufferNumbs", "dispatchMaxBuffer", "getMessageEntireTimeMax",
                      "putMessageEntireTimeMax")


def _exporter_fixed_keys(start_ms: int, now_ms: int) -> dict[str, str]:
    """The runtime-info keys RocketMQ's tools parse that have no measured value here (see docs/metrics.md)."""
    up_s = max(now_ms - start_ms, 0) // 1000
    days, rest = divmod(up_s, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    out = {key: "0" for key in NO_JAVA_PARTS_KEYS}
    out["runtime"] = f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"
    out["startAcceptSendRequestTimeStamp"] = str(start_ms)
    out["putMessageDistributeTime"] = " ".join(f"[{b}]:0" for b in PUT_LATENCY_BUCKETS)
    return out
