"""Controller configuration from a RocketMQ-style ``key=value`` file (``ferry controller -c controller.conf``;
the same keys in namesrv.conf with ``enableControllerInNamesrv=true``).

| key                                 | type | default                  | meaning                                       |
|-------------------------------------|------|--------------------------|-----------------------------------------------|
| controllerPeers                     | str  | "" (single node)         | ``n0-host:raftPort;n1-host:raftPort;...``     |
| controllerSelfId                    | str  | n0                       | this node's id in controllerPeers             |
| controllerStorePath                 | str  | ~/ferrymq/controller     | Raft journal + full dump                      |
| controllerListenPort                | int  | 9880                     | remoting port brokers and the CLI talk to     |
| listenHost                          | str  | 127.0.0.1                | address the remoting port binds               |
| controllerBrokerHeartbeatTimeoutMs  | int  | 3000                     | a replica silent this long is dead            |
| enableElectUncleanMaster            | bool | false                    | elect outside the SyncStateSet when needed    |

Invalid values raise ``ConfigError`` naming the key; unknown keys are kept as warnings.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ferrymq.common.properties import parse_bool, parse_int, read_properties
from ferrymq.common.tls import TLS_KEYS, TlsServerSettings
from ferrymq.common.tls import server_settings as tls_server_settings
from ferrymq.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_LISTEN_PORT = 9880
DEFAULT_SELF_ID = "n0"
DEFAULT_HEARTBEAT_TIMEOUT_MS = 3000
#: below this a broker's 1 s heartbeat period cannot keep a replica alive
MIN_HEARTBEAT_TIMEOUT_MS = 500
#: Raft address of the single node when controllerPeers is empty (port 0: any free port, no peer dials it)
SINGLE_NODE_RAFT_ADDR = "127.0.0.1:0"
MAX_PORT = 65535
#: hosts that bind every interface; the advertised address then uses the Raft peer's host
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})

KEYS = ("controllerPeers", "controllerSelfId", "controllerStorePath", "controllerListenPort", "listenHost",
        "controllerBrokerHeartbeatTimeoutMs", "enableElectUncleanMaster")


def default_store_path() -> str:
    return os.path.join(os.path.expanduser("~"), "ferrymq", "controller")


@dataclass(slots=True, frozen=True)
class Peer:
    node_id: str
    #: Raft "host:port"
    raft_addr: str


@dataclass(slots=True)
class ControllerConfig:
    peers: list[Peer] = field(default_factory=list)
    self_id: str = DEFAULT_SELF_ID
    store_path: str = field(default_factory=default_store_path)
    listen_port: int = DEFAULT_LISTEN_PORT
    listen_host: str = "127.0.0.1"
    heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS
    elect_unclean: bool = False
    warnings: list[str] = field(default_factory=list)
    #: TLS of the remoting port (tlsServerMode, tls.server.*; the Raft port between controllers is plain)
    tls: TlsServerSettings = field(default_factory=TlsServerSettings)

    @property
    def single_node(self) -> bool:
        return len(self.peers) <= 1

    @property
    def self_raft_addr(self) -> str:
        for p in self.peers:
            if p.node_id == self.self_id:
                return p.raft_addr
        return SINGLE_NODE_RAFT_ADDR

    @property
    def other_raft_addrs(self) -> list[str]:
        return [p.raft_addr for p in self.peers if p.node_id != self.self_id]

    def peer_id(self, raft_addr: str) -> str | None:
        for p in self.peers:
            if p.raft_addr == raft_addr:
                return p.node_id
        return None

    def advertised_host(self) -> str:
        """The host others reach this controller's remoting port on."""
        if self.listen_host not in WILDCARD_HOSTS:
            return self.listen_host
        host = self.self_raft_addr.rpartition(":")[0]
        return host if host not in WILDCARD_HOSTS else "127.0.0.1"

    def validate(self) -> None:
        ids = [p.node_id for p in self.peers]
        if len(set(ids)) != len(ids):
            raise ConfigError("controllerPeers", f"duplicate node ids in {ids}")
        addrs = [p.raft_addr for p in self.peers]
        if len(set(addrs)) != len(addrs):
            raise ConfigError("controllerPeers", f"duplicate Raft addresses in {addrs}")
        if self.peers and self.self_id not in ids:
            raise ConfigError("controllerSelfId", f"{self.self_id!r} is not one of controllerPeers {ids}")
        if not self.store_path:
            raise ConfigError("controllerStorePath", "must not be empty")
        if not 0 <= self.listen_port <= MAX_PORT:
            raise ConfigError("controllerListenPort", f"port out of range: {self.listen_port}")
        if self.heartbeat_timeout_ms < MIN_HEARTBEAT_TIMEOUT_MS:
            raise ConfigError("controllerBrokerHeartbeatTimeoutMs",
                              f"must be >= {MIN_HEARTBEAT_TIMEOUT_MS}, got {self.heartbeat_timeout_ms}")
        if self.listen_host not in WILDCARD_HOSTS:
            try:
                ipaddress.ip_address(self.listen_host)
            except ValueError:
                if not self.listen_host.replace("-", "").replace(".", "").isalnum():
                    raise ConfigError("listenHost", f"not a host name or IP address: {self.listen_host!r}") from None


def parse_peers(raw: str) -> list[Peer]:
    """``n0-127.0.0.1:9878;n1-127.0.0.1:9868`` -> peers (``,`` also separates)."""
    peers: list[Peer] = []
    for item in raw.replace(",", ";").split(";"):
        item = item.strip()
        if not item:
            continue
        node_id, sep, addr = item.partition("-")
        host, colon, port = addr.rpartition(":")
        if not sep or not node_id or not colon or not host or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
            raise ConfigError("controllerPeers", f"expected <id>-<host>:<port>, got {item!r}")
        peers.append(Peer(node_id.strip(), f"{host.strip()}:{int(port)}"))
    return peers


def from_properties(props: Mapping[str, str], *, other_known_keys: Iterable[str] = (),
                    base_dir: str = "") -> ControllerConfig:
    """A validated config; ``other_known_keys`` are keys of the embedding process (namesrv.conf) that are
    not warned about."""
    cfg = ControllerConfig()
    known = set(KEYS) | set(other_known_keys)
    for key, raw in props.items():
        if key == "controllerPeers":
            cfg.peers = parse_peers(raw)
        elif key == "controllerSelfId":
            cfg.self_id = raw.strip()
        elif key == "controllerStorePath":
            cfg.store_path = os.path.expanduser(raw.strip())
        elif key == "controllerListenPort":
            cfg.listen_port = parse_int(key, raw, minimum=0, maximum=MAX_PORT)
        elif key == "listenHost":
            cfg.listen_host = raw.strip()
        elif key == "controllerBrokerHeartbeatTimeoutMs":
            cfg.heartbeat_timeout_ms = parse_int(key, raw)
        elif key == "enableElectUncleanMaster":
            cfg.elect_unclean = parse_bool(key, raw)
        elif key in TLS_KEYS:
            continue
        elif key not in known:
            msg = f"unknown config key {key!r} ignored"
            cfg.warnings.append(msg)
            log.warning(msg)
    cfg.tls = tls_server_settings(props, base_dir)
    cfg.tls.context()  # a bad certificate path is a config error now
    cfg.validate()
    return cfg


def load_config(path: str) -> ControllerConfig:
    return from_properties(read_properties(path), base_dir=os.path.dirname(os.path.abspath(path)))
