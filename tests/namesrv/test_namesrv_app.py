"""NameServer over real TCP on 127.0.0.1, spoken to with ferrymq.remoting.connection.connect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.namesrv import NameServer
from ferrymq.namesrv.register_body import RegisterBrokerBody, body_crc32, encode_register_body
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection, connect
from support.aio import wait_for
from support.clock import ManualClock

CLUSTER = "DefaultCluster"
WAIT_S = 5.0


#: start of the namesrv tests' manual clock
T0_MS = 1_700_000_000_000


def register_body_json(topics: dict[str, int], counter: int = 1) -> bytes:
    """A body shaped like a Java broker's (§3.2), written by hand."""
    table = {
        name: {"order": False, "perm": perm, "readQueueNums": 4, "topicFilterType": "SINGLE_TAG",
               "topicName": name, "topicSysFlag": 0, "writeQueueNums": 4}
        for name, perm in topics.items()
    }
    return orjson.dumps({
        "filterServerList": [],
        "topicConfigSerializeWrapper": {"dataVersion": {"counter": counter, "timestamp": 1_700_000_000_000},
                                        "topicConfigTable": table},
    })


def register_cmd(name: str, addr: str, broker_id: int, body: bytes, **extra: object) -> RemotingCommand:
    fields: dict[str, object] = {
        "brokerName": name, "brokerAddr": addr, "clusterName": CLUSTER,
        "haServerAddr": addr.rsplit(":", 1)[0] + ":10912", "brokerId": broker_id, "compressed": False,
        "bodyCrc32": body_crc32(body),
    }
    fields.update(extra)
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, fields, body)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0_MS)


@pytest.fixture
async def namesrv(clock: ManualClock) -> AsyncIterator[NameServer]:
    server = NameServer(host="127.0.0.1", port=0, clock_ms=clock)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def client(namesrv: NameServer) -> AsyncIterator[Connection]:
    conn = await connect(namesrv.addr)
    try:
        yield conn
    finally:
        conn.close()


async def route(conn: Connection, topic: str) -> RemotingCommand:
    return await conn.invoke(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))


async def test_register_route_and_connection_close(namesrv: NameServer, client: Connection) -> None:
    assert namesrv.port > 0 and namesrv.addr == f"127.0.0.1:{namesrv.port}"
    master = await connect(namesrv.addr)
    slave = await connect(namesrv.addr)
    try:
        body = register_body_json({"TopicTest": 6, "TBW102": 7})
        resp = await master.invoke(register_cmd("broker-a", "127.0.0.1:10911", 0, body))
        assert resp.code == ResponseCode.SUCCESS
        assert "masterAddr" not in resp.ext_fields
        resp = await slave.invoke(register_cmd("broker-a", "127.0.0.1:11911", 1, body))
        assert resp.code == ResponseCode.SUCCESS
        assert resp.ext_fields == {"haServerAddr": "127.0.0.1:10912", "masterAddr": "127.0.0.1:10911"}

        resp = await route(client, "TopicTest")
        assert resp.code == ResponseCode.SUCCESS
        assert b'"brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.1:11911"}' in resp.body
        assert orjson.loads(resp.body) == {
            "brokerDatas": [{"brokerAddrs": {"0": "127.0.0.1:10911", "1": "127.0.0.1:11911"},
                             "brokerName": "broker-a", "cluster": CLUSTER}],
            "filterServerTable": {},
            "queueDatas": [{"brokerName": "broker-a", "perm": 6, "readQueueNums": 4, "topicSysFlag": 0,
                            "writeQueueNums": 4}],
        }

        master.close()

        async def slave_only() -> bool:
            r = await route(client, "TopicTest")
            assert r.code == ResponseCode.SUCCESS  # the route survives with the slave
            return bool(orjson.loads(r.body)["brokerDatas"][0]["brokerAddrs"] == {"1": "127.0.0.1:11911"})

        await wait_for(slave_only, WAIT_S)
        slave.close()

        async def gone() -> bool:
            return (await route(client, "TopicTest")).code == ResponseCode.TOPIC_NOT_EXIST

        await wait_for(gone, WAIT_S)
        resp = await route(client, "TopicTest")
        assert resp.remark == "No topic route info in name server for the topic: TopicTest"
    finally:
        master.close()
        slave.close()


async def test_compressed_registration_and_crc(namesrv: NameServer, client: Connection) -> None:
    reg = RegisterBrokerBody(DataVersion(1, 1), {"Z": TopicConfig("Z", 2, 2, 6)})
    body = encode_register_body(reg, compressed=True)
    resp = await client.invoke(register_cmd("b", "127.0.0.1:20911", 0, body, compressed=True))
    assert resp.code == ResponseCode.SUCCESS
    assert (await route(client, "Z")).code == ResponseCode.SUCCESS

    bad = register_cmd("b", "127.0.0.1:20911", 0, register_body_json({"Y": 6}), bodyCrc32=12345)
    resp = await client.invoke(bad)
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")
    assert (await route(client, "Y")).code == ResponseCode.TOPIC_NOT_EXIST

    resp = await client.invoke(RemotingCommand.request(RequestCode.REGISTER_BROKER, {"brokerName": "x"}))
    assert resp.code == ResponseCode.SYSTEM_ERROR


async def test_admin_requests(namesrv: NameServer, client: Connection) -> None:
    body = register_body_json({"T1": 6, "T2": 6})
    assert (await client.invoke(register_cmd("broker-a", "127.0.0.1:10911", 0, body))).code == 0

    async def call(code: int, fields: dict[str, object] | None = None, body: bytes = b"") -> RemotingCommand:
        return await client.invoke(RemotingCommand.request(code, fields, body))

    resp = await call(RequestCode.GET_BROKER_CLUSTER_INFO)
    assert jsonx.loads(resp.body) == {
        "brokerAddrTable": {"broker-a": {"brokerAddrs": {"0": "127.0.0.1:10911"}, "brokerName": "broker-a",
                                         "cluster": CLUSTER}},
        "clusterAddrTable": {CLUSTER: ["broker-a"]},
    }
    resp = await call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    assert orjson.loads(resp.body) == {"topicList": ["T1", "T2"]}
    resp = await call(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": CLUSTER})
    assert orjson.loads(resp.body) == {"topicList": ["T1", "T2"]}

    resp = await call(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert (resp.code, resp.ext_fields) == (0, {"wipeTopicCount": "2"})
    assert orjson.loads((await route(client, "T1")).body)["queueDatas"][0]["perm"] == 4
    resp = await call(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert (resp.code, resp.ext_fields) == (0, {"addTopicCount": "2"})
    assert orjson.loads((await route(client, "T1")).body)["queueDatas"][0]["perm"] == 6

    assert (await call(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T2"})).code == 0
    assert (await route(client, "T2")).code == ResponseCode.TOPIC_NOT_EXIST

    resp = await call(RequestCode.QUERY_DATA_VERSION,
                      {"brokerName": "broker-a", "brokerAddr": "127.0.0.1:10911", "clusterName": CLUSTER,
                       "brokerId": 0}, orjson.dumps({"counter": 1, "timestamp": 1_700_000_000_000}))
    assert resp.ext_fields == {"changed": "false"}
    assert orjson.loads(resp.body) == {"counter": 1, "timestamp": 1_700_000_000_000}

    resp = await call(RequestCode.UNREGISTER_BROKER, {"brokerName": "broker-a", "brokerAddr": "127.0.0.1:10911",
                                                      "clusterName": CLUSTER, "brokerId": 0})
    assert resp.code == 0
    assert (await route(client, "T1")).code == ResponseCode.TOPIC_NOT_EXIST


async def test_kv_config(namesrv: NameServer, client: Connection) -> None:
    async def call(code: int, **fields: object) -> RemotingCommand:
        return await client.invoke(RemotingCommand.request(code, fields))

    assert (await call(RequestCode.GET_KV_CONFIG, namespace="ns", key="k")).code == ResponseCode.QUERY_NOT_FOUND
    assert (await call(RequestCode.GET_KVLIST_BY_NAMESPACE, namespace="ns")).code == ResponseCode.QUERY_NOT_FOUND
    assert (await call(RequestCode.PUT_KV_CONFIG, namespace="ns", key="k", value="v")).code == 0
    resp = await call(RequestCode.GET_KV_CONFIG, namespace="ns", key="k")
    assert (resp.code, resp.ext_fields) == (0, {"value": "v"})
    resp = await call(RequestCode.GET_KVLIST_BY_NAMESPACE, namespace="ns")
    assert orjson.loads(resp.body) == {"table": {"k": "v"}}
    assert (await call(RequestCode.DELETE_KV_CONFIG, namespace="ns", key="k")).code == 0
    assert (await call(RequestCode.GET_KV_CONFIG, namespace="ns", key="k")).code == ResponseCode.QUERY_NOT_FOUND

    # ORDER_TOPIC_CONFIG entries show up as orderTopicConf in the route
    body = register_body_json({"O": 6})
    assert (await client.invoke(register_cmd("b", "127.0.0.1:10911", 0, body))).code == 0
    await call(RequestCode.PUT_KV_CONFIG, namespace="ORDER_TOPIC_CONFIG", key="O", value="b:4")
    assert orjson.loads((await route(client, "O")).body)["orderTopicConf"] == "b:4"


async def test_expiry_scan_closes_silent_broker(namesrv: NameServer, client: Connection, clock: ManualClock) -> None:
    broker = await connect(namesrv.addr)
    try:
        assert (await broker.invoke(register_cmd("b", "127.0.0.1:10911", 0, register_body_json({"E": 6})))).code == 0
        clock.now_ms += 120_000
        assert namesrv.scan_not_active_brokers() == []
        clock.now_ms += 1
        assert [e.addr for e in namesrv.scan_not_active_brokers()] == ["127.0.0.1:10911"]
        assert (await route(client, "E")).code == ResponseCode.TOPIC_NOT_EXIST
        await asyncio.wait_for(broker.wait_closed(), WAIT_S)
    finally:
        broker.close()


async def test_stop_and_restart_cycle() -> None:
    server = NameServer()
    await server.start()
    port = server.port
    await server.stop()
    assert server.port == port
