"""TLS for the remoting and HA ports: settings, SSL contexts (Python's ``ssl``), and a listener that serves
the three server modes of RocketMQ.

Server settings (broker.conf, namesrv.conf, controller.conf; RocketMQ's key names):

| key                           | values                                | meaning                                  |
|-------------------------------|---------------------------------------|------------------------------------------|
| tlsServerMode (tls.server.mode) | disabled, permissive, enforcing     | plain only; TLS and plain on one port (told apart by the first byte); TLS only |
| tls.server.certPath           | PEM file                              | the server's certificate (chain)         |
| tls.server.keyPath            | PEM file                              | its private key (unencrypted PEM)        |
| tls.server.trustCertPath      | PEM file                              | CAs that client certificates must chain to |
| tls.server.need.client.auth   | none, optional, require               | ask clients for a certificate            |

Client settings (the broker's own connections to name servers, the controller and its master's HA port; our
client through ``TlsClientSettings``):

| key                           | meaning                                                                   |
|-------------------------------|---------------------------------------------------------------------------|
| tlsEnable (tls.enable)        | connect with TLS                                                          |
| tls.client.trustCertPath      | CAs the server's certificate must chain to; its address (IP or name) must match the certificate. Without it the connection is encrypted but the server is not authenticated (RocketMQ's "test mode") |
| tls.client.certPath / keyPath | a client certificate, for servers with need.client.auth                   |

Permissive mode reads the first byte of a connection without consuming it (``MSG_PEEK``): a TLS record starts
with 0x16 (handshake); a remoting frame starts with the high byte of its length, 0 for every frame below
16 MiB, and an HA stream with the high byte of an offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ferrymq.common import aio
from ferrymq.errors import ConfigError

log = logging.getLogger(__name__)

#: first byte of a TLS record carrying a handshake (ClientHello)
TLS_HANDSHAKE_RECORD = 0x16
#: a connection in permissive mode must send its first byte within this
FIRST_BYTE_TIMEOUT_MS = 10_000
#: a TLS handshake must finish within this
HANDSHAKE_TIMEOUT_MS = 10_000
#: permissive mode, protocols where the server speaks first (HA with haSecret sends its challenge first): a
#: client silent this long is served plain (a TLS client sends its ClientHello at once)
SILENT_MEANS_PLAIN_MS = 300
LISTEN_BACKLOG = 1024


class TlsMode(enum.StrEnum):
    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


class ClientAuth(enum.StrEnum):
    NONE = "none"
    OPTIONAL = "optional"
    REQUIRE = "require"


_VERIFY_MODE = {ClientAuth.NONE: ssl.CERT_NONE, ClientAuth.OPTIONAL: ssl.CERT_OPTIONAL,
                ClientAuth.REQUIRE: ssl.CERT_REQUIRED}

SERVER_MODE_KEYS = ("tlsServerMode", "tls.server.mode")
SERVER_CERT_KEY = "tls.server.certPath"
SERVER_KEY_KEY = "tls.server.keyPath"
SERVER_TRUST_KEY = "tls.server.trustCertPath"
SERVER_CLIENT_AUTH_KEY = "tls.server.need.client.auth"
CLIENT_ENABLE_KEYS = ("tlsEnable", "tls.enable")
CLIENT_TRUST_KEY = "tls.client.trustCertPath"
CLIENT_CERT_KEY = "tls.client.certPath"
CLIENT_KEY_KEY = "tls.client.keyPath"
#: every key this module reads (config readers accept them as known keys)
TLS_KEYS = frozenset((*SERVER_MODE_KEYS, SERVER_CERT_KEY, SERVER_KEY_KEY, SERVER_TRUST_KEY, SERVER_CLIENT_AUTH_KEY,
                      *CLIENT_ENABLE_KEYS, CLIENT_TRUST_KEY, CLIENT_CERT_KEY, CLIENT_KEY_KEY))


@dataclass(frozen=True, slots=True)
class TlsServerSettings:
    mode: TlsMode = TlsMode.DISABLED
    cert_path: str = ""
    key_path: str = ""
    trust_cert_path: str = ""
    need_client_auth: ClientAuth = ClientAuth.NONE

    @property
    def enabled(self) -> bool:
        return self.mode is not TlsMode.DISABLED

    def context(self) -> ssl.SSLContext | None:
        """The server context (None when disabled); ConfigError naming the key of a bad file."""
        if not self.enabled:
            return None
        if not self.cert_path or not self.key_path:
            missing = SERVER_CERT_KEY if not self.cert_path else SERVER_KEY_KEY
            raise ConfigError(missing, f"required when tlsServerMode is {self.mode.value}")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(ctx, self.cert_path, self.key_path, SERVER_CERT_KEY)
        if self.need_client_auth is not ClientAuth.NONE:
            if not self.trust_cert_path:
                raise ConfigError(SERVER_TRUST_KEY, f"required when {SERVER_CLIENT_AUTH_KEY} is "
                                                    f"{self.need_client_auth.value}")
            _load_trust(ctx, self.trust_cert_path, SERVER_TRUST_KEY)
        ctx.verify_mode = _VERIFY_MODE[self.need_client_auth]
        return ctx


@dataclass(frozen=True, slots=True)
class TlsClientSettings:
    """A client's TLS: ``TlsClientSettings()`` encrypts without authenticating the server; give
    ``trust_cert_path`` to verify it, ``cert_path``/``key_path`` to present a certificate."""

    trust_cert_path: str = ""
    cert_path: str = ""
    key_path: str = ""

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.trust_cert_path:
            _load_trust(ctx, self.trust_cert_path, CLIENT_TRUST_KEY)
            ctx.check_hostname = True
            ctx.verify_mode = ssl.CERT_REQUIRED
        else:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_path or self.key_path:
            if not (self.cert_path and self.key_path):
                raise ConfigError(CLIENT_CERT_KEY if not self.cert_path else CLIENT_KEY_KEY,
                                  "a client certificate needs both tls.client.certPath and tls.client.keyPath")
            _load_chain(ctx, self.cert_path, self.key_path, CLIENT_CERT_KEY)
        return ctx


def _check_file(path: str, key: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(key, f"no such file: {path}")


def _load_chain(ctx: ssl.SSLContext, cert_path: str, key_path: str, key: str) -> None:
    _check_file(cert_path, key)
    _check_file(key_path, key.replace("certPath", "keyPath"))
    try:
        ctx.load_cert_chain(cert_path, key_path)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(key, f"cannot load certificate {cert_path} with key {key_path}: {exc}") from None


def _load_trust(ctx: ssl.SSLContext, path: str, key: str) -> None:
    _check_file(path, key)
    try:
        ctx.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(key, f"cannot load trusted certificates from {path}: {exc}") from None


def _first(props: Mapping[str, str], keys: tuple[str, ...]) -> tuple[str, str] | None:
    for key in keys:
        if key in props:
            return key, props[key].strip()
    return None


def _choice(key: str, raw: str, kind: type[enum.StrEnum]) -> enum.StrEnum:
    try:
        return kind(raw.strip().lower())
    except ValueError:
        raise ConfigError(key, f"expected one of {', '.join(m.value for m in kind)}; got {raw!r}") from None


def _path(props: Mapping[str, str], key: str, base_dir: str) -> str:
    raw = props.get(key, "").strip()
    return os.path.join(base_dir, os.path.expanduser(raw)) if raw else ""


def server_settings(props: Mapping[str, str], base_dir: str = "") -> TlsServerSettings:
    """The server settings of a properties file (relative paths are taken from ``base_dir``)."""
    found = _first(props, SERVER_MODE_KEYS)
    mode = TlsMode.DISABLED if found is None or not found[1] else _choice(found[0], found[1], TlsMode)
    auth_raw = props.get(SERVER_CLIENT_AUTH_KEY, "").strip()
    auth = _choice(SERVER_CLIENT_AUTH_KEY, auth_raw, ClientAuth) if auth_raw else ClientAuth.NONE
    return TlsServerSettings(mode=TlsMode(mode), cert_path=_path(props, SERVER_CERT_KEY, base_dir),
                             key_path=_path(props, SERVER_KEY_KEY, base_dir),
                             trust_cert_path=_path(props, SERVER_TRUST_KEY, base_dir),
                             need_client_auth=ClientAuth(auth))


def client_settings(props: Mapping[str, str], base_dir: str = "") -> TlsClientSettings | None:
    """The client settings of a properties file, None when tlsEnable is not true."""
    found = _first(props, CLIENT_ENABLE_KEYS)
    if found is None or not found[1]:
        return None
    if found[1].lower() not in ("true", "false"):
        raise ConfigError(found[0], f"expected true or false, got {found[1]!r}")
    if found[1].lower() == "false":
        return None
    return TlsClientSettings(trust_cert_path=_path(props, CLIENT_TRUST_KEY, base_dir),
                             cert_path=_path(props, CLIENT_CERT_KEY, base_dir),
                             key_path=_path(props, CLIENT_KEY_KEY, base_dir))


# ---- the process's default client TLS (daemons and the CLI set it once at start) ---------------------------

_default_client_context: ssl.SSLContext | None = None


def set_default_client_tls(settings: TlsClientSettings | None) -> None:
    """Connections opened without their own context use ``settings`` (None: plain TCP)."""
    global _default_client_context
    _default_client_context = settings.context() if settings is not None else None


def default_client_context() -> ssl.SSLContext | None:
    return _default_client_context


def server_hostname(ctx: ssl.SSLContext | None, host: str) -> str | None:
    """What to pass as ``server_hostname`` when connecting to ``host`` with ``ctx``."""
    if ctx is None:
        return None
    return host


# ---- listening -------------------------------------------------------------------------------------------


_SILENT = -1


class Listener:
    """A listening port serving ``protocol_factory`` in one of the three modes."""

    def __init__(self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int,
                 settings: TlsServerSettings | None = None, *,
                 first_byte_timeout_ms: int = FIRST_BYTE_TIMEOUT_MS,
                 handshake_timeout_ms: int = HANDSHAKE_TIMEOUT_MS,
                 silent_means_plain_ms: int | None = None) -> None:
        self._factory = protocol_factory
        self.host = host
        self.port = port
        self.settings = settings or TlsServerSettings()
        self._ctx = self.settings.context()
        self._first_byte_timeout_ms = first_byte_timeout_ms
        self._silent_means_plain_ms = silent_means_plain_ms
        self._handshake_timeout_s = handshake_timeout_ms / 1000
        self._server: asyncio.base_events.Server | None = None
        self._sock: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        #: permissive mode: connections served plain and with TLS
        self.plain_connections = 0
        self.tls_connections = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.settings.mode is TlsMode.PERMISSIVE:
            sock = socket.create_server((self.host, self.port), backlog=LISTEN_BACKLOG,
                                        family=socket.AF_INET6 if ":" in self.host else socket.AF_INET)
            sock.setblocking(False)
            self._sock = sock
            self.port = int(sock.getsockname()[1])
            self._accept_task = asyncio.create_task(self._accept_loop(sock), name=f"tls-accept-{self.port}")
            return
        if self._ctx is not None:
            self._server = await loop.create_server(self._factory, self.host, self.port, reuse_address=True,
                                                    backlog=LISTEN_BACKLOG, ssl=self._ctx,
                                                    ssl_handshake_timeout=self._handshake_timeout_s)
        else:
            self._server = await loop.create_server(self._factory, self.host, self.port, reuse_address=True,
                                                    backlog=LISTEN_BACKLOG)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn_sock, _ = await loop.sock_accept(sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # EMFILE and the like: log, let the backlog wait
                log.warning("accept on %s:%d failed: %s", self.host, self.port, exc)
                await asyncio.sleep(0.1)
                continue
            conn_sock.setblocking(False)
            task = asyncio.create_task(self._serve_sniffed(conn_sock))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _serve_sniffed(self, conn_sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            first = await self._peek_first_byte(loop, conn_sock)
            if first == _SILENT:
                first = 0  # a plain client waiting for the server to speak first
            elif first is None:
                conn_sock.close()
                return
            with_tls = first == TLS_HANDSHAKE_RECORD
            if with_tls:
                self.tls_connections += 1
                await loop.connect_accepted_socket(self._factory, conn_sock, ssl=self._ctx,
                                                   ssl_handshake_timeout=self._handshake_timeout_s)
            else:
                self.plain_connections += 1
                await loop.connect_accepted_socket(self._factory, conn_sock)
        except asyncio.CancelledError:
            conn_sock.close()
            raise
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            log.info("connection on %s:%d refused: %s", self.host, self.port, exc)
            conn_sock.close()

    async def _peek_first_byte(self, loop: asyncio.AbstractEventLoop, conn_sock: socket.socket) -> int | None:
        readable: asyncio.Future[None] = loop.create_future()
        fd = conn_sock.fileno()
        def on_readable() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, on_readable)
        wait_ms = self._silent_means_plain_ms or self._first_byte_timeout_ms
        try:
            await aio.wait_for(readable, wait_ms / 1000)
        except TimeoutError:
            if self._silent_means_plain_ms is not None:
                return _SILENT
            log.info("closing a connection on %s:%d that sent nothing within %d ms", self.host, self.port,
                     self._first_byte_timeout_ms)
            return None
        finally:
            loop.remove_reader(fd)
        try:
            data = conn_sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return await self._peek_first_byte(loop, conn_sock)
        return data[0] if data else None

    @property
    def sockets(self) -> list[socket.socket]:
        if self._server is not None:
            return list(self._server.sockets)
        return [self._sock] if self._sock is not None else []

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._accept_task is not None:
            self._accept_task.cancel()
        for task in list(self._pending):
            task.cancel()
        if self._sock is not None:
            self._sock.close()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
        tasks = [t for t in (self._accept_task, *self._pending) if t is not None]
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
