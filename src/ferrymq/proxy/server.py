"""The gRPC endpoint: a ``grpc.aio`` server carrying ``MessagingService``.

One implementation, two ways to run it: ``ferry proxy -n NAMESRV --listen HOST:PORT`` (cluster mode, in
front of every broker group the name servers know), or inside the broker process when the broker config
says ``enableGrpcServer=true`` (local mode, ``grpcServerPort``; the proxy uses the broker's name servers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from ferrymq.acl.config import AclConfig
from ferrymq.client.config import local_ip
from ferrymq.common.tls import (
    SERVER_CERT_KEY,
    SERVER_KEY_KEY,
    SERVER_TRUST_KEY,
    ClientAuth,
    TlsServerSettings,
)
from ferrymq.errors import ConfigError
from ferrymq.proxy.config import ProxyConfig
from ferrymq.proxy.loopback import LocalBroker
from ferrymq.proxy.service import MessagingService
from ferrymq.proxy.v2 import service_pb2_grpc as sgrpc

log = logging.getLogger(__name__)

#: gRPC message size limit both ways (a 4 MiB body plus its properties and framing)
MAX_GRPC_MESSAGE_BYTES = 16 * 1024 * 1024
#: how long stop() lets running calls finish
STOP_GRACE_S = 1.0


def _read_pem(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror}") from None


def server_credentials(settings: TlsServerSettings) -> grpc.ServerCredentials:
    """gRPC server credentials of the remoting port's TLS settings. gRPC cannot tell TLS from plain on one
    port, so ``permissive`` serves TLS like ``enforcing`` (docs/grpc.md)."""
    settings.context()  # the same ConfigError as the remoting port for missing or unreadable files
    chain = _read_pem(settings.cert_path, SERVER_CERT_KEY)
    key = _read_pem(settings.key_path, SERVER_KEY_KEY)
    auth = settings.need_client_auth
    roots = _read_pem(settings.trust_cert_path, SERVER_TRUST_KEY) if auth is not ClientAuth.NONE else None
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=roots,
                                       require_client_auth=auth is ClientAuth.REQUIRE)


def acl_file_source(path: str) -> Callable[[], AclConfig | None]:
    """The ACL of ``path``, re-read when the file changes (acl/guard.py; a bad file at start is a
    ConfigError)."""
    from ferrymq.acl.guard import AclGuard

    return guard_source(AclGuard(path))


def admin_credentials(acl: AclConfig) -> tuple[str, str]:
    """Local mode under aclEnable: the proxy's own remoting calls to the brokers sign with the first admin
    account of the broker's ACL (("", "") when it has none: a warning, and the brokers refuse those calls
    unless the address is white)."""
    for account in acl.accounts.values():
        if account.admin:
            return account.access_key, account.secret_key
    log.warning("aclEnable with enableGrpcServer: plain_acl.yml has no admin account for the gRPC endpoint's "
                "calls to the brokers")
    return "", ""


def guard_source(guard: Any) -> Callable[[], AclConfig | None]:
    """The current ACL of an ``AclGuard`` (reloaded when its file changes)."""

    def source() -> AclConfig:
        guard.maybe_reload()
        return guard.acl

    return source


class ProxyServer:
    def __init__(self, config: ProxyConfig, *, acl_source: Callable[[], AclConfig | None] | None = None,
                 local_broker: LocalBroker | None = None) -> None:
        config.validate()
        self.config = config
        if acl_source is None and config.acl_path:
            acl_source = acl_file_source(config.acl_path)
        self._credentials = (server_credentials(config.tls_server)
                             if config.tls_server is not None and config.tls_server.enabled else None)
        self.service = MessagingService(config, acl_source=acl_source, local_broker=local_broker)
        self._server: grpc.aio.Server | None = None
        self.port = config.listen_port

    @property
    def addr(self) -> str:
        return f"{self.service.advertised_host}:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ])
        sgrpc.add_MessagingServiceServicer_to_server(self.service, server)
        target = f"{self.config.listen_host}:{self.config.listen_port}"
        try:
            if self._credentials is not None:
                bound = server.add_secure_port(target, self._credentials)
            else:
                bound = server.add_insecure_port(target)
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise OSError(f"cannot listen on {self.config.listen_host}:{self.config.listen_port}")
        self.port = bound
        host = self.config.listen_host
        self.service.advertised_host = local_ip() if host in ("0.0.0.0", "::", "") else host
        self.service.advertised_port = bound
        await self.service.start()
        await server.start()
        self._server = server
        log.info("gRPC proxy (apache.rocketmq.v2) serving on %s:%d (%s%s)", host, bound,
                 "TLS" if self._credentials is not None else "plain",
                 ", ACL" if self.service.auth.enabled else "")

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(STOP_GRACE_S)
            self._server = None
        await self.service.close()
