"""Round trips against an in-process NameServer + BrokerController on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from client_helpers import wait_for

from ferrymq.client import (
    Admin,
    ConsumeStatus,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendStatus,
    new_message,
    select_by_hash,
)
from ferrymq.client.sync import SyncAdmin, SyncProducer, SyncPullConsumer
from support.inproc import needs_cluster

pytestmark = needs_cluster

FAST = {"rebalance_interval_ms": 500, "persist_offset_interval_ms": 200, "heartbeat_broker_interval_ms": 1000,
        "poll_name_server_interval_ms": 1000}


async def create(ns: str, topic: str, queues: int = 4) -> None:
    async with Admin(ns) as admin:
        await admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
        await admin.wait_for_route(topic)


async def pull_all(c: PullConsumer, topic: str, expr: str = "*") -> list[MessageExt]:
    out: list[MessageExt] = []
    for mq in await c.fetch_subscribe_message_queues(topic):
        offset = 0
        while True:
            r = await c.pull(mq, offset, 32, sub_expression=expr)
            out.extend(r.messages)
            if r.status is not PullStatus.FOUND and r.next_begin_offset == offset:
                break
            if r.status is PullStatus.NO_NEW_MSG:
                break
            offset = r.next_begin_offset
    return out


async def test_producer_pull_round_trip(ns_addr: str) -> None:
    await create(ns_addr, "RT")
    big = ("0123456789" * 1000).encode()
    async with Producer(ns_addr, "pg") as p:
        r1 = await p.send(new_message("RT", "hello", tags="TagA", keys=["k1", "k2"], properties={"myprop": "v"}))
        assert r1.status is SendStatus.SEND_OK and len(r1.msg_id) == 32 and len(r1.offset_msg_id) == 32
        r2 = await p.send(new_message("RT", big, tags="TagB"))
        batch = await p.send_batch([new_message("RT", f"b{i}", tags="TagA", keys=f"bk{i}") for i in range(3)])
        assert batch.msg_id.count(",") == 2 and batch.offset_msg_id.count(",") == 2
        many = await p.send_many([new_message("RT", f"m{i}", tags="TagC") for i in range(40)])
        assert {r.message_queue.queue_id for r in many} == {0, 1, 2, 3}  # round robin
        await p.send_oneway(new_message("RT", "oneway", tags="TagA"))
    async with PullConsumer(ns_addr, "pull-cg") as c:
        msgs = await wait_for(lambda: _pull_n(c, "RT", 46))
        by_body = {m.body: m for m in msgs}
        m1 = by_body[b"hello"]
        assert m1.tags == "TagA" and m1.keys == ["k1", "k2"] and m1.properties["myprop"] == "v"
        assert m1.msg_id == r1.msg_id and m1.offset_msg_id == r1.offset_msg_id
        assert by_body[big].tags == "TagB" and by_body[big].sys_flag & 1 == 0
        assert [m.body for m in msgs if m.body.startswith(b"b")] == [b"b0", b"b1", b"b2"]
        tag_a = await pull_all(c, "RT", "TagA || TagB")
        assert {m.body for m in tag_a} == {b"hello", big, b"b0", b"b1", b"b2", b"oneway"}
        mq = r2.message_queue
        assert await c.max_offset(mq) >= 1 and await c.min_offset(mq) == 0
        assert await c.search_offset(mq, 0) == 0
        assert await c.earliest_msg_store_time(mq) > 0
        assert await c.fetch_committed_offset(mq) == -1 or True
        await c.commit_offset(mq, 1)
        assert await c.fetch_committed_offset(mq) == 1
        empty = await c.pull(mq, await c.max_offset(mq), 32)
        assert empty.status is PullStatus.NO_NEW_MSG
        bad = await c.pull(mq, 10_000, 32)
        assert bad.status is PullStatus.OFFSET_ILLEGAL


async def _pull_n(c: PullConsumer, topic: str, n: int) -> list[MessageExt] | None:
    msgs = await pull_all(c, topic)
    return msgs if len(msgs) >= n else None


async def test_blocking_pull_wakes_on_new_message(ns_addr: str, broker: Any) -> None:
    await create(ns_addr, "LP", 1)
    async with PullConsumer(ns_addr, "lp-cg") as c, Producer(ns_addr, "pg") as p:
        mq = (await c.fetch_subscribe_message_queues("LP"))[0]
        pending = asyncio.create_task(c.pull(mq, 0, 32, block=True))
        await wait_for(lambda: broker.long_polling.parked_count == 1)  # the broker holds the pull
        assert not pending.done()
        await p.send(new_message("LP", "wake"))
        r = await asyncio.wait_for(pending, 10)
        assert r.status is PullStatus.FOUND and r.messages[0].body == b"wake"


async def test_auto_create_through_tbw102(ns_addr: str) -> None:
    async with Producer(ns_addr, "pg") as p:
        r = await p.send(new_message("AutoCreated", "x"))
        assert r.status is SendStatus.SEND_OK
    async with Admin(ns_addr) as admin:
        assert "AutoCreated" in await wait_for(admin.topic_list)


def push(ns: str, group: str, topic: str, listener: Any, expr: str = "*", **kw: Any) -> PushConsumer:
    c = PushConsumer(ns, group, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **{**FAST, **kw})
    c.subscribe(topic, expr)
    c.register_message_listener(listener)
    return c


async def test_push_consumer_round_trip_with_tag_filter(ns_addr: str) -> None:
    await create(ns_addr, "PT")
    got: list[bytes] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = push(ns_addr, "push-cg", "PT", listener, "TagA || TagB", consume_batch_size=4)
    await c.start()
    try:
        async with Producer(ns_addr, "pg") as p:
            for i in range(30):
                await p.send(new_message("PT", f"m{i}", tags=["TagA", "TagB", "TagC"][i % 3]))
        want = {f"m{i}".encode() for i in range(30) if i % 3 != 2}
        await wait_for(lambda: set(got) >= want)
        # offsets are committed: the group's committed offsets sum to all messages
        async with Admin(ns_addr) as admin:
            async def committed() -> bool:
                rows = await admin.consumer_progress("push-cg", "PT")
                return sum(r[2] for r in rows) == 30
            await wait_for(committed)
    finally:
        await c.close()
    assert set(got) == want


async def test_retry_then_dlq(ns_addr: str) -> None:
    await create(ns_addr, "RQ", 2)
    attempts: list[tuple[str, int]] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            attempts.append((m.topic, m.reconsume_times))
            if m.body == b"bad":
                raise RuntimeError("boom")  # an exception counts as RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    c = push(ns_addr, "retry-cg", "RQ", listener, max_reconsume_times=2)
    await c.start()
    try:
        async with Producer(ns_addr, "pg") as p:
            await p.send(new_message("RQ", "bad", keys="badkey"))
            await p.send(new_message("RQ", "good"))
        await wait_for(lambda: len(attempts) >= 4, timeout_s=30)
        assert [a for a in attempts if a[1] > 0] == [("RQ", 1), ("RQ", 2)]  # real topic restored
    finally:
        await c.close()
    async with PullConsumer(ns_addr, "dlq-reader") as pc:
        mqs = await wait_for(lambda: _try(pc.fetch_subscribe_message_queues("%DLQ%retry-cg")))
        r = await wait_for(lambda: _found(pc, mqs[0]))
        assert [m.body for m in r.messages] == [b"bad"]
        assert r.messages[0].properties.get("RETRY_TOPIC") == "RQ"


@pytest.mark.parametrize("failure", ["raise", "error_code"])
async def test_failed_send_back_resends_through_the_retry_topic(ns_addr: str, failure: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """CONSUMER_SEND_MSG_BACK fails (transport error / error code): the client re-sends the message to
    %RETRY%<group> itself, and it comes back with its reconsume count incremented."""
    from ferrymq.client import api
    from ferrymq.remoting.codec import RemotingCommand

    send_backs: list[dict[str, Any]] = []

    def failing_send_back(**kw: Any) -> RemotingCommand:
        send_backs.append(kw)
        if failure == "raise":
            raise ConnectionError("send-back unavailable")
        return RemotingCommand.request(9_999, {})  # the broker answers REQUEST_CODE_NOT_SUPPORTED

    monkeypatch.setattr(api, "build_send_back", failing_send_back)
    resent: list[tuple[str, Any]] = []
    plain_send = Producer.send

    async def recording_send(self: Producer, msg: Any, **kw: Any) -> Any:
        if msg.topic.startswith("%RETRY%"):
            resent.append((self.group, msg))
        return await plain_send(self, msg, **kw)

    monkeypatch.setattr(Producer, "send", recording_send)
    await create(ns_addr, "SBF", 2)
    seen: list[MessageExt] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(msgs)
        return ConsumeStatus.RECONSUME_LATER if all(m.reconsume_times == 0 for m in msgs) else \
            ConsumeStatus.CONSUME_SUCCESS

    # local retries would take a minute: anything seen again sooner came through %RETRY%sbf-cg
    c = push(ns_addr, "sbf-cg", "SBF", listener, max_reconsume_times=3, retry_local_delay_ms=60_000)
    await c.start()
    try:
        async with Producer(ns_addr, "pg") as p:
            sent = await p.send(new_message("SBF", "again", tags="T1", keys="k1", properties={"mine": "v"}))
        await wait_for(lambda: len(seen) >= 2, timeout_s=30)
        first, again = seen[0], seen[1]
        assert len(send_backs) == 1 and send_backs[0]["origin_msg_id"] == sent.msg_id
        assert first.reconsume_times == 0 and "RETRY_TOPIC" not in first.properties
        assert again.topic == "SBF" and again.body == b"again" and again.reconsume_times == 1
        assert again.properties["RETRY_TOPIC"] == "SBF" and again.properties["RECONSUME_TIME"] == "1"
        assert again.properties["MAX_RECONSUME_TIMES"] == "3"
        assert [(g, m.topic, m.properties["DELAY"]) for g, m in resent] == [
            ("CLIENT_INNER_PRODUCER", "%RETRY%sbf-cg", "3")]  # the broker drops DELAY on delivery
        assert again.properties["ORIGIN_MESSAGE_ID"] == sent.msg_id and again.msg_id == sent.msg_id
        assert again.tags == "T1" and again.keys == ["k1"] and again.properties["mine"] == "v"
        assert "CLIENT_INNER_PRODUCER" in c.instance.producer_groups
        # both the original and the retried message are committed
        async with Admin(ns_addr) as admin:
            async def committed() -> bool:
                return sum(r[2] for r in await admin.consumer_progress("sbf-cg", "SBF")) == 1
            await wait_for(committed)
    finally:
        await c.close()
    assert len(seen) == 2


async def _try(coro: Any) -> Any:
    try:
        return await coro
    except Exception:
        return None


async def _found(pc: PullConsumer, mq: Any) -> Any:
    r = await pc.pull(mq, 0, 32)
    return r if r.messages else None


async def test_orderly_per_key_order(ns_addr: str) -> None:
    await create(ns_addr, "OT", 4)
    seen: dict[str, list[int]] = {}
    fail_once = {"k1-3"}

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            key, seq = m.keys[0], int(m.body)
            if f"{key}-{seq}" in fail_once:
                fail_once.discard(f"{key}-{seq}")
                return ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            seen.setdefault(key, []).append(seq)
        return ConsumeStatus.SUCCESS

    c = push(ns_addr, "order-cg", "OT", listener, orderly=True, suspend_current_queue_time_ms=100)
    await c.start()
    try:
        async with Producer(ns_addr, "pg") as p:
            for seq in range(10):
                for key in ("k0", "k1", "k2"):
                    await p.send(new_message("OT", str(seq), keys=key), selector=select_by_hash, arg=key)
        await wait_for(lambda: sum(len(v) for v in seen.values()) >= 30)
        assert all(c.process_queues[mq].locked for mq in c.process_queues)
    finally:
        await c.close()
    assert seen == {k: list(range(10)) for k in ("k0", "k1", "k2")}


async def test_broadcasting_delivers_everything_to_everyone(ns_addr: str, tmp_path: Path) -> None:
    await create(ns_addr, "BT", 2)
    got: dict[int, list[bytes]] = {0: [], 1: []}
    consumers = []
    for i in range(2):
        c = push(ns_addr, "bc-cg", "BT", lambda msgs, i=i: got[i].extend(m.body for m in msgs),
                 message_model="BROADCASTING", offset_store_dir=str(tmp_path / f"c{i}"))
        await c.start()
        consumers.append(c)
    try:
        async with Producer(ns_addr, "pg") as p:
            for i in range(10):
                await p.send(new_message("BT", f"m{i}"))
        await wait_for(lambda: len(got[0]) >= 10 and len(got[1]) >= 10)
    finally:
        for c in consumers:
            await c.close()
    assert sorted(got[0]) == sorted(got[1]) == sorted(f"m{i}".encode() for i in range(10))
    table = json.loads((tmp_path / "c0" / "bc-cg" / "offsets.json").read_text())["offsetTable"]
    assert sum(e["offset"] for e in table) == 10


async def test_two_consumers_split_queues_and_take_over(ns_addr: str) -> None:
    await create(ns_addr, "ST", 4)
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    a = push(ns_addr, "split-cg", "ST", lambda msgs: got["a"].extend(m.body for m in msgs), instance_name="a")
    b = push(ns_addr, "split-cg", "ST", lambda msgs: got["b"].extend(m.body for m in msgs), instance_name="b")
    await a.start()
    await b.start()
    try:
        def split() -> bool:
            qa = {mq for mq in a.process_queues if mq.topic == "ST"}
            qb = {mq for mq in b.process_queues if mq.topic == "ST"}
            return len(qa) == 2 and len(qb) == 2 and not (qa & qb)
        await wait_for(split)
        async with Producer(ns_addr, "pg") as p:
            for i in range(20):
                await p.send(new_message("ST", f"m{i}"))
            await wait_for(lambda: len(got["a"]) + len(got["b"]) >= 20)
            assert got["a"] and got["b"]
            await b.close()
            await wait_for(lambda: len([mq for mq in a.process_queues if mq.topic == "ST"]) == 4)
            for i in range(20, 40):
                await p.send(new_message("ST", f"m{i}"))
        await wait_for(lambda: {f"m{i}".encode() for i in range(20, 40)} <= set(got["a"]))
    finally:
        await a.close()
        await b.close()
    assert {f"m{i}".encode() for i in range(40)} == set(got["a"]) | set(got["b"])


async def test_admin_api(ns_addr: str, broker: Any) -> None:
    async with Admin(ns_addr) as admin:
        info = await admin.cluster_info()
        assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
        assert await admin.create_topic("AT", cluster="DefaultCluster", read_queue_nums=2, write_queue_nums=2)
        await wait_for(lambda: _try(admin.topic_route("AT")))
        async with Producer(ns_addr, "pg") as p:
            r = await p.send(new_message("AT", "find me", keys="needle"))
        status = await admin.topic_status("AT")
        assert sum(hi - lo for _, lo, hi, _ in status) == 1
        m = await admin.view_message(r.offset_msg_id)
        assert m.body == b"find me"
        found = await wait_for(lambda: admin.query_messages_by_key("AT", "needle"))
        assert [x.body for x in found] == [b"find me"]
        progress = await admin.consumer_progress("nobody", "AT")
        assert sum(row[3] for row in progress) == 1
        rt = await admin.broker_runtime_info(broker.broker_addr)
        assert rt
        ha = await admin.ha_status()
        assert ha[0]["brokerName"] == "broker-a" and "runtime" in ha[0]
        await admin.create_subscription_group("sg-1", retry_max_times=3)
        await admin.delete_topic("AT")
        assert "AT" not in await admin.topic_list()


async def test_sync_facades(ns_addr: str) -> None:
    # the broker runs on this test's loop: drive the blocking facades from a worker thread
    await asyncio.to_thread(_sync_round_trip, ns_addr)


def _sync_round_trip(ns_addr: str) -> None:
    with SyncAdmin(ns_addr) as admin:
        admin.create_topic("SY", read_queue_nums=1, write_queue_nums=1)
        route = admin.wait_for_route("SY")
        assert route.queue_datas[0].read_queue_nums == 1
    with SyncProducer(ns_addr, "pg") as p:
        r = p.send(new_message("SY", "sync"))
        assert r.status is SendStatus.SEND_OK
    with SyncPullConsumer(ns_addr, "sync-cg") as c:
        mq = c.fetch_subscribe_message_queues("SY")[0]
        res = c.pull(mq, 0, 10)
        assert [m.body for m in res.messages] == [b"sync"]


@pytest.mark.parametrize("n", [1])
async def test_consumer_restart_resumes_from_committed_offset(ns_addr: str, n: int) -> None:
    await create(ns_addr, "RS", 1)
    got: list[bytes] = []
    async with Producer(ns_addr, "pg") as p:
        for i in range(5):
            await p.send(new_message("RS", f"a{i}"))
        c = push(ns_addr, "resume-cg", "RS", lambda msgs: got.extend(m.body for m in msgs))
        await c.start()
        await wait_for(lambda: len(got) == 5)
        await c.close()
        for i in range(5):
            await p.send(new_message("RS", f"b{i}"))
    c = push(ns_addr, "resume-cg", "RS", lambda msgs: got.extend(m.body for m in msgs))
    await c.start()
    try:
        await wait_for(lambda: len(got) >= 10)
    finally:
        await c.close()
    assert got == [f"a{i}".encode() for i in range(5)] + [f"b{i}".encode() for i in range(5)]
