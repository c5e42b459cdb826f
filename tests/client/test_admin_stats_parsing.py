"""Admin reading of GET_CONSUME_STATS / GET_TOPIC_STATS_INFO against fake servers: the MessageQueue-keyed
fastjson shape, the list shape of earlier brokers, and errors that name the broker instead of being
swallowed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ferrymq.client import Admin
from ferrymq.common.route import BrokerData, MessageQueue, QueueData, TopicRouteData
from ferrymq.errors import ClientError, ProtocolError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher
from ferrymq.remoting.server import RemotingServer
from support.ports import LOOPBACK

CONSUME_STATS_FASTJSON = (
    b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:'
    b'{"brokerOffset":9,"consumerOffset":4,"lastTimestamp":1700000000000},'
    b'{"brokerName":"b","queueId":0,"topic":"%RETRY%g"}:{"brokerOffset":1,"consumerOffset":1,"lastTimestamp":0}}}')
CONSUME_STATS_LIST = (
    b'{"consumeTps":0,"offsetTable":[{"messageQueue":{"brokerName":"b","queueId":0,"topic":"Old"},'
    b'"offsetWrapper":{"brokerOffset":3,"consumerOffset":3,"lastTimestamp":5}}]}')


class Cluster:
    """A fake name server (cluster info, routes) and one fake master ``b``."""

    def __init__(self) -> None:
        self.ns_dispatcher = Dispatcher()
        self.broker_dispatcher = Dispatcher()
        self.ns = RemotingServer(self.ns_dispatcher, LOOPBACK, 0)
        self.broker = RemotingServer(self.broker_dispatcher, LOOPBACK, 0)
        self.ns_dispatcher.register(RequestCode.GET_BROKER_CLUSTER_INFO, self.cluster_info)
        self.ns_dispatcher.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.route)

    def cluster_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        body = {"brokerAddrTable": {"b": {"brokerName": "b", "cluster": "C", "brokerAddrs": {0: self.broker.addr}}},
                "clusterAddrTable": {"C": ["b"]}}
        return cmd.response(ResponseCode.SUCCESS, body=jsonx.dumps(body))

    def route(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        rt = TopicRouteData([QueueData("b", 2, 2, 6)], [BrokerData("C", "b", {0: self.broker.addr})])
        return cmd.response(ResponseCode.SUCCESS, body=jsonx.dumps(rt.to_json()))

    def answer(self, code: int, body: bytes = b"", remark: str | None = None) -> None:
        for req in (RequestCode.GET_CONSUME_STATS, RequestCode.GET_TOPIC_STATS_INFO):
            self.broker_dispatcher.register(req, lambda conn, cmd: cmd.response(code, body=body, remark=remark))


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    await c.ns.start()
    await c.broker.start()
    try:
        yield c
    finally:
        await c.broker.stop()
        await c.ns.stop()


async def test_consume_stats_fastjson_shape(cluster: Cluster) -> None:
    cluster.answer(ResponseCode.SUCCESS, CONSUME_STATS_FASTJSON)
    async with Admin(cluster.ns.addr) as admin:
        stats = await admin.consume_stats(cluster.broker.addr, "g")
        assert stats[MessageQueue("T", "b", 1)] == {"brokerOffset": 9, "consumerOffset": 4,
                                                     "lastTimestamp": 1700000000000}
        assert await admin._group_topics("g") == ["%RETRY%g", "T"]


async def test_consume_stats_list_shape_of_earlier_brokers(cluster: Cluster) -> None:
    cluster.answer(ResponseCode.SUCCESS, CONSUME_STATS_LIST)
    async with Admin(cluster.ns.addr) as admin:
        assert await admin.consume_stats(cluster.broker.addr, "g") == {
            MessageQueue("Old", "b", 0): {"brokerOffset": 3, "consumerOffset": 3, "lastTimestamp": 5}}


@pytest.mark.parametrize(("code", "body", "what"), [
    (ResponseCode.SYSTEM_ERROR, b"", "stats unavailable"),
    (ResponseCode.SUCCESS, b'{"offsetTable":{{"brokerName":', "not JSON"),
    (ResponseCode.SUCCESS, b'{"offsetTable":[{"brokerName":"b"}]}', "not a MessageQueue"),
])
async def test_group_topics_names_the_failing_broker(cluster: Cluster, code: int, body: bytes, what: str) -> None:
    cluster.answer(code, body, remark="stats unavailable")
    async with Admin(cluster.ns.addr) as admin:
        with pytest.raises(ClientError, match=r"from broker b \(127\.0\.0\.1:\d+\) failed") as ei:
            await admin.consumer_progress("g")
        assert what in str(ei.value)


async def test_topic_stats_errors_are_not_swallowed(cluster: Cluster) -> None:
    cluster.answer(ResponseCode.SUCCESS, b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:7}}')
    async with Admin(cluster.ns.addr) as admin:
        with pytest.raises(ProtocolError, match="bad entry"):
            await admin.topic_status("T")
