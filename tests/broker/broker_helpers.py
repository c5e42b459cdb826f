"""Helpers shared by the broker tests: config, a raw remoting client, request builders (``wait_for`` is
``support.aio.wait_for``, re-exported)."""

from __future__ import annotations

from typing import Any

from ferrymq.broker.config import BrokerConfig
from ferrymq.common.message import MessageExt
from ferrymq.common.message_codec import iter_records
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.connection import Connection, Dispatcher, connect
from support.aio import wait_for as wait_for
from support.inproc import broker_config

#: the broker suite's BrokerConfig values on top of ``support.inproc.broker_config`` (also the ``broker`` fixture's)
BROKER_SETTINGS: dict[str, Any] = {
    "broker_name": "broker-t",
    "mapped_file_size_commit_log": 4 * 1024 * 1024,
    "mapped_file_size_consume_queue": 20 * 1000,
}


def make_config(data_dir: str, namesrv: str | None = None, **overrides: Any) -> BrokerConfig:
    cfg: BrokerConfig = broker_config(data_dir, namesrv, **{**BROKER_SETTINGS, **overrides})
    return cfg


class Client:
    """A raw remoting client that records server→client requests."""

    def __init__(self) -> None:
        self.dispatcher = Dispatcher()
        self.notifications: list[RemotingCommand] = []
        self.dispatcher.register(40, self._notify)
        self.conn: Connection | None = None

    def _notify(self, conn: Connection, cmd: RemotingCommand) -> None:
        self.notifications.append(cmd)
        return None

    async def open(self, addr: str) -> Client:
        self.conn = await connect(addr, self.dispatcher)
        return self

    async def call(self, code: int, fields: dict[str, Any] | None = None, body: bytes = b"",
                   timeout_ms: int = 5000, version: int = 407) -> RemotingCommand:
        assert self.conn is not None
        cmd = RemotingCommand.request(code, fields, body)
        cmd.version = version
        return await self.conn.invoke(cmd, timeout_ms)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def send_v1(topic: str, queue_id: int = 0, properties: str = "TAGS\x01TagA\x02", **extra: Any) -> dict[str, Any]:
    fields = {
        "producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": queue_id, "sysFlag": 0, "bornTimestamp": 1700000000000, "flag": 0,
        "properties": properties, "reconsumeTimes": "0", "unitMode": "0", "batch": "0",
    }
    fields.update(extra)
    return fields


def pull(topic: str, group: str = "cg", queue_id: int = 0, offset: int = 0, sys_flag: int = 6,
         sub: str = "*", suspend_ms: int = 15000, max_msgs: int = 32) -> dict[str, Any]:
    return {
        "consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": max_msgs, "sysFlag": sys_flag, "commitOffset": 0, "suspendTimeoutMillis": suspend_ms,
        "subscription": sub, "subVersion": 0,
    }


def records(body: bytes) -> list[MessageExt]:
    return list(iter_records(body))
