"""TLS on a remoting server (common/tls.py, remoting/server.py) over real loopback sockets: the three server modes, client
authentication, wrong certificates on either side, a silent peer in permissive mode, and the settings' errors."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ferrymq.common.tls import (
    ClientAuth,
    Listener,
    TlsClientSettings,
    TlsMode,
    TlsServerSettings,
    client_settings,
    server_settings,
)
from ferrymq.errors import ConfigError, ConnectError, ConnectionClosedError, RemotingTimeoutError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher, connect
from ferrymq.remoting.server import RemotingServer
from support.aio import wait_for
from support.certs import CertSet, make_certs

ECHO = 7777
REFUSED = (ConnectError, ConnectionClosedError, RemotingTimeoutError)


def _echo_dispatcher() -> Dispatcher:
    dispatcher = Dispatcher()
    dispatcher.register(ECHO, lambda _conn, cmd: cmd.response(ResponseCode.SUCCESS, remark="echo", body=cmd.body))
    return dispatcher


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _server_settings(certs: CertSet, mode: TlsMode, auth: ClientAuth = ClientAuth.NONE) -> TlsServerSettings:
    return TlsServerSettings(mode=mode, cert_path=str(certs.server_cert), key_path=str(certs.server_key),
                             trust_cert_path=str(certs.ca), need_client_auth=auth)


class Servers:
    def __init__(self) -> None:
        self.servers: list[RemotingServer] = []
        self.conns: list[Connection] = []

    async def serve(self, settings: TlsServerSettings | None) -> RemotingServer:
        server = RemotingServer(_echo_dispatcher(), "127.0.0.1", 0, tls=settings)
        self.servers.append(server)
        await server.start()
        return server

    async def round_trip(self, server: RemotingServer, client: TlsClientSettings | None) -> bytes:
        conn = await connect(server.addr, ssl_context=client.context() if client is not None else None,
                             timeout_ms=3000)
        self.conns.append(conn)
        resp = await conn.invoke(RemotingCommand.request(ECHO, {}, b"ping"), timeout_ms=3000)
        assert resp.code == ResponseCode.SUCCESS
        return resp.body

    async def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for server in self.servers:
            await server.stop()


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    s = Servers()
    try:
        yield s
    finally:
        await s.close()


async def test_enforcing_serves_tls_clients_and_refuses_plain_ones(servers: Servers, certs: CertSet) -> None:
    server = await servers.serve(_server_settings(certs, TlsMode.ENFORCING))
    assert await servers.round_trip(server, TlsClientSettings(trust_cert_path=str(certs.ca))) == b"ping"
    assert await servers.round_trip(server, TlsClientSettings()) == b"ping"  # encrypted, server not verified
    with pytest.raises(REFUSED):
        await servers.round_trip(server, None)


async def test_permissive_serves_both_on_one_port(servers: Servers, certs: CertSet) -> None:
    server = await servers.serve(_server_settings(certs, TlsMode.PERMISSIVE))
    for _ in range(3):
        assert await servers.round_trip(server, None) == b"ping"
        assert await servers.round_trip(server, TlsClientSettings(trust_cert_path=str(certs.ca))) == b"ping"
    listener = server._server
    assert (listener.plain_connections, listener.tls_connections) == (3, 3)


async def test_disabled_refuses_a_tls_client(servers: Servers, certs: CertSet) -> None:
    server = await servers.serve(None)
    assert await servers.round_trip(server, None) == b"ping"
    with pytest.raises(REFUSED):
        await servers.round_trip(server, TlsClientSettings(trust_cert_path=str(certs.ca)))


async def test_a_client_refuses_a_server_certificate_from_another_ca(servers: Servers, certs: CertSet) -> None:
    rogue = TlsServerSettings(mode=TlsMode.ENFORCING, cert_path=str(certs.rogue_cert), key_path=str(certs.rogue_key))
    server = await servers.serve(rogue)
    with pytest.raises(ConnectError, match="certificate verify failed"):
        await servers.round_trip(server, TlsClientSettings(trust_cert_path=str(certs.ca)))
    ours = await servers.serve(_server_settings(certs, TlsMode.ENFORCING))
    with pytest.raises(ConnectError, match="certificate verify failed"):
        await servers.round_trip(ours, TlsClientSettings(trust_cert_path=str(certs.other_ca)))


async def test_required_client_auth(servers: Servers, certs: CertSet) -> None:
    server = await servers.serve(_server_settings(certs, TlsMode.ENFORCING, ClientAuth.REQUIRE))
    with_cert = TlsClientSettings(trust_cert_path=str(certs.ca), cert_path=str(certs.client_cert),
                                  key_path=str(certs.client_key))
    assert await servers.round_trip(server, with_cert) == b"ping"
    with pytest.raises(REFUSED):  # TLS 1.3: the refusal arrives after the client's handshake completed
        await servers.round_trip(server, TlsClientSettings(trust_cert_path=str(certs.ca)))
    rogue_client = TlsClientSettings(trust_cert_path=str(certs.ca), cert_path=str(certs.rogue_cert),
                                     key_path=str(certs.rogue_key))
    with pytest.raises(REFUSED):
        await servers.round_trip(server, rogue_client)


async def test_permissive_closes_a_connection_that_sends_nothing(certs: CertSet) -> None:
    listener = Listener(asyncio.Protocol, "127.0.0.1", 0, _server_settings(certs, TlsMode.PERMISSIVE),
                        first_byte_timeout_ms=200)
    await listener.start()
    loop = asyncio.get_running_loop()
    sock = socket.create_connection(("127.0.0.1", listener.port))
    sock.setblocking(False)
    try:
        data = await asyncio.wait_for(loop.sock_recv(sock, 16), 5)
        assert data == b""  # closed by the listener, nothing served
        assert listener.plain_connections == listener.tls_connections == 0
    finally:
        sock.close()
        listener.close()
        await listener.wait_closed()


async def test_stopping_a_permissive_server_closes_its_connections(certs: CertSet) -> None:
    server = RemotingServer(_echo_dispatcher(), "127.0.0.1", 0, tls=_server_settings(certs, TlsMode.PERMISSIVE))
    await server.start()
    conn = await connect(server.addr, timeout_ms=3000)
    # the port tells plain from TLS by the first byte, so the connection is served from the first request on
    assert (await conn.invoke(RemotingCommand.request(ECHO, {}, b"x"), timeout_ms=3000)).body == b"x"
    await wait_for(lambda: len(server.connections) == 1, what="connection served")
    await server.stop()
    await asyncio.wait_for(conn.wait_closed(), 5)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def test_settings_from_properties(tmp_path: Path, certs: CertSet) -> None:
    props = {"tlsServerMode": "Enforcing", "tls.server.certPath": certs.server_cert.name,
             "tls.server.keyPath": certs.server_key.name, "tls.server.trustCertPath": certs.ca.name,
             "tls.server.need.client.auth": "require", "tlsEnable": "true", "tls.client.trustCertPath": "ca.pem"}
    s = server_settings(props, str(certs.ca.parent))
    assert s.mode is TlsMode.ENFORCING and s.need_client_auth is ClientAuth.REQUIRE
    assert s.context() is not None  # relative paths resolved against the config's directory
    c = client_settings(props, str(certs.ca.parent))
    assert c is not None and c.trust_cert_path == str(certs.ca)
    assert client_settings({"tls.enable": "false"}) is None
    assert server_settings({"tls.server.mode": "permissive"}).mode is TlsMode.PERMISSIVE
    assert server_settings({}).context() is None


@pytest.mark.parametrize(("props", "key"), [
    ({"tlsServerMode": "strict"}, "tlsServerMode"),
    ({"tlsServerMode": "enforcing"}, "tls.server.certPath"),
    ({"tlsServerMode": "enforcing", "tls.server.certPath": "missing.pem", "tls.server.keyPath": "k"},
     "tls.server.certPath"),
    ({"tls.server.need.client.auth": "always"}, "tls.server.need.client.auth"),
    ({"tlsEnable": "yes"}, "tlsEnable"),
])
def test_bad_settings_name_their_key(tmp_path: Path, props: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        server_settings(props, str(tmp_path)).context()
        client_settings(props, str(tmp_path))
    assert key in str(info.value)


def test_client_auth_needs_a_trust_file(certs: CertSet) -> None:
    settings = TlsServerSettings(mode=TlsMode.ENFORCING, cert_path=str(certs.server_cert),
                                 key_path=str(certs.server_key), need_client_auth=ClientAuth.REQUIRE)
    with pytest.raises(ConfigError, match="tls.server.trustCertPath"):
        settings.context()
    with pytest.raises(ConfigError, match="tls.client.keyPath"):
        TlsClientSettings(cert_path=str(certs.client_cert)).context()
