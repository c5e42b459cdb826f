"""Transactional messages against a real broker process (broker/transaction.py, client/transaction.py):
commit delivered once, rollback never, UNKNOW settled by the check-back, a dead producer's half message asked
of another producer of its group, and a broker SIGKILLed between the half message and the decision."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from procs import Cluster, wait_for

from ferrymq.client import Message, PullConsumer, PullStatus, new_message
from ferrymq.client.transaction import LocalTransactionState as S
from ferrymq.client.transaction import TransactionProducer

FAST_CHECKS = {"transactionTimeOut": 500, "transactionCheckInterval": 300, "transactionCheckMax": 5}
TOPIC = "TxTopic"


async def _bodies(ns: str, topic: str, queues: int = 4) -> list[str]:
    """Every body of ``topic`` readable by a consumer (queues 0..queues-1, from offset 0)."""
    out: list[str] = []
    async with PullConsumer(ns, "tx-reader") as consumer:
        for mq in await consumer.fetch_subscribe_message_queues(topic):
            offset = 0
            while True:
                res = await consumer.pull(mq, offset, 32)
                if res.status is not PullStatus.FOUND:
                    break
                out += [m.body.decode() for m in res.messages]
                offset = res.next_begin_offset
    return out


def bodies(ns: str, topic: str = TOPIC) -> list[str]:
    return asyncio.run(_bodies(ns, topic))


def _send(ns: str, group: str, items: list[tuple[str, S]], check: Callable[[Any], S]) -> list[Any]:
    async def run() -> list[Any]:
        states = dict(items)
        async with TransactionProducer(ns, group, execute_local=lambda msg, arg: states[msg.body.decode()],
                                       check_local=check) as producer:
            return [await producer.send_in_transaction(new_message(TOPIC, body)) for body, _ in items]

    return asyncio.run(run())


def test_commit_rollback_and_check_back(cluster: Callable[..., Cluster]) -> None:
    c = cluster(**FAST_CHECKS)
    checked: list[str] = []

    def check(msg: Any) -> S:
        checked.append(msg.body.decode())
        return S.COMMIT_MESSAGE

    results = _send(c.ns_addr, "tx-a", [("c1", S.COMMIT_MESSAGE), ("r1", S.ROLLBACK_MESSAGE),
                                         ("c2", S.COMMIT_MESSAGE)], check)
    assert [r.local_state for r in results] == [S.COMMIT_MESSAGE, S.ROLLBACK_MESSAGE, S.COMMIT_MESSAGE]
    wait_for(lambda: sorted(bodies(c.ns_addr)) == ["c1", "c2"], timeout_s=30, what="committed messages",
             alive=c.alive)

    async def unknown_then_check() -> None:
        async with TransactionProducer(c.ns_addr, "tx-b", execute_local=lambda m, a: S.UNKNOW,
                                       check_local=check) as producer:
            await producer.send_in_transaction(new_message(TOPIC, b"u1"))
            assert "u1" not in await _bodies(c.ns_addr, TOPIC)  # undecided: invisible
            for _ in range(200):  # the check-back needs the producer alive
                if "u1" in await _bodies(c.ns_addr, TOPIC):
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"u1 not delivered after the check-back; checked {checked}")

    asyncio.run(unknown_then_check())
    assert checked.count("u1") >= 1 and "c1" not in checked and "r1" not in checked
    assert sorted(bodies(c.ns_addr)) == ["c1", "c2", "u1"]  # each once, rollback never


def test_check_back_reaches_another_producer_of_the_group(cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    c = cluster(**FAST_CHECKS)
    script = textwrap.dedent(f"""
        import asyncio, os
        from ferrymq.client import new_message
        from ferrymq.client.transaction import LocalTransactionState as S, TransactionProducer
        async def main():
            p = TransactionProducer({c.ns_addr!r}, "tx-shared", execute_local=lambda m, a: S.UNKNOW,
                                    check_local=lambda m: S.UNKNOW)
            await p.start()
            r = await p.send_in_transaction(new_message({TOPIC!r}, b"orphan"))
            print(r.send_result.status.value, flush=True)
            os._exit(0)  # dies without deciding
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "SEND_OK", out.stderr

    async def other_producer() -> None:
        async with TransactionProducer(c.ns_addr, "tx-shared", execute_local=lambda m, a: S.UNKNOW,
                                       check_local=lambda m: S.COMMIT_MESSAGE if m.body == b"orphan" else S.UNKNOW):
            for _ in range(300):
                if "orphan" in await _bodies(c.ns_addr, TOPIC):
                    return
                await asyncio.sleep(0.1)
            raise AssertionError("the orphan half message was not committed through the group's other producer")

    asyncio.run(other_producer())
    assert bodies(c.ns_addr).count("orphan") == 1


def test_broker_killed_between_half_and_decision(cluster: Callable[..., Cluster]) -> None:
    c = cluster(**FAST_CHECKS)
    decided: list[str] = []

    async def half_then_kill() -> None:
        # the restarted broker asks producers it knows: this one heartbeats every 500 ms (30 s by default)
        async with TransactionProducer(c.ns_addr, "tx-k", execute_local=lambda m, a: S.UNKNOW,
                                       check_local=lambda m: (decided.append(m.body.decode()),
                                                              S.COMMIT_MESSAGE)[1],
                                       heartbeat_broker_interval_ms=500) as producer:
            await producer.send_in_transaction(Message(TOPIC, b"survivor"))
            await producer.send_in_transaction(Message(TOPIC, b"dropped"))
            await asyncio.to_thread(c.broker.restart, kill=True)  # SIGKILL before any decision
            for _ in range(300):
                got = await _bodies(c.ns_addr, TOPIC)
                if "survivor" in got and "dropped" in got:
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"half messages not settled after the restart (checked {decided})")

    asyncio.run(half_then_kill())
    got = bodies(c.ns_addr)
    assert got.count("survivor") == 1 and got.count("dropped") == 1, got


def test_rejected_when_the_broker_refuses_transactions(cluster: Callable[..., Cluster]) -> None:
    c = cluster(rejectTransactionMessage=True)

    async def run() -> None:
        async with TransactionProducer(c.ns_addr, "tx-r", execute_local=lambda m, a: S.COMMIT_MESSAGE,
                                       check_local=lambda m: S.COMMIT_MESSAGE) as producer:
            try:
                await producer.send_in_transaction(new_message(TOPIC, b"no"))
            except Exception as exc:
                assert "rejectTransactionMessage" in str(exc)
            else:
                raise AssertionError("a half message was accepted by a broker that refuses them")

    asyncio.run(run())
