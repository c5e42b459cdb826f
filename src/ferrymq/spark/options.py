"""Option parsing for the Spark source and sink (pure Python, no pyspark import).

Spark hands options as a case-insensitive mapping of strings. Every option is checked here, on the
driver, before any query runs; a bad or conflicting value raises ``ConfigError`` naming the option.

Source options (names follow Spark's Kafka source, queue identity follows RocketMQ):

| option                 | default                                   | query  | meaning                                         |
|------------------------|-------------------------------------------|--------|-------------------------------------------------|
| nameServer             | required                                  | both   | ``host:port[;host:port]``                       |
| subscribe / topic      | one of subscribe, subscribePattern, assign | both   | comma-separated topics (``topic`` = alias)       |
| subscribePattern       |                                           | both   | Python regex, matched in full against topic list |
| assign                 |                                           | both   | JSON ``{"T": [0, "broker-a:1"]}``                |
| startingOffsets        | earliest (batch) / latest (stream)        | both   | earliest, latest or offsets JSON                |
| endingOffsets          | latest                                    | batch  | latest or offsets JSON (-1 = latest)            |
| startingTimestamp      |                                           | both   | ms since epoch, every queue; wins over the two   |
|                        |                                           |        | options below                                   |
| startingOffsetsByTimestamp |                                       | both   | JSON of ms per queue (all queues); wins over     |
|                        |                                           |        | startingOffsets                                 |
| startingOffsetsByTimestampStrategy | error                         | both   | no message at/after the time: error, or latest  |
| endingTimestamp        |                                           | batch  | ms since epoch, every queue (exclusive end)      |
| endingOffsetsByTimestamp |                                         | batch  | JSON of ms per queue (all queues)                |
| fetchOffset.numRetries | 3                                         | both   | retries of a failed offset/route look-up        |
| fetchOffset.retryIntervalMs | 10                                   | both   | pause between those retries                     |
| maxOffsetsPerTrigger   |                                           | stream | row cap per micro-batch, split by lag           |
| minOffsetsPerTrigger   |                                           | stream | wait for this many rows ...                     |
| maxTriggerDelay        | 15m                                       | stream | ... but no longer than this                     |
| minPartitions          |                                           | both   | split queue ranges into at least N tasks        |
| failOnDataLoss         | true                                      | both   | fail (true) or warn and skip (false)            |
| subExpression          | ``*``                                     | both   | tag filter ``a || b``, or a SQL92 selector      |
| expressionType         | TAG                                       | both   | TAG, or SQL92 (filtered by the broker)          |
| pullBatchSize          | 1024                                      | both   | max messages asked per PULL request             |
| pullTimeoutMs          | 10000                                     | both   | timeout of one PULL / metadata request          |
| pullPipelineDepth      | 32                                        | both   | concurrent PULL requests per task               |
| readFromSlave          | whenMasterDown                            | both   | never, whenMasterDown, prefer                   |
| group                  | ``spark-ferrymq-source``                  | both   | consumer group named in PULL requests           |
| accessKey, secretKey   |                                           | both   | ACL credentials: every request is signed        |
| tls                    | false (true when a tls*Path is set)       | both   | TLS to name servers and brokers                 |
| tlsTrustCertPath       |                                           | both   | CA file the servers' certificates must chain to |
| tlsCertPath, tlsKeyPath|                                           | both   | client certificate (mutual TLS)                 |

Timestamps resolve with SEARCH_OFFSET_BY_TIMESTAMP to the first offset stored at or after the time. Starting
precedence is Kafka's: startingTimestamp, then startingOffsetsByTimestamp, then startingOffsets (a lower one is
ignored with a log line); ending: endingTimestamp, endingOffsetsByTimestamp, endingOffsets. An ending time
with no message at or after it ends at the latest offset.

Offsets JSON: ``{"topic": {"brokerName:queueId": offset}}`` (also accepted: the old connector's nested
``{"topic": {"brokerName": {"queueId": offset}}}``); -2 = earliest, -1 = latest.

Sink options: nameServer (required), topic (wins over the column), group (producer group),
sendTimeoutMs, sendPipelineDepth, and the same accessKey/secretKey/tls* options; exactlyOnce (false) and
exactlyOnce.timeoutMs (1 h): the exactly-once sink of decision 0006 (needs the topic option).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ferrymq.common.sql92 import EXPRESSION_TYPE_SQL92, EXPRESSION_TYPE_TAG
from ferrymq.errors import ConfigError

EARLIEST = -2
LATEST = -1

#: offsets one pipeline slot covers (a chunk; a broker answers at most its per-pull caps, see docs/spark.md)
DEFAULT_PULL_BATCH_SIZE = 1024
MAX_PULL_BATCH_SIZE = 10_000
DEFAULT_PULL_TIMEOUT_MS = 10_000
DEFAULT_PULL_PIPELINE_DEPTH = 32
MAX_PULL_PIPELINE_DEPTH = 256
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
DEFAULT_FETCH_OFFSET_NUM_RETRIES = 3
DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS = 10
TIMESTAMP_STRATEGIES = ("error", "latest")
DEFAULT_SOURCE_GROUP = "spark-ferrymq-source"
DEFAULT_SINK_GROUP = "spark-ferrymq-sink"
DEFAULT_SEND_TIMEOUT_MS = 10_000
DEFAULT_SEND_PIPELINE_DEPTH = 64
#: how long a batch's half messages may wait for their commit (and a crashed driver for its restart)
DEFAULT_EXACTLY_ONCE_TIMEOUT_MS = 3_600_000
#: the smallest exactlyOnce.timeoutMs: the commit refuses batches within a minute of it
MIN_EXACTLY_ONCE_TIMEOUT_MS = 120_000
MAX_SEND_PIPELINE_DEPTH = 4096

READ_FROM_SLAVE_CHOICES = ("never", "whenMasterDown", "prefer")

#: ACL credentials and TLS, for the source and the sink (``ClientSecurity``)
SECURITY_OPTION_NAMES = ("accessKey", "secretKey", "tls", "tlsTrustCertPath", "tlsCertPath", "tlsKeyPath")
SOURCE_OPTION_NAMES = (
    "nameServer", "subscribe", "topic", "subscribePattern", "assign", "startingOffsets", "endingOffsets",
    "startingTimestamp", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions",
    "failOnDataLoss", "subExpression", "pullBatchSize", "pullTimeoutMs", "pullPipelineDepth", "readFromSlave",
    "group", "expressionType", "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
    "endingTimestamp", "endingOffsetsByTimestamp", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
    *SECURITY_OPTION_NAMES,
)  # fmt: skip
SINK_OPTION_NAMES = ("nameServer", "topic", "group", "sendTimeoutMs", "sendPipelineDepth", "exactlyOnce",
                     "exactlyOnce.timeoutMs", *SECURITY_OPTION_NAMES)
#: Options Spark itself may pass along (streaming sinks get checkpointLocation, file-like calls a path).
SPARK_OPTION_NAMES = ("path", "checkpointLocation", "queryName")
SOURCE_OPTIONS = frozenset(k.lower() for k in SOURCE_OPTION_NAMES + SPARK_OPTION_NAMES)
SINK_OPTIONS = frozenset(k.lower() for k in SINK_OPTION_NAMES + SPARK_OPTION_NAMES)
STREAM_ONLY_OPTIONS = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
BATCH_ONLY_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")

_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


# ---- queue keys -----------------------------------------------------------------------------------


def queue_key(broker_name: str, queue_id: int) -> str:
    """The offset-JSON key of a queue: ``brokerName:queueId``."""
    return f"{broker_name}:{queue_id}"


def parse_queue_key(option: str, key: str) -> tuple[str, int]:
    broker, sep, qid = key.rpartition(":")
    if not sep or not broker or not qid.lstrip("-").isdigit() or int(qid) < 0:
        raise ConfigError(option, f"queue key {key!r} must look like 'brokerName:queueId'")
    return broker, int(qid)


# ---- small parsers --------------------------------------------------------------------------------


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive lookup (Spark's CaseInsensitiveDict, or a plain dict in tests)."""
    value = options.get(name)
    if value is None:
        lowered = name.lower()
        for k, v in options.items():
            if k.lower() == lowered:
                value = v
                break
    return None if value is None else str(value)


def _int(
    options: Mapping[str, str], name: str, default: int | None, lo: int, hi: int | None = None
) -> int | None:
    raw = _get(options, name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {raw!r}") from None
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise ConfigError(name, f"must be {bound}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(name, f"must be true or false, got {raw!r}")


def parse_duration_ms(name: str, raw: str) -> int:
    """``500ms``, ``30s``, ``15m``, ``1h``, ``1d`` or a bare number of milliseconds."""
    match = _DURATION.match(raw)
    if not match:
        raise ConfigError(name, f"must be a duration like 30s, 15m or 500ms, got {raw!r}")
    unit = (match.group(2) or "ms").lower()
    return int(match.group(1)) * _DURATION_MS[unit]


def _json(name: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ConfigError(name, f"is not valid JSON ({exc}): {raw!r}") from None


# ---- offsets specs --------------------------------------------------------------------------------

#: topic -> "brokerName:queueId" -> offset (>= 0, or EARLIEST / LATEST)
OffsetsMap = dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``earliest``, ``latest`` or explicit per-queue offsets."""

    kind: str  # "earliest" | "latest" | "specific"
    offsets: OffsetsMap = field(default_factory=dict)

    def for_queue(self, topic: str, broker_name: str, queue_id: int, default: int) -> int:
        """The offset this spec asks for a queue (EARLIEST/LATEST/explicit); ``default`` if unnamed."""
        if self.kind == "earliest":
            return EARLIEST
        if self.kind == "latest":
            return LATEST
        return self.offsets.get(topic, {}).get(queue_key(broker_name, queue_id), default)


def parse_offsets(name: str, raw: str, allow_earliest: bool = True, allow_latest: bool = True) -> OffsetSpec:
    text = raw.strip()
    if text.lower() == "earliest":
        if not allow_earliest:
            raise ConfigError(name, "'earliest' is not allowed here")
        return OffsetSpec("earliest")
    if text.lower() == "latest":
        if not allow_latest:
            raise ConfigError(name, "'latest' is not allowed here")
        return OffsetSpec("latest")
    obj = _json(name, text)
    if not isinstance(obj, dict) or not obj:
        raise ConfigError(name, 'must be earliest, latest or JSON like {"topic": {"broker-a:0": 42}}')
    result: OffsetsMap = {}
    for topic, queues in obj.items():
        if not isinstance(queues, dict):
            raise ConfigError(name, f"topic {topic!r} must map to an object of queue offsets")
        flat: dict[str, int] = {}
        for key, value in queues.items():
            if isinstance(value, dict):  # nested form: broker -> queueId -> offset
                for qid, off in value.items():
                    if not str(qid).isdigit():
                        raise ConfigError(name, f"queue id {qid!r} of broker {key!r} must be a number")
                    flat[queue_key(key, int(qid))] = _offset_value(name, off, allow_earliest, allow_latest)
            else:
                broker, qid_int = parse_queue_key(name, key)
                flat[queue_key(broker, qid_int)] = _offset_value(name, value, allow_earliest, allow_latest)
        result[str(topic)] = flat
    return OffsetSpec("specific", result)


def _offset_value(name: str, value: Any, allow_earliest: bool, allow_latest: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, f"offsets must be integers, got {value!r}")
    if value == EARLIEST and not allow_earliest:
        raise ConfigError(name, "-2 (earliest) is not allowed here")
    if value == LATEST and not allow_latest:
        raise ConfigError(name, "-1 (latest) is not allowed here")
    if value < EARLIEST:
        raise ConfigError(name, f"offset {value} is invalid (use >= 0, -2 = earliest, -1 = latest)")
    return value


def parse_timestamps(name: str, raw: str) -> OffsetsMap:
    """``{"topic": {"brokerName:queueId": ms}}``: a time (ms since the epoch, >= 0) per queue."""
    obj = _json(name, raw.strip())
    if not isinstance(obj, dict) or not obj:
        raise ConfigError(name, 'must be JSON like {"topic": {"broker-a:0": 1700000000000}}')
    result: OffsetsMap = {}
    for topic, queues in obj.items():
        if not isinstance(queues, dict) or not queues:
            raise ConfigError(name, f"topic {topic!r} must map to an object of queue timestamps")
        flat: dict[str, int] = {}
        for key, value in queues.items():
            broker, qid = parse_queue_key(name, str(key))
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(name, f"timestamps must be integers >= 0 (ms since the epoch), got {value!r}")
            flat[queue_key(broker, qid)] = value
        result[str(topic)] = flat
    return result


# ---- source --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assignment:
    """topic -> queue selectors: ``(None, qid)`` = that queue id on every broker, or ``(broker, qid)``."""

    queues: dict[str, tuple[tuple[str | None, int], ...]]

    def selects(self, topic: str, broker_name: str, queue_id: int) -> bool:
        for broker, qid in self.queues.get(topic, ()):
            if qid == queue_id and (broker is None or broker == broker_name):
                return True
        return False


def parse_assign(raw: str) -> Assignment:
    obj = _json("assign", raw)
    if not isinstance(obj, dict) or not obj:
        raise ConfigError("assign", 'must be JSON like {"topicA": [0, 1], "topicB": ["broker-a:0"]}')
    queues: dict[str, tuple[tuple[str | None, int], ...]] = {}
    for topic, items in obj.items():
        if not isinstance(items, list) or not items:
            raise ConfigError("assign", f"topic {topic!r} must map to a non-empty list of queues")
        selected: list[tuple[str | None, int]] = []
        for item in items:
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                selected.append((None, item))
            elif isinstance(item, str):
                selected.append(parse_queue_key("assign", item))
            else:
                raise ConfigError("assign", f"queue {item!r} must be a queue id or 'brokerName:queueId'")
        queues[str(topic)] = tuple(selected)
    return Assignment(queues)


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """ACL credentials and TLS of the connector's clients (options accessKey, secretKey, tls, tlsTrustCertPath,
    tlsCertPath, tlsKeyPath; docs/security.md). Picklable: executors build their own SSL contexts."""

    access_key: str = ""
    secret_key: str = ""
    tls: bool = False
    tls_trust_cert_path: str = ""
    tls_cert_path: str = ""
    tls_key_path: str = ""

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of a ferrymq client (Producer, PullConsumer)."""
        tls = None
        if self.tls:
            from ferrymq.common.tls import TlsClientSettings

            tls = TlsClientSettings(trust_cert_path=self.tls_trust_cert_path, cert_path=self.tls_cert_path,
                                    key_path=self.tls_key_path)
        return {"access_key": self.access_key, "secret_key": self.secret_key, "tls": tls}


def parse_security(options: Mapping[str, str]) -> ClientSecurity:
    access_key = (_get(options, "accessKey") or "").strip()
    secret_key = (_get(options, "secretKey") or "").strip()
    if bool(access_key) != bool(secret_key):
        raise ConfigError("secretKey" if access_key else "accessKey", "accessKey and secretKey go together")
    paths = {name: (_get(options, name) or "").strip() for name in ("tlsTrustCertPath", "tlsCertPath", "tlsKeyPath")}
    tls = _bool(options, "tls", any(paths.values()))
    if not tls and any(paths.values()):
        raise ConfigError("tls", "is false but a tls*Path option is set")
    if bool(paths["tlsCertPath"]) != bool(paths["tlsKeyPath"]):
        raise ConfigError("tlsKeyPath" if paths["tlsCertPath"] else "tlsCertPath",
                          "tlsCertPath and tlsKeyPath go together")
    security = ClientSecurity(access_key, secret_key, tls, paths["tlsTrustCertPath"], paths["tlsCertPath"],
                              paths["tlsKeyPath"])
    if tls:
        kwargs = security.client_kwargs()
        try:
            kwargs["tls"].context()  # unreadable certificate files fail at load(), naming the option
        except ConfigError as exc:
            option = {"tls.client.trustCertPath": "tlsTrustCertPath", "tls.client.certPath": "tlsCertPath",
                      "tls.client.keyPath": "tlsKeyPath"}.get(exc.key, "tls")
            raise ConfigError(option, str(exc).split(": ", 1)[-1]) from None
    return security


@dataclass(frozen=True, slots=True)
class SourceOptions:
    name_server: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assignment: Assignment | None = None
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    starting_timestamp_ms: int | None = None
    starting_by_timestamp: OffsetsMap | None = None
    starting_timestamp_strategy: str = "error"
    ending_timestamp_ms: int | None = None
    ending_by_timestamp: OffsetsMap | None = None
    fetch_offset_num_retries: int = DEFAULT_FETCH_OFFSET_NUM_RETRIES
    fetch_offset_retry_interval_ms: int = DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    sub_expression: str = "*"
    pull_batch_size: int = DEFAULT_PULL_BATCH_SIZE
    pull_timeout_ms: int = DEFAULT_PULL_TIMEOUT_MS
    pull_pipeline_depth: int = DEFAULT_PULL_PIPELINE_DEPTH
    read_from_slave: str = "whenMasterDown"
    group: str = DEFAULT_SOURCE_GROUP
    streaming: bool = False
    expression_type: str = EXPRESSION_TYPE_TAG
    security: ClientSecurity = ClientSecurity()

    @property
    def tag_set(self) -> frozenset[str] | None:
        """Tags the sub-expression accepts, or None for all (a SQL92 selector: the broker filters)."""
        return parse_sub_expression(self.sub_expression) if self.expression_type == EXPRESSION_TYPE_TAG else None

    def executor_options(self) -> ExecutorOptions:
        return ExecutorOptions(
            name_server=self.name_server,
            group=self.group,
            read_from_slave=self.read_from_slave,
            sub_expression=self.sub_expression,
            pull_batch_size=self.pull_batch_size,
            pull_timeout_ms=self.pull_timeout_ms,
            pull_pipeline_depth=self.pull_pipeline_depth,
            fail_on_data_loss=self.fail_on_data_loss,
            expression_type=self.expression_type,
            security=self.security,
            fetch_offset_num_retries=self.fetch_offset_num_retries,
            fetch_offset_retry_interval_ms=self.fetch_offset_retry_interval_ms,
        )


@dataclass(frozen=True, slots=True)
class ExecutorOptions:
    """What an executor task needs (small and picklable; the cache key of its pull client)."""

    name_server: str
    group: str
    read_from_slave: str
    sub_expression: str
    pull_batch_size: int
    pull_timeout_ms: int
    pull_pipeline_depth: int
    fail_on_data_loss: bool
    expression_type: str = EXPRESSION_TYPE_TAG
    security: ClientSecurity = ClientSecurity()
    fetch_offset_num_retries: int = DEFAULT_FETCH_OFFSET_NUM_RETRIES
    fetch_offset_retry_interval_ms: int = DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS

    @property
    def client_key(self) -> tuple[str, str, str, int, ClientSecurity]:
        return (self.name_server, self.group, self.read_from_slave, self.pull_timeout_ms, self.security)


def parse_sub_expression(expr: str) -> frozenset[str] | None:
    text = expr.strip()
    if text in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in text.split("||") if t.strip())
    return tags or None


def _check_unknown(options: Mapping[str, str], names: tuple[str, ...], what: str) -> None:
    known = {k.lower() for k in names + SPARK_OPTION_NAMES}
    for key in options:
        if key.lower() not in known:
            raise ConfigError(key, f"unknown {what} option (known: {', '.join(names)})")


def parse_source_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Validate source options; raises ConfigError naming the first bad option."""
    _check_unknown(options, SOURCE_OPTION_NAMES, "source")
    name_server = (_get(options, "nameServer") or "").strip()
    if not name_server:
        raise ConfigError("nameServer", "is required (host:port of the name server)")

    subscribe = _get(options, "subscribe")
    topic_alias = _get(options, "topic")
    if subscribe is not None and topic_alias is not None:
        raise ConfigError("topic", "is an alias of subscribe; set only one of them")
    subscribe = subscribe if subscribe is not None else topic_alias
    pattern = _get(options, "subscribePattern")
    assign_raw = _get(options, "assign")
    chosen = [
        n for n, v in (("subscribe", subscribe), ("subscribePattern", pattern), ("assign", assign_raw)) if v
    ]
    if len(chosen) != 1:
        detail = f"got {', '.join(chosen)}" if chosen else "got none"
        raise ConfigError(
            "subscribe", f"exactly one of subscribe, subscribePattern, assign is required ({detail})"
        )

    topics: tuple[str, ...] = ()
    if subscribe:
        topics = tuple(dict.fromkeys(t.strip() for t in subscribe.split(",") if t.strip()))
        if not topics:
            raise ConfigError("subscribe", "names no topic")
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError("subscribePattern", f"is not a valid regex: {exc}") from None
    assignment = parse_assign(assign_raw) if assign_raw else None

    starting_raw = _get(options, "startingOffsets")
    if starting_raw is not None:
        starting = parse_offsets("startingOffsets", starting_raw, allow_latest=streaming)
        if not streaming and starting.kind == "latest":
            raise ConfigError("startingOffsets", "'latest' is not allowed for batch queries")
    else:
        starting = OffsetSpec("latest" if streaming else "earliest")
    starting_ts = _int(options, "startingTimestamp", None, 0)
    starting_by_ts_raw = _get(options, "startingOffsetsByTimestamp")
    starting_by_ts = (
        parse_timestamps("startingOffsetsByTimestamp", starting_by_ts_raw) if starting_by_ts_raw is not None else None
    )
    strategy = (_get(options, "startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if strategy not in TIMESTAMP_STRATEGIES:
        raise ConfigError("startingOffsetsByTimestampStrategy",
                          f"must be one of {', '.join(TIMESTAMP_STRATEGIES)}, got {strategy!r}")

    if streaming:
        for name in BATCH_ONLY_OPTIONS:
            if _get(options, name) is not None:
                raise ConfigError(name, "is for batch queries only")
    ending_raw = _get(options, "endingOffsets")
    ending = (
        parse_offsets("endingOffsets", ending_raw, allow_earliest=False)
        if ending_raw is not None
        else OffsetSpec("latest")
    )
    ending_ts = _int(options, "endingTimestamp", None, 0)
    ending_by_ts_raw = _get(options, "endingOffsetsByTimestamp")
    ending_by_ts = (
        parse_timestamps("endingOffsetsByTimestamp", ending_by_ts_raw) if ending_by_ts_raw is not None else None
    )

    max_per_trigger = _int(options, "maxOffsetsPerTrigger", None, 1)
    min_per_trigger = _int(options, "minOffsetsPerTrigger", None, 1)
    delay_raw = _get(options, "maxTriggerDelay")
    max_delay_ms = (
        parse_duration_ms("maxTriggerDelay", delay_raw)
        if delay_raw is not None
        else DEFAULT_MAX_TRIGGER_DELAY_MS
    )
    if delay_raw is not None and min_per_trigger is None:
        raise ConfigError("maxTriggerDelay", "only applies together with minOffsetsPerTrigger")
    if max_per_trigger is not None and min_per_trigger is not None and min_per_trigger > max_per_trigger:
        raise ConfigError(
            "minOffsetsPerTrigger", f"({min_per_trigger}) exceeds maxOffsetsPerTrigger ({max_per_trigger})"
        )
    if not streaming:
        for name in STREAM_ONLY_OPTIONS:
            if _get(options, name) is not None:
                raise ConfigError(name, "is for streaming queries only (readStream)")

    read_from_slave = (_get(options, "readFromSlave") or "whenMasterDown").strip()
    canonical = {c.lower(): c for c in READ_FROM_SLAVE_CHOICES}
    if read_from_slave.lower() not in canonical:
        raise ConfigError(
            "readFromSlave", f"must be one of {', '.join(READ_FROM_SLAVE_CHOICES)}, got {read_from_slave!r}"
        )
    group = (_get(options, "group") or DEFAULT_SOURCE_GROUP).strip()
    if not group:
        raise ConfigError("group", "must not be empty")

    return SourceOptions(
        name_server=name_server,
        topics=topics,
        pattern=pattern or None,
        assignment=assignment,
        starting=starting,
        ending=ending,
        starting_timestamp_ms=starting_ts,
        starting_by_timestamp=starting_by_ts,
        starting_timestamp_strategy=strategy,
        ending_timestamp_ms=ending_ts,
        ending_by_timestamp=ending_by_ts,
        fetch_offset_num_retries=_int(options, "fetchOffset.numRetries", DEFAULT_FETCH_OFFSET_NUM_RETRIES, 0, 1000)
        or 0,
        fetch_offset_retry_interval_ms=_int(options, "fetchOffset.retryIntervalMs",
                                            DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS, 0, 3_600_000) or 0,
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=max_delay_ms,
        min_partitions=_int(options, "minPartitions", None, 1),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        sub_expression=(_get(options, "subExpression") or "*").strip() or "*",
        pull_batch_size=_int(options, "pullBatchSize", DEFAULT_PULL_BATCH_SIZE, 1, MAX_PULL_BATCH_SIZE)
        or DEFAULT_PULL_BATCH_SIZE,
        pull_timeout_ms=_int(options, "pullTimeoutMs", DEFAULT_PULL_TIMEOUT_MS, 1) or DEFAULT_PULL_TIMEOUT_MS,
        pull_pipeline_depth=_int(
            options, "pullPipelineDepth", DEFAULT_PULL_PIPELINE_DEPTH, 1, MAX_PULL_PIPELINE_DEPTH
        )
        or DEFAULT_PULL_PIPELINE_DEPTH,
        read_from_slave=canonical[read_from_slave.lower()],
        group=group,
        streaming=streaming,
        expression_type=_expression_type(options),
        security=parse_security(options),
    )


def _expression_type(options: Mapping[str, str]) -> str:
    """``expressionType``: TAG or SQL92; a SQL92 ``subExpression`` is compiled here, on the driver."""
    value = (_get(options, "expressionType") or EXPRESSION_TYPE_TAG).strip().upper()
    if value not in (EXPRESSION_TYPE_TAG, EXPRESSION_TYPE_SQL92):
        raise ConfigError("expressionType", f"must be TAG or SQL92, not {value!r}")
    if value == EXPRESSION_TYPE_SQL92:
        from ferrymq.common.sql92 import SqlParseError, compile_selector

        try:
            compile_selector((_get(options, "subExpression") or "").strip())
        except SqlParseError as exc:
            raise ConfigError("subExpression", f"not a valid SQL92 selector: {exc}") from None
    return value


# ---- sink ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SinkOptions:
    name_server: str
    topic: str | None = None
    group: str = DEFAULT_SINK_GROUP
    send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS
    send_pipeline_depth: int = DEFAULT_SEND_PIPELINE_DEPTH
    security: ClientSecurity = ClientSecurity()
    exactly_once: bool = False
    exactly_once_timeout_ms: int = DEFAULT_EXACTLY_ONCE_TIMEOUT_MS

    @property
    def producer_key(self) -> tuple[str, str, int, ClientSecurity]:
        return (self.name_server, self.group, self.send_timeout_ms, self.security)


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    _check_unknown(options, SINK_OPTION_NAMES, "sink")
    name_server = (_get(options, "nameServer") or "").strip()
    if not name_server:
        raise ConfigError("nameServer", "is required (host:port of the name server)")
    topic = _get(options, "topic")
    if topic is not None and not topic.strip():
        raise ConfigError("topic", "must not be empty")
    group = (_get(options, "group") or DEFAULT_SINK_GROUP).strip()
    if not group:
        raise ConfigError("group", "must not be empty")
    exactly_once = _bool(options, "exactlyOnce", False)
    if exactly_once and not topic:
        raise ConfigError("exactlyOnce", "needs the topic option (its route names the brokers that keep the "
                                         "epoch records)")
    return SinkOptions(
        name_server=name_server,
        topic=topic.strip() if topic else None,
        group=group,
        send_timeout_ms=_int(options, "sendTimeoutMs", DEFAULT_SEND_TIMEOUT_MS, 1) or DEFAULT_SEND_TIMEOUT_MS,
        send_pipeline_depth=_int(
            options, "sendPipelineDepth", DEFAULT_SEND_PIPELINE_DEPTH, 1, MAX_SEND_PIPELINE_DEPTH
        )
        or DEFAULT_SEND_PIPELINE_DEPTH,
        security=parse_security(options),
        exactly_once=exactly_once,
        exactly_once_timeout_ms=_int(options, "exactlyOnce.timeoutMs", DEFAULT_EXACTLY_ONCE_TIMEOUT_MS,
                                     MIN_EXACTLY_ONCE_TIMEOUT_MS) or DEFAULT_EXACTLY_ONCE_TIMEOUT_MS,
    )
