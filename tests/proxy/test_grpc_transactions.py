"""Transactional messages of the real 5.x SDK through the gRPC endpoint: half messages on the broker,
EndTransaction commit and rollback, and the broker's check-back carried to the SDK's TransactionChecker over
its Telemetry stream (RecoverOrphanedTransactionCommand)."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import pytest

from ferrymq.broker.transaction import Decision
from ferrymq.proxy.v2 import definition_pb2 as pb
from ferrymq.proxy.v2 import service_pb2 as spb
from ferrymq.proxy.v2 import service_pb2_grpc as sgrpc
from support.aio import wait_for

pytestmark = pytest.mark.acceptance


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    # undecided half messages are asked about after 1 s, in rounds every 0.5 s
    return {"transaction_check_interval_ms": 500, "transaction_timeout_ms": 1000}


def uniq(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def bodies(records: list[dict[str, Any]]) -> list[str]:
    return sorted(r["body"] for r in records if "body" in r)


async def test_commit_rollback_and_check_back(grpc_stack: Any) -> None:
    topic, group = uniq("TX"), uniq("g")
    await grpc_stack.create_topic(topic)
    records = await grpc_stack.sdk("transact", topic=topic, prefix="x", decisions=["commit", "rollback", "none"],
                                   expect_checks=1, check_answer="COMMIT", linger_s=1, timeout_s=60)
    sent = [r for r in records if "seq" in r]
    assert [r["ok"] for r in sent] == [True, True, True], sent
    checked = [r for r in records if "checked" in r]
    # only the undecided one is asked about, with its topic and id
    assert {r["checked"] for r in checked} == {"x-2"}, checked
    assert {r["message_id"] for r in checked} == {sent[2]["message_id"]}
    assert {r["topic"] for r in checked} == {topic}
    got = await grpc_stack.sdk("simple", topic=topic, group=group, expect=2, timeout_s=60)
    assert bodies(got) == ["x-0", "x-2"]
    again = await grpc_stack.sdk("simple", topic=topic, group=group, expect=1, await_s=1, timeout_s=3)
    assert bodies(again) == []  # the rolled back one never shows


async def test_check_back_rollback(grpc_stack: Any) -> None:
    topic, group = uniq("TY"), uniq("g")
    await grpc_stack.create_topic(topic)
    records = await grpc_stack.sdk("transact", topic=topic, prefix="y", decisions=["none", "commit"],
                                   expect_checks=1, check_answer="ROLLBACK", linger_s=1, timeout_s=60)
    assert {r["checked"] for r in records if "checked" in r} == {"y-0"}
    got = await grpc_stack.sdk("simple", topic=topic, group=group, expect=1, timeout_s=30)
    assert bodies(got) == ["y-1"]
    # the broker recorded the checker's answer for the first half message, the producer's for the second
    transactions = grpc_stack.broker.transactions
    await wait_for(lambda: transactions.decision_of(0) is not None, timeout_s=10, what="check-back answered")
    assert (transactions.decision_of(0), transactions.decision_of(1)) == (Decision.ROLLBACK, Decision.COMMIT)


async def test_end_transaction_refuses_foreign_ids(grpc_stack: Any) -> None:
    """A transaction id is good only for the topic it was issued for (a client may not end the transaction
    of a topic by naming another it may publish to), and only from this proxy run."""
    topic = uniq("TZ")
    await grpc_stack.create_topic(topic)
    async with grpc.aio.insecure_channel(grpc_stack.endpoints) as channel:
        stub = sgrpc.MessagingServiceStub(channel)
        message = pb.Message(topic=pb.Resource(name=topic), body=b"z", system_properties=pb.SystemProperties(
            message_id=uuid.uuid4().hex.upper(), body_encoding=pb.IDENTITY, message_type=pb.TRANSACTION))
        sent = await stub.SendMessage(spb.SendMessageRequest(messages=[message]), timeout=10)
        assert sent.status.code == pb.OK, sent.status
        tid = sent.entries[0].transaction_id
        assert tid
        for bad_topic, bad_tid in ((topic, "garbage"), ("OtherTopic", tid), (topic, tid[:-1] + "0"),
                                   (topic, tid.rsplit(".", 1)[0])):
            if bad_tid == tid[:-1] + "0" and tid.endswith("0"):
                bad_tid = tid[:-1] + "1"
            answer = await stub.EndTransaction(spb.EndTransactionRequest(
                topic=pb.Resource(name=bad_topic), message_id=message.system_properties.message_id,
                transaction_id=bad_tid, resolution=pb.COMMIT, source=pb.SOURCE_CLIENT), timeout=10)
            assert answer.status.code == pb.INVALID_TRANSACTION_ID, (bad_topic, bad_tid, answer.status)
        answer = await stub.EndTransaction(spb.EndTransactionRequest(
            topic=pb.Resource(name=topic), message_id=message.system_properties.message_id, transaction_id=tid,
            resolution=pb.TRANSACTION_RESOLUTION_UNSPECIFIED, source=pb.SOURCE_CLIENT), timeout=10)
        assert answer.status.code == pb.BAD_REQUEST
        answer = await stub.EndTransaction(spb.EndTransactionRequest(
            topic=pb.Resource(name=topic), message_id=message.system_properties.message_id, transaction_id=tid,
            resolution=pb.ROLLBACK, source=pb.SOURCE_CLIENT), timeout=10)
        assert answer.status.code == pb.OK, answer.status
