"""Store configuration (RocketMQ MessageStoreConfig names in snake_case, units last)."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
CQ_STORE_UNIT_SIZE = 20
_TIME_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class FlushDiskType(enum.StrEnum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(enum.StrEnum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


def _total_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def parse_delay_levels(text: str) -> dict[int, int]:
    """``"1s 5s 1m"`` -> {1: 1000, 2: 5000, 3: 60000}. ValueError on a bad entry."""
    table: dict[int, int] = {}
    for level, item in enumerate(text.split(), start=1):
        unit = item[-1:]
        if unit not in _TIME_UNITS_MS or not item[:-1].isdigit():
            raise ValueError(f"bad delay level {item!r} in {text!r}")
        table[level] = int(item[:-1]) * _TIME_UNITS_MS[unit]
    return table


COMMIT_LOG_PREALLOCATION_MODES = ("warm", "fallocate", "sparse")


@dataclass
class StoreConfig:
    store_path_root_dir: str
    store_path_commit_log: str = ""  # "" -> <root>/commitlog
    mapped_file_size_commit_log: int = 1 << 30
    mapped_file_size_consume_queue: int = 300_000 * CQ_STORE_UNIT_SIZE
    #: how new commit log segments get their blocks: "warm" (zero-filled one segment ahead on a background
    #: thread, segment_warmer.py; a SLAVE or SYNC_FLUSH store uses "fallocate"), "fallocate" (reserved when created,
    #: mapped_file.py) or "sparse"
    commit_log_preallocation: str = "warm"
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER
    offset_check_in_slave: bool = False
    flush_interval_commit_log_ms: int = 500
    flush_commit_log_least_pages: int = 4
    flush_interval_consume_queue_ms: int = 1000
    sync_flush_timeout_ms: int = 5000
    file_reserved_time_hours: int = 72
    max_message_size: int = 4 * 1024 * 1024
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_disk: int = 8
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    access_message_in_memory_max_ratio: int = 40
    total_memory_bytes: int = field(default_factory=_total_memory_bytes)
    check_crc_on_recover: bool = True
    message_index_enable: bool = True
    index_hash_slot_num: int = 5_000_000
    index_max_num: int = 20_000_000
    max_msgs_num_batch: int = 64  # QUERY_MESSAGE result cap
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    max_properties_size: int = 32767
    max_topic_length: int = 127
    recover_segments_normal: int = 3  # segments CRC-walked on a normal (clean) start
    dispatch_pending_max: int = 100_000  # master's in-memory dispatch queue bound
    #: consume queue files mapped (and holding descriptors) at once; 0: derived from RLIMIT_NOFILE
    #: (queue_table.default_max_open_segment_files)
    max_open_segment_files: int = 0
    #: percent of the store's file system in use above which expired segments are deleted at once
    disk_max_used_space_ratio: int = 75
    #: percent above which the forced cleanup runs (message_store.check_disk_space)
    disk_space_clean_forcibly_ratio: int = 85
    #: RocketMQ's forced cleanup (opt-in): above disk_space_clean_forcibly_ratio the oldest segment is deleted even
    #: before it expires, consumed or not. Off: the forced cleanup never deletes a segment younger than
    #: file_reserved_time_hours or holding messages a subscribed group has not consumed; a full disk refuses sends
    clean_file_forcibly_enable: bool = False
    #: percent above which the store refuses puts (DISK_FULL) until usage falls below it again
    disk_space_warning_level_ratio: int = 90

    def __post_init__(self) -> None:
        if not self.store_path_commit_log:
            self.store_path_commit_log = os.path.join(self.store_path_root_dir, "commitlog")
        self.flush_disk_type = FlushDiskType(self.flush_disk_type)
        self.broker_role = BrokerRole(self.broker_role)
        # a consume queue file holds whole 20-byte units
        unit = CQ_STORE_UNIT_SIZE
        self.mapped_file_size_consume_queue = -(-self.mapped_file_size_consume_queue // unit) * unit
        if self.commit_log_preallocation not in COMMIT_LOG_PREALLOCATION_MODES:
            raise ValueError(f"commit_log_preallocation must be one of {', '.join(COMMIT_LOG_PREALLOCATION_MODES)}")
        if self.mapped_file_size_commit_log < 4096:
            raise ValueError("mapped_file_size_commit_log must be at least 4096 bytes")
        if self.max_open_segment_files < 0:
            raise ValueError("max_open_segment_files must be >= 0 (0: derived from RLIMIT_NOFILE)")
        if self.index_hash_slot_num <= 0 or self.index_max_num <= 1:
            raise ValueError("index_hash_slot_num must be > 0 and index_max_num > 1")
        parse_delay_levels(self.message_delay_level)
        for name in ("disk_max_used_space_ratio", "disk_space_clean_forcibly_ratio",
                     "disk_space_warning_level_ratio"):
            if not 1 <= getattr(self, name) <= 99:
                raise ValueError(f"{name} must be a percentage from 1 to 99")

    @property
    def store_path_consume_queue(self) -> str:
        return os.path.join(self.store_path_root_dir, "consumequeue")

    @property
    def store_path_index(self) -> str:
        return os.path.join(self.store_path_root_dir, "index")

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "checkpoint")

    @property
    def queue_offsets_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "queueoffsets")

    @property
    def index_manifest_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "indexfiles")

    @property
    def abort_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "abort")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "lock")

    @property
    def is_slave(self) -> bool:
        return self.broker_role is BrokerRole.SLAVE

    def delay_level_table_ms(self) -> dict[int, int]:
        return parse_delay_levels(self.message_delay_level)

    @property
    def memory_for_hot_data_bytes(self) -> int:
        """Bytes behind the commit log head still counted as "in memory" (§2.7 PULL limits)."""
        return int(self.total_memory_bytes * (self.access_message_in_memory_max_ratio / 100.0))
