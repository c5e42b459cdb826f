"""The C++ RocketMQ client bundled in PyPI ``rocketmq==0.4.4`` against real ferrymq processes.

The client runs in subprocess scripts (cpp_scripts/), so a crash or hang of librocketmq cannot take
pytest down. Timing facts of that client that shape the waits below: it commits consumer offsets every
5 s and on shutdown, refreshes routes every 30 s, and a send with no name server fails only after ~50 s.

The SIGKILL test checks crash recovery (commit log and consume queues rebuilt after an abort, every
acknowledged send consumable). A process kill leaves written pages in the OS page cache, so it cannot
tell SYNC_FLUSH from ASYNC_FLUSH; only a machine crash could.
"""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from procs import (
    CPP_SCRIPTS_DIR,
    Cluster,
    ProcessGroup,
    query_consumer_offset,
    route,
    spawn_cpp_script,
    wait_for,
)

from support.jsonl import read_jsonl

pytestmark = pytest.mark.acceptance

sys.path.insert(0, str(CPP_SCRIPTS_DIR))
from _cpp_common import expected_message  # noqa: E402

RunScript = Callable[..., dict[str, Any]]
#: tag cycle of the main test: every 5th message is TagC, which `TagA || TagB` must filter out
FILTER_TAGS = ["TagA", "TagB", "TagA", "TagB", "TagC"]
#: 18 default delay levels; level 2 is 5 s
DELAY_LEVEL_2_MS = 5000
#: body padding that makes a 10-message batch pass the C++ client's 4 KiB compression threshold
BIG_BODY_PAD = 1000


def uniq(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def produce(run_script: RunScript, c: Cluster, tmp: Path, *, topic: str, prefix: str, count: int,
            tags: list[str], timeout_s: float = 240, **extra: Any) -> list[dict[str, Any]]:
    out = tmp / f"produce-{prefix}-{uuid.uuid4().hex[:6]}.jsonl"
    args = {"namesrv": c.ns_addr, "topic": topic, "group": uniq("pg"), "count": count, "prefix": prefix,
            "tags": tags, "out": str(out), "deadline_s": timeout_s - 20, **extra}
    summary = run_script("cpp", "produce", args, timeout_s=timeout_s)
    results = read_jsonl(out)
    assert summary["attempted"] == count, f"producer stopped early: {summary}"
    return results


def consume(run_script: RunScript, c: Cluster, tmp: Path, *, topic: str, group: str, expect: set[int],
            expression: str = "*", timeout_s: float = 150, **extra: Any) -> tuple[dict[str, Any], list[dict]]:
    out = tmp / f"consume-{group}-{uuid.uuid4().hex[:6]}.jsonl"
    args = {"namesrv": c.ns_addr, "topic": topic, "group": group, "expression": expression,
            "expect_seqs": sorted(expect), "out": str(out), "timeout_s": timeout_s - 30, **extra}
    summary = run_script("cpp", "consume", args, timeout_s=timeout_s)
    return summary, read_jsonl(out)


def assert_all_ok(results: list[dict[str, Any]], count: int) -> None:
    bad = [r for r in results if not r.get("ok")]
    assert not bad, f"{len(bad)} of {count} sends failed, first: {bad[:3]}"
    assert len(results) == count


def assert_exact(rec: dict[str, Any], prefix: str, tags: list[str], topic: str) -> None:
    exp = expected_message(prefix, rec["seq"], tags)
    got = {k: rec[k] for k in ("seq", "body", "keys", "tags", "prop")}
    assert got == exp, f"message {rec['seq']} differs: got {got}, sent {exp}"
    assert rec["topic"] == topic


@pytest.mark.timeout(420)
def test_send_sync_1000_to_new_topic_then_push_consume_with_tag_filter(
        cluster: Callable[..., Cluster], run_script: RunScript, tmp_path: Path) -> None:
    c = cluster()
    topic = uniq("CppNew")
    assert route(c.ns_addr, topic) is None, "topic must not exist before the first send"

    count = 1000
    prefix = "m"
    results = produce(run_script, c, tmp_path, topic=topic, prefix=prefix, count=count, tags=FILTER_TAGS)
    assert_all_ok(results, count)
    assert all(r["status"] == 0 for r in results)  # SendStatus.OK
    msg_ids = [r["msg_id"] for r in results]
    assert len(set(msg_ids)) == count, "msg ids must be unique"
    assert route(c.ns_addr, topic) is not None, "auto-created topic must be routed by the namesrv"

    wanted = {s for s in range(count) if FILTER_TAGS[s % len(FILTER_TAGS)] != "TagC"}
    summary, recs = consume(run_script, c, tmp_path, topic=topic, group=uniq("cg"), expect=wanted,
                            expression="TagA || TagB", settle_s=2)
    assert summary["met"], f"consumer did not get every message: {summary}"
    seqs = Counter(r["seq"] for r in recs)
    assert set(seqs) == wanted, f"unexpected seqs: {sorted(set(seqs) - wanted)[:20]}"
    dups = {s: n for s, n in seqs.items() if n > 1}
    assert not dups, f"{len(dups)} messages delivered more than once: {list(dups.items())[:10]}"
    for rec in recs:
        assert_exact(rec, prefix, FILTER_TAGS, topic)
        assert rec["reconsume_times"] == 0


@pytest.mark.timeout(300)
def test_send_batch_and_delay_level_2(
        cluster: Callable[..., Cluster], run_script: RunScript, tmp_path: Path) -> None:
    c = cluster()
    topic = uniq("CppBatch")
    tags = ["TagA", "TagB"]
    batch = produce(run_script, c, tmp_path, topic=topic, prefix="b", count=10, tags=tags, batch=10)
    assert_all_ok(batch, 10)
    delayed = produce(run_script, c, tmp_path, topic=topic, prefix="b", count=3, tags=tags, start=100,
                      delay_level=2)
    assert_all_ok(delayed, 3)
    sent_at = {r["seq"]: r["send_start_ms"] for r in delayed}
    # ten ~1 KiB bodies: the client deflates the batch body (>= 4 KiB) and sets sysFlag bit 0
    big = produce(run_script, c, tmp_path, topic=topic, prefix="b", count=10, tags=tags, batch=10, start=200,
                  body_pad=BIG_BODY_PAD)
    assert_all_ok(big, 10)

    expect = set(range(10)) | {100, 101, 102} | set(range(200, 210))
    summary, recs = consume(run_script, c, tmp_path, topic=topic, group=uniq("cg"), expect=expect)
    assert summary["met"], f"consumer did not get every message: {summary}"
    assert {r["seq"] for r in recs} == expect
    for rec in recs:
        if rec["seq"] >= 200:
            exp = expected_message("b", rec["seq"], tags, BIG_BODY_PAD)
            assert {k: rec[k] for k in exp} == exp, f"compressed-batch message {rec['seq']} differs"
            continue
        assert_exact(rec, "b", tags, topic)
        if rec["seq"] in sent_at:
            waited_ms = rec["recv_ms"] - sent_at[rec["seq"]]
            assert waited_ms >= DELAY_LEVEL_2_MS, f"delay-level-2 message {rec['seq']} arrived after {waited_ms} ms"
            assert rec["recv_ms"] - rec["born_ms"] >= DELAY_LEVEL_2_MS
            assert waited_ms < DELAY_LEVEL_2_MS + 60_000, f"delay-level-2 message {rec['seq']} took {waited_ms} ms"


@pytest.mark.timeout(420)
def test_restarted_consumer_resumes_from_committed_offset(
        cluster: Callable[..., Cluster], run_script: RunScript, tmp_path: Path) -> None:
    c = cluster()
    topic = uniq("CppResume")
    tags = ["TagA"]
    count = 400
    assert_all_ok(produce(run_script, c, tmp_path, topic=topic, prefix="r", count=count, tags=tags), count)
    group = uniq("cg")

    # run 1: one slow consume thread, stop after 150 deliveries; shutdown commits the offsets
    s1, run1 = consume(run_script, c, tmp_path, topic=topic, group=group, expect=set(), stop_after=150,
                       thread_count=1, delay_ms=20)
    assert s1["met"], f"first run got too few messages: {s1}"
    queues = _read_queue_nums(c, topic)
    committed = {q: query_consumer_offset(c.broker_addr, group, topic, q) for q in range(queues)}
    assert any((o or 0) > 0 for o in committed.values()), f"nothing committed by the first run: {committed}"
    first_seen = {r["seq"] for r in run1}
    assert first_seen < set(range(count)), "first run consumed everything; nothing left to resume"
    committed_msgs = {(r["queue_id"], r["queue_offset"]) for r in run1
                      if r["queue_offset"] < (committed.get(r["queue_id"]) or 0)}

    # run 2: the same group resumes
    rest = set(range(count)) - first_seen
    print(f"run 1: {len(run1)} deliveries, committed offsets {committed}; run 2 expects {len(rest)} more")
    s2, run2 = consume(run_script, c, tmp_path, topic=topic, group=group, expect=rest, settle_s=2)
    assert s2["met"], f"second run did not get the rest: {s2}"
    redelivered = [r for r in run2 if (r["queue_id"], r["queue_offset"]) in committed_msgs]
    assert not redelivered, (f"{len(redelivered)} committed messages re-delivered after restart "
                             f"(committed offsets {committed}); first: {redelivered[:3]}")
    below = [r for r in run2 if r["queue_offset"] < (committed.get(r["queue_id"]) or 0)]
    assert not below, f"second run started below the committed offsets {committed}: {below[:3]}"
    assert first_seen | {r["seq"] for r in run2} == set(range(count))
    for rec in run1 + run2:
        assert_exact(rec, "r", tags, topic)


@pytest.mark.timeout(600)
def test_sync_flush_broker_sigkill_keeps_every_acknowledged_message(
        cluster: Callable[..., Cluster], run_script: RunScript, procs: ProcessGroup, tmp_path: Path) -> None:
    c = cluster(flushDiskType="SYNC_FLUSH")
    topic = uniq("CppKill")
    tags = ["TagA", "TagB"]
    out_a = tmp_path / "produce-a.jsonl"
    args = {"namesrv": c.ns_addr, "topic": topic, "group": uniq("pg"), "count": 20_000, "prefix": "k",
            "tags": tags, "out": str(out_a), "deadline_s": 120, "timeout_ms": 3000}
    producer_a = spawn_cpp_script(procs, tmp_path, "cpp-producer-a", "produce", args)

    def acked() -> list[dict[str, Any]]:
        return [r for r in read_jsonl(out_a) if r.get("ok")]

    wait_for(lambda: len(acked()) >= 300, timeout_s=120, what="300 acknowledged sends before the kill",
             alive=[producer_a, *c.alive])
    c.broker.kill()  # SIGKILL mid-stream
    # let the producer see the failure (bounded), then stop it
    try:
        wait_for(lambda: any(not r.get("ok") for r in read_jsonl(out_a)), timeout_s=20,
                 what="producer A to record a failed send", alive=[producer_a])
    except (TimeoutError, RuntimeError):
        pass
    producer_a.kill()
    acked_a = {r["seq"] for r in acked()}
    failed_a = [r for r in read_jsonl(out_a) if not r.get("ok")]
    print(f"producer A: {len(acked_a)} acknowledged before/around the SIGKILL, {len(failed_a)} failed; "
          f"first failure: {failed_a[:1]}")

    c.broker.restart()
    after = produce(run_script, c, tmp_path, topic=topic, prefix="k", count=200, tags=tags, start=1_000_000)
    assert_all_ok(after, 200)
    acked_all = acked_a | {r["seq"] for r in after}

    summary, recs = consume(run_script, c, tmp_path, topic=topic, group=uniq("cg"), expect=acked_all,
                            timeout_s=240)
    got = {r["seq"] for r in recs}
    lost = sorted(acked_all - got)
    assert not lost, (f"{len(lost)} of {len(acked_all)} acknowledged messages lost after SIGKILL "
                      f"(first {lost[:20]}); consumer summary {summary}")
    for rec in recs:
        assert_exact(rec, "k", tags, topic)


def _read_queue_nums(c: Cluster, topic: str) -> int:
    r = route(c.ns_addr, topic)
    assert r is not None
    return max(int(q["readQueueNums"]) for q in r["queueDatas"])
