"""Auto-renewal with the real 5.x Python SDK's PushConsumer (it receives with ``auto_renew`` and no invisible
duration): a callback longer than the invisible time is not delivered again while it runs, and the messages
of a consumer SIGKILLed mid-callback go to another consumer once renewal stops. The proxy renews in 2 s
steps (1 s ahead) so the test stays short; the defaults are 60 s and 10 s."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sdk5_support import DRIVER
from test_sdk5_clients import committed_total, received, uniq

from ferrymq.client.producer import Producer
from ferrymq.common.message import Message
from support.aio import wait_for

pytestmark = pytest.mark.acceptance

INVISIBLE_MS, AHEAD_MS = 2_000, 1_000
MESSAGES = 6


@pytest.fixture
def proxy_settings() -> dict[str, Any]:
    return {"auto_renew_invisible_ms": INVISIBLE_MS, "renew_ahead_ms": AHEAD_MS}


class SdkProcess:
    """One driver verb running in the background (``GrpcStack.sdk`` waits for its end instead)."""

    def __init__(self, stack: Any, verb: str, **args: Any) -> None:
        self.out = stack.home / f"{verb}-{uuid.uuid4().hex[:8]}.jsonl"
        self.args = {"verb": verb, "endpoints": stack.endpoints, "out": str(self.out), **args}
        self.env = {**os.environ, "PYTHONPATH": str(stack.sdk_path), "HOME": str(stack.home), **stack.env}
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> SdkProcess:
        with open(self.out.with_suffix(".stderr"), "wb") as stderr:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, str(DRIVER), json.dumps(self.args), env=self.env,
                stdout=asyncio.subprocess.DEVNULL, stderr=stderr)
        return self

    def running(self) -> bool:
        """True while the process runs; an AssertionError with its last words once it ended."""
        if self.proc is not None and self.proc.returncode is None:
            return True
        stderr = self.out.with_suffix(".stderr")
        tail = stderr.read_text(errors="replace")[-1500:] if stderr.exists() else ""
        raise AssertionError(f"SDK {self.args['verb']} ended (exit {self.proc and self.proc.returncode}): "
                             f"{self.records()[-3:]} {tail}")

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.read_text().splitlines()] if Path(self.out).exists() else []

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()  # SIGKILL: no NotifyClientTermination, the connection just drops
            await self.proc.wait()


async def produce(stack: Any, topic: str, prefix: str) -> None:
    async with Producer(stack.namesrv.addr, uniq("pg")) as producer:
        for i in range(MESSAGES):
            await producer.send(Message(topic, f"{prefix}-{i}".encode()))


def telemetry_open(stack: Any, group: str) -> int:
    """Clients of ``group`` whose Telemetry stream is open (started: their settings came)."""
    return sum(1 for info in stack.proxy.service._clients.values() if info.outbox is not None and info.group == group)


def proxy_state(stack: Any, group: str) -> str:
    """What the proxy holds for ``group`` (a failure's diagnosis)."""
    svc = stack.proxy.service
    now = svc.clock_ms()
    clients = {c: ("telemetry open" if i.outbox is not None else "telemetry closed")
               for c, i in svc._clients.items() if i.group == group}
    held = {k[3]: [(o, e.attempt, e.visible_at_ms - now) for o, e in pq.entries.items()]
            for k, pq in svc.pop_queues.items() if k[0] == group}
    return f"clients {clients}, renewed {len(svc.renewals)}, held (offset, attempt, visible in ms) {held}"


async def test_push_consumers_keep_their_messages_while_they_live(grpc_stack: Any) -> None:
    """Both cases at once on one stack (separate topics and groups): the SDK processes' start-up and shutdown
    are most of the time."""
    await asyncio.gather(a_callback_longer_than_the_invisible_time_consumes_each_message_once(grpc_stack),
                         a_killed_consumers_messages_go_to_another_consumer_once_renewal_stops(grpc_stack))


async def a_callback_longer_than_the_invisible_time_consumes_each_message_once(grpc_stack: Any) -> None:
    topic, group = uniq("TR"), uniq("gr")
    await grpc_stack.create_topic(topic)
    await produce(grpc_stack, topic, "slow")
    consume_s = 1.75 * INVISIBLE_MS / 1000  # past the first invisible time and two renewals
    records = await grpc_stack.sdk("push", topic=topic, group=group, expect=MESSAGES, consume_s=consume_s,
                                   timeout_s=40)
    starts = Counter(r["body"] for r in received(records))
    assert starts == {f"slow-{i}": 1 for i in range(MESSAGES)}, starts
    assert all(r["attempt"] == 1 for r in received(records))
    assert Counter(r["consumed"] for r in records if "consumed" in r and "done" not in r) == starts
    # the acks carried the handles of the first delivery: all acknowledged, the offsets move to the end
    await wait_for(lambda: committed_total(grpc_stack.broker, group, topic, 4) == MESSAGES, timeout_s=10,
                   what="offsets committed")


async def a_killed_consumers_messages_go_to_another_consumer_once_renewal_stops(grpc_stack: Any) -> None:
    topic, group = uniq("TK"), uniq("gk")
    await grpc_stack.create_topic(topic)
    await produce(grpc_stack, topic, "held")
    stuck = await SdkProcess(grpc_stack, "push", topic=topic, group=group, expect=MESSAGES, consume_s=600,
                             timeout_s=60).start()
    other = SdkProcess(grpc_stack, "push", topic=topic, group=group, expect=MESSAGES, timeout_s=90)
    try:
        await wait_for(lambda: len(received(stuck.records())) >= MESSAGES, timeout_s=30,
                       what="every message in a callback of the first consumer")
        await other.start()
        await wait_for(lambda: other.running() and telemetry_open(grpc_stack, group) == 2, timeout_s=30,
                       what="second consumer started")
        # 1.5 invisible times with both consumers receiving: nothing held is delivered again to either
        await asyncio.sleep(1.5 * INVISIBLE_MS / 1000)
        assert Counter(r["body"] for r in received(stuck.records())) == {f"held-{i}": 1 for i in range(MESSAGES)}
        assert received(other.records()) == []
        killed_at = time.time()
        await stuck.kill()
        try:
            await wait_for(lambda: other.running() and len(received(other.records())) >= MESSAGES, timeout_s=20,
                           what="the killed consumer's messages delivered to the other one")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {proxy_state(grpc_stack, group)}") from None
        again = received(other.records())
        assert sorted(r["body"] for r in again) == sorted(f"held-{i}" for i in range(MESSAGES))
        assert all(r["attempt"] == 2 for r in again)
        # the renewal stopped at the next step: back after at most one invisible time (+ the receive's poll)
        assert max(r["t"] for r in again) - killed_at < (INVISIBLE_MS + 3_000) / 1000
    finally:
        await stuck.kill()
        await other.kill()
