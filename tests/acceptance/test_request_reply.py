"""Request-reply across processes: this test process requests (the blocking SyncProducer), a responder
process answers (push consumer with a SQL92 selector + Producer.reply), through a real broker process
started with enablePropertyFilter=true. A request the selector filters out gets no reply: it times out."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from procs import Cluster

from ferrymq.client import new_message
from ferrymq.client.sync import SyncProducer
from ferrymq.errors import RequestTimeoutError

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]

RESPONDER = Path(__file__).resolve().parent / "request_reply_responder.py"
#: the responder's start (routes, first heartbeat, CHECK_CLIENT_CONFIG)
RESPONDER_READY_TIMEOUT_S = 30.0
#: the first request also waits for the responder's first rebalance and pull
FIRST_REQUEST_TIMEOUT_MS = 20_000
REQUEST_TIMEOUT_MS = 5_000
UNANSWERED_TIMEOUT_MS = 1_500


def test_requester_and_responder_in_different_processes(cluster, procs) -> None:
    c: Cluster = cluster(enablePropertyFilter="true")
    c.create_topic("RRX", queues=2)
    responder = procs.spawn("responder", [sys.executable, str(RESPONDER), c.ns_addr, "RRX"])
    responder.wait_log(r"responder ready", timeout_s=RESPONDER_READY_TIMEOUT_S)

    with SyncProducer(c.ns_addr, "rr-requester-pg") as requester:
        first = requester.request(new_message("RRX", "p0", properties={"kind": "ping"}), FIRST_REQUEST_TIMEOUT_MS)
        assert first.body == f"pong:p0:{responder.pid}".encode()
        assert first.properties["MSG_TYPE"] == "reply"
        assert first.topic.endswith("_REPLY_TOPIC")
        for i in range(1, 4):
            reply = requester.request(new_message("RRX", f"p{i}", properties={"kind": "ping"}), REQUEST_TIMEOUT_MS)
            assert reply.body == f"pong:p{i}:{responder.pid}".encode()
        with pytest.raises(RequestTimeoutError):  # filtered out by the responder's selector: never answered
            requester.request(new_message("RRX", "other", properties={"kind": "other"}), UNANSWERED_TIMEOUT_MS)
    assert responder.returncode is None and os.getpid() != responder.pid
