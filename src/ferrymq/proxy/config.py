"""Settings of the gRPC proxy (``ferry proxy`` options; the broker's ``grpc*`` keys in local mode)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ferrymq.common.tls import TlsClientSettings, TlsServerSettings
from ferrymq.proxy.translate import DEFAULT_DELAY_LEVELS_MS

#: gRPC port of RocketMQ's proxy (``grpcServerPort``)
DEFAULT_GRPC_PORT = 8081
#: deliveries of one message before it moves to ``%DLQ%<group>`` (RocketMQ: retryMaxTimes 16 + 1)
DEFAULT_MAX_DELIVERY_ATTEMPTS = 17
#: the largest 5.x message body accepted (RocketMQ's maxMessageSize)
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: how often acknowledged progress is written to the brokers as consumer offsets
DEFAULT_OFFSET_COMMIT_INTERVAL_MS = 1_000
#: producer group the proxy sends under (5.x messages carry none)
DEFAULT_PRODUCER_GROUP = "FERRYMQ_GRPC_PROXY"
#: invisible time of a message received with auto_renew (PushConsumers), and the step of each renewal
#: (RocketMQ's defaultInvisibleTimeMills)
DEFAULT_AUTO_RENEW_INVISIBLE_MS = 60_000
#: an auto-renewed message is renewed this long before it would become visible (renewAheadTimeMillis)
DEFAULT_RENEW_AHEAD_MS = 10_000
#: an auto-renewed message is renewed for at most this long after its delivery (renewMaxTimeMillis: 3 h)
DEFAULT_RENEW_MAX_MS = 3 * 3_600_000


@dataclass(slots=True)
class ProxyConfig:
    #: name servers, "a:9876;b:9876"
    namesrv_addr: str
    listen_host: str = "127.0.0.1"
    #: 0: any free port (``ProxyServer.port`` tells which)
    listen_port: int = DEFAULT_GRPC_PORT
    delay_levels_ms: tuple[int, ...] = DEFAULT_DELAY_LEVELS_MS
    max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS
    #: consumer groups consumed in FIFO order (a queue hands out one batch at a time)
    fifo_groups: frozenset[str] = field(default_factory=frozenset)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    offset_commit_interval_ms: int = DEFAULT_OFFSET_COMMIT_INTERVAL_MS
    producer_group: str = DEFAULT_PRODUCER_GROUP
    #: credentials and TLS of the proxy's own remoting calls to name servers and brokers
    access_key: str = ""
    secret_key: str = ""
    tls: TlsClientSettings | None = None
    #: TLS of the gRPC port itself (the remoting port's settings: tlsServerMode, tls.server.*); None: plain
    tls_server: TlsServerSettings | None = None
    #: plain_acl.yml checked against 5.x clients' signatures (""; no check, unless the broker hands its own
    #: ACL to local mode)
    acl_path: str = ""
    #: auto-renewal of PushConsumers' messages (proxy/renew.py)
    auto_renew_invisible_ms: int = DEFAULT_AUTO_RENEW_INVISIBLE_MS
    renew_ahead_ms: int = DEFAULT_RENEW_AHEAD_MS
    renew_max_ms: int = DEFAULT_RENEW_MAX_MS

    def validate(self) -> None:
        from ferrymq.errors import ConfigError

        if not self.namesrv_addr.strip():
            raise ConfigError("namesrvAddr", "the gRPC proxy needs name servers to find the brokers")
        if not 0 <= self.listen_port <= 65535:
            raise ConfigError("grpcServerPort", f"{self.listen_port} is not a port")
        if self.max_delivery_attempts < 1:
            raise ConfigError("grpcMaxDeliveryAttempts", "must be at least 1")
        if self.offset_commit_interval_ms < 1:
            raise ConfigError("grpcOffsetCommitIntervalMs", "must be at least 1")
        if self.auto_renew_invisible_ms < 2:
            raise ConfigError("grpcAutoRenewInvisibleTimeMillis", "must be at least 2")
        if not 0 < self.renew_ahead_ms < self.auto_renew_invisible_ms:
            raise ConfigError("grpcRenewAheadTimeMillis", "must be above 0 and below the auto-renew invisible time "
                                                      f"({self.auto_renew_invisible_ms} ms)")
        if self.renew_max_ms < 0:
            raise ConfigError("grpcRenewMaxTimeMillis", "must be at least 0")
