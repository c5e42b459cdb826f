"""Runtime broker configuration (GET_BROKER_CONFIG / UPDATE_BROKER_CONFIG): every key as properties text,
and the update of the keys that are safe to change while the broker runs.

| key (runtime-safe)                    | takes effect                                           |
|---------------------------------------|--------------------------------------------------------|
| brokerPermission                      | at once: re-registered with every topic's perm masked (6 = RW, 4 = read only) |
| maxMessageSize                        | next send (broker check and store check)               |
| flushIntervalCommitLog                | next ASYNC_FLUSH round                                 |
| syncFlushTimeout, slaveTimeout        | next SYNC_FLUSH / SYNC_MASTER wait                     |
| longPollingEnable, shortPollingTimeMills | next parked pull                                    |
| slaveReadEnable                       | next pull answer                                       |
| enablePropertyFilter                  | next heartbeat / pull / CHECK_CLIENT_CONFIG            |
| storeReplyMessageEnable               | next reply                                             |
| maxReconsumeTimes                     | next send-back / retry send                            |
| rejectTransactionMessage              | next half message                                      |
| transactionTimeOut, transactionCheckInterval, transactionCheckMax | next check-back round      |
| autoCreateTopicEnable, autoCreateSubscriptionGroup | next send / heartbeat of an unknown name  |
| channelExpiredTimeout                 | next client channel scan                               |
| fileReservedTime, diskMaxUsedSpaceRatio, diskSpaceCleanForciblyRatio, cleanFileForciblyEnable, diskSpaceWarningLevelRatio | next disk check (1 s) / expiry round (10 s) |
| maxTransfer{Count,Bytes}OnMessageIn{Memory,Disk} | next pull                                   |

Every other key is refused (the remark names it): ports, names, paths, roles and store geometry need a
restart. An update is all or nothing: one refused key, one unknown key or one invalid value and nothing
changes. An accepted update is written to the broker's config file (``ferry broker -c``): the lines of the
updated keys are replaced in place, keys the file lacked are appended, comments and other lines are kept.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from ferrymq.broker.config import FIELDS, BrokerConfig, _convert
from ferrymq.broker.transaction import TransactionConfig
from ferrymq.common.properties import update_properties_file
from ferrymq.common.topic import PERM_READ, PERM_WRITE
from ferrymq.errors import ConfigError

if TYPE_CHECKING:
    from ferrymq.broker.context import RuntimeConfigContext

log = logging.getLogger(__name__)


def _store(attr: str) -> Callable[[RuntimeConfigContext, Any], None]:
    def apply(ctl: RuntimeConfigContext, value: Any) -> None:
        setattr(ctl.store_config, attr, value)
    return apply


def _flush_interval(ctl: RuntimeConfigContext, value: Any) -> None:
    ctl.flush_service.interval_ms = value
    ctl.store_config.flush_interval_commit_log_ms = value


def _transactions(ctl: RuntimeConfigContext, _value: Any) -> None:
    c = ctl.config
    ctl.transactions.config = TransactionConfig(c.transaction_timeout_ms, c.transaction_check_interval_ms,
                                                c.transaction_check_max)


def _auto_create_topic(ctl: RuntimeConfigContext, value: Any) -> None:
    ctl.topics.auto_create_topic_enable = value


def _auto_create_group(ctl: RuntimeConfigContext, value: Any) -> None:
    ctl.groups.auto_create = value


def _channel_expiry(ctl: RuntimeConfigContext, value: Any) -> None:
    ctl.consumers.channel_expired_ms = value
    ctl.producers.channel_expired_ms = value


def _broker_permission(ctl: RuntimeConfigContext, _value: Any) -> None:
    """As RocketMQ: the permission masks every topic's perm in the registration, and the broker registers
    at once with a new data version, so the name servers route (or stop routing) writes to it."""
    registrar = ctl.registrar
    if registrar is None:
        return
    registrar._topic_wrapper = lambda: masked_topic_wrapper(ctl)  # noqa: SLF001 - the registration body source
    ctl.topics.data_version.next_version(ctl.clock_ms())
    registrar.trigger()


def masked_topic_wrapper(ctl: RuntimeConfigContext) -> dict[str, Any]:
    """The registration's TopicConfigSerializeWrapper with each perm ANDed with brokerPermission."""
    obj = ctl.topics.encode()
    perm = ctl.config.broker_permission
    if perm & FULL_PERM == FULL_PERM:
        return obj
    table = obj.get("topicConfigTable") or {}
    obj["topicConfigTable"] = {name: {**tc, "perm": int(tc.get("perm", FULL_PERM)) & perm} for name, tc in table.items()}
    return obj


def _config_only(_ctl: RuntimeConfigContext, _value: Any) -> None:
    """The broker reads the key from its BrokerConfig on every use."""


#: read and write permission bits
FULL_PERM = PERM_READ | PERM_WRITE

#: runtime-safe key -> what else to update once BrokerConfig holds the new value
RUNTIME_KEYS: dict[str, Callable[[RuntimeConfigContext, Any], None]] = {
    "brokerPermission": _broker_permission,
    "maxMessageSize": _store("max_message_size"),
    "flushIntervalCommitLog": _flush_interval,
    "syncFlushTimeout": _store("sync_flush_timeout_ms"),
    "slaveTimeout": _config_only,
    "longPollingEnable": _config_only,
    "shortPollingTimeMills": _config_only,
    "slaveReadEnable": _config_only,
    "enablePropertyFilter": _config_only,
    "storeReplyMessageEnable": _config_only,
    "maxReconsumeTimes": _config_only,
    "rejectTransactionMessage": _config_only,
    "transactionTimeOut": _transactions,
    "transactionCheckInterval": _transactions,
    "transactionCheckMax": _transactions,
    "autoCreateTopicEnable": _auto_create_topic,
    "autoCreateSubscriptionGroup": _auto_create_group,
    "channelExpiredTimeout": _channel_expiry,
    "fileReservedTime": _store("file_reserved_time_hours"),
    "diskMaxUsedSpaceRatio": _store("disk_max_used_space_ratio"),
    "diskSpaceCleanForciblyRatio": _store("disk_space_clean_forcibly_ratio"),
    "cleanFileForciblyEnable": _store("clean_file_forcibly_enable"),
    "diskSpaceWarningLevelRatio": _store("disk_space_warning_level_ratio"),
    "maxTransferCountOnMessageInMemory": _store("max_transfer_count_on_message_in_memory"),
    "maxTransferBytesOnMessageInMemory": _store("max_transfer_bytes_on_message_in_memory"),
    "maxTransferCountOnMessageInDisk": _store("max_transfer_count_on_message_in_disk"),
    "maxTransferBytesOnMessageInDisk": _store("max_transfer_bytes_on_message_in_disk"),
}

#: what a refusal says to do instead
RESTART_HINT = "set it in the broker's config file and restart the broker"


def format_value(value: Any) -> str:
    """A config value as properties text (the form the config file takes)."""
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    return str(value)


def config_properties(cfg: BrokerConfig) -> dict[str, str]:
    """Every key of the broker's configuration with its current value, in the order of docs/configuration.md."""
    return {key: format_value(getattr(cfg, f.name)) for key, f in FIELDS.items()}


def properties_text(props: dict[str, str]) -> str:
    """``key=value`` lines, as RocketMQ's admin tools exchange them."""
    return "".join(f"{k}={v}\n" for k, v in props.items())


@dataclass(slots=True)
class UpdateResult:
    #: keys applied (after conversion, as properties text)
    applied: dict[str, str] = field(default_factory=dict)
    #: None when accepted, else why nothing was changed
    refused: str | None = None
    #: the config file the update was written to ("" when the broker has none)
    persisted_to: str = ""


def apply_update(ctl: RuntimeConfigContext, props: dict[str, str]) -> UpdateResult:
    """Check every key (known, runtime-safe, valid value, the whole config still valid), then apply all of
    them and write them to the config file; or change nothing and say why."""
    unknown = sorted(k for k in props if k not in FIELDS)
    if unknown:
        return UpdateResult(refused=f"unknown config key(s): {', '.join(unknown)}")
    fixed = sorted(k for k in props if k not in RUNTIME_KEYS)
    if fixed:
        return UpdateResult(refused=f"not updatable at runtime: {', '.join(fixed)} ({RESTART_HINT}); runtime-safe "
                                    f"keys: {', '.join(RUNTIME_KEYS)}")
    cfg = ctl.config
    trial = copy.copy(cfg)
    values: dict[str, Any] = {}
    try:
        for key, raw in props.items():
            f = FIELDS[key]
            values[key] = _convert(key, f.type, raw)
            setattr(trial, f.name, values[key])
        trial.validate()
    except ConfigError as exc:
        return UpdateResult(refused=f"invalid value: {exc}")
    result = UpdateResult()
    for key, value in values.items():
        setattr(cfg, FIELDS[key].name, value)
    for key, value in values.items():
        RUNTIME_KEYS[key](ctl, value)
        result.applied[key] = format_value(value)
    log.info("broker config updated at runtime: %s", ", ".join(f"{k}={v}" for k, v in result.applied.items()))
    if cfg.config_path:
        try:
            update_properties_file(cfg.config_path, result.applied)
            result.persisted_to = cfg.config_path
        except OSError as exc:
            log.error("runtime config update applied but not written to %s: %s", cfg.config_path, exc)
    return result
