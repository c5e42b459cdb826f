"""TLS with real processes: a name server, a SYNC_MASTER and its SLAVE all in enforcing mode (the slave replicating
over TLS with haSecret on top), our client and ``ferry --tls``; a plain client and a client that trusts another CA
refused; a permissive name server and broker serving plain and TLS clients on one port."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import (
    Broker,
    Namesrv,
    ProcessGroup,
    broker_listed,
    cluster_info,
    ferry_argv,
    free_port,
    max_offset,
    port_answers,
    start_broker,
    wait_for,
    write_properties,
)

from ferrymq.client import Message, Producer
from ferrymq.client.consumer.pull import PullConsumer
from ferrymq.common import tls
from ferrymq.common.route import MessageQueue
from ferrymq.common.tls import TlsClientSettings
from support.certs import CertSet, make_certs

pytestmark = pytest.mark.acceptance

TOPIC = "TlsTopic"
COUNT = 40
START_TIMEOUT_S = 60


@pytest.fixture
def certs(tmp_path: Path) -> CertSet:
    return make_certs(tmp_path / "certs")


@pytest.fixture
def trusting_process(certs: CertSet) -> Iterator[TlsClientSettings]:
    """This test process's own helpers (procs.request, route look-ups) speak TLS trusting the test CA."""
    settings = TlsClientSettings(trust_cert_path=str(certs.ca))
    tls.set_default_client_tls(settings)
    try:
        yield settings
    finally:
        tls.set_default_client_tls(None)


def _server_props(certs: CertSet, mode: str) -> dict[str, Any]:
    return {"tlsServerMode": mode, "tls.server.certPath": str(certs.server_cert),
            "tls.server.keyPath": str(certs.server_key)}


def _client_props(certs: CertSet) -> dict[str, Any]:
    return {"tlsEnable": True, "tls.client.trustCertPath": str(certs.ca)}


def _start_namesrv(procs: ProcessGroup, props: dict[str, Any]) -> Namesrv:
    port = free_port()
    conf = write_properties(procs.base_dir / "namesrv.conf", dict(props, listenHost="127.0.0.1", listenPort=port))
    proc = procs.spawn("namesrv", ferry_argv("namesrv", "-c", str(conf)))
    ns = Namesrv(proc, port)
    wait_for(lambda: port_answers(port) and cluster_info(ns.addr) is not None, timeout_s=START_TIMEOUT_S,
             what="TLS name server", alive=[proc])
    return ns


def _ferry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ferry_argv(*args), capture_output=True, text=True, timeout=60)


async def _round_trip(ns_addr: str, client_tls: TlsClientSettings | None, group: str) -> tuple[int, int]:
    sent = 0
    async with Producer(ns_addr, f"{group}_pg", tls=client_tls) as producer:
        for i in range(COUNT):
            result = await producer.send(Message(TOPIC, f"{group}-{i}".encode()))
            sent += result.status.name == "SEND_OK"
    consumer = PullConsumer(ns_addr, f"{group}_cg", tls=client_tls)
    await consumer.start()
    try:
        pulled = 0
        for mq in await consumer.fetch_subscribe_message_queues(TOPIC):
            result = await consumer.pull(MessageQueue(mq.topic, mq.broker_name, mq.queue_id), 0, max_nums=1000)
            pulled += sum(1 for m in result.messages if m.body.startswith(group.encode()))
    finally:
        await consumer.close()
    return sent, pulled


def test_enforcing_cluster_with_a_slave_replicating_over_tls(procs: ProcessGroup, certs: CertSet,
                                                             trusting_process: TlsClientSettings) -> None:
    ns = _start_namesrv(procs, _server_props(certs, "enforcing"))
    tls_props = dict(_server_props(certs, "enforcing"), **_client_props(certs), haSecret="group-a-secret")
    master = start_broker(procs, [ns.addr], name="master", brokerRole="SYNC_MASTER", timeout_s=START_TIMEOUT_S,
                          **tls_props)
    slave = start_broker(procs, [ns.addr], name="slave", brokerRole="SLAVE", brokerId=1,
                         haListenPort=free_port(), timeout_s=START_TIMEOUT_S, **tls_props)
    wait_for(lambda: broker_listed(ns.addr, "broker-a", slave.addr, 1), timeout_s=START_TIMEOUT_S,
             what="slave registered over TLS", alive=[slave.proc])

    # SYNC_MASTER: every SEND_OK waited for the slave's ack, so the slave replicated over TLS
    sent, pulled = asyncio.run(_round_trip(ns.addr, trusting_process, "tls"))
    assert (sent, pulled) == (COUNT, COUNT)
    master_total = sum(max_offset(master.addr, TOPIC, q) for q in range(4))
    wait_for(lambda: sum(max_offset(slave.addr, TOPIC, q) for q in range(4)) == master_total, timeout_s=30,
             what="the slave's queues to match the master's")

    ok = _ferry("--tls", "--tls-trust-cert", str(certs.ca), "cluster", "list", "-n", ns.addr, "--json")
    assert ok.returncode == 0, ok.stderr
    assert master.addr in ok.stdout and slave.addr in ok.stdout

    plain = _ferry("cluster", "list", "-n", ns.addr, "--json")
    assert plain.returncode != 0 and master.addr not in plain.stdout
    wrong_ca = _ferry("--tls-trust-cert", str(certs.other_ca), "cluster", "list", "-n", ns.addr, "--json")
    assert wrong_ca.returncode != 0
    assert "certificate verify failed" in wrong_ca.stdout + wrong_ca.stderr
    for broker in (master, slave):
        assert broker.proc is not None and not broker.proc.exited


def test_permissive_broker_serves_plain_and_tls_clients(procs: ProcessGroup, certs: CertSet) -> None:
    ns = _start_namesrv(procs, _server_props(certs, "permissive"))  # a client's TLS setting covers both
    broker: Broker = start_broker(procs, [ns.addr], name="broker", timeout_s=START_TIMEOUT_S,
                                  **_server_props(certs, "permissive"))
    assert asyncio.run(_round_trip(ns.addr, None, "plain")) == (COUNT, COUNT)
    assert asyncio.run(_round_trip(ns.addr, TlsClientSettings(trust_cert_path=str(certs.ca)), "tls")) == (COUNT, COUNT)
    assert broker.proc is not None and not broker.proc.exited


def test_a_missing_certificate_stops_the_broker_naming_the_key(procs: ProcessGroup, certs: CertSet) -> None:
    conf = write_properties(procs.base_dir / "bad.conf", {
        "brokerName": "broker-bad", "listenPort": free_port(broker=True), "listenHost": "127.0.0.1",
        "storePathRootDir": str(procs.base_dir / "bad-store"), "namesrvAddr": "127.0.0.1:1",
        "tlsServerMode": "enforcing", "tls.server.certPath": str(certs.ca.parent / "missing.pem"),
        "tls.server.keyPath": str(certs.server_key)})
    result = subprocess.run(ferry_argv("broker", "-c", str(conf)), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "tls.server.certPath" in result.stderr and "missing.pem" in result.stderr
