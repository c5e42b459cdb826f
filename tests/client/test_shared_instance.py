"""Producers that give the same ``instance_name`` (and equal options) share one started ClientInstance: one
connection per broker for all of them; the last one to close closes it, an earlier one unregisters only its
group. Producers without an instance name, with other options, or transactional keep their own."""

from __future__ import annotations

import asyncio
from typing import Any

from client_helpers import wait_for

from ferrymq.client import Admin, Producer, SendStatus, new_message
from ferrymq.client.instance import _SHARED
from ferrymq.client.transaction import LocalTransactionState, TransactionProducer
from support.inproc import needs_cluster

pytestmark = needs_cluster


async def _create(ns: str, topic: str) -> None:
    async with Admin(ns) as admin:
        await admin.create_topic(topic, read_queue_nums=4, write_queue_nums=4)
        await admin.wait_for_route(topic)


def _open_broker_connections(p: Producer, ns_addr: str) -> list[Any]:
    return [c for addr, c in p.instance.pool._conns.items() if not c.closed and addr != ns_addr]


async def test_same_instance_name_shares_one_instance_and_connection(ns_addr: str, broker: Any) -> None:
    await _create(ns_addr, "Shared")
    producers = [Producer(ns_addr, f"pg-shared-{i}", instance_name="shared-a") for i in range(8)]
    await asyncio.gather(*(p.start() for p in producers))  # started together: still one instance
    try:
        inst = producers[0].instance
        assert all(p.instance is inst for p in producers)
        assert inst.producer_groups >= {f"pg-shared-{i}" for i in range(8)}

        async def run(p: Producer, n: int) -> list[int]:
            offsets = []
            for k in range(n):
                r = await p.send(new_message("Shared", f"{p.group}-{k}".encode()))
                assert r.status is SendStatus.SEND_OK
                offsets.append(r.queue_offset)
            return offsets

        await asyncio.gather(*(run(p, 50) for p in producers))
        assert len(_open_broker_connections(producers[0], ns_addr)) == 1  # one broker: one connection for all eight
        await inst.send_heartbeats()
        chans = broker.producers.groups
        conns = {conn for g in range(8) for conn in chans[f"pg-shared-{g}"]}
        assert len(conns) == 1  # the broker sees every group on the one connection

        # an earlier producer closing leaves the instance to the others and unregisters only its group
        await producers[0].close()
        assert not inst.closing
        await wait_for(lambda: "pg-shared-0" not in broker.producers.groups)
        assert "pg-shared-1" in broker.producers.groups
        r = await producers[1].send(new_message("Shared", b"after"))
        assert r.status is SendStatus.SEND_OK
    finally:
        for p in producers:
            await p.close()
    assert inst.closing  # the last producer closed it
    assert not any(e.instance is inst for e in _SHARED.values())


async def test_a_producer_started_after_all_closed_gets_a_new_instance(ns_addr: str) -> None:
    a = Producer(ns_addr, "pg-again", instance_name="again")
    await a.start()
    first = a.instance
    await a.close()
    assert first.closing
    b = Producer(ns_addr, "pg-again", instance_name="again")
    await b.start()
    try:
        assert b.instance is not first and not b.instance.closing
    finally:
        await b.close()


async def test_same_group_closing_keeps_the_group_registered(ns_addr: str, broker: Any) -> None:
    await _create(ns_addr, "SharedGroup")
    a = Producer(ns_addr, "pg-same", instance_name="same-group")
    b = Producer(ns_addr, "pg-same", instance_name="same-group")
    await a.start()
    await b.start()
    try:
        assert a.instance is b.instance
        await a.send(new_message("SharedGroup", b"x"))
        await a.instance.send_heartbeats()
        assert "pg-same" in broker.producers.groups
        await a.close()
        await b.instance.send_heartbeats()
        assert "pg-same" in b.instance.producer_groups
        assert "pg-same" in broker.producers.groups
        assert (await b.send(new_message("SharedGroup", b"y"))).status is SendStatus.SEND_OK
    finally:
        await a.close()
        await b.close()


async def test_no_sharing_without_a_name_with_other_options_or_for_transactions(ns_addr: str) -> None:
    plain = [Producer(ns_addr, "pg-own"), Producer(ns_addr, "pg-own")]
    other_options = [Producer(ns_addr, "pg-opt", instance_name="opt"),
                     Producer(ns_addr, "pg-opt", instance_name="opt", poll_name_server_interval_ms=1_000)]

    def local(msg: Any, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    tx = [TransactionProducer(ns_addr, f"pg-tx-{i}", execute_local=local, check_local=local, instance_name="tx")
          for i in range(2)]
    everything = plain + other_options + tx
    for p in everything:
        await p.start()
    try:
        assert plain[0].instance is not plain[1].instance
        assert other_options[0].instance is not other_options[1].instance
        assert tx[0].instance is not tx[1].instance
    finally:
        for p in everything:
            await p.close()
    assert all(p._instance is None for p in everything)
    assert not any(e.instance.config.instance_name in ("opt", "tx") for e in _SHARED.values())


async def test_producers_on_other_event_loops_do_not_share(ns_addr: str) -> None:
    from ferrymq.client.sync import SyncProducer

    await _create(ns_addr, "SharedSync")

    def run() -> None:
        a = SyncProducer(ns_addr, "pg-sync-a", instance_name="sync")
        b = SyncProducer(ns_addr, "pg-sync-b", instance_name="sync")
        try:
            assert a.wrapped.instance is not b.wrapped.instance  # each facade runs its own loop
            assert a.send(new_message("SharedSync", b"a")).status is SendStatus.SEND_OK
            assert b.send(new_message("SharedSync", b"b")).status is SendStatus.SEND_OK
        finally:
            a.close()
            b.close()

    await asyncio.to_thread(run)
    assert not any(e.instance.config.instance_name == "sync" for e in _SHARED.values())


async def test_sharing_producers_recover_together_from_a_dropped_connection(ns_addr: str) -> None:
    await _create(ns_addr, "SharedDrop")
    producers = [Producer(ns_addr, f"pg-drop-{i}", instance_name="drop", send_timeout_ms=10_000) for i in range(4)]
    await asyncio.gather(*(p.start() for p in producers))
    try:
        for p in producers:
            assert (await p.send(new_message("SharedDrop", b"before"))).status is SendStatus.SEND_OK
        (conn,) = _open_broker_connections(producers[0], ns_addr)
        conn.abort()  # the one connection all four send through

        async def send_until_ok(p: Producer) -> None:
            async def ok() -> bool:
                try:
                    return (await p.send(new_message("SharedDrop", b"after"))).status is SendStatus.SEND_OK
                except Exception:  # noqa: BLE001 - reconnecting: try again until the deadline
                    return False
            await wait_for(ok)

        await asyncio.gather(*(send_until_ok(p) for p in producers))
        conns = _open_broker_connections(producers[0], ns_addr)
        assert len(conns) == 1 and conns[0] is not conn
    finally:
        for p in producers:
            await p.close()
