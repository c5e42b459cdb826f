"""Admin API: topics, cluster, consumer progress, message lookup, broker runtime/HA status."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from ferrymq.client import api, routes
from ferrymq.client.config import ClientConfig, parse_name_servers
from ferrymq.client.consumer.core import ConsumerCore
from ferrymq.client.instance import ClientInstance
from ferrymq.client.jsonmq import mq_keyed_map
from ferrymq.common.message import MessageExt
from ferrymq.common.route import MASTER_ID, MessageQueue, TopicRouteData
from ferrymq.common.topic import PERM_READ, PERM_WRITE, validate_topic
from ferrymq.errors import BrokerError, ClientError, TopicNotExistError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode


@dataclass(slots=True)
class BrokerInfo:
    cluster: str
    broker_name: str
    broker_id: int
    addr: str


def parse_cluster_info(obj: dict[str, Any]) -> dict[str, Any]:
    """Normalise GET_BROKER_CLUSTER_INFO: brokerAddrs keys become ints."""
    table = {}
    for name, bd in (obj.get("brokerAddrTable") or {}).items():
        table[name] = {
            "brokerName": bd.get("brokerName", name),
            "cluster": bd.get("cluster", ""),
            "brokerAddrs": {int(k): v for k, v in (bd.get("brokerAddrs") or {}).items()},
        }
    clusters = {c: sorted(names) for c, names in (obj.get("clusterAddrTable") or {}).items()}
    return {"brokerAddrTable": table, "clusterAddrTable": clusters}


class Admin:
    def __init__(self, name_server: str | list[str], *, request_timeout_ms: int = 5_000) -> None:
        self.config = ClientConfig(parse_name_servers(name_server), request_timeout_ms=request_timeout_ms)
        self._instance: ClientInstance | None = None

    @property
    def instance(self) -> ClientInstance:
        if self._instance is None:
            raise ClientError("admin is not started")
        return self._instance

    async def start(self) -> None:
        if self._instance is None:
            self._instance = ClientInstance(self.config)

    async def close(self) -> None:
        if self._instance is not None:
            await self._instance.close()
            self._instance = None

    async def __aenter__(self) -> Admin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, addr: str, cmd: RemotingCommand, timeout_ms: int | None = None) -> RemotingCommand:
        return await self.instance.invoke(addr, cmd, timeout_ms)

    # ---- cluster --------------------------------------------------------------------------------------------
    async def cluster_info(self) -> dict[str, Any]:
        resp = api.check(await self.instance.invoke_namesrv(
            RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)))
        return parse_cluster_info(jsonx.loads(resp.body) if resp.body else {})

    async def brokers(self, cluster: str | None = None, *, masters_only: bool = False) -> list[BrokerInfo]:
        info = await self.cluster_info()
        if cluster is not None and cluster not in info["clusterAddrTable"]:
            raise ClientError(f"cluster {cluster} is not known to the name server")
        out: list[BrokerInfo] = []
        for name, bd in sorted(info["brokerAddrTable"].items()):
            if cluster is not None and bd["cluster"] != cluster:
                continue
            for bid, addr in sorted(bd["brokerAddrs"].items()):
                if masters_only and bid != MASTER_ID:
                    continue
                out.append(BrokerInfo(bd["cluster"], name, bid, addr))
        return out

    async def broker_runtime_info(self, broker_addr: str) -> dict[str, str]:
        resp = await self._call(broker_addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))
        return api.parse_kv_table(resp)

    async def ha_status(self, cluster: str | None = None) -> list[dict[str, Any]]:
        """Runtime info (HA fields included) of every broker address in the cluster(s)."""
        rows: list[dict[str, Any]] = []
        for b in await self.brokers(cluster):
            row: dict[str, Any] = {"cluster": b.cluster, "brokerName": b.broker_name, "brokerId": b.broker_id,
                                   "addr": b.addr}
            try:
                row["runtime"] = await self.broker_runtime_info(b.addr)
            except Exception as exc:
                row["error"] = str(exc)
            rows.append(row)
        return rows

    # ---- topics --------------------------------------------------------------------------------------------------
    async def create_topic(
        self,
        topic: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = PERM_READ | PERM_WRITE,
        order: bool = False,
    ) -> list[str]:
        """Create/update the topic on one broker, or on every master of a cluster (all clusters if none
        is given). Returns the broker addresses updated."""
        reason = validate_topic(topic)
        if reason:
            raise ClientError(reason)
        if broker_addr:
            addrs = [broker_addr]
        else:
            addrs = [b.addr for b in await self.brokers(cluster, masters_only=True)]
            if not addrs:
                raise ClientError("no master broker found to create the topic on")
        for addr in addrs:
            api.check(await self._call(addr, api.build_create_topic(
                topic, read_queue_nums=read_queue_nums, write_queue_nums=write_queue_nums, perm=perm, order=order)))
        return addrs

    async def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        masters = [b.addr for b in await self.brokers(cluster, masters_only=True)]
        for addr in masters:
            api.check(await self._call(addr, RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER,
                                                                     {"topic": topic})))
        results = await self.instance.invoke_all_namesrv(
            lambda: RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic,
                                                                                  "clusterName": cluster}))
        for r in results:
            if isinstance(r, BaseException):
                raise r
            api.check(r)
        self.instance.routes.pop(topic, None)

    async def topic_route(self, topic: str) -> TopicRouteData:
        return await self.instance.update_route(topic)

    async def wait_for_route(self, topic: str, timeout_ms: int = 10_000, interval_ms: int = 100) -> TopicRouteData:
        """The topic's route, polling until the name server has it (brokers register new topics async)."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                return await self.topic_route(topic)
            except TopicNotExistError:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(interval_ms / 1000)

    async def topic_list(self) -> list[str]:
        resp = api.check(await self.instance.invoke_namesrv(
            RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)))
        return sorted(str(t) for t in (jsonx.loads(resp.body).get("topicList") or [])) if resp.body else []

    def _core(self, group: str = "TOOLS_CONSUMER") -> ConsumerCore:
        return ConsumerCore(self.instance, group)

    async def topic_status(self, topic: str) -> list[tuple[MessageQueue, int, int, int]]:
        """(queue, min_offset, max_offset, last_update_ms) per readable queue."""
        route = await self.topic_route(topic)
        core = self._core()
        out: list[tuple[MessageQueue, int, int, int]] = []
        stats: dict[MessageQueue, dict[str, Any]] = {}
        for bd in route.broker_datas:
            addr = bd.lowest_addr()
            if addr is None:
                continue
            try:
                resp = await self._call(addr, RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO,
                                                                      {"topic": topic}))
                if resp.code == ResponseCode.SUCCESS and resp.body:
                    for mq, v in mq_keyed_map(resp.body, "offsetTable"):
                        if isinstance(v, dict):
                            stats[mq] = v
            except Exception:
                pass
        for mq in routes.subscribe_queues(topic, route):
            s = stats.get(mq)
            if s is not None:
                out.append((mq, int(s.get("minOffset", 0)), int(s.get("maxOffset", 0)),
                            int(s.get("lastUpdateTimestamp", 0))))
                continue
            lo = await core.query_offset(RequestCode.GET_MIN_OFFSET, mq)
            hi = await core.query_offset(RequestCode.GET_MAX_OFFSET, mq)
            out.append((mq, lo, hi, 0))
        return out

    # ---- consumer groups -----------------------------------------------------------------------------------------
    async def consumer_progress(self, group: str, topic: str | None = None) -> list[tuple[MessageQueue, int, int, int]]:
        """(queue, broker_offset, consumer_offset, lag) per queue. Without ``topic``: the topics the broker
        reports for the group (GET_CONSUME_STATS), else the retry topic."""
        topics = [topic] if topic else await self._group_topics(group)
        core = self._core(group)
        out: list[tuple[MessageQueue, int, int, int]] = []
        for t in topics:
            try:
                route = await self.topic_route(t)
            except BrokerError:
                continue
            for mq in routes.subscribe_queues(t, route):
                broker_offset = await core.query_offset(RequestCode.GET_MAX_OFFSET, mq)
                consumer_offset = await core.fetch_committed_offset(mq)
                lag = broker_offset - max(consumer_offset, 0)
                out.append((mq, broker_offset, consumer_offset, max(lag, 0)))
        return out

    async def _group_topics(self, group: str) -> list[str]:
        topics: set[str] = set()
        for b in await self.brokers(masters_only=True):
            try:
                resp = await self._call(b.addr, RemotingCommand.request(RequestCode.GET_CONSUME_STATS,
                                                                        {"consumerGroup": group, "topic": ""}))
                if resp.code == ResponseCode.SUCCESS and resp.body:
                    topics |= {mq.topic for mq, _ in mq_keyed_map(resp.body, "offsetTable")}
            except Exception:
                continue
        if not topics:
            raise ClientError(f"no topic found for group {group}; pass a topic")
        return sorted(topics)

    async def create_subscription_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        retry_max_times: int = 16,
        retry_queue_nums: int = 1,
        consume_broadcast_enable: bool = True,
        consume_enable: bool = True,
        consume_from_min_enable: bool = True,
        which_broker_when_consume_slowly: int = 1,
    ) -> list[str]:
        body = {
            "brokerId": 0, "consumeBroadcastEnable": consume_broadcast_enable, "consumeEnable": consume_enable,
            "consumeFromMinEnable": consume_from_min_enable, "groupName": group,
            "notifyConsumerIdsChangedEnable": True, "retryMaxTimes": retry_max_times,
            "retryQueueNums": retry_queue_nums, "whichBrokerWhenConsumeSlowly": which_broker_when_consume_slowly,
        }
        addrs = [broker_addr] if broker_addr else [b.addr for b in await self.brokers(cluster, masters_only=True)]
        for addr in addrs:
            api.check(await self._call(addr, RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, jsonx.dumps(body))))
        return addrs

    # ---- messages --------------------------------------------------------------------------------------------------
    async def view_message(self, offset_msg_id: str) -> MessageExt:
        addr, cmd = api.build_view_message(offset_msg_id)
        resp = api.check(await self._call(addr, cmd))
        msgs = api.decode_messages(resp.body)
        if not msgs:
            raise ClientError(f"message {offset_msg_id} not found")
        return msgs[0]

    async def query_messages_by_key(self, topic: str, key: str, max_num: int = 32,
                                    begin_ms: int = 0, end_ms: int | None = None) -> list[MessageExt]:
        """Messages whose KEYS (or UNIQ_KEY) contain ``key``, from every broker group of the topic."""
        route = await self.topic_route(topic)
        end_ms = end_ms if end_ms is not None else int(time.time() * 1000) + 60_000

        async def one(addr: str) -> list[MessageExt]:
            resp = await self._call(addr, api.build_query_message(topic, key, max_num, begin_ms, end_ms),
                                    timeout_ms=15_000)
            if resp.code == ResponseCode.QUERY_NOT_FOUND:
                return []
            api.check(resp)
            return api.decode_messages(resp.body) if resp.body else []

        addrs = [a for a in (bd.lowest_addr() for bd in route.broker_datas) if a]
        found: list[MessageExt] = []
        for batch in await asyncio.gather(*(one(a) for a in addrs)):
            found.extend(batch)
        out = [m for m in found if m.topic == topic and (key in m.keys or m.msg_id == key)]
        out.sort(key=lambda m: (m.store_timestamp, m.phy_offset))
        return out[:max_num]
