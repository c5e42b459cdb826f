"""Route data exchanged with the name server (protocol §3.1), and the MessageQueue value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MASTER_ID = 0


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> MessageQueue:
        return cls(str(obj["topic"]), str(obj["brokerName"]), int(obj["queueId"]))


@dataclass(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> QueueData:
        return cls(
            broker_name=str(obj["brokerName"]),
            read_queue_nums=int(obj["readQueueNums"]),
            write_queue_nums=int(obj["writeQueueNums"]),
            perm=int(obj["perm"]),
            topic_sys_flag=int(obj.get("topicSysFlag", obj.get("topicSynFlag", 0)) or 0),
        )


@dataclass(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)  # brokerId -> "ip:port"

    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def lowest_addr(self) -> str | None:
        """The master if present, else the lowest-id slave."""
        if not self.broker_addrs:
            return None
        return self.broker_addrs[min(self.broker_addrs)]

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
            "brokerName": self.broker_name,
            "cluster": self.cluster,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> BrokerData:
        return cls(
            cluster=str(obj.get("cluster", "")),
            broker_name=str(obj["brokerName"]),
            broker_addrs={int(k): str(v) for k, v in (obj.get("brokerAddrs") or {}).items()},
        )


@dataclass(slots=True)
class TopicRouteData:
    queue_datas: list[QueueData] = field(default_factory=list)
    broker_datas: list[BrokerData] = field(default_factory=list)
    order_topic_conf: str | None = None

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "brokerDatas": [b.to_json() for b in sorted(self.broker_datas, key=lambda b: b.broker_name)],
            "filterServerTable": {},
            "queueDatas": [q.to_json() for q in sorted(self.queue_datas, key=lambda q: q.broker_name)],
        }
        if self.order_topic_conf:
            obj["orderTopicConf"] = self.order_topic_conf
        return obj

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TopicRouteData:
        return cls(
            queue_datas=[QueueData.from_json(q) for q in obj.get("queueDatas") or []],
            broker_datas=[BrokerData.from_json(b) for b in obj.get("brokerDatas") or []],
            order_topic_conf=obj.get("orderTopicConf"),
        )

    def broker(self, broker_name: str) -> BrokerData | None:
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b
        return None
