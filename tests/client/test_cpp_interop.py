"""Interop with the Apache C++ client (PyPI rocketmq==0.4.4) run in subprocesses:
our producer → C++ PushConsumer, and C++ producer → our push consumer."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from client_helpers import wait_for

from ferrymq.client import Admin, ConsumeStatus, MessageExt, Producer, PushConsumer, new_message
from support.inproc import needs_cluster

pytestmark = [needs_cluster, pytest.mark.acceptance]

SCRIPTS = Path(__file__).parent / "cpp"
SUBPROCESS_TIMEOUT_S = 90


def _cpp_available() -> bool:
    try:
        import rocketmq.client  # noqa: F401
    except Exception:
        return False
    return True


cpp_only = pytest.mark.skipif(not _cpp_available(), reason="PyPI rocketmq==0.4.4 not installed")


async def run_script(name: str, args: dict[str, Any]) -> tuple[int, list[dict[str, Any]], str]:
    """Run ``cpp/<name>`` with ``args`` (one JSON argument) to its end; killed on a timeout or any failure.
    Returns (exit code, its JSON stdout lines, the tail of its stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPTS / name), json.dumps(args),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), SUBPROCESS_TIMEOUT_S)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    return proc.returncode or 0, lines, err.decode()[-2000:]


async def make_topic(ns: str, topic: str) -> None:
    async with Admin(ns) as admin:
        await admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
        await admin.wait_for_route(topic)


@cpp_only
async def test_our_producer_to_cpp_consumer(ns_addr: str) -> None:
    await make_topic(ns_addr, "InteropA")
    sent = {}
    async with Producer(ns_addr, "py-pg") as p:
        for i in range(5):
            r = await p.send(new_message("InteropA", f"py-body-{i}", tags="PyTag", keys=[f"pykey-{i}", "common"],
                                         properties={"myprop": f"p{i}"}))
            sent[f"py-body-{i}"] = r
    code, lines, err = await run_script("cpp_consume.py", {"namesrv": ns_addr, "topic": "InteropA",
                                                           "group": "cpp-cg", "count": 5, "timeout_s": 60})
    assert code == 0, err
    got = {rec["body"]: rec for rec in lines}
    assert set(got) == set(sent)
    for i in range(5):
        rec = got[f"py-body-{i}"]
        assert rec["tags"] == "PyTag" and rec["keys"] == f"pykey-{i} common" and rec["prop"] == f"p{i}"
        assert rec["msg_id"] == sent[f"py-body-{i}"].msg_id  # C++ reports our UNIQ_KEY


@cpp_only
async def test_cpp_producer_to_our_consumer(ns_addr: str) -> None:
    await make_topic(ns_addr, "InteropB")
    got: list[MessageExt] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(ns_addr, "py-cg", consume_from_where="CONSUME_FROM_FIRST_OFFSET", rebalance_interval_ms=500)
    c.subscribe("InteropB", "CppTag")
    c.register_message_listener(listener)
    await c.start()
    try:
        code, lines, err = await run_script("cpp_produce.py", {"namesrv": ns_addr, "topic": "InteropB", "count": 5})
        assert code == 0, err
        assert len(lines) == 5
        await wait_for(lambda: len({m.body for m in got}) >= 5, timeout_s=30)
    finally:
        await c.close()
    by_body = {m.body.decode(): m for m in got}
    for rec in lines:
        m = by_body[f"cpp-body-{rec['seq']}"]
        assert m.tags == "CppTag" and m.keys == [f"cppkey-{rec['seq']}"]
        assert m.properties["myprop"] == f"v{rec['seq']}"
        assert m.msg_id == rec["msg_id"]
