"""The Apache C++ client 2.1 (PyPI ``rocketmq-python-cvs==2.1.0.3``, librocketmq 2.1.0) against real ferrymq
processes: a name server, a SYNC_MASTER and its slave.

The client runs unchanged in subprocess scripts (cpp21_scripts/), installed into a directory of its own
(``cpp21_dir``: its module is named ``rocketmq`` like the 1.x client's). Each script checks it loaded the 2.1
library. What the binding offers and the tests use: send_sync, send_async, send_oneway, send_orderly (a queue
selector over a sharding key), send_batch; PushConsumer (clustering, concurrent and orderly, tag filter);
PullConsumer; and through the C API it does not wrap: SendMessageOrderlyByShardingKey and the transaction
producer.

Client facts that shape the tests (rocketmq-client-cpp tag 2.1.0):

* ``PushConsumer.shutdown`` dereferences the message-trace producer, which exists only when message trace is
  on (``DefaultMQPushConsumerImpl::shutdownMessageTraceInnerProducer``,
  src/consumer/DefaultMQPushConsumerImpl.cpp:1114-1117, created at :1086-1098), so with trace off (the default)
  it dies of SIGSEGV before it commits its offsets (:404 before :412); 2.2.0 checks first. The push consumer
  scripts therefore run with trace on (the trace producer then sends to ``RMQ_SYS_TRACE_TOPIC``).
* A batch send's SendResult carries no msg id: the client takes the batch wrapper's own unique key, which it
  never sets (``MQClientAPIImpl::processSendResponse``, src/MQClientAPIImpl.cpp:539); the messages have theirs.
* The first send of a new producer can fail and be retried when the client's heartbeat thread is connecting to
  the same broker at that moment: a second caller gets no connection while one is being made
  (``TcpRemotingClient::CreateTransport``, src/transport/TcpRemotingClient.cpp:305-314).
* The unlock of an orderly consumer's shutdown leaves out the first queue of each broker
  (``Rebalance::unlockAll``, src/consumer/Rebalance.cpp:273-278); ferrymq releases it on the client's
  UNREGISTER_CLIENT (docs/protocol-remoting.md).
* Consumer offsets are committed every 5 s and on shutdown; routes are re-read every 30 s.
"""

from __future__ import annotations

import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cpp21_support import spawn_cpp21_script
from ha_support import (
    HAPair,
    consumer_offsets,
    pull_queue,
    queue_max_offsets,
    route_broker_ids,
    runtime_info,
    start_ha_pair,
    wait_caught_up,
)
from procs import (
    CPP_SCRIPTS_DIR,
    ProcessGroup,
    create_topic,
    max_offset,
    route,
    wait_for,
    wait_route,
)

from ferrymq.common.message import SYSFLAG_COMPRESSED
from support.jsonl import read_jsonl

pytestmark = pytest.mark.acceptance

sys.path.insert(0, str(CPP_SCRIPTS_DIR))
from _cpp_common import expected_message  # noqa: E402

RunScript = Callable[..., dict[str, Any]]
#: every 5th message is TagC, which `TagA || TagB` must filter out
FILTER_TAGS = ["TagA", "TagB", "TagA", "TagB", "TagC"]
QUEUES = 4
#: orderly sends: sharding keys 0..SHARDS-1, key k goes to queue k % QUEUES (the binding's hashing selector)
SHARDS = 6
#: first seq of the sends through the sharding-key API (the selector's start at 0)
SHARDING_KEY_START = 10_000
#: the client deflates bodies over 4096 bytes (CompressMsgBodyOverHowmuch)
BIG_BODY_PAD = 6000
#: 18 default delay levels; level 2 is 5 s
DELAY_LEVEL_2_MS = 5000
#: a restarted orderly consumer gets every queue within this (the broker keeps an unrenewed lock 60 s)
ORDERLY_RESUME_BOUND_S = 30.0
#: broker.conf: a half message without a decision is checked back 0.5 s after its send, rounds every 0.3 s
FAST_TRANSACTION_CHECKS = {"transactionTimeOut": 500, "transactionCheckInterval": 300, "transactionCheckMax": 5}
#: the name server routes a created topic within a registration (plus slack)
ROUTE_TIMEOUT_S = 30.0
#: the slave test: sync sends (the first auto-creates the topic), then a backlog sent async
SLAVE_SYNC_SENDS = 300
SLAVE_BACKLOG = 1000
#: the push consumer is under way when the master dies
KILL_AFTER_DELIVERIES = 200
#: the push consumer prefetches about this many messages per queue (its default, 1000, would take everything)
PREFETCH_PER_QUEUE = 64
#: pulls that may complete between reading the master's served-message counter and the kill: a batch per queue
INFLIGHT_PULL_SLACK = QUEUES * 32
#: the push consumer gets every message (through the kill) within this
SLAVE_CONSUME_TIMEOUT_S = 120.0
#: the name server drops a SIGKILLed master when its connection closes
NAMESRV_DROP_TIMEOUT_S = 15.0


def uniq(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, cpp21_dir: Path) -> Iterator[HAPair]:
    """One name server + SYNC_MASTER + SLAVE shared by the tests that do not kill anything."""
    group = ProcessGroup(tmp_path_factory.mktemp("cpp21-pair"))
    try:
        yield start_ha_pair(group, **FAST_TRANSACTION_CHECKS)
    finally:
        group.stop_all()


@pytest.fixture
def pair_logs(pair: HAPair, request: pytest.FixtureRequest) -> Iterator[HAPair]:
    """``pair``, whose process logs are printed when the test failed."""
    yield pair
    if any(getattr(getattr(request.node, f"rep_{w}", None), "failed", False) for w in ("setup", "call")):
        sys.stdout.write(f"\n===== logs of the shared pair =====\n{pair.group.dump()}\n")


def send(run_script: RunScript, ns_addr: str, tmp: Path, *, topic: str, mode: str, prefix: str, count: int,
         tags: list[str], timeout_s: float = 120, **extra: Any) -> list[dict[str, Any]]:
    out = tmp / f"send-{mode}-{uuid.uuid4().hex[:6]}.jsonl"
    args = {"namesrv": ns_addr, "topic": topic, "group": uniq("pg"), "count": count, "prefix": prefix,
            "tags": tags, "mode": mode, "out": str(out), "deadline_s": timeout_s - 20, **extra}
    summary = run_script("cpp21", "send", args, timeout_s=timeout_s)
    assert summary["client"].startswith("CPP CORE VERSION: 2.1."), summary
    assert summary["attempted"] == count and summary.get("unanswered") == 0, f"sender stopped early: {summary}"
    results = read_jsonl(out)
    bad = [r for r in results if not r.get("ok")]
    assert not bad, f"{len(bad)} of {count} {mode} sends failed, first: {bad[:3]}"
    assert sorted(r["seq"] for r in results) == list(range(extra.get("start", 0), extra.get("start", 0) + count))
    return results


def push_consume(run_script: RunScript, ns_addr: str, tmp: Path, *, topic: str, group: str, expect: set[int],
                 expression: str = "*", timeout_s: float = 120, **extra: Any) -> tuple[dict[str, Any], list[dict]]:
    out = tmp / f"push-{group}-{uuid.uuid4().hex[:6]}.jsonl"
    args = {"namesrv": ns_addr, "topic": topic, "group": group, "expression": expression, "trace": True,
            "expect_seqs": sorted(expect), "out": str(out), "timeout_s": timeout_s - 30, **extra}
    summary = run_script("cpp21", "push_consume", args, timeout_s=timeout_s)
    return summary, read_jsonl(out)


def pull(run_script: RunScript, ns_addr: str, tmp: Path, *, topic: str, expect: set[int],
         timeout_s: float = 90) -> list[dict[str, Any]]:
    out = tmp / f"pull-{uuid.uuid4().hex[:6]}.jsonl"
    args = {"namesrv": ns_addr, "topic": topic, "group": uniq("pull"), "expect_seqs": sorted(expect),
            "out": str(out), "timeout_s": timeout_s - 30}
    summary = run_script("cpp21", "pull", args, timeout_s=timeout_s)
    assert summary["met"], f"pull consumer did not get every message: {summary}"
    return read_jsonl(out)


def assert_exact(rec: dict[str, Any], prefix: str, tags: list[str], topic: str) -> None:
    exp = expected_message(prefix, rec["seq"], tags)
    got = {k: rec[k] for k in ("seq", "body", "keys", "tags", "prop")}
    assert got == exp, f"message {rec['seq']} differs: got {got}, sent {exp}"
    assert rec["topic"] == topic


def assert_once_each(recs: list[dict[str, Any]], wanted: set[int]) -> None:
    seqs = Counter(r["seq"] for r in recs)
    assert set(seqs) == wanted, (f"missing {sorted(wanted - set(seqs))[:20]}, "
                                 f"unexpected {sorted(set(seqs) - wanted)[:20]}")
    dups = {s: n for s, n in seqs.items() if n > 1}
    assert not dups, f"{len(dups)} messages delivered more than once: {list(dups.items())[:10]}"


def routed_topic(p: HAPair, prefix: str) -> str:
    topic = uniq(prefix)
    create_topic(p.master.addr, topic, queues=QUEUES)
    wait_route(p.ns_addr, topic, timeout_s=ROUTE_TIMEOUT_S, broker_name=p.master.broker_name, alive=p.alive)
    return topic


@pytest.mark.timeout(240)
def test_sync_sends_to_a_new_topic_then_push_consume_with_tag_filter(
        pair_logs: HAPair, run_script: RunScript, tmp_path: Path) -> None:
    p = pair_logs
    topic = uniq("Cpp21New")
    assert route(p.ns_addr, topic) is None, "the topic must not exist before the first send"
    count = 300
    results = send(run_script, p.ns_addr, tmp_path, topic=topic, mode="sync", prefix="m", count=count,
                   tags=FILTER_TAGS)
    assert all(r["status"] == 0 for r in results)  # SendStatus.OK: the slave acknowledged too
    assert len({r["msg_id"] for r in results}) == count, "msg ids must be unique"
    assert route(p.ns_addr, topic) is not None, "the auto-created topic must be routed"

    wanted = {s for s in range(count) if FILTER_TAGS[s % len(FILTER_TAGS)] != "TagC"}
    summary, recs = push_consume(run_script, p.ns_addr, tmp_path, topic=topic, group=uniq("cg"), expect=wanted,
                                 expression="TagA || TagB", settle_s=2)
    assert summary["met"], f"push consumer did not get every message: {summary}"
    assert_once_each(recs, wanted)
    sent_ids = {r["seq"]: r["msg_id"] for r in results}
    for rec in recs:
        assert_exact(rec, "m", FILTER_TAGS, topic)
        assert rec["reconsume_times"] == 0
        assert rec["msg_id"] == sent_ids[rec["seq"]], "the consumer must see the msg id the producer was given"


@pytest.mark.timeout(240)
def test_async_oneway_and_batch_sends_arrive_once_each_through_the_pull_consumer(
        pair_logs: HAPair, run_script: RunScript, tmp_path: Path) -> None:
    p = pair_logs
    topic = routed_topic(p, "Cpp21Modes")
    tags = ["TagA", "TagB"]
    sent = send(run_script, p.ns_addr, tmp_path, topic=topic, mode="async", prefix="x", count=200, tags=tags)
    assert all(r["status"] == 0 and r["msg_id"] for r in sent)
    send(run_script, p.ns_addr, tmp_path, topic=topic, mode="oneway", prefix="x", count=100, tags=tags, start=1000)
    batch = send(run_script, p.ns_addr, tmp_path, topic=topic, mode="batch", prefix="x", count=50, tags=tags,
                 start=2000, batch=10)
    assert all(r["status"] == 0 for r in batch)
    wanted = set(range(200)) | set(range(1000, 1100)) | set(range(2000, 2050))

    recs = pull(run_script, p.ns_addr, tmp_path, topic=topic, expect=wanted)
    assert_once_each(recs, wanted)
    for rec in recs:
        assert_exact(rec, "x", tags, topic)
    assert len({r["msg_id"] for r in recs}) == len(wanted), "every message, batched or not, has its own msg id"
    by_queue: dict[int, list[int]] = defaultdict(list)
    for rec in recs:
        by_queue[rec["queue_id"]].append(rec["queue_offset"])
    for queue_id, offsets in by_queue.items():
        assert offsets == list(range(len(offsets))), f"queue {queue_id}: offsets not dense from 0: {offsets[:20]}"


@pytest.mark.timeout(240)
def test_orderly_sends_keep_each_sharding_key_on_one_queue_in_order_for_the_orderly_consumer(
        pair_logs: HAPair, run_script: RunScript, tmp_path: Path) -> None:
    """send_orderly (the binding's queue selector: key % queue count) and the C API's
    SendMessageOrderlyByShardingKey (hash of the key); an orderly push consumer gets each key's messages from
    one queue in send order."""
    p = pair_logs
    topic = routed_topic(p, "Cpp21Order")
    tags = ["TagA"]
    count = 240
    send(run_script, p.ns_addr, tmp_path, topic=topic, mode="orderly", prefix="o", count=count, tags=tags,
         shards=SHARDS)
    send(run_script, p.ns_addr, tmp_path, topic=topic, mode="sharding_key", prefix="o", count=count, tags=tags,
         shards=SHARDS, start=SHARDING_KEY_START)
    wanted = set(range(count)) | set(range(SHARDING_KEY_START, SHARDING_KEY_START + count))
    summary, recs = push_consume(run_script, p.ns_addr, tmp_path, topic=topic, group=uniq("og"), expect=wanted,
                                 orderly=True)
    assert summary["met"], f"orderly consumer did not get every message: {summary}"
    assert_once_each(recs, wanted)
    per_key: dict[tuple[bool, int], list[dict[str, Any]]] = defaultdict(list)
    for rec in recs:  # lines in delivery order
        assert_exact(rec, "o", tags, topic)
        per_key[(rec["seq"] >= SHARDING_KEY_START, rec["seq"] % SHARDS)].append(rec)
    for (by_hash, key), delivered in per_key.items():
        queues = {r["queue_id"] for r in delivered}
        assert len(queues) == 1, f"key {key} (sharding key API: {by_hash}) spread over queues {queues}"
        if not by_hash:
            assert queues == {key % QUEUES}, f"selector key {key} on queue {queues}, not {key % QUEUES}"
        seqs = [r["seq"] for r in delivered]
        assert seqs == sorted(seqs), f"key {key} (sharding key API: {by_hash}) delivered out of send order"
        offsets = [r["queue_offset"] for r in delivered]
        assert offsets == sorted(offsets), f"key {key}: queue offsets out of order"


@pytest.mark.timeout(240)
def test_compressed_bodies_and_delay_level_round_trip(
        pair_logs: HAPair, run_script: RunScript, tmp_path: Path) -> None:
    """Bodies over the client's 4 KiB threshold travel deflated (sysFlag bit 0) and arrive as sent; a
    delay-level-2 message arrives no sooner than 5 s after its send."""
    p = pair_logs
    topic = routed_topic(p, "Cpp21Big")
    tags = ["TagA"]
    send(run_script, p.ns_addr, tmp_path, topic=topic, mode="sync", prefix="z", count=5, tags=tags,
         body_pad=BIG_BODY_PAD)
    delayed = send(run_script, p.ns_addr, tmp_path, topic=topic, mode="sync", prefix="z", count=3, tags=tags,
                   start=100, delay_level=2)
    sent_at = {r["seq"]: r["send_start_ms"] for r in delayed}
    stored = [m for q in range(QUEUES) for m in pull_queue(p.master.addr, topic, q, 0, max_offset(p.master.addr,
                                                                                                      topic, q))]
    big = [m for m in stored if int(m.properties.get("seq", -1)) < 5]
    assert len(big) == 5 and all(m.sys_flag & SYSFLAG_COMPRESSED and len(m.body) < BIG_BODY_PAD for m in big), (
        "the big bodies must be stored deflated, as the client sent them")
    wanted = set(range(5)) | {100, 101, 102}
    summary, recs = push_consume(run_script, p.ns_addr, tmp_path, topic=topic, group=uniq("cg"), expect=wanted)
    assert summary["met"], f"push consumer did not get every message: {summary}"
    assert_once_each(recs, wanted)
    for rec in recs:
        if rec["seq"] in sent_at:
            assert_exact(rec, "z", tags, topic)
            waited_ms = rec["recv_ms"] - sent_at[rec["seq"]]
            assert waited_ms >= DELAY_LEVEL_2_MS, f"delay-level-2 message {rec['seq']} arrived after {waited_ms} ms"
        else:
            exp = expected_message("z", rec["seq"], tags, BIG_BODY_PAD)
            assert {k: rec[k] for k in exp} == exp, f"compressed message {rec['seq']} differs"


@pytest.mark.timeout(240)
def test_transactions_commit_roll_back_and_settle_unknown_ones_through_the_check_back(
        pair_logs: HAPair, run_script: RunScript, tmp_path: Path) -> None:
    """The C API's transaction producer (the binding wraps none of it): a committed message is delivered, a
    rolled-back one never, and one left UNKNOWN is checked back by the broker and delivered after the
    producer's check answers commit."""
    p = pair_logs
    topic = routed_topic(p, "Cpp21Tx")
    tags = ["TagA"]
    count = 30
    out = tmp_path / "transact.jsonl"
    summary = run_script("cpp21", "transact", {
        "namesrv": p.ns_addr, "topic": topic, "group": uniq("txg"), "count": count, "prefix": "t", "tags": tags,
        "out": str(out), "linger_s": 60}, timeout_s=120)
    assert summary["attempted"] == count and summary["failed"] == 0, summary
    lines = read_jsonl(out)
    unknown = {s for s in range(count) if s % 3 == 2}
    checked = {r["check"] for r in lines if "check" in r}
    assert checked == unknown, f"checked back {sorted(checked)}, left UNKNOWN {sorted(unknown)}"

    committed = {s for s in range(count) if s % 3 != 1}
    recs = pull(run_script, p.ns_addr, tmp_path, topic=topic, expect=committed)
    assert_once_each(recs, committed)
    for rec in recs:
        assert_exact(rec, "t", tags, topic)


@pytest.mark.timeout(300)
def test_restarted_push_consumer_resumes_from_its_committed_offsets(
        pair_logs: HAPair, run_script: RunScript, tmp_path: Path) -> None:
    p = pair_logs
    topic = routed_topic(p, "Cpp21Resume")
    tags = ["TagA"]
    count = 400
    send(run_script, p.ns_addr, tmp_path, topic=topic, mode="sync", prefix="r", count=count, tags=tags)
    group = uniq("cg")

    # run 1: one slow consume thread, stop after 150 deliveries; shutdown commits the offsets
    s1, run1 = push_consume(run_script, p.ns_addr, tmp_path, topic=topic, group=group, expect=set(),
                            stop_after=150, thread_count=1, delay_ms=20)
    assert s1["met"], f"first run got too few messages: {s1}"
    committed = dict(enumerate(consumer_offsets(p.master.addr, group, topic, QUEUES)))
    assert any((o or 0) > 0 for o in committed.values()), f"nothing committed by the first run: {committed}"
    first_seen = {r["seq"] for r in run1}
    assert first_seen < set(range(count)), "the first run consumed everything; nothing left to resume"
    committed_msgs = {(r["queue_id"], r["queue_offset"]) for r in run1
                      if r["queue_offset"] < (committed.get(r["queue_id"]) or 0)}

    rest = set(range(count)) - first_seen
    s2, run2 = push_consume(run_script, p.ns_addr, tmp_path, topic=topic, group=group, expect=rest, settle_s=2)
    assert s2["met"], f"second run did not get the rest: {s2}"
    redelivered = [r for r in run2 if (r["queue_id"], r["queue_offset"]) in committed_msgs]
    assert not redelivered, (f"{len(redelivered)} committed messages re-delivered after the restart "
                             f"(committed offsets {committed}); first: {redelivered[:3]}")
    below = [r for r in run2 if r["queue_offset"] < (committed.get(r["queue_id"]) or 0)]
    assert not below, f"the second run started below the committed offsets {committed}: {below[:3]}"
    assert first_seen | {r["seq"] for r in run2} == set(range(count))
    for rec in run1 + run2:
        assert_exact(rec, "r", tags, topic)


@pytest.mark.timeout(300)
def test_master_sigkill_mid_consumption_push_and_pull_consumers_read_the_rest_from_the_slave(
        procs: ProcessGroup, cpp21_dir: Path, run_script: RunScript, tmp_path: Path) -> None:
    """A push consumer consuming when the master is SIGKILLed goes on from the slave and commits its offsets
    there; a pull consumer started afterwards reads everything from the slave. The topic was auto-created by the
    first send a moment before. What the consumer got from the master is bounded by the master's count of
    messages served to pulls, read just before the kill: the rest came from the slave."""
    p = start_ha_pair(procs)
    topic = uniq("Cpp21Slave")
    tags = ["TagA", "TagB"]
    send(run_script, p.ns_addr, tmp_path, topic=topic, mode="sync", prefix="s", count=SLAVE_SYNC_SENDS, tags=tags)
    send(run_script, p.ns_addr, tmp_path, topic=topic, mode="async", prefix="s", count=SLAVE_BACKLOG, tags=tags,
         start=SLAVE_SYNC_SENDS)
    wanted = set(range(SLAVE_SYNC_SENDS + SLAVE_BACKLOG))
    wait_caught_up(p)

    group = uniq("cg")
    out = tmp_path / "push-through-the-kill.jsonl"
    consumer = spawn_cpp21_script(procs, tmp_path, cpp21_dir, "cpp21-consumer", "push_consume", {
        "namesrv": p.ns_addr, "group": group, "topic": topic, "out": str(out), "expect_seqs": sorted(wanted),
        "timeout_s": SLAVE_CONSUME_TIMEOUT_S, "thread_count": 1, "trace": True,
        "max_cache": PREFETCH_PER_QUEUE})
    wait_for(lambda: len(read_jsonl(out)) >= KILL_AFTER_DELIVERIES, timeout_s=60,
             what=f"{KILL_AFTER_DELIVERIES} deliveries before the kill", alive=[*p.alive, consumer])
    served_by_master = int(runtime_info(p.master.addr)["getMessageTransferedMsgCount"])
    p.master.kill()
    assert served_by_master + INFLIGHT_PULL_SLACK < len(wanted), (
        f"the master served {served_by_master} of {len(wanted)} before the kill: nothing left for the slave")
    wait_for(lambda: route_broker_ids(p.ns_addr, topic) == {1: p.slave.addr}, timeout_s=NAMESRV_DROP_TIMEOUT_S,
             what="the route to list only the slave", alive=[p.namesrv.proc])
    assert consumer.wait_exit(SLAVE_CONSUME_TIMEOUT_S + 30) == 0, "the push consumer script failed"
    pushed = read_jsonl(out)
    assert {r["seq"] for r in pushed} == wanted, f"missing {sorted(wanted - {r['seq'] for r in pushed})[:20]}"
    slave_ends = queue_max_offsets(p.slave.addr, topic, QUEUES)
    wait_for(lambda: consumer_offsets(p.slave.addr, group, topic, QUEUES) == slave_ends, timeout_s=10,
             what=f"the consumer's offsets {slave_ends} on the slave (committed oneway at its shutdown)",
             alive=[p.namesrv.proc])

    recs = pull(run_script, p.ns_addr, tmp_path, topic=topic, expect=wanted)
    assert_once_each(recs, wanted)
    for rec in recs + pushed:
        assert_exact(rec, "s", tags, topic)


@pytest.mark.timeout(240)
def test_restarted_orderly_consumer_gets_every_queue_without_waiting_for_lock_expiry(
        pair_logs: HAPair, run_script: RunScript, tmp_path: Path) -> None:
    p = pair_logs
    topic = routed_topic(p, "Cpp21OrderResume")
    tags = ["TagA"]
    count = 200
    send(run_script, p.ns_addr, tmp_path, topic=topic, mode="orderly", prefix="q", count=count, tags=tags,
         shards=QUEUES)
    group = uniq("og")
    s1, run1 = push_consume(run_script, p.ns_addr, tmp_path, topic=topic, group=group, expect=set(),
                            stop_after=40, orderly=True, delay_ms=20)
    assert s1["met"], f"first run got too few messages: {s1}"
    rest = set(range(count)) - {r["seq"] for r in run1}
    s2, run2 = push_consume(run_script, p.ns_addr, tmp_path, topic=topic, group=group, expect=rest, orderly=True,
                            timeout_s=30 + ORDERLY_RESUME_BOUND_S)
    assert s2["met"], (f"the restarted orderly consumer did not get the rest within {ORDERLY_RESUME_BOUND_S} s "
                       f"(a queue still locked by the first run?): {s2}")
