"""Pull consumer: the caller picks queues and offsets (what the Spark connector builds on)."""

from __future__ import annotations

import time
from typing import Any

from ferrymq.client import api, routes
from ferrymq.client.config import client_config
from ferrymq.client.consumer.core import ConsumerBase, ConsumerCore
from ferrymq.client.instance import ClientInstance
from ferrymq.client.selectors import MessageSelector, as_message_selector
from ferrymq.client.values import PullResult
from ferrymq.common.route import MessageQueue
from ferrymq.common.tls import TlsClientSettings
from ferrymq.common.topic import retry_topic
from ferrymq.errors import ClientError
from ferrymq.remoting.codes import RequestCode

#: Default request timeout of a non-blocking pull.
PULL_TIMEOUT_MS = 10_000


class PullConsumer(ConsumerBase):
    _kind = "pull"

    def __init__(
        self,
        name_server: str | list[str],
        group: str,
        *,
        read_from_slave: str = "whenMasterDown",
        pull_timeout_ms: int = PULL_TIMEOUT_MS,
        broker_suspend_max_time_ms: int = api.BROKER_SUSPEND_MAX_TIME_MS,
        consumer_timeout_when_suspend_ms: int = api.CONSUMER_TIMEOUT_WHEN_SUSPEND_MS,
        poll_name_server_interval_ms: int = 30_000,
        heartbeat_broker_interval_ms: int = 30_000,
        instance_name: str | None = None,
        access_key: str = "",
        secret_key: str = "",
        tls: TlsClientSettings | None = None,
    ) -> None:
        self.config = client_config(name_server, poll_name_server_interval_ms=poll_name_server_interval_ms,
                                    heartbeat_broker_interval_ms=heartbeat_broker_interval_ms,
                                    instance_name=instance_name, access_key=access_key,
                                    secret_key=secret_key, tls=tls)
        self.group = group
        self.read_from_slave = read_from_slave
        self.pull_timeout_ms = pull_timeout_ms
        self.broker_suspend_max_time_ms = broker_suspend_max_time_ms
        self.consumer_timeout_when_suspend_ms = consumer_timeout_when_suspend_ms
        self._topics: dict[str, str] = {}
        #: topic -> expression type of its subscription (absent: TAG)
        self._expression_types: dict[str, str] = {}
        self._sub_version = int(time.time() * 1000)
        self._core: ConsumerCore | None = None

    # ---- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._core is not None:
            return
        inst = ClientInstance(self.config)
        self._core = ConsumerCore(inst, self.group, self.read_from_slave)
        inst.consumers[self.group] = self
        await inst.start()

    async def close(self) -> None:
        if self._core is not None:
            await self._core.instance.close()
            self._core = None

    # ---- ConsumerHooks (heartbeat as a CONSUME_ACTIVELY consumer) ----------------------------------------
    def consumer_data(self) -> dict[str, Any]:
        return {
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "consumeType": "CONSUME_ACTIVELY",
            "groupName": self.group,
            "messageModel": "CLUSTERING",
            "subscriptionDataSet": self._subscription_set(),
            "unitMode": False,
        }

    def _subscription_set(self) -> list[dict[str, Any]]:
        return [api.subscription_data(t, e, self._sub_version, self._expression_types.get(t, "TAG"))
                for t, e in self._topics.items()]

    def subscribed_topics(self) -> set[str]:
        return set(self._topics)

    def rebalance_now(self) -> None:
        return None

    def running_info(self) -> dict[str, Any]:
        return {"properties": {"consumeType": "CONSUME_ACTIVELY", "clientId": self.instance.client_id},
                "subscriptionSet": self._subscription_set(),
                "mqTable": {}, "statusTable": {}}

    async def reset_offsets(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        return None

    # ---- API ----------------------------------------------------------------------------------------------
    async def fetch_subscribe_message_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues of a topic (slave-only broker groups included)."""
        route = await self.instance.update_route(topic)
        mqs = routes.subscribe_queues(topic, route)
        if not mqs:
            raise ClientError(f"topic {topic} has no readable queue")
        return mqs

    async def pull(
        self,
        mq: MessageQueue,
        queue_offset: int,
        max_nums: int = 32,
        *,
        sub_expression: str | MessageSelector = "*",
        timeout_ms: int | None = None,
        block: bool = False,
        decode: bool = True,
    ) -> PullResult:
        """One pull. ``block=True`` long-polls (the broker holds it up to ``broker_suspend_max_time_ms``).
        ``sub_expression``: a tag expression, or ``MessageSelector.by_sql(...)`` (filtered by the broker)."""
        if queue_offset < 0:
            raise ClientError("queue_offset must be >= 0")
        if max_nums <= 0:
            raise ClientError("max_nums must be > 0")
        selector = as_message_selector(sub_expression)
        if mq.topic not in self._topics and not mq.topic.startswith("%"):
            self._topics[mq.topic] = selector.expression
            if not selector.is_tag:
                self._expression_types[mq.topic] = selector.expression_type
        await self._ensure_broker(mq)
        if timeout_ms is None:
            timeout_ms = self.consumer_timeout_when_suspend_ms if block else self.pull_timeout_ms
        return await self.core.pull(
            mq, queue_offset, max_nums, sub_expression=selector.expression,
            expression_type=selector.expression_type, sub_version=self._sub_version,
            block=block, suspend_timeout_ms=self.broker_suspend_max_time_ms, timeout_ms=timeout_ms, decode=decode)

    async def _ensure_broker(self, mq: MessageQueue) -> None:
        if mq.broker_name not in self.instance.broker_addrs:
            await self.instance.update_route(mq.topic)

    async def min_offset(self, mq: MessageQueue) -> int:
        await self._ensure_broker(mq)
        return await self.core.query_offset(RequestCode.GET_MIN_OFFSET, mq)

    async def max_offset(self, mq: MessageQueue) -> int:
        """The next offset to be written (one past the last message)."""
        await self._ensure_broker(mq)
        return await self.core.query_offset(RequestCode.GET_MAX_OFFSET, mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        await self._ensure_broker(mq)
        return await self.core.query_offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, timestamp=timestamp_ms)

    async def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        await self._ensure_broker(mq)
        return await self.core.query_offset(RequestCode.GET_EARLIEST_MSG_STORETIME, mq)

    async def commit_offset(self, mq: MessageQueue, queue_offset: int) -> None:
        await self._ensure_broker(mq)
        await self.core.commit_offset(mq, queue_offset)

    async def fetch_committed_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset, -1 when there is none."""
        await self._ensure_broker(mq)
        return await self.core.fetch_committed_offset(mq)

    def retry_topic(self) -> str:
        return retry_topic(self.group)
