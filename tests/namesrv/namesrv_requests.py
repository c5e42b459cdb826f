"""Requests a broker sends a name server, as raw commands, for tests that drive a name server directly."""

from __future__ import annotations

import orjson

from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

#: the registering broker's identity (REGISTER_BROKER / UNREGISTER_BROKER header fields)
BROKER = {"brokerName": "broker-a", "brokerAddr": "127.0.0.1:10911", "clusterName": "DefaultCluster",
          "brokerId": 0}


def register_cmd(topic: str = "TopicA", addr: str = "127.0.0.1:10911") -> RemotingCommand:
    """REGISTER_BROKER of ``BROKER`` at ``addr`` with a plain body holding one topic of 4 queues."""
    body = orjson.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1, "timestamp": 1},
        "topicConfigTable": {topic: {"topicName": topic, "perm": 6, "readQueueNums": 4, "writeQueueNums": 4}}}})
    return RemotingCommand.request(RequestCode.REGISTER_BROKER,
                                   {**BROKER, "brokerAddr": addr, "haServerAddr": "", "compressed": False}, body)
