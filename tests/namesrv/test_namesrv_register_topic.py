"""REGISTER_TOPIC_IN_NAMESRV (217, RocketMQ 5): one topic's queue data registered by a broker without its whole
table, accepted only over the connection the broker's master registered on; and the broker side: a topic
created on a master registers alone, a name server that refuses it gets the whole table (broker/registration.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from namesrv_requests import register_cmd

from ferrymq.broker.registration import NameServerRegistrar
from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.namesrv.app import NameServer
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection, connect


def topic_cmd(topic: str, broker_name: str = "broker-a", body: bytes | None = None) -> RemotingCommand:
    if body is None:
        body = orjson.dumps({"queueDatas": [{"brokerName": broker_name, "readQueueNums": 8, "writeQueueNums": 6,
                                             "perm": 6, "topicSysFlag": 0}], "brokerDatas": []})
    return RemotingCommand.request(RequestCode.REGISTER_TOPIC_IN_NAMESRV, {"topic": topic}, body)


async def route(conn: Connection, topic: str) -> RemotingCommand:
    return await conn.invoke(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))


@pytest.fixture
async def server() -> AsyncIterator[NameServer]:
    ns = NameServer()
    await ns.start()
    yield ns
    await ns.stop()


async def test_a_topic_registered_alone_over_the_registering_connection_gets_its_route(server: NameServer) -> None:
    broker = await connect(server.addr)
    other = await connect(server.addr)
    try:
        assert (await broker.invoke(register_cmd())).code == ResponseCode.SUCCESS
        assert (await route(other, "TopicB")).code == ResponseCode.TOPIC_NOT_EXIST
        assert (await broker.invoke(topic_cmd("TopicB"))).code == ResponseCode.SUCCESS
        got = await route(other, "TopicB")
        assert got.code == ResponseCode.SUCCESS
        (qd,) = orjson.loads(got.body)["queueDatas"]
        assert (qd["brokerName"], qd["readQueueNums"], qd["writeQueueNums"], qd["perm"]) == ("broker-a", 8, 6, 6)
        assert (await route(other, "TopicA")).code == ResponseCode.SUCCESS  # the table registered before stays
    finally:
        broker.close()
        other.close()


async def test_a_topic_from_another_connection_or_for_an_unknown_broker_is_refused(server: NameServer) -> None:
    broker = await connect(server.addr)
    other = await connect(server.addr)
    try:
        refused = await broker.invoke(topic_cmd("TopicC"))  # nothing registered yet
        assert refused.code == ResponseCode.SYSTEM_ERROR and "not registered" in refused.remark
        assert (await broker.invoke(register_cmd())).code == ResponseCode.SUCCESS
        spoofed = await other.invoke(topic_cmd("TopicC"))
        assert spoofed.code == ResponseCode.SYSTEM_ERROR
        unknown = await broker.invoke(topic_cmd("TopicC", broker_name="broker-z"))
        assert unknown.code == ResponseCode.SYSTEM_ERROR
        for bad in (b"not json", b'{"queueDatas": 5}', b'{"queueDatas": [{"brokerName": "broker-a"}]}'):
            assert (await broker.invoke(topic_cmd("TopicC", body=bad))).code == ResponseCode.SYSTEM_ERROR
        assert (await route(other, "TopicC")).code == ResponseCode.TOPIC_NOT_EXIST
    finally:
        broker.close()
        other.close()


class FakePool:
    """The registrar's connection pool: answers REGISTER_TOPIC_IN_NAMESRV with ``topic_code``, records requests."""

    def __init__(self, topic_code: int) -> None:
        self.topic_code = topic_code
        self.requests: list[tuple[str, RemotingCommand]] = []

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int) -> RemotingCommand:
        self.requests.append((addr, cmd))
        code = self.topic_code if cmd.code == RequestCode.REGISTER_TOPIC_IN_NAMESRV else ResponseCode.SUCCESS
        return cmd.response(code)


def registrar(pool: FakePool, broker_id: int = 0) -> NameServerRegistrar:
    return NameServerRegistrar(
        pool, ["ns1:9876", "ns2:9876"], cluster_name="C", broker_name="broker-a", broker_id=broker_id,
        broker_addr=lambda: "127.0.0.1:10911", ha_server_addr=lambda: "", period_ms=30_000,
        topic_wrapper=lambda: {"dataVersion": DataVersion().to_json(), "topicConfigTable": {}}, coalesce_ms=10)


async def _settled(reg: NameServerRegistrar, pool: FakePool, count: int) -> None:
    for _ in range(500):
        if len(pool.requests) >= count and (reg._single_task is None or reg._single_task.done()) and (
                reg._pending is None or reg._pending.done()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(pool.requests)} requests, wanted {count}")


@pytest.mark.parametrize("code, full", [(ResponseCode.SUCCESS, False),
                                        (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, True)])
async def test_a_master_registers_a_created_topic_alone_or_its_whole_table_when_refused(code: int,
                                                                                      full: bool) -> None:
    pool = FakePool(code)
    reg = registrar(pool)
    reg.register_topic(TopicConfig("Fresh", 8, 8, 6))
    await _settled(reg, pool, 4 if full else 2)
    codes: list[Any] = [cmd.code for _addr, cmd in pool.requests]
    assert codes[:2] == [RequestCode.REGISTER_TOPIC_IN_NAMESRV] * 2
    body = orjson.loads(pool.requests[0][1].body)
    assert pool.requests[0][1].ext_fields["topic"] == "Fresh"
    assert body["queueDatas"] == [{"brokerName": "broker-a", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6,
                                   "topicSysFlag": 0}]
    assert codes[2:] == ([RequestCode.REGISTER_BROKER] * 2 if full else [])
    assert (reg.single_registrations, reg.single_fallbacks) == ((0, 1) if full else (1, 0))


async def test_a_slave_registers_its_whole_table() -> None:
    pool = FakePool(ResponseCode.SUCCESS)
    reg = registrar(pool, broker_id=1)
    reg.register_topic(TopicConfig("Fresh", 8, 8, 6))
    await _settled(reg, pool, 2)
    assert [cmd.code for _addr, cmd in pool.requests] == [RequestCode.REGISTER_BROKER] * 2
