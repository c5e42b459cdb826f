"""The Apache C++ client (PyPI ``rocketmq==0.4.4``) and ali-ons against a broker holding 5,000 topics
(issue 24): route fetch, send and consume work, and the broker keeps answering a probe promptly meanwhile.

The estate is created the way an admin tool scripting many creates would, but concurrently:
UPDATE_AND_CREATE_TOPIC pipelined over CREATE_CONNECTIONS connections (CREATES_IN_FLIGHT each). The clients
then use topics created last, so their route comes from the registration that carried the whole table.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from procs import NODE_DIR, Cluster, json_body, request, wait_route

from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import connect
from support.jsonl import read_jsonl

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]

RunScript = Callable[..., dict[str, Any]]

ESTATE_TOPICS = 5_000
QUEUES_PER_TOPIC = 8
CREATE_CONNECTIONS = 4
CREATES_IN_FLIGHT = 32
REQUEST_TIMEOUT_MS = 30_000
#: messages each client sends and consumes
MESSAGES = 20
TAGS = ["TagA", "TagB"]
#: the longest a probe request (GET_MAX_OFFSET) may wait while the clients work on the estate
PROBE_BOUND_S = 0.5
#: how long the name server may take to route the last topic created (registration is coalesced)
ROUTE_TIMEOUT_S = 30.0


def _topic(i: int) -> str:
    return f"Estate{i:05d}"


async def _create_estate(addr: str) -> None:
    """ESTATE_TOPICS creates, CREATES_IN_FLIGHT at a time on each of CREATE_CONNECTIONS connections."""
    conns = [await connect(addr, timeout_ms=3000) for _ in range(CREATE_CONNECTIONS)]
    try:
        async def worker(conn: Any, first: int) -> None:
            for start in range(first, ESTATE_TOPICS, CREATE_CONNECTIONS * CREATES_IN_FLIGHT):
                batch = range(start, min(start + CREATES_IN_FLIGHT, ESTATE_TOPICS))
                answers = await asyncio.gather(*(conn.invoke(RemotingCommand.request(
                    RequestCode.UPDATE_AND_CREATE_TOPIC, {
                        "topic": _topic(i), "defaultTopic": "TBW102", "readQueueNums": QUEUES_PER_TOPIC,
                        "writeQueueNums": QUEUES_PER_TOPIC, "perm": 6, "topicFilterType": "SINGLE_TAG",
                        "topicSysFlag": 0, "order": "false"}), REQUEST_TIMEOUT_MS) for i in batch))
                for i, resp in zip(batch, answers, strict=True):
                    assert resp.code == ResponseCode.SUCCESS, f"create {_topic(i)}: {resp.code} {resp.remark}"

        await asyncio.gather(*(worker(conn, n * CREATES_IN_FLIGHT) for n, conn in enumerate(conns)))
    finally:
        for conn in conns:
            conn.close()


class Prober:
    """Asks the broker GET_MAX_OFFSET of an estate topic every few ms in a thread of its own event loop,
    recording the longest answer time, while the test runs the clients."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.worst_s = 0.0
        self.probes = 0
        self._stop = False
        self._thread: Any = None

    def __enter__(self) -> Prober:
        import threading

        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join(10)

    async def _run(self) -> None:
        conn = await connect(self.addr, timeout_ms=3000)
        try:
            while not self._stop:
                t0 = time.perf_counter()
                resp = await conn.invoke(RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {
                    "topic": _topic(self.probes % ESTATE_TOPICS), "queueId": 0}), 5000)
                assert resp.code == ResponseCode.SUCCESS
                self.worst_s = max(self.worst_s, time.perf_counter() - t0)
                self.probes += 1
                await asyncio.sleep(0.005)
        finally:
            conn.close()


@pytest.fixture
def estate(cluster: Callable[..., Cluster]) -> Cluster:
    c = cluster()
    started = time.monotonic()
    asyncio.run(_create_estate(c.broker_addr))
    created_s = time.monotonic() - started
    table = json_body(request(c.broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG))["topicConfigTable"]
    assert all(_topic(i) in table for i in range(ESTATE_TOPICS))
    wait_route(c.ns_addr, _topic(ESTATE_TOPICS - 1), timeout_s=ROUTE_TIMEOUT_S, alive=c.alive)
    c.extra["created_s"] = created_s
    return c


def _expected(prefix: str, seq: int) -> dict[str, Any]:
    return {"seq": seq, "body": f"{prefix}-body-{seq}-", "keys": f"{prefix}-key-{seq}",
            "tags": TAGS[seq % len(TAGS)], "prop": f"{prefix}-v-{seq}"}


def test_cpp_client_and_alions_on_a_5000_topic_broker(estate: Cluster, run_script: RunScript,
                                                      tmp_path: Path) -> None:
    c = estate
    with Prober(c.broker_addr) as prober:
        # the C++ client: route fetch, sync sends, push consume with a tag filter
        cpp_topic = _topic(ESTATE_TOPICS - 1)
        sent_path = tmp_path / "cpp-sent.jsonl"
        sent = run_script("cpp", "produce", {
            "namesrv": c.ns_addr, "topic": cpp_topic, "group": f"pg_{uuid.uuid4().hex[:8]}", "count": MESSAGES,
            "prefix": "cpp", "tags": TAGS, "out": str(sent_path), "deadline_s": 60}, timeout_s=90)
        assert sent["attempted"] == MESSAGES, sent
        results = read_jsonl(sent_path)
        assert all(r.get("ok") for r in results) and len(results) == MESSAGES, results[:3]
        got_path = tmp_path / "cpp-got.jsonl"
        consumed = run_script("cpp", "consume", {
            "namesrv": c.ns_addr, "topic": cpp_topic, "group": f"cg_{uuid.uuid4().hex[:8]}",
            "expression": "TagA || TagB", "expect_seqs": list(range(MESSAGES)), "out": str(got_path),
            "timeout_s": 60}, timeout_s=90)
        assert consumed.get("met"), consumed
        assert {r["seq"] for r in read_jsonl(got_path)} == set(range(MESSAGES))

        # ali-ons: route fetch, send, consume
        assert (NODE_DIR / "node_modules" / "ali-ons").is_dir(), (
            "ali-ons is not installed: run `npm --prefix tests/acceptance/node install --no-audit --no-fund`")
        js_topic = _topic(ESTATE_TOPICS - 2)
        res = run_script("node", "alions_roundtrip", {
            "namesrv": c.ns_addr, "topic": js_topic, "producerGroup": f"pgjs_{uuid.uuid4().hex[:8]}",
            "consumerGroup": f"cgjs_{uuid.uuid4().hex[:8]}", "count": MESSAGES, "prefix": "js",
            "expression": "TagA || TagB", "timeoutMs": 90_000, "logDir": str(c.group.base_dir / "logs"),
        }, timeout_s=120)
        assert "fatal" not in res, res
        assert not res["sendErrors"], res["sendErrors"][:3]
        assert all(s["status"] == "SEND_OK" for s in res["sent"]) and len(res["sent"]) == MESSAGES
        assert res["met"], f"not every message consumed; errors: {res['errors'][:5]}"
        for r in res["received"]:
            assert {k: r[k] for k in ("seq", "body", "keys", "tags", "prop")} == _expected("js", r["seq"])
    assert prober.probes > 0
    assert prober.worst_s < PROBE_BOUND_S, (
        f"a probe waited {prober.worst_s * 1000:.0f} ms on the 5,000-topic broker ({prober.probes} probes)")
