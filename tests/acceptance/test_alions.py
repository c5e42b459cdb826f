"""npm ``ali-ons`` (pure JS RocketMQ client) against real ferrymq processes.

ali-ons never falls back to TBW102, so the topic is created first (UPDATE_AND_CREATE_TOPIC on the
broker) and we wait until the namesrv routes it; ``%RETRY%<group>`` is created by the broker on the
consumer's heartbeat. Needs ``npm --prefix tests/acceptance/node install`` (the README's test command).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from procs import NODE_DIR, Cluster, route, wait_route

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(300)]

RunScript = Callable[..., dict[str, Any]]
TAGS = ["TagA", "TagB"]


def _expected(prefix: str, seq: int) -> dict[str, Any]:
    return {"seq": seq, "body": f"{prefix}-body-{seq}-", "keys": f"{prefix}-key-{seq}",
            "tags": TAGS[seq % len(TAGS)], "prop": f"{prefix}-v-{seq}"}


def test_alions_produce_and_consume(cluster: Callable[..., Cluster], run_script: RunScript) -> None:
    assert (NODE_DIR / "node_modules" / "ali-ons").is_dir(), (
        "ali-ons is not installed: run `npm --prefix tests/acceptance/node install --no-audit --no-fund`")
    c = cluster()
    topic = f"JsTopic_{uuid.uuid4().hex[:8]}"
    c.create_topic(topic, queues=4)
    group = f"cgjs_{uuid.uuid4().hex[:8]}"
    count = 300
    prefix = "js"
    res = run_script("node", "alions_roundtrip", {
        "namesrv": c.ns_addr, "topic": topic, "producerGroup": f"pgjs_{uuid.uuid4().hex[:8]}",
        "consumerGroup": group, "count": count, "prefix": prefix, "expression": "TagA || TagB",
        "timeoutMs": 200_000, "logDir": str(c.group.base_dir / "logs"),
    }, timeout_s=260)
    assert "fatal" not in res, res
    assert not res["sendErrors"], f"{len(res['sendErrors'])} sends failed, first: {res['sendErrors'][:3]}"
    assert len(res["sent"]) == count
    assert all(s["status"] == "SEND_OK" for s in res["sent"]), res["sent"][:3]
    assert len({s["msgId"] for s in res["sent"]}) == count, "msg ids must be unique"
    assert res["met"], f"not every message consumed; errors: {res['errors'][:5]}; got {len(res['received'])}"

    seqs = Counter(r["seq"] for r in res["received"])
    assert set(seqs) == set(range(count))
    dups = {s: n for s, n in seqs.items() if n > 1}
    assert not dups, f"{len(dups)} messages delivered more than once: {list(dups.items())[:10]}"
    for r in res["received"]:
        got = {k: r[k] for k in ("seq", "body", "keys", "tags", "prop")}
        assert got == _expected(prefix, r["seq"]), got
    # the broker created and registered the retry topic on the consumer's heartbeat
    assert route(c.ns_addr, f"%RETRY%{group}") is not None or wait_route(
        c.ns_addr, f"%RETRY%{group}", timeout_s=10, alive=c.alive)
