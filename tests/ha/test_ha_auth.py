"""HA peer authentication (ha/auth.py): the handshake codec, and a SYNC master with ``haSecret`` over real
loopback sockets: a slave with the secret replicates and releases SYNC waits; a wrong secret or an impostor
that only sends offset reports never does."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from ha_store_support import open_store, put_n

from ferrymq.ha import auth
from ferrymq.ha.client import HAClient
from ferrymq.ha.service import HAService
from ferrymq.store.config import BrokerRole
from support.aio import wait_for

SECRET = "s3cret-of-group-a"


def test_handshake_round_trip_and_refusals() -> None:
    nonce, challenge = auth.new_challenge()
    proof = auth.response_to(challenge, SECRET, "broker-a")
    assert auth.verify(proof, SECRET, "broker-a", nonce)
    assert not auth.verify(proof, "other", "broker-a", nonce)
    assert not auth.verify(proof, SECRET, "broker-b", nonce), "bound to the broker group"
    assert not auth.verify(proof, SECRET, "broker-a", auth.new_challenge()[0]), "bound to the nonce"
    assert not auth.verify(proof[:-1], SECRET, "broker-a", nonce)
    with pytest.raises(auth.HAAuthError):
        auth.response_to(b"\0" * auth.CHALLENGE.size, SECRET, "broker-a")  # a plain master's transfer bytes
    with pytest.raises(auth.HAAuthError):
        auth.response_to(challenge[:-1], SECRET, "broker-a")


class _Group:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.master = open_store(tmp / "master", BrokerRole.SYNC_MASTER)
        self.service = HAService(self.master, listen_host="127.0.0.1", listen_port=0, heartbeat_interval_ms=200,
                                 housekeeping_interval_ms=2000, ha_secret=SECRET, broker_name="broker-a")
        self.slaves: list[tuple[HAClient, object]] = []

    async def slave(self, name: str, secret: str) -> tuple[HAClient, object]:
        store = open_store(self.tmp / name, BrokerRole.SLAVE)
        client = HAClient(store, master_ha_addr=f"127.0.0.1:{self.service.port}", heartbeat_interval_ms=200,
                          housekeeping_interval_ms=2000, reconnect_interval_ms=100, session_retry_delay_ms=50,
                          on_appended=store.reput, ha_secret=secret, broker_name="broker-a")
        await client.start()
        self.slaves.append((client, store))
        return client, store

    async def close(self) -> None:
        for client, store in self.slaves:
            await client.stop()
            store.shutdown()  # type: ignore[attr-defined]
        await self.service.stop()
        self.master.shutdown()


async def test_slave_with_the_secret_replicates_and_releases_sync_waits(tmp_path: Path) -> None:
    group = _Group(tmp_path)
    await group.service.start()
    try:
        _client, store = await group.slave("good", SECRET)
        await wait_for(lambda: group.service.connection_count == 1, 5, what="authenticated link")
        ends = put_n(group.master, 0, 50)
        group.service.notify_data_appended()
        assert await group.service.wait_for_slave_ack(ends[-1], 5000)
        await wait_for(lambda: store.max_phy_offset == ends[-1], 5, what="slave caught up")  # type: ignore[attr-defined]
    finally:
        await group.close()


async def test_wrong_secret_and_impostor_never_release_a_sync_wait(tmp_path: Path) -> None:
    group = _Group(tmp_path)
    await group.service.start()
    try:
        _client, store = await group.slave("wrong", "not-the-secret")
        # an impostor: connects and reports a huge offset over and over, as a plain RocketMQ slave would
        reader, writer = await asyncio.open_connection("127.0.0.1", group.service.port)
        ends = put_n(group.master, 0, 20)
        group.service.notify_data_appended()
        for _ in range(20):
            writer.write(struct.pack(">q", 1 << 40))
        await writer.drain()
        assert not await group.service.wait_for_slave_ack(ends[-1], 1500)
        assert not group.service.is_slave_ok(ends[-1])
        assert group.service.connection_count == 0
        assert store.max_phy_offset == 0  # type: ignore[attr-defined]
        # the impostor got the challenge and nothing else, then was closed
        got = await asyncio.wait_for(reader.read(1 << 16), 10)
        assert got == b"" or got[:4] == auth.CHALLENGE_MAGIC
        writer.close()
    finally:
        await group.close()
