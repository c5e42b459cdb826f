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
from ferrymq.common.message import PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, MessageExt, decode_offset_msg_id
from ferrymq.common.route import MASTER_ID, MessageQueue, TopicRouteData
from ferrymq.common.tls import TlsClientSettings
from ferrymq.common.topic import PERM_READ, PERM_WRITE, validate_topic
from ferrymq.errors import BrokerError, ClientError, FerryError, ProtocolError, TopicNotExistError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode

#: timeout of a QUERY_MESSAGE call (the broker walks index files)
QUERY_MESSAGE_TIMEOUT_MS = 15_000
#: most records one unique-key query asks for (the broker caps it at its defaultQueryMaxNum, 32)
UNIQUE_KEY_QUERY_MAX_NUM = 32
#: topics looked up at once when a message is found by unique key without a topic
MESSAGE_LOOKUP_CONCURRENCY = 8
#: lengths of a message id in hex digits: IPv4 forms (offset msgId 4+4+8 bytes, Java/C++ UNIQ_KEY 16 bytes)
#: and IPv6 forms (28 bytes)
MESSAGE_ID_HEX_LENGTHS = (32, 56)
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def check_message_id(msg_id: str) -> str:
    """``msg_id`` without surrounding blanks if it can be a message id (hex digits, 32 or 56 of them: an
    offset msgId or a client unique key); ClientError otherwise."""
    text = msg_id.strip()
    if len(text) not in MESSAGE_ID_HEX_LENGTHS or not set(text) <= _HEX_DIGITS:
        raise ClientError(f"malformed message id {msg_id!r}: expected "
                          f"{' or '.join(map(str, MESSAGE_ID_HEX_LENGTHS))} hex digits "
                          "(an offset msgId, or the msgId/UNIQ_KEY a producer or consumer reports)")
    return text


def decode_offset_id(msg_id: str) -> tuple[str, int] | None:
    """(broker address, commit log offset) if ``msg_id`` has the shape of an offset msgId (IPv4 store
    host, a port in 1..65535, a non-negative offset), else None: then it can only be a unique key."""
    try:
        ip, port, phy_offset = decode_offset_msg_id(msg_id)
    except ValueError:
        return None
    if not 0 < port <= api.MAX_PORT or phy_offset < 0:
        return None
    return f"{ip}:{port}", phy_offset


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
    def __init__(self, name_server: str | list[str], *, request_timeout_ms: int = 5_000, access_key: str = "",
                 secret_key: str = "", tls: TlsClientSettings | None = None) -> None:
        self.config = ClientConfig(parse_name_servers(name_server), request_timeout_ms=request_timeout_ms,
                                   access_key=access_key, secret_key=secret_key, tls=tls)
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

    async def _require_masters(self, cluster: str | None, broker_names: set[str] | None, action: str) -> None:
        """Refuse ``action`` when a broker group it concerns has no master: a change made without the master
        would be undone when the master comes back (its tables win), yet be reported as done."""
        info = await self.cluster_info()
        headless = sorted(
            name for name, bd in info["brokerAddrTable"].items()
            if (cluster is None or bd["cluster"] == cluster)
            and (broker_names is None or name in broker_names)
            and MASTER_ID not in bd["brokerAddrs"])
        if headless:
            raise ClientError(f"cannot {action}: broker group(s) {', '.join(headless)} have no master now "
                              "(down or failing over); nothing was changed, retry when the master is back")

    async def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        try:
            route = await self.instance.update_route(topic)
            serving: set[str] | None = {qd.broker_name for qd in route.queue_datas}
        except TopicNotExistError:
            serving = None
        await self._require_masters(cluster, serving, f"delete topic {topic}")
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

    async def topic_stats(self, broker_addr: str, topic: str) -> dict[MessageQueue, dict[str, int]]:
        """GET_TOPIC_STATS_INFO of one broker: minOffset, maxOffset and lastUpdateTimestamp (store time of
        the queue's last message, 0 when empty) per queue."""
        resp = api.check(await self._call(broker_addr, RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO,
                                                                               {"topic": topic})))
        out: dict[MessageQueue, dict[str, int]] = {}
        for mq, value in mq_keyed_map(resp.body or b"{}", "offsetTable"):
            if not isinstance(value, dict):
                raise ProtocolError(f"topic stats of {topic} from {broker_addr}: bad entry for {mq}: {value!r}")
            out[mq] = {k: int(value.get(k, 0)) for k in ("minOffset", "maxOffset", "lastUpdateTimestamp")}
        return out

    async def topic_status(self, topic: str) -> list[tuple[MessageQueue, int, int, int]]:
        """(queue, min_offset, max_offset, last_update_ms) per readable queue; last_update_ms is the store
        timestamp of the queue's last message (0 when it is empty)."""
        route = await self.topic_route(topic)
        core = self._core()
        out: list[tuple[MessageQueue, int, int, int]] = []
        stats: dict[MessageQueue, dict[str, int]] = {}
        for bd in route.broker_datas:
            addr = bd.lowest_addr()
            if addr is not None:
                stats.update(await self.topic_stats(addr, topic))
        for mq in routes.subscribe_queues(topic, route):
            s = stats.get(mq)
            if s is not None:
                out.append((mq, s["minOffset"], s["maxOffset"], s["lastUpdateTimestamp"]))
                continue
            # a read queue beyond the broker's write queues (readQueueNums > writeQueueNums)
            lo = await core.query_offset(RequestCode.GET_MIN_OFFSET, mq)
            hi = await core.query_offset(RequestCode.GET_MAX_OFFSET, mq)
            out.append((mq, lo, hi, 0))
        return out

    # ---- consumer groups -----------------------------------------------------------------------------------------
    async def consumer_progress(self, group: str, topic: str | None = None) -> list[tuple[MessageQueue, int, int, int]]:
        """(queue, broker_offset, consumer_offset, lag) per queue. Without ``topic``: every topic the
        group has committed offsets for on any master (GET_CONSUME_STATS)."""
        topics = [topic] if topic else await self._group_topics(group)
        core = self._core(group)
        out: list[tuple[MessageQueue, int, int, int]] = []
        for t in topics:
            try:
                route = await self.topic_route(t)
            except TopicNotExistError:
                continue
            for mq in routes.subscribe_queues(t, route):
                broker_offset = await core.query_offset(RequestCode.GET_MAX_OFFSET, mq)
                consumer_offset = await core.fetch_committed_offset(mq)
                lag = broker_offset - max(consumer_offset, 0)
                out.append((mq, broker_offset, consumer_offset, max(lag, 0)))
        return out

    async def consume_stats(self, broker_addr: str, group: str, topic: str = "") -> dict[MessageQueue, dict[str, int]]:
        """GET_CONSUME_STATS of one broker: brokerOffset, consumerOffset and lastTimestamp per queue of the
        group (of ``topic``, or of every topic the group has offsets for)."""
        resp = api.check(await self._call(broker_addr, RemotingCommand.request(
            RequestCode.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic})))
        out: dict[MessageQueue, dict[str, int]] = {}
        for mq, value in mq_keyed_map(resp.body or b"{}", "offsetTable"):
            if not isinstance(value, dict):
                raise ProtocolError(f"consume stats of {group} from {broker_addr}: bad entry for {mq}: {value!r}")
            out[mq] = {k: int(value.get(k, 0)) for k in ("brokerOffset", "consumerOffset", "lastTimestamp")}
        return out

    async def _group_topics(self, group: str) -> list[str]:
        """The topics of every master's consume stats for ``group``. A master that cannot answer is an
        error naming it (a partial list would under-report the lag)."""
        topics: set[str] = set()
        for b in await self.brokers(masters_only=True):
            try:
                stats = await self.consume_stats(b.addr, group)
            except (FerryError, ValueError) as exc:
                raise ClientError(f"consume stats of group {group} from broker {b.broker_name} ({b.addr}) "
                                  f"failed: {type(exc).__name__}: {exc}") from exc
            topics |= {mq.topic for mq in stats}
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
        if not broker_addr:
            await self._require_masters(cluster, None, f"create group {group}")
        addrs = [broker_addr] if broker_addr else [b.addr for b in await self.brokers(cluster, masters_only=True)]
        if not addrs:
            raise ClientError(f"cannot create group {group}: no master broker is registered"
                              + (f" in cluster {cluster}" if cluster else ""))
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

    async def find_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """A message by either id RocketMQ gives it (like Java's ``viewMessage(topic, msgId)``):

        * the offset msgId (store host + commit log offset, what the broker answers a send with): read
          with VIEW_MESSAGE_BY_ID from that broker, when the id decodes to a registered broker address;
        * otherwise, or when that finds nothing, the client's unique key (UNIQ_KEY, what producers and
          consumers report as msgId): a QUERY_MESSAGE by unique key in ``topic``, or in every topic the
          name server lists when none is given. When several records carry the key (re-sends, retries),
          the earliest stored one is returned.

        ClientError for a malformed id (``check_message_id``) or when no message has it."""
        msg_id = check_message_id(msg_id)
        offset_id = decode_offset_id(msg_id)
        if offset_id is not None:
            addr, _ = offset_id
            if addr in {b.addr for b in await self.brokers()}:
                try:
                    m = await self.view_message(msg_id)
                    if m.offset_msg_id == msg_id.upper():
                        return m
                except BrokerError:
                    pass  # nothing at that offset: try it as a unique key
        topics = [topic] if topic else await self.topic_list()
        sem = asyncio.Semaphore(MESSAGE_LOOKUP_CONCURRENCY)

        async def lookup(t: str) -> list[MessageExt]:
            async with sem:
                try:
                    return await self.query_messages_by_unique_key(t, msg_id)
                except TopicNotExistError:
                    return []
        found = [m for batch in await asyncio.gather(*(lookup(t) for t in topics)) for m in batch]
        if not found:
            where = f"topic {topic}" if topic else f"any of the {len(topics)} topics"
            raise ClientError(f"no message with id {msg_id} in {where}")
        return min(found, key=lambda m: (m.store_timestamp, m.phy_offset))

    async def query_messages_by_unique_key(self, topic: str, uniq_key: str) -> list[MessageExt]:
        """Messages of ``topic`` whose UNIQ_KEY is ``uniq_key`` (QUERY_MESSAGE with the unique-key flag)."""
        route = await self.topic_route(topic)
        end_ms = int(time.time() * 1000) + 60_000

        async def one(addr: str) -> list[MessageExt]:
            resp = await self._call(addr, api.build_query_message(topic, uniq_key, UNIQUE_KEY_QUERY_MAX_NUM, 0,
                                                                  end_ms, unique_key=True),
                                    timeout_ms=QUERY_MESSAGE_TIMEOUT_MS)
            if resp.code == ResponseCode.QUERY_NOT_FOUND:
                return []
            api.check(resp)
            return api.decode_messages(resp.body) if resp.body else []

        addrs = [a for a in (bd.lowest_addr() for bd in route.broker_datas) if a]
        batches = await asyncio.gather(*(one(a) for a in addrs))
        return [m for batch in batches for m in batch
                if m.topic == topic and m.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == uniq_key]

    async def query_messages_by_key(self, topic: str, key: str, max_num: int = 32,
                                    begin_ms: int = 0, end_ms: int | None = None) -> list[MessageExt]:
        """Messages whose KEYS (or UNIQ_KEY) contain ``key``, from every broker group of the topic."""
        route = await self.topic_route(topic)
        end_ms = end_ms if end_ms is not None else int(time.time() * 1000) + 60_000

        async def one(addr: str) -> list[MessageExt]:
            resp = await self._call(addr, api.build_query_message(topic, key, max_num, begin_ms, end_ms),
                                    timeout_ms=QUERY_MESSAGE_TIMEOUT_MS)
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
