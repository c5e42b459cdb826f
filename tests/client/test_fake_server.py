"""Transport behaviour against a tiny fake server (RemotingServer with handlers): pooling, pending
calls failing on close, pipelining, timeouts, name server failover, reconnect backoff."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from client_helpers import wait_for

from ferrymq.client import Producer, new_message
from ferrymq.client.config import ClientConfig
from ferrymq.client.instance import ClientInstance
from ferrymq.common.route import BrokerData, QueueData, TopicRouteData
from ferrymq.errors import ConnectError, ConnectionClosedError, RemotingTimeoutError, TopicNotExistError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.connection import Connection, Dispatcher
from ferrymq.remoting.server import RemotingServer
from support.ports import free_port


class Fake:
    def __init__(self) -> None:
        self.dispatcher = Dispatcher()
        self.server = RemotingServer(self.dispatcher, "127.0.0.1", 0)
        self.seen: list[RemotingCommand] = []
        self.release = asyncio.Event()

    @property
    def addr(self) -> str:
        return self.server.addr


@pytest.fixture
async def fake() -> AsyncIterator[Fake]:
    f = Fake()
    await f.server.start()
    try:
        yield f
    finally:
        await f.server.stop()


def instance(*ns: str, **kw: Any) -> ClientInstance:
    return ClientInstance(ClientConfig(list(ns), **kw))


async def test_one_connection_per_address_and_pipelining(fake: Fake) -> None:
    order: list[int] = []

    async def slow_echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        n = int(cmd.ext_fields["n"])
        await asyncio.sleep(0.01 * (10 - n))  # later requests answer first
        order.append(n)
        return cmd.response(0, {"n": n})

    fake.dispatcher.register(900, slow_echo)
    inst = instance(fake.addr)
    try:
        results = await asyncio.gather(*(inst.invoke(fake.addr, RemotingCommand.request(900, {"n": i}), 3000)
                                         for i in range(10)))
        assert [r.ext_fields["n"] for r in results] == [str(i) for i in range(10)]
        assert order != sorted(order)  # answered out of order, matched by opaque
        assert len(fake.server.connections) == 1
    finally:
        await inst.close()


async def test_language_and_version_on_the_wire(fake: Fake) -> None:
    seen: list[RemotingCommand] = []

    def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(cmd)
        return cmd.response(0)

    fake.dispatcher.register(901, handler)
    inst = instance(fake.addr)
    try:
        await inst.invoke(fake.addr, RemotingCommand.request(901), 1000)
        assert seen[0].language == "PYTHON" and seen[0].version == 407
    finally:
        await inst.close()


async def test_pending_calls_fail_with_cause_when_connection_closes(fake: Fake) -> None:
    async def never(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(3600)
        raise AssertionError

    fake.dispatcher.register(902, never)
    inst = instance(fake.addr)
    try:
        calls = [asyncio.create_task(inst.invoke(fake.addr, RemotingCommand.request(902), 10_000)) for _ in range(3)]
        await wait_for(lambda: len(fake.server.connections) == 1)
        await asyncio.sleep(0.05)
        for c in list(fake.server.connections):
            c.close()
        for t in calls:
            with pytest.raises(ConnectionClosedError):
                await t
        # the next call opens a new connection
        fake.dispatcher.register(903, lambda conn, cmd: cmd.response(0))
        assert (await inst.invoke(fake.addr, RemotingCommand.request(903), 2000)).code == 0
    finally:
        await inst.close()


async def test_timeout_is_reported_in_ms(fake: Fake) -> None:
    async def slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(1)
        return cmd.response(0)

    fake.dispatcher.register(904, slow)
    inst = instance(fake.addr)
    try:
        with pytest.raises(RemotingTimeoutError, match="50 ms"):
            await inst.invoke(fake.addr, RemotingCommand.request(904), 50)
    finally:
        await inst.close()


async def test_connect_failure_backs_off_then_retries() -> None:
    dead = f"127.0.0.1:{free_port()}"
    inst = instance(dead, reconnect_backoff_base_ms=200, reconnect_backoff_max_ms=400)
    try:
        with pytest.raises(ConnectError):
            await inst.invoke(dead, RemotingCommand.request(1), 500)
        with pytest.raises(ConnectError, match="backing off"):
            await inst.invoke(dead, RemotingCommand.request(1), 500)
        await asyncio.sleep(0.25)
        with pytest.raises(ConnectError) as ei:
            await inst.invoke(dead, RemotingCommand.request(1), 500)
        assert "backing off" not in str(ei.value)
    finally:
        await inst.close()


def route_body(broker_addr: str) -> bytes:
    rt = TopicRouteData([QueueData("b", 2, 2, 6)], [BrokerData("C", "b", {0: broker_addr})])
    return jsonx.dumps(rt.to_json())


async def test_name_server_failover_is_sticky(fake: Fake) -> None:
    dead = f"127.0.0.1:{free_port()}"
    hits: list[str] = []

    def get_route(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        hits.append(cmd.ext_fields["topic"])
        if cmd.ext_fields["topic"] == "Missing":
            return cmd.response(17, remark="No topic route info in name server for the topic: Missing")
        return cmd.response(0, body=route_body(fake.addr))

    fake.dispatcher.register(105, get_route)
    inst = instance(dead, fake.addr)
    inst._ns_index = 0  # start on the dead one
    try:
        rt = await inst.update_route("T")
        assert rt.broker("b") is not None and inst.master_addr("b") == fake.addr
        await inst.update_route("T")
        assert inst.name_servers[inst._ns_index % 2] == fake.addr  # stays on the live one
        with pytest.raises(TopicNotExistError):  # a coded answer is not retried elsewhere
            await inst.update_route("Missing")
        assert hits == ["T", "T", "Missing"]
    finally:
        await inst.close()


async def test_producer_retries_on_another_broker_and_tbw102_fallback(fake: Fake) -> None:
    other = Fake()
    await other.server.start()
    sends: dict[str, list[RemotingCommand]] = {"good": [], "bad": []}

    def ns_route(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if cmd.ext_fields["topic"] != "TBW102":
            return cmd.response(17, remark="no route")
        rt = TopicRouteData([QueueData("good", 8, 8, 7), QueueData("bad", 8, 8, 7)],
                            [BrokerData("C", "good", {0: fake.addr}), BrokerData("C", "bad", {0: other.addr})])
        return cmd.response(0, body=jsonx.dumps(rt.to_json()))

    def good(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        sends["good"].append(cmd)
        return cmd.response(0, {"msgId": "ID", "queueId": cmd.ext_fields["e"], "queueOffset": "4"})

    def bad(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        sends["bad"].append(cmd)
        return cmd.response(14, remark="service not available now")

    ns = Fake()
    ns.dispatcher.register(105, ns_route)
    await ns.server.start()
    fake.dispatcher.register(310, good)
    other.dispatcher.register(310, bad)
    try:
        async with Producer(ns.addr, "pg", send_latency_fault_enable=True) as p:
            for _ in range(6):
                r = await p.send(new_message("NewTopic", "x" * 5000))
                assert r.message_queue.broker_name == "good" and r.queue_offset == 4
            assert len(sends["bad"]) <= 1  # the failed broker is avoided afterwards
            h = sends["good"][0].ext_fields
            assert h["b"] == "NewTopic" and h["c"] == "TBW102" and h["f"] == "1"  # compressed
            assert int(h["e"]) < 4  # at most 4 queues per broker through TBW102
            assert "UNIQ_KEY" in h["i"]
    finally:
        await other.server.stop()
        await ns.server.stop()


async def test_broker_requests_reach_the_consumer_hooks(fake: Fake) -> None:
    class Hooks:
        group = "cg"
        rebalanced = 0

        def consumer_data(self) -> dict[str, Any]:
            return {"groupName": "cg"}

        def subscribed_topics(self) -> set[str]:
            return set()

        def rebalance_now(self) -> None:
            self.rebalanced += 1

        def running_info(self) -> dict[str, Any]:
            return {"properties": {"x": "1"}}

        async def reset_offsets(self, topic: str, offsets: dict[Any, int]) -> None:
            self.reset = (topic, offsets)

    conns: list[Connection] = []

    def hb(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        conns.append(conn)
        return cmd.response(0)

    unregistered: list[dict[str, str]] = []
    fake.dispatcher.register(34, hb)
    fake.dispatcher.register(35, lambda conn, cmd: (unregistered.append(cmd.ext_fields), cmd.response(0))[1])
    inst = instance(fake.addr)
    hooks = Hooks()
    inst.consumers["cg"] = hooks  # type: ignore[assignment]
    inst.broker_addrs = {"b": {0: fake.addr}}
    try:
        await inst.send_heartbeats()
        conn = conns[0]
        conn.invoke_oneway(RemotingCommand.request(40, {"consumerGroup": "cg"}))
        await wait_for(lambda: hooks.rebalanced == 1)
        info = await conn.invoke(RemotingCommand.request(307, {"consumerGroup": "cg", "clientId": "x"}), 2000)
        assert info.code == 0 and jsonx.loads(info.body)["properties"] == {"x": "1"}
        body = b'{"offsetTable":[{"brokerName":"b","queueId":0,"topic":"T","offset":3}]}'
        r = await conn.invoke(RemotingCommand.request(220, {"topic": "T", "group": "cg", "timestamp": 0,
                                                            "isForce": True}, body), 2000)
        assert r.code == 0 and hooks.reset[0] == "T"
    finally:
        await inst.close()
    assert unregistered == [{"clientID": inst.client_id, "consumerGroup": "cg"}]


async def test_slave_only_route_pulls_and_commits_on_the_slave_then_back_to_master() -> None:
    ns, master, slave = Fake(), Fake(), Fake()
    for f in (ns, master, slave):
        await f.server.start()
    state = {"master_up": False}
    calls: dict[str, list[RemotingCommand]] = {"master": [], "slave": []}

    def ns_route(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        addrs = {1: slave.addr}
        if state["master_up"]:
            addrs[0] = master.addr
        rt = TopicRouteData([QueueData("b", 1, 1, 6)], [BrokerData("C", "b", addrs)])
        return cmd.response(0, body=jsonx.dumps(rt.to_json()))

    def broker(name: str) -> Any:
        def handle(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
            calls[name].append(cmd)
            if cmd.code == 11:
                return cmd.response(19, {"nextBeginOffset": cmd.ext_fields["queueOffset"], "minOffset": "0",
                                         "maxOffset": "0", "suggestWhichBrokerId": "0"})
            return cmd.response(0, {"offset": "0"})
        return handle

    ns.dispatcher.register(105, ns_route)
    for name, f in (("master", master), ("slave", slave)):
        for code in (11, 15, 14, 34, 35):
            f.dispatcher.register(code, broker(name))
    from ferrymq.client import PullConsumer
    from ferrymq.client.consumer.core import ConsumerCore

    try:
        async with PullConsumer(ns.addr, "cg") as c:
            mq = (await c.fetch_subscribe_message_queues("T"))[0]
            await c.core.pull(mq, 3, 32, commit_offset=3, timeout_ms=2000)
            await c.commit_offset(mq, 3)
            pull = calls["slave"][0]
            assert pull.code == 11 and int(pull.ext_fields["sysFlag"]) & 1 == 0  # no commit flag to a slave
            assert calls["slave"][1].code == 15 and calls["slave"][1].ext_fields["commitOffset"] == "3"
            assert not calls["master"]
            state["master_up"] = True
            await c.instance.update_route("T")
            await c.core.pull(mq, 3, 32, commit_offset=3, timeout_ms=2000)
            await c.commit_offset(mq, 4)
            assert int(calls["master"][0].ext_fields["sysFlag"]) & 1 == 1
            assert calls["master"][1].code == 15
            never = ConsumerCore(c.instance, "cg", "never")
            state["master_up"] = False
            await c.instance.update_route("T")
            with pytest.raises(Exception, match="no master"):
                await never.pull_addr(mq)
    finally:
        for f in (ns, master, slave):
            await f.server.stop()
