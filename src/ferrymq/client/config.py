"""Client options (units in names). Shared by producers, consumers and the admin API."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

from ferrymq.common.tls import TlsClientSettings

#: Java client default for the route refresh period.
POLL_NAME_SERVER_INTERVAL_MS = 30_000
#: Heartbeat period to every broker (Java/C++/ali-ons: 30 s).
HEARTBEAT_BROKER_INTERVAL_MS = 30_000
#: Default timeout of a request that is not a long poll.
REQUEST_TIMEOUT_MS = 3_000
CONNECT_TIMEOUT_MS = 3_000
#: Capped exponential backoff (with jitter) between connection attempts to one address.
RECONNECT_BACKOFF_BASE_MS = 100
RECONNECT_BACKOFF_MAX_MS = 5_000
#: Queue count used for a topic learned through the TBW102 fallback (clients' defaultTopicQueueNums).
DEFAULT_TOPIC_QUEUE_NUMS = 4
#: Bodies at least this large are zlib-compressed (sysFlag bit 0).
COMPRESS_MSG_BODY_OVER_BYTES = 4 * 1024
COMPRESS_LEVEL = 5
#: Largest message body a producer accepts (broker maxMessageSize).
MAX_MESSAGE_SIZE_BYTES = 4 * 1024 * 1024
#: Version ordinal we announce (V4_9_7) and our language.
CLIENT_VERSION = 407
CLIENT_LANGUAGE = "PYTHON"


def local_ip() -> str:
    """Best-effort non-loopback IPv4 address of this host (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            ip: str = s.getsockname()[0]
            return ip
    except OSError:
        return "127.0.0.1"


def parse_name_servers(name_server: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"a:9876;b:9876"``, ``"a:9876,b:9876"`` or a list → list of addresses."""
    if isinstance(name_server, str):
        parts = name_server.replace(",", ";").split(";")
    else:
        parts = list(name_server)
    addrs = [p.strip() for p in parts if p and p.strip()]
    if not addrs:
        raise ValueError("at least one name server address is required")
    return addrs


#: credentials of clients built without their own (``ferry --access-key/--secret-key`` sets them)
_default_credentials: tuple[str, str] = ("", "")


def set_default_credentials(access_key: str, secret_key: str) -> None:
    """ACL credentials for every client of this process that is not given its own."""
    global _default_credentials
    _default_credentials = (access_key, secret_key)


@dataclass(slots=True)
class ClientConfig:
    name_servers: list[str]
    instance_name: str = field(default_factory=lambda: f"{os.getpid()}#{time.monotonic_ns()}")
    client_ip: str = field(default_factory=local_ip)
    poll_name_server_interval_ms: int = POLL_NAME_SERVER_INTERVAL_MS
    heartbeat_broker_interval_ms: int = HEARTBEAT_BROKER_INTERVAL_MS
    request_timeout_ms: int = REQUEST_TIMEOUT_MS
    connect_timeout_ms: int = CONNECT_TIMEOUT_MS
    reconnect_backoff_base_ms: int = RECONNECT_BACKOFF_BASE_MS
    reconnect_backoff_max_ms: int = RECONNECT_BACKOFF_MAX_MS
    #: ACL credentials (RocketMQ ``accessKey``/``secretKey``): every request is signed when access_key is set
    access_key: str = ""
    secret_key: str = ""
    #: TLS to name servers and brokers (None: the process default, which is plain TCP unless ``ferry --tls``
    #: or ``remoting.tls.set_default_client_tls`` set one)
    tls: TlsClientSettings | None = None

    def __post_init__(self) -> None:
        if not self.access_key:
            self.access_key, self.secret_key = _default_credentials

    @property
    def client_id(self) -> str:
        return f"{self.client_ip}@{self.instance_name}"


def client_config(
    name_server: str | list[str],
    *,
    poll_name_server_interval_ms: int,
    heartbeat_broker_interval_ms: int,
    instance_name: str | None,
    access_key: str = "",
    secret_key: str = "",
    tls: TlsClientSettings | None = None,
) -> ClientConfig:
    """The options of a producer or consumer (an empty ``instance_name`` keeps the generated one)."""
    config = ClientConfig(parse_name_servers(name_server),
                          poll_name_server_interval_ms=poll_name_server_interval_ms,
                          heartbeat_broker_interval_ms=heartbeat_broker_interval_ms,
                          access_key=access_key, secret_key=secret_key, tls=tls)
    if instance_name:
        config.instance_name = instance_name
    return config
