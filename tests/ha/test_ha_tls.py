"""Replication over TLS (tlsServerMode on the HA port, tls.client.* on the slave), classic HA and controller-mode
HA, over real loopback sockets: a slave with the right certificates replicates and releases SYNC waits (also with
haSecret on top); a plain slave, or one without a client certificate where one is required, never does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ha_store_support import open_store, put_n

from ferrymq.common.tls import ClientAuth, TlsClientSettings, TlsMode, TlsServerSettings
from ferrymq.ha.auto_client import AutoSwitchHAClient
from ferrymq.ha.auto_master import AutoSwitchHAMaster
from ferrymq.ha.client import HAClient
from ferrymq.ha.epoch import EpochFile
from ferrymq.ha.service import HAService
from ferrymq.store.config import BrokerRole
from support.aio import wait_for
from support.certs import CertSet, make_certs

SECRET = "s3cret-of-group-a"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_certs(tmp_path_factory.mktemp("hacerts"))


def _server(certs: CertSet, mode: TlsMode = TlsMode.ENFORCING) -> TlsServerSettings:
    return TlsServerSettings(mode=mode, cert_path=str(certs.server_cert), key_path=str(certs.server_key),
                             trust_cert_path=str(certs.ca), need_client_auth=ClientAuth.REQUIRE)


def _client(certs: CertSet, *, with_cert: bool = True) -> TlsClientSettings:
    if not with_cert:
        return TlsClientSettings(trust_cert_path=str(certs.ca))
    return TlsClientSettings(trust_cert_path=str(certs.ca), cert_path=str(certs.client_cert),
                             key_path=str(certs.client_key))


class Classic:
    def __init__(self, tmp: Path, tls: TlsServerSettings, secret: str) -> None:
        self.tmp = tmp
        self.master = open_store(tmp / "master", BrokerRole.SYNC_MASTER)
        self.service = HAService(self.master, listen_host="127.0.0.1", listen_port=0, heartbeat_interval_ms=200,
                                 housekeeping_interval_ms=2000, ha_secret=secret, broker_name="broker-a", tls=tls)
        self.slaves: list[tuple[HAClient, object]] = []

    async def slave(self, name: str, client_tls: TlsClientSettings | None, secret: str) -> tuple[HAClient, object]:
        store = open_store(self.tmp / name, BrokerRole.SLAVE)
        client = HAClient(store, master_ha_addr=f"127.0.0.1:{self.service.port}", heartbeat_interval_ms=200,
                          housekeeping_interval_ms=2000, reconnect_interval_ms=100, session_retry_delay_ms=50,
                          on_appended=store.reput, ha_secret=secret, broker_name="broker-a",
                          ssl_context=client_tls.context() if client_tls is not None else None)
        await client.start()
        self.slaves.append((client, store))
        return client, store

    async def close(self) -> None:
        for client, store in self.slaves:
            await client.stop()
            store.shutdown()  # type: ignore[attr-defined]
        await self.service.stop()
        self.master.shutdown()


@pytest.mark.parametrize("secret", ["", SECRET])
async def test_classic_slave_replicates_over_tls(tmp_path: Path, certs: CertSet, secret: str) -> None:
    group = Classic(tmp_path, _server(certs), secret)
    await group.service.start()
    try:
        _link, store = await group.slave("good", _client(certs), secret)
        await wait_for(lambda: group.service.connection_count == 1, 10, what="TLS link")
        ends = put_n(group.master, 0, 200)
        group.service.notify_data_appended()
        assert await group.service.wait_for_slave_ack(ends[-1], 5000)
        await wait_for(lambda: store.max_phy_offset == ends[-1], 10, what="slave caught up")  # type: ignore[attr-defined]
    finally:
        await group.close()


async def test_classic_plain_or_certless_slave_never_acks(tmp_path: Path, certs: CertSet) -> None:
    group = Classic(tmp_path, _server(certs), "")
    await group.service.start()
    try:
        _, plain = await group.slave("plain", None, "")
        _, certless = await group.slave("certless", _client(certs, with_cert=False), "")
        ends = put_n(group.master, 0, 20)
        group.service.notify_data_appended()
        assert not await group.service.wait_for_slave_ack(ends[-1], 1500)
        assert group.service.connection_count == 0
        assert plain.max_phy_offset == certless.max_phy_offset == 0  # type: ignore[attr-defined]
    finally:
        await group.close()


class Auto:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.stores: list[object] = []
        self.parts: list[AutoSwitchHAMaster | AutoSwitchHAClient] = []

    def store(self, name: str) -> tuple[object, EpochFile]:
        store = open_store(self.tmp / name, BrokerRole.ASYNC_MASTER)
        self.stores.append(store)
        return store, EpochFile.in_store(str(self.tmp / name))

    async def close(self) -> None:
        for part in reversed(self.parts):
            await part.stop()
        for store in self.stores:
            if store.running:  # type: ignore[attr-defined]
                store.shutdown()  # type: ignore[attr-defined]


@pytest.fixture
async def auto(tmp_path: Path) -> AsyncIterator[Auto]:
    group = Auto(tmp_path)
    try:
        yield group
    finally:
        await group.close()


async def test_controller_mode_replica_over_tls(auto: Auto, certs: CertSet) -> None:
    ms, me = auto.store("m")
    me.append(1, 0)
    put_n(ms, 0, 300)
    master = AutoSwitchHAMaster(ms, me, "127.0.0.1", 0, broker_name="b", replica_id=1, ha_secret=SECRET,
                                tls=_server(certs, TlsMode.PERMISSIVE))
    await master.start()
    auto.parts.append(master)
    clients = []
    for replica_id, tls in ((2, _client(certs)), (3, None)):  # 3 is plain: permissive lets it in
        ss, se = auto.store(f"s{replica_id}")
        client = AutoSwitchHAClient(ss, se, replica_id, "b", ha_secret=SECRET, on_appended=ss.reput,  # type: ignore[attr-defined]
                                    reconnect_interval_ms=100,
                                    ssl_context=tls.context() if tls is not None else None)
        await client.start()
        client.set_master(f"127.0.0.1:{master.port}", 1)
        auto.parts.append(client)
        clients.append((client, ss))
    for _, ss in clients:
        await wait_for(lambda ss=ss: ss.max_phy_offset == ms.max_phy_offset, what="catch-up")  # type: ignore[attr-defined]
    master.set_sync_state_set({1, 2, 3}, 1)
    ends = put_n(ms, 300, 10)
    master.notify_data_appended()
    assert await master.wait_for_ack(ends[-1], 5000)
    listener = master._server
    assert listener is not None and (listener.tls_connections, listener.plain_connections) >= (1, 1)
