"""HA limits and intervals (RocketMQ MessageStoreConfig ``ha*`` names in snake_case, units last)."""

from __future__ import annotations

from dataclasses import dataclass

#: Master: size-0 heartbeat after this long without a write. Slave: periodic report interval.
DEFAULT_HEARTBEAT_INTERVAL_MS = 5000
#: Master drops a slave it has not heard from for this long; the slave drops a silent master.
DEFAULT_HOUSEKEEPING_INTERVAL_MS = 20000
#: Largest body of one master -> slave transfer.
DEFAULT_TRANSFER_BATCH_SIZE = 32 * 1024
#: ``is_slave_ok`` is False when the slave is this many bytes (or more) behind.
DEFAULT_SLAVE_FALLBEHIND_MAX = 256 * 1024 * 1024
#: Slave, while catching up (a read ends inside the next transfer): report at least every this many
#: appended bytes ... (a read that ends on a transfer boundary reports at once, always)
DEFAULT_REPORT_EVERY_BYTES = 1024 * 1024
#: ... or this long after the previous report.
DEFAULT_REPORT_MAX_DELAY_MS = 10
#: Slave: wait between connection attempts while no connection is up.
DEFAULT_RECONNECT_INTERVAL_MS = 5000
#: Master: how often each slave's lag is logged (printMasterAndSlaveDiff).
DEFAULT_DIFF_LOG_INTERVAL_MS = 60_000


@dataclass(frozen=True, slots=True)
class HAConfig:
    heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS
    housekeeping_interval_ms: int = DEFAULT_HOUSEKEEPING_INTERVAL_MS
    transfer_batch_size: int = DEFAULT_TRANSFER_BATCH_SIZE

    def __post_init__(self) -> None:
        if self.heartbeat_interval_ms <= 0:
            raise ValueError("heartbeat_interval_ms must be > 0")
        if self.housekeeping_interval_ms <= 0:
            raise ValueError("housekeeping_interval_ms must be > 0")
        if self.transfer_batch_size <= 0:
            raise ValueError("transfer_batch_size must be > 0")
