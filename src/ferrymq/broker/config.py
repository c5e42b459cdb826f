"""Broker configuration from a RocketMQ-style ``.properties`` file (RocketMQ key names).

| key                            | type   | default                         |
|--------------------------------|--------|---------------------------------|
| see ``FIELDS`` below; docs/configuration.md renders the same table with explanations |

Unknown keys are logged as warnings (``BrokerConfig.warnings``); invalid values raise
``ConfigError`` naming the key. A SLAVE with brokerId 0 is a start-up error; masters get brokerId 0.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass, field, fields
from enum import Enum, StrEnum
from typing import Any

from ferrymq.common.http_auth import check_basic, check_token
from ferrymq.common.properties import read_properties
from ferrymq.common.tls import TLS_KEYS, TlsClientSettings, TlsServerSettings
from ferrymq.common.tls import client_settings as tls_client_settings
from ferrymq.common.tls import server_settings as tls_server_settings
from ferrymq.errors import ConfigError
from ferrymq.remoting.limits import (
    DEFAULT_FRAME_DEADLINE_MS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    DEFAULT_MAX_PARTIAL_BYTES_TOTAL,
    DEFAULT_MAX_WRITE_BUFFER_BYTES,
    DEFAULT_MAX_WRITE_BUFFER_BYTES_TOTAL,
    DEFAULT_WRITE_HIGH_WATER_BYTES,
    ServerLimits,
)
from ferrymq.store.config import COMMIT_LOG_PREALLOCATION_MODES

log = logging.getLogger(__name__)


class BrokerRole(StrEnum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


class FlushDiskType(StrEnum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


DEFAULT_LISTEN_PORT = 10911
DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
#: registerNameServerPeriod is clamped to this range like Java does
REGISTER_PERIOD_MIN_MS = 10_000
REGISTER_PERIOD_MAX_MS = 60_000
MASTER_ID = 0
#: the fast (VIP) port is listenPort minus this
FAST_PORT_OFFSET = 2
#: smallest commit log segment accepted (a segment must hold whole records and its end-of-file blank)
MIN_COMMIT_LOG_FILE_SIZE = 4096
#: a broker.conf must set at least one of these; a file that sets none is not a broker config
REQUIRED_ANY_KEYS = ("brokerName", "brokerClusterName", "storePathRootDir", "listenPort", "namesrvAddr",
                     "brokerRole")


def _meta(key: str, doc: str) -> Any:
    return {"key": key, "doc": doc}


@dataclass(slots=True)
class BrokerConfig:
    broker_cluster_name: str = field(default="DefaultCluster", metadata=_meta(
        "brokerClusterName", "Cluster the broker registers under"))
    broker_name: str = field(default="broker-a", metadata=_meta("brokerName", "Broker (master/slave set) name"))
    broker_id: int = field(default=0, metadata=_meta("brokerId", "0 = master, >= 1 = slave"))
    namesrv_addr: list[str] = field(default_factory=list, metadata=_meta(
        "namesrvAddr", "Name servers, ';'-separated host:port list"))
    listen_port: int = field(default=DEFAULT_LISTEN_PORT, metadata=_meta(
        "listenPort", "Remoting port (0 = any free port); the fast port is listenPort-2"))
    fast_listen_enable: bool = field(default=True, metadata=_meta(
        "fastListenEnable", "Also serve on listenPort-2 (the VIP channel)"))
    broker_ip1: str = field(default="127.0.0.1", metadata=_meta(
        "brokerIP1", "Address registered with the name server and written as store host"))
    listen_host: str = field(default="0.0.0.0", metadata=_meta("listenHost", "Interface to bind (ferrymq extension)"))
    store_path_root_dir: str = field(default="~/store", metadata=_meta("storePathRootDir", "Data directory"))
    store_path_commit_log: str = field(default="", metadata=_meta(
        "storePathCommitLog", "Commit log directory (default <storePathRootDir>/commitlog)"))
    mapped_file_size_commit_log: int = field(default=1024 * 1024 * 1024, metadata=_meta(
        "mappedFileSizeCommitLog", "Commit log file size in bytes"))
    commit_log_preallocation: str = field(default="warm", metadata=_meta(
        "commitLogPreallocation", "warm: zero-fill the next commit log file ahead of need on a background "
        "thread (steadier latency: no journal commit per flush; a SLAVE or SYNC_FLUSH broker uses fallocate); "
        "fallocate: reserve each file's blocks when it is created; sparse. A full disk fails the put cleanly "
        "in the first two. ferrymq extension"))
    mapped_file_size_consume_queue: int = field(default=300_000 * 20, metadata=_meta(
        "mappedFileSizeConsumeQueue", "Consume queue file size in bytes (multiple of 20)"))
    max_open_segment_files: int = field(default=0, metadata=_meta(
        "maxOpenSegmentFiles", "Consume queue files mapped at once (each holds two file descriptors); the least "
        "recently used is closed when another must open and reopened on its next use. 0: an eighth of the "
        "descriptor limit (RLIMIT_NOFILE, raised to its hard limit at start), at most 16384. ferrymq extension"))
    flush_disk_type: FlushDiskType = field(default=FlushDiskType.ASYNC_FLUSH, metadata=_meta(
        "flushDiskType", "ASYNC_FLUSH or SYNC_FLUSH (group commit)"))
    flush_interval_commit_log_ms: int = field(default=500, metadata=_meta(
        "flushIntervalCommitLog", "ASYNC_FLUSH period in ms"))
    sync_flush_timeout_ms: int = field(default=5000, metadata=_meta(
        "syncFlushTimeout", "SYNC_FLUSH wait in ms before FLUSH_DISK_TIMEOUT"))
    slave_timeout_ms: int = field(default=-1, metadata=_meta(
        "slaveTimeout", "SYNC_MASTER wait for a slave ack in ms (default: syncFlushTimeout)"))
    auto_create_topic_enable: bool = field(default=True, metadata=_meta(
        "autoCreateTopicEnable", "Create unknown topics on send through TBW102"))
    auto_create_subscription_group: bool = field(default=True, metadata=_meta(
        "autoCreateSubscriptionGroup", "Create unknown consumer groups on demand"))
    default_topic_queue_nums: int = field(default=8, metadata=_meta(
        "defaultTopicQueueNums", "Queue count of TBW102"))
    file_reserved_time_hours: int = field(default=72, metadata=_meta(
        "fileReservedTime", "Hours a commit log file is kept"))
    max_message_size: int = field(default=4 * 1024 * 1024, metadata=_meta(
        "maxMessageSize", "Largest message body in bytes"))
    register_name_server_period_ms: int = field(default=30_000, metadata=_meta(
        "registerNameServerPeriod", "Registration period in ms (clamped to 10000..60000)"))
    compressed_register: bool = field(default=False, metadata=_meta(
        "compressedRegister", "Send REGISTER_BROKER with the compressed body (RocketMQ 4.9+ name servers and "
        "ferrymq's); false: the plain JSON body every name server reads"))
    broker_role: BrokerRole = field(default=BrokerRole.ASYNC_MASTER, metadata=_meta(
        "brokerRole", "ASYNC_MASTER, SYNC_MASTER or SLAVE. Controller mode: SYNC replication unless "
        "ASYNC_MASTER is written explicitly"))
    metrics_port: int = field(default=-1, metadata=_meta(
        "metricsPort", "Prometheus endpoint port on metricsListenHost (GET /metrics); -1 = off, 0 = any free port"))
    metrics_listen_host: str = field(default="127.0.0.1", metadata=_meta(
        "metricsListenHost", "Interface of the metrics endpoint (an IP address; 127.0.0.1 = this machine only). "
        "Its series name topics and groups: elsewhere, set metricsAuthToken or metricsBasicAuth"))
    metrics_auth_token: str = field(default="", metadata={**_meta(
        "metricsAuthToken", "Bearer token a scrape must present (Authorization: Bearer <token>, else 401); "
        "empty = none"), "secret": True})
    metrics_basic_auth: str = field(default="", metadata={**_meta(
        "metricsBasicAuth", "user:password a scrape may present as HTTP basic auth instead (else 401); "
        "empty = none"), "secret": True})
    gc_freeze_enable: bool = field(default=True, metadata=_meta(
        "gcFreezeEnable", "Freeze live objects out of the garbage collector's full passes: at start, and after a "
        "full pass once the heap doubled (common/gc_policy.py); false: every pass walks the whole heap"))
    enable_grpc_server: bool = field(default=False, metadata=_meta(
        "enableGrpcServer", "Serve RocketMQ 5 clients over gRPC (apache.rocketmq.v2) from the broker process "
        "(local mode, docs/grpc.md); needs namesrvAddr"))
    grpc_server_port: int = field(default=8081, metadata=_meta(
        "grpcServerPort", "Port of the gRPC endpoint on listenHost (enableGrpcServer); 0 = any free port"))
    grpc_fifo_groups: str = field(default="", metadata=_meta(
        "grpcFifoGroups", "Comma-separated consumer groups the gRPC endpoint delivers in FIFO order"))
    grpc_max_delivery_attempts: int = field(default=17, metadata=_meta(
        "grpcMaxDeliveryAttempts", "Deliveries of a message to a gRPC consumer before it moves to %DLQ%<group>"))
    grpc_auto_renew_invisible_time_ms: int = field(default=60_000, metadata=_meta(
        "grpcAutoRenewInvisibleTimeMillis", "Invisible time of a message a 5.x PushConsumer receives (auto_renew), "
        "renewed by the same step while the client works on it (RocketMQ's defaultInvisibleTimeMills)"))
    grpc_renew_ahead_time_ms: int = field(default=10_000, metadata=_meta(
        "grpcRenewAheadTimeMillis", "An auto-renewed message is renewed this long before it would become visible "
        "(RocketMQ's renewAheadTimeMillis); below grpcAutoRenewInvisibleTimeMillis"))
    grpc_renew_max_time_ms: int = field(default=10_800_000, metadata=_meta(
        "grpcRenewMaxTimeMillis", "An auto-renewed message is renewed for at most this long after its delivery, "
        "then delivered again (RocketMQ's renewMaxTimeMillis, 3 h)"))
    ha_listen_port: int = field(default=-1, metadata=_meta(
        "haListenPort", "HA port (default listenPort+1)"))
    ha_master_address: str = field(default="", metadata=_meta(
        "haMasterAddress", "Slave: master HA address host:port (default: learnt from the name server)"))
    ha_send_heartbeat_interval_ms: int = field(default=5000, metadata=_meta(
        "haSendHeartbeatInterval", "HA heartbeat/report period in ms"))
    ha_housekeeping_interval_ms: int = field(default=20_000, metadata=_meta(
        "haHousekeepingInterval", "HA connection idle limit in ms"))
    ha_transfer_batch_size: int = field(default=32 * 1024, metadata=_meta(
        "haTransferBatchSize", "Largest HA transfer body in bytes"))
    ha_slave_fallbehind_max: int = field(default=256 * 1024 * 1024, metadata=_meta(
        "haSlaveFallbehindMax", "SYNC_MASTER: a slave further behind than this is not OK"))
    max_transfer_count_on_message_in_memory: int = field(default=32, metadata=_meta(
        "maxTransferCountOnMessageInMemory", "Most messages one pull returns when the data is hot"))
    max_transfer_bytes_on_message_in_memory: int = field(default=256 * 1024, metadata=_meta(
        "maxTransferBytesOnMessageInMemory", "Most bytes one pull returns when the data is hot"))
    max_transfer_count_on_message_in_disk: int = field(default=8, metadata=_meta(
        "maxTransferCountOnMessageInDisk", "Most messages one pull returns when the data is cold"))
    max_transfer_bytes_on_message_in_disk: int = field(default=64 * 1024, metadata=_meta(
        "maxTransferBytesOnMessageInDisk", "Most bytes one pull returns when the data is cold"))
    slave_sync_interval_ms: int = field(default=10_000, metadata=_meta(
        "slaveSyncInterval", "SLAVE: period of copying topics/offsets/delay offsets/groups from the master, ms"))
    slave_read_enable: bool = field(default=False, metadata=_meta(
        "slaveReadEnable", "Suggest reading from a slave when the master reads from disk"))
    access_message_in_memory_max_ratio: int = field(default=40, metadata=_meta(
        "accessMessageInMemoryMaxRatio", "Percent of RAM considered hot for pulls"))
    message_delay_level: str = field(default=DEFAULT_MESSAGE_DELAY_LEVEL, metadata=_meta(
        "messageDelayLevel", "Delay levels 1..18"))
    long_polling_enable: bool = field(default=True, metadata=_meta(
        "longPollingEnable", "Park pulls that find nothing"))
    short_polling_time_ms: int = field(default=1000, metadata=_meta(
        "shortPollingTimeMills", "Park time when long polling is disabled"))
    enable_property_filter: bool = field(default=False, metadata=_meta(
        "enablePropertyFilter", "Accept SQL92 subscriptions (property filters evaluated at pull time)"))
    store_reply_message_enable: bool = field(default=True, metadata=_meta(
        "storeReplyMessageEnable", "Also store request-reply answers in <cluster>_REPLY_TOPIC"))
    max_reconsume_times: int = field(default=16, metadata=_meta(
        "maxReconsumeTimes",
        "Most retries a message gets before it goes to the DLQ: caps the group's retryMaxTimes and the client's "
        "header value"))
    flush_consumer_offset_interval_ms: int = field(default=5000, metadata=_meta(
        "flushConsumerOffsetInterval", "Consumer offset persist period in ms"))
    flush_delay_offset_interval_ms: int = field(default=10_000, metadata=_meta(
        "flushDelayOffsetInterval", "Delay offset persist period in ms"))
    timer_max_delay_sec: int = field(default=3 * 24 * 3600, metadata=_meta(
        "timerMaxDelaySec", "Longest delay a timer message may ask for, in seconds (a later delivery time is "
        "refused)"))
    timer_roll_window_sec: int = field(default=24 * 3600, metadata=_meta(
        "timerRollWindowSec", "A pending timer message whose record in the commit log is older than this many "
        "seconds is re-written at the log's end (rolled), so retention can delete the old segment; keep it below "
        "fileReservedTime"))
    channel_expired_timeout_ms: int = field(default=120_000, metadata=_meta(
        "channelExpiredTimeout", "Client channels without heartbeat are dropped after this"))
    delete_when: str = field(default="04", metadata=_meta("deleteWhen", "Accepted for compatibility; ignored"))
    broker_permission: int = field(default=6, metadata=_meta("brokerPermission", "Broker perm bits (6 = RW)"))
    disk_max_used_space_ratio: int = field(default=75, metadata=_meta(
        "diskMaxUsedSpaceRatio", "Percent of the store's disk in use above which expired commit log files are "
        "deleted at once"))
    disk_space_clean_forcibly_ratio: int = field(default=85, metadata=_meta(
        "diskSpaceCleanForciblyRatio", "Percent in use (as df shows it) above which the forced cleanup runs: by "
        "default it deletes only commit log files older than fileReservedTime that every subscribed group has "
        "consumed (with cleanFileForciblyEnable, the oldest file even before it expires)"))
    clean_file_forcibly_enable: bool = field(default=False, metadata=_meta(
        "cleanFileForciblyEnable", "Opt in to RocketMQ's forced cleanup: above diskSpaceCleanForciblyRatio the oldest "
        "commit log file is deleted before it expires, even with messages no group has consumed yet (off: a full "
        "disk refuses sends instead)"))
    disk_space_warning_level_ratio: int = field(default=90, metadata=_meta(
        "diskSpaceWarningLevelRatio", "Percent in use above which sends are refused (SERVICE_NOT_AVAILABLE, "
        "remark 'disk is full') until space returns; reads go on"))
    ha_secret: str = field(default="", metadata=_meta(
        "haSecret", "Shared secret of a broker group's HA links: a slave must prove it (HMAC over a nonce, "
        "ha/auth.py) before the master sends it data or counts its acks; empty = the plain RocketMQ protocol"))
    transaction_timeout_ms: int = field(default=6000, metadata=_meta(
        "transactionTimeOut", "A half message undecided this long (ms) is asked about (check-back)"))
    transaction_check_interval_ms: int = field(default=60_000, metadata=_meta(
        "transactionCheckInterval", "Period (ms) of the transaction check-back rounds"))
    transaction_check_max: int = field(default=15, metadata=_meta(
        "transactionCheckMax", "Check-backs of one half message before it is discarded"))
    reject_transaction_message: bool = field(default=False, metadata=_meta(
        "rejectTransactionMessage", "Refuse transactional half messages (NO_PERMISSION)"))
    enable_controller_mode: bool = field(default=False, metadata=_meta(
        "enableControllerMode", "Take the role (master or slave) from the controller (docs/failover.md); "
        "the master replicates SYNC (every SyncStateSet member holds a message before SEND_OK) unless "
        "brokerRole=ASYNC_MASTER is set explicitly"))
    controller_addr: list[str] = field(default_factory=list, metadata=_meta(
        "controllerAddr", "Controllers, ';'-separated host:port list (controller mode)"))
    all_ack_in_sync_state_set: bool = field(default=True, metadata=_meta(
        "allAckInSyncStateSet", "Controller mode, SYNC: a send waits for every SyncStateSet member's ack"))
    read_uncommitted: bool = field(default=False, metadata=_meta(
        "readUnCommitted", "Controller mode: also serve consumers records the SyncStateSet has not confirmed yet "
        "(a failover may take them back; false: only records every SyncStateSet member holds)"))
    in_sync_replicas: int = field(default=1, metadata=_meta(
        "inSyncReplicas", "Controller mode, SYNC without allAckInSyncStateSet: replicas (master included) "
        "that must hold a message before SEND_OK"))
    min_in_sync_replicas: int = field(default=1, metadata=_meta(
        "minInSyncReplicas", "Controller mode: a SyncStateSet smaller than this refuses SYNC sends "
        "(SLAVE_NOT_AVAILABLE)"))
    ha_max_time_slave_not_catchup_ms: int = field(default=15_000, metadata=_meta(
        "haMaxTimeSlaveNotCatchup", "Controller mode: a SyncStateSet member behind the master this long is "
        "removed from the set; a slave that catches up is added back"))
    controller_heartbeat_period_ms: int = field(default=1000, metadata=_meta(
        "controllerHeartbeatPeriodMs", "Controller mode: heartbeat period to the controller"))
    controller_lease_ms: int = field(default=2000, metadata=_meta(
        "controllerLeaseMs", "Controller mode: a master answers SEND_OK only this long after sending its last "
        "heartbeat the controller answered (must stay below the controller's "
        "controllerBrokerHeartbeatTimeoutMs, 3000 by default, so a deposed master is silent before a new one "
        "is elected; every heartbeat declares it and the controller refuses one that is not below)"))
    max_connections: int = field(default=DEFAULT_MAX_CONNECTIONS, metadata=_meta(
        "maxConnections", "Most client connections open at once, per port; more are closed at once"))
    max_connections_per_address: int = field(default=DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, metadata=_meta(
        "maxConnectionsPerAddress", "Most connections from one remote IP, per port"))
    frame_deadline_ms: int = field(default=DEFAULT_FRAME_DEADLINE_MS, metadata=_meta(
        "frameDeadlineMs", "A request frame begun must arrive whole within this, or the connection closes"))
    max_partial_frame_bytes_total: int = field(default=DEFAULT_MAX_PARTIAL_BYTES_TOTAL, metadata=_meta(
        "maxPartialFrameBytesTotal", "Bytes of unfinished frames all connections of a port may hold"))
    write_buffer_high_water_bytes: int = field(default=DEFAULT_WRITE_HIGH_WATER_BYTES, metadata=_meta(
        "writeBufferHighWaterBytes", "Answers buffered for a client past which its requests are not read"))
    max_write_buffer_bytes: int = field(default=DEFAULT_MAX_WRITE_BUFFER_BYTES, metadata=_meta(
        "maxWriteBufferBytesPerConnection", "Answers buffered for one client past which it is disconnected"))
    max_write_buffer_bytes_total: int = field(default=DEFAULT_MAX_WRITE_BUFFER_BYTES_TOTAL, metadata=_meta(
        "maxWriteBufferBytesTotal", "Answers buffered for all non-reading clients of a port; the largest "
        "backlog is disconnected past it"))
    acl_enable: bool = field(default=False, metadata=_meta(
        "aclEnable", "Check every request against plain_acl.yml (signatures, topic/group perms, admin codes)"))
    acl_file: str = field(default="", metadata=_meta(
        "aclFile", "The ACL file (default: plain_acl.yml beside broker.conf, else in <storePathRootDir>/config); "
        "reloaded when it changes"))
    # ---- derived, not read from the file ----
    warnings: list[str] = field(default_factory=list, metadata={"derived": True})
    #: brokerRole was written (broker.conf or an override; in code: pass broker_role_set=True with
    #: broker_role): only then does ASYNC_MASTER opt a controller-mode broker out of SYNC replication
    broker_role_set: bool = field(default=False, metadata={"derived": True})
    #: the TLS keys as written (common/tls.py reads them: tlsServerMode, tls.server.*, tlsEnable, tls.client.*)
    tls_props: dict[str, str] = field(default_factory=dict, metadata={"derived": True})
    #: directory of the broker.conf this config came from ("" when built in code)
    source_dir: str = field(default="", metadata={"derived": True})
    #: the .properties file the broker was started with (``ferry broker -c``); runtime config updates
    #: (UPDATE_BROKER_CONFIG) are written back to it; empty for a broker built in-process
    config_path: str = field(default="", metadata={"derived": True})

    # ----------------------------------------------------------------------------------------
    @property
    def is_slave(self) -> bool:
        return self.broker_role is BrokerRole.SLAVE

    @property
    def root_dir(self) -> str:
        return os.path.expanduser(self.store_path_root_dir)

    @property
    def commit_log_dir(self) -> str:
        return os.path.expanduser(self.store_path_commit_log) if self.store_path_commit_log else os.path.join(
            self.root_dir, "commitlog")

    @property
    def config_dir(self) -> str:
        return os.path.join(self.root_dir, "config")

    @property
    def tls_server(self) -> TlsServerSettings:
        """TLS of the remoting and HA ports (relative certificate paths are taken from broker.conf's directory)."""
        return tls_server_settings(self.tls_props, self.source_dir)

    @property
    def tls_client(self) -> TlsClientSettings | None:
        """TLS of the broker's own connections (name servers, controller, its master's HA port)."""
        return tls_client_settings(self.tls_props, self.source_dir)

    @property
    def acl_path(self) -> str:
        """aclFile (relative to broker.conf's directory), else plain_acl.yml beside broker.conf, else in the
        config directory."""
        if self.acl_file:
            return os.path.join(self.source_dir, os.path.expanduser(self.acl_file))
        return os.path.join(self.source_dir or self.config_dir, "plain_acl.yml")

    @property
    def controller_sync_replication(self) -> bool:
        """Controller mode: does the master replicate SYNC? Yes unless brokerRole=ASYNC_MASTER was set
        explicitly (the field's default, ASYNC_MASTER, is the classic mode's and does not count)."""
        return not (self.broker_role_set and self.broker_role is BrokerRole.ASYNC_MASTER)

    @property
    def effective_ha_listen_port(self) -> int:
        if self.ha_listen_port >= 0:
            return self.ha_listen_port
        return self.listen_port + 1 if self.listen_port > 0 else 0

    @property
    def replica_wait_ms(self) -> int:
        return self.slave_timeout_ms if self.slave_timeout_ms >= 0 else self.sync_flush_timeout_ms

    @property
    def register_period_ms(self) -> int:
        return max(REGISTER_PERIOD_MIN_MS, min(REGISTER_PERIOD_MAX_MS, self.register_name_server_period_ms))

    def validate(self) -> None:
        if self.enable_grpc_server and not 0 <= self.grpc_server_port <= 65535:
            raise ConfigError("grpcServerPort", f"port out of range: {self.grpc_server_port}")
        if self.grpc_max_delivery_attempts < 1:
            raise ConfigError("grpcMaxDeliveryAttempts", f"must be >= 1, got {self.grpc_max_delivery_attempts}")
        if not 0 < self.grpc_renew_ahead_time_ms < self.grpc_auto_renew_invisible_time_ms:
            raise ConfigError("grpcRenewAheadTimeMillis", f"must be > 0 and < grpcAutoRenewInvisibleTimeMillis "
                              f"({self.grpc_auto_renew_invisible_time_ms}), got {self.grpc_renew_ahead_time_ms}")
        if self.grpc_renew_max_time_ms < 0:
            raise ConfigError("grpcRenewMaxTimeMillis", f"must be >= 0, got {self.grpc_renew_max_time_ms}")
        if self.max_open_segment_files < 0:
            raise ConfigError("maxOpenSegmentFiles", f"must be >= 0 (0: derived from the descriptor limit), "
                              f"got {self.max_open_segment_files}")
        if self.commit_log_preallocation not in COMMIT_LOG_PREALLOCATION_MODES:
            raise ConfigError("commitLogPreallocation",
                              f"must be one of {', '.join(COMMIT_LOG_PREALLOCATION_MODES)}, "
                              f"got {self.commit_log_preallocation!r}")
        if self.enable_controller_mode:
            self._validate_controller_mode()
        elif self.is_slave and self.broker_id <= MASTER_ID:
            raise ConfigError("brokerId", "a SLAVE needs brokerId > 0")
        elif not self.is_slave:
            self.broker_id = MASTER_ID
        self._validate_addresses()
        if self.mapped_file_size_consume_queue <= 0 or self.mapped_file_size_consume_queue % 20:
            raise ConfigError("mappedFileSizeConsumeQueue",
                              f"must be a positive multiple of 20, got {self.mapped_file_size_consume_queue}")
        if self.mapped_file_size_commit_log < MIN_COMMIT_LOG_FILE_SIZE:
            raise ConfigError("mappedFileSizeCommitLog", f"must be at least {MIN_COMMIT_LOG_FILE_SIZE} bytes, "
                                                         f"got {self.mapped_file_size_commit_log}")
        for key, value in (("transactionTimeOut", self.transaction_timeout_ms),
                           ("transactionCheckInterval", self.transaction_check_interval_ms),
                           ("transactionCheckMax", self.transaction_check_max)):
            if value <= 0:
                raise ConfigError(key, f"must be positive, got {value}")
        for key, value in (("maxMessageSize", self.max_message_size),
                           ("flushIntervalCommitLog", self.flush_interval_commit_log_ms),
                           ("syncFlushTimeout", self.sync_flush_timeout_ms),
                           ("haSendHeartbeatInterval", self.ha_send_heartbeat_interval_ms),
                           ("haHousekeepingInterval", self.ha_housekeeping_interval_ms),
                           ("haTransferBatchSize", self.ha_transfer_batch_size),
                           ("flushConsumerOffsetInterval", self.flush_consumer_offset_interval_ms),
                           ("flushDelayOffsetInterval", self.flush_delay_offset_interval_ms),
                           ("timerMaxDelaySec", self.timer_max_delay_sec),
                           ("timerRollWindowSec", self.timer_roll_window_sec),
                           ("channelExpiredTimeout", self.channel_expired_timeout_ms),
                           ("slaveSyncInterval", self.slave_sync_interval_ms),
                           ("defaultTopicQueueNums", self.default_topic_queue_nums),
                           ("maxTransferCountOnMessageInMemory", self.max_transfer_count_on_message_in_memory),
                           ("maxTransferBytesOnMessageInMemory", self.max_transfer_bytes_on_message_in_memory),
                           ("maxTransferCountOnMessageInDisk", self.max_transfer_count_on_message_in_disk),
                           ("maxTransferBytesOnMessageInDisk", self.max_transfer_bytes_on_message_in_disk)):
            if value <= 0:
                raise ConfigError(key, f"must be positive, got {value}")
        for key, value in (("diskMaxUsedSpaceRatio", self.disk_max_used_space_ratio),
                           ("diskSpaceCleanForciblyRatio", self.disk_space_clean_forcibly_ratio),
                           ("diskSpaceWarningLevelRatio", self.disk_space_warning_level_ratio)):
            if not 1 <= value <= 99:
                raise ConfigError(key, f"must be a percentage from 1 to 99, got {value}")
        for key, value in (("maxReconsumeTimes", self.max_reconsume_times),
                           ("fileReservedTime", self.file_reserved_time_hours),
                           ("shortPollingTimeMills", self.short_polling_time_ms)):
            if value < 0:
                raise ConfigError(key, f"must not be negative, got {value}")
        if self.slave_timeout_ms < -1:
            raise ConfigError("slaveTimeout", f"must be -1 (use syncFlushTimeout) or >= 0, got {self.slave_timeout_ms}")
        parse_delay_levels(self.message_delay_level)
        self.server_limits()

    def _validate_controller_mode(self) -> None:
        if not self.controller_addr:
            raise ConfigError("controllerAddr", "enableControllerMode=true needs the controllers' host:port list")
        if self.broker_id < 1:
            raise ConfigError("brokerId", "in controller mode brokerId is the replica's identity in its group: "
                                          f"give each broker a distinct id >= 1 (got {self.broker_id}); the "
                                          "master registers as 0 with the name servers by itself")
        for key, value in (("inSyncReplicas", self.in_sync_replicas),
                           ("minInSyncReplicas", self.min_in_sync_replicas),
                           ("haMaxTimeSlaveNotCatchup", self.ha_max_time_slave_not_catchup_ms),
                           ("controllerHeartbeatPeriodMs", self.controller_heartbeat_period_ms),
                           ("controllerLeaseMs", self.controller_lease_ms)):
            if value <= 0:
                raise ConfigError(key, f"must be positive, got {value}")
        if self.controller_heartbeat_period_ms >= self.controller_lease_ms:
            raise ConfigError("controllerHeartbeatPeriodMs", f"must be shorter than controllerLeaseMs "
                                                             f"({self.controller_lease_ms}) or the lease lapses "
                                                             "between heartbeats")

    def server_limits(self) -> ServerLimits:
        """The per-port connection limits (remoting/limits.py) these keys set."""
        try:
            return ServerLimits(
                max_connections=self.max_connections,
                max_connections_per_address=self.max_connections_per_address,
                frame_deadline_ms=self.frame_deadline_ms,
                max_partial_bytes_total=self.max_partial_frame_bytes_total,
                write_high_water_bytes=self.write_buffer_high_water_bytes,
                max_write_buffer_bytes=self.max_write_buffer_bytes,
                max_write_buffer_bytes_total=self.max_write_buffer_bytes_total,
            )
        except ValueError as exc:  # the message starts with the ServerLimits field's name
            key = next(k for attr, k in _LIMIT_KEYS.items() if str(exc).startswith(attr + " "))
            raise ConfigError(key, str(exc)) from None

    def _validate_addresses(self) -> None:
        if not 0 <= self.listen_port <= 65535:
            raise ConfigError("listenPort", f"port out of range: {self.listen_port}")
        if self.metrics_port != -1 and not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metricsPort", f"port out of range (-1 = off): {self.metrics_port}")
        try:
            ipaddress.ip_address(self.metrics_listen_host)
        except ValueError:
            raise ConfigError("metricsListenHost", f"must be an IP address, got {self.metrics_listen_host!r}") from None
        for key, value, check in (("metricsAuthToken", self.metrics_auth_token, check_token),
                                  ("metricsBasicAuth", self.metrics_basic_auth, check_basic)):
            try:
                if value:
                    check(value)
            except ValueError as exc:
                raise ConfigError(key, str(exc)) from None
        if self.ha_listen_port != -1 and not 0 <= self.ha_listen_port <= 65535:
            raise ConfigError("haListenPort", f"must be -1 (listenPort+1) or a port 0..65535, "
                                              f"got {self.ha_listen_port}")
        if self.ha_listen_port == -1 and self.listen_port == 65535:
            raise ConfigError("listenPort", "65535 leaves no room for the HA port listenPort+1: set haListenPort")
        if self.fast_listen_enable and 0 < self.listen_port <= FAST_PORT_OFFSET:
            raise ConfigError("listenPort", f"{self.listen_port} leaves no room for the fast port "
                                            f"listenPort-{FAST_PORT_OFFSET}: use a higher port or fastListenEnable=false")
        try:  # clients decode the registered address (and the offset msgId's store host) as an IP
            ipaddress.ip_address(self.broker_ip1)
        except ValueError:
            raise ConfigError("brokerIP1", f"must be an IP address, got {self.broker_ip1!r}") from None
        for addr in self.namesrv_addr:
            _check_addr("namesrvAddr", addr)
        if self.ha_master_address:
            _check_addr("haMasterAddress", self.ha_master_address)


def _check_addr(key: str, addr: str) -> None:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(key, f"address must be host:port, got {addr!r}")


_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 1m"`` → delays in ms, index 0 = level 1."""
    out: list[int] = []
    for item in text.split():
        unit = _UNITS_MS.get(item[-1:])
        if unit is None or not item[:-1].isdigit():
            raise ConfigError("messageDelayLevel", f"bad delay {item!r} (want <n>s|m|h|d)")
        out.append(int(item[:-1]) * unit)
    if not out:
        raise ConfigError("messageDelayLevel", "no delay levels")
    return out


#: ServerLimits field -> the broker.conf key that sets it (for config errors)
_LIMIT_KEYS = {
    "max_connections_per_address": "maxConnectionsPerAddress", "max_connections": "maxConnections",
    "frame_deadline_ms": "frameDeadlineMs", "max_partial_bytes_total": "maxPartialFrameBytesTotal",
    "write_high_water_bytes": "writeBufferHighWaterBytes",
    "max_write_buffer_bytes_total": "maxWriteBufferBytesTotal",
    "max_write_buffer_bytes": "maxWriteBufferBytesPerConnection",
}

# key name -> dataclass field
FIELDS = {f.metadata["key"]: f for f in fields(BrokerConfig) if "key" in f.metadata}


def _convert(key: str, ftype: Any, raw: str) -> Any:
    raw = raw.strip()
    t = str(ftype)
    if t == "bool":
        low = raw.lower()
        if low in ("true", "false"):
            return low == "true"
        raise ConfigError(key, f"expected true or false, got {raw!r}")
    if t == "int":
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(key, f"expected an integer, got {raw!r}") from None
    if t == "list[str]":
        return [a.strip() for a in raw.split(";") if a.strip()]
    if t == "BrokerRole":
        try:
            return BrokerRole(raw.upper())
        except ValueError:
            raise ConfigError(key, f"expected one of {[r.value for r in BrokerRole]}, got {raw!r}") from None
    if t == "FlushDiskType":
        try:
            return FlushDiskType(raw.upper())
        except ValueError:
            raise ConfigError(key, f"expected ASYNC_FLUSH or SYNC_FLUSH, got {raw!r}") from None
    return raw


def from_properties(props: dict[str, str]) -> BrokerConfig:
    cfg = BrokerConfig()
    for key, raw in props.items():
        if key in TLS_KEYS:
            cfg.tls_props[key] = raw
            continue
        f = FIELDS.get(key)
        if f is None:
            msg = f"unknown config key {key!r} ignored"
            cfg.warnings.append(msg)
            log.warning(msg)
            continue
        setattr(cfg, f.name, _convert(key, f.type, raw))
        if key == "brokerRole":
            cfg.broker_role_set = True
    cfg.validate()
    cfg.tls_server  # noqa: B018 -- a bad mode or client-auth value is a ConfigError now, not at start
    cfg.tls_client  # noqa: B018
    return cfg


def load_config(path: str, overrides: dict[str, str] | None = None) -> BrokerConfig:
    props = read_properties(path)
    if not any(key in props for key in REQUIRED_ANY_KEYS):
        raise ConfigError("-c", f"{path} sets none of {', '.join(REQUIRED_ANY_KEYS)}: not a broker config")
    props.update(overrides or {})
    cfg = from_properties(props)
    cfg.source_dir = os.path.dirname(os.path.abspath(path))
    cfg.config_path = os.path.abspath(path)
    return cfg


def config_table() -> list[tuple[str, str, str]]:
    """(key, default, doc) rows for docs/configuration.md."""
    cfg = BrokerConfig()
    rows = []
    for key, f in FIELDS.items():
        value = getattr(cfg, f.name)
        if isinstance(value, Enum):
            value = value.value
        elif isinstance(value, list):
            value = ";".join(value)
        elif isinstance(value, bool):
            value = str(value).lower()
        rows.append((key, str(value), f.metadata["doc"]))
    return rows
