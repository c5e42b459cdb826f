"""Every ``ferry`` command docs/operations.md shows is run: the ones of a name server + broker here, as an
operator would paste them (placeholders filled in), against real processes with a live producer and consumer;
the rest (controllers, ACL, TLS, elections) by the acceptance test named beside them. A command added to the
page without a run here fails ``test_every_documented_command_has_a_run``."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from ferry_cli import CLI_TIMEOUT_S, FAST_CLIENT
from procs import Cluster, ferry_argv

from ferrymq.client import ConsumeStatus, MessageExt, Producer, PushConsumer, new_message

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "operations.md"
TOPIC = "OpsDocT"
GROUP = "ops-doc-cg"
CLONE_GROUP = "ops-doc-cg2"
PRODUCER_GROUP = "ops-doc-pg"
#: deadline of the condition waits
WAIT_S = 30.0

#: documented commands another acceptance test runs (they need controllers, ACL accounts or TLS certificates)
RUN_ELSEWHERE = {
    "ferry --access-key ... --secret-key ...": "tests/acceptance/test_acl.py",
    "ferry acl ...": "tests/acceptance/test_acl.py",
    "ferry --tls-trust-cert ca.pem": "tests/acceptance/test_tls_cluster.py",
    "ferry controller status": "tests/acceptance/test_controller.py",
    "ferry controller metadata": "tests/acceptance/test_controller.py",
    "ferry controller sync-state-set -b NAME": "tests/acceptance/test_controller.py",
    "ferry ha elect": "tests/acceptance/test_failover_controller.py",
    "ferry broker epoch -b NAME": "tests/broker/test_controller_mode.py",
}

#: documented command -> the argument lists run here, in this order ({placeholders} filled in at run time)
RUN_HERE: dict[str, list[list[str]]] = {
    "ferry cluster list": [["cluster", "list"]],
    "ferry ha status": [["ha", "status"]],
    "ferry broker status -b ADDR": [["broker", "status", "-b", "{addr}"]],
    "ferry broker config get -b ADDR": [["broker", "config", "get", "-b", "{addr}"]],
    "ferry broker config set -b ADDR k=v ...": [["broker", "config", "set", "-b", "{addr}", "fileReservedTime=48"]],
    "ferry broker config set -b MASTER slaveTimeout=1000": [
        ["broker", "config", "set", "-b", "{addr}", "slaveTimeout=1000"]],
    "ferry broker config set": [["broker", "config", "set", "-b", "{addr}", "maxMessageSize=4194304"]],
    "ferry broker wipe-write-perm -b NAME": [["broker", "wipe-write-perm", "-b", "{name}"]],
    "ferry broker add-write-perm -b NAME": [["broker", "add-write-perm", "-b", "{name}"]],
    "ferry broker delete-expired-commitlog": [["broker", "delete-expired-commitlog"]],
    "ferry broker consume-stats -b ADDR [--order]": [["broker", "consume-stats", "-b", "{addr}"],
                                                    ["broker", "consume-stats", "-b", "{addr}", "--order"]],
    "ferry cluster clean-expired": [["cluster", "clean-expired"]],
    "ferry cluster clean-unused-topic": [["cluster", "clean-unused-topic"]],
    "ferry consumer progress -g G": [["consumer", "progress", "-g", GROUP]],
    "ferry consumer connection -g G": [["consumer", "connection", "-g", GROUP]],
    "ferry consumer status -g G -t T": [["consumer", "status", "-g", GROUP, "-t", TOPIC]],
    "ferry consumer status -g G -i CLIENT_ID": [["consumer", "status", "-g", GROUP, "-i", "{client_id}"]],
    "ferry consumer topics -g G": [["consumer", "topics", "-g", GROUP]],
    "ferry consumer config -g G": [["consumer", "config", "-g", GROUP]],
    "ferry stats all [-t T] [--active]": [["stats", "all"], ["stats", "all", "-t", TOPIC, "--active"]],
    "ferry topic who-consumes -t T": [["topic", "who-consumes", "-t", TOPIC]],
    "ferry producer connection -g G": [["producer", "connection", "-g", PRODUCER_GROUP]],
    "ferry producer all -b ADDR": [["producer", "all", "-b", "{addr}"]],
    "ferry consumer reset-offset -g G -t T -s WHEN": [["consumer", "reset-offset", "-g", GROUP, "-t", TOPIC,
                                                       "-s", "0"]],
    "ferry consumer skip-backlog -g G -t T": [["consumer", "skip-backlog", "-g", GROUP, "-t", TOPIC]],
    "ferry consumer clone-offset -s SRC -d DST [-t T]": [
        ["consumer", "clone-offset", "-s", GROUP, "-d", CLONE_GROUP],
        ["consumer", "clone-offset", "-s", GROUP, "-d", CLONE_GROUP, "-t", TOPIC]],
    "ferry group create -g G": [["group", "create", "-g", "ops-doc-new"]],
    "ferry kv set|get|delete NS KEY [VALUE]": [["kv", "set", "ORDER_TOPIC_CONFIG", "OpsDocKey", "broker-a:4"],
                                               ["kv", "get", "ORDER_TOPIC_CONFIG", "OpsDocKey"],
                                               ["kv", "delete", "ORDER_TOPIC_CONFIG", "OpsDocKey"]],
    "ferry namesrv-config get": [["namesrv-config", "get"]],
    "ferry message show --id ID": [["message", "show", "--id", "{msg_id}"]],
    "ferry message show -t T --queue Q --offset N": [["message", "show", "-t", TOPIC, "--queue", "{queue}",
                                                      "--offset", "{queue_offset}"]],
    "ferry message print -t T [--broker B] [--queue Q] [--begin WHEN] [--end WHEN] [--limit N]": [
        ["message", "print", "-t", TOPIC],
        ["message", "print", "-t", TOPIC, "--broker", "{name}", "--queue", "{queue}", "--begin", "0",
         "--end", "{now_ms}", "--limit", "5"]],
    "ferry topic update-perm -t T -p 2|4|6": [["topic", "update-perm", "-t", TOPIC, "-p", "4"],
                                                ["topic", "update-perm", "-t", TOPIC, "-p", "6"]],
}


def documented_commands() -> set[str]:
    found = {c.replace("\\|", "|") for c in re.findall(r"`(ferry [^`]*)`", DOC.read_text())}
    return {c for c in found if not c.startswith("ferry bench")}


def test_every_documented_command_has_a_run() -> None:
    documented = documented_commands()
    covered = set(RUN_HERE) | set(RUN_ELSEWHERE)
    assert documented - covered == set(), "documented in docs/operations.md but run by no test"
    assert covered - documented == set(), "runs of commands the page no longer shows"
    for command, test_file in RUN_ELSEWHERE.items():
        verb = command.split()[1]
        assert verb in (REPO / test_file).read_text(), f"{test_file} does not run {command!r}"


def run(ns: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ferry_argv(*argv, "-n", ns), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)


def test_documented_commands_run_against_a_live_cluster(cluster: Callable[..., Cluster]) -> None:
    c = cluster()
    c.create_topic(TOPIC, queues=2)
    asyncio.run(_run_all(c))


async def _run_all(c: Cluster) -> None:
    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        return ConsumeStatus.CONSUME_SUCCESS

    loop = asyncio.get_running_loop()
    async with Producer(c.ns_addr, PRODUCER_GROUP,
                        heartbeat_broker_interval_ms=FAST_CLIENT["heartbeat_broker_interval_ms"]) as producer:
        sent = [await producer.send(new_message(TOPIC, f"doc-{i}", keys=f"k{i}")) for i in range(6)]
        consumer = PushConsumer(c.ns_addr, GROUP, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **FAST_CLIENT)
        consumer.subscribe(TOPIC, "*")
        consumer.register_message_listener(listener)
        await consumer.start()
        try:
            async def connected() -> str | None:
                cp = await loop.run_in_executor(None, run, c.ns_addr, ["consumer", "connection", "-g", GROUP,
                                                                      "--json"])
                if cp.returncode != 0:
                    return None
                conns = json.loads(cp.stdout).get("connections") or []
                return str(conns[0]["clientId"]) if conns else None
            client_id = await wait_for_async(connected, "the consumer to be connected")
            values = {"addr": c.broker_addr, "name": c.broker.broker_name, "client_id": client_id,
                      "msg_id": sent[0].offset_msg_id, "queue": str(sent[0].message_queue.queue_id),
                      "queue_offset": str(sent[0].queue_offset), "now_ms": str(int(time.time() * 1000) + 60_000)}
            failures = []
            for command, runs in RUN_HERE.items():
                for argv in runs:
                    filled = [a.format(**values) for a in argv]
                    cp = await loop.run_in_executor(None, run, c.ns_addr, filled)
                    if cp.returncode != 0 or "Traceback" in cp.stderr:
                        failures.append(f"{command!r} as `ferry {' '.join(filled)}`: exit {cp.returncode}: "
                                        f"{cp.stderr.strip()[-500:]}")
            assert not failures, "\n".join(failures)
        finally:
            await consumer.close()


async def wait_for_async(cond: Callable[[], Awaitable[str | None]], what: str) -> str:
    """Polls ``cond`` until it gives a value (a condition wait, bounded by WAIT_S)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        value = await cond()
        if value:
            return str(value)
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)

