"""Admin operations behind the mqadmin verbs operators reach for beyond the daily ones: a topic's permission,
a broker's status and consumption summary, a group's subscription config, and messages printed by range.

| function              | mqadmin                  | request codes                                    |
|-----------------------|--------------------------|--------------------------------------------------|
| update_topic_perm     | updateTopicPerm          | 21 GET_ALL_TOPIC_CONFIG, 17 UPDATE_AND_CREATE_TOPIC (each master of the topic) |
| broker_status         | brokerStatus             | 28 GET_BROKER_RUNTIME_INFO                        |
| broker_consume_stats  | brokerConsumeStats       | 317 GET_BROKER_CONSUME_STATS                     |
| group_config          | getConsumerConfig        | 201 GET_ALL_SUBSCRIPTIONGROUP_CONFIG (each master) |
| messages_in_range     | printMsg, printMsgByQueue | 11 PULL_MESSAGE per queue                        |
| broker_epochs         | getBrokerEpoch           | 106 GET_BROKER_CLUSTER_INFO, 1007 GET_BROKER_EPOCH_CACHE (each replica) |
| stats_all             | statsAll                 | 300 QUERY_TOPIC_CONSUME_BY_WHO, 315 VIEW_BROKER_STATS_DATA (TOPIC_PUT_NUMS, GROUP_GET_NUMS) |
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ferrymq.client import api, routes
from ferrymq.client.admin import Admin
from ferrymq.client.jsonmq import loads_mq_keys, mq_table_entries
from ferrymq.common.message import MessageExt
from ferrymq.common.topic import PERM_INHERIT, PERM_READ, PERM_WRITE, TopicConfig
from ferrymq.errors import ClientError, TopicNotExistError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

#: the permission bits a topic may carry (4 read, 2 write, 1 inherit)
TOPIC_PERM_BITS = PERM_READ | PERM_WRITE | PERM_INHERIT
#: messages asked for by one pull of messages_in_range
PRINT_PULL_BATCH = 32


async def update_topic_perm(admin: Admin, topic: str, perm: int, *, cluster: str | None = None,
                            broker_addr: str | None = None) -> list[dict[str, Any]]:
    """Change only the permission of ``topic`` on every master serving it (or one broker): its queue counts,
    order flag and system flag stay as the broker has them. Refused, changing nothing, while a broker group of
    the topic has no master."""
    if perm & ~TOPIC_PERM_BITS or not perm & (PERM_READ | PERM_WRITE):
        raise ClientError(f"perm must be 4 (read), 2 (write) or 6 (read and write), optionally with 1 "
                          f"(inherit); got {perm}")
    route = await admin.topic_route(topic)
    serving = {qd.broker_name for qd in route.queue_datas}
    if broker_addr:
        targets = [("", broker_addr)]
    else:
        await admin._require_masters(cluster, serving, f"change the permission of {topic}")
        targets = [(b.broker_name, b.addr) for b in await admin.brokers(cluster, masters_only=True)
                   if b.broker_name in serving]
        if not targets:
            raise ClientError(f"no master serves {topic}" + (f" in cluster {cluster}" if cluster else ""))
    rows = []
    for name, addr in targets:
        resp = api.check(await admin.instance.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG)))
        table = (jsonx.loads(resp.body) if resp.body else {}).get("topicConfigTable") or {}
        if topic not in table:
            raise ClientError(f"broker {addr} has no topic {topic}")
        tc = TopicConfig.from_json(table[topic])
        api.check(await admin.instance.invoke(addr, api.build_create_topic(
            topic, read_queue_nums=tc.read_queue_nums, write_queue_nums=tc.write_queue_nums, perm=perm,
            order=tc.order, topic_sys_flag=tc.topic_sys_flag)))
        rows.append({"topic": topic, "brokerName": name, "broker": addr, "oldPerm": tc.perm, "perm": perm})
    return rows


async def broker_status(admin: Admin, broker_addr: str) -> dict[str, str]:
    """Every key of the broker's runtime info (mqadmin brokerStatus)."""
    return await admin.broker_runtime_info(broker_addr)


async def broker_consume_stats(admin: Admin, broker_addr: str, *, order: bool = False) -> list[dict[str, Any]]:
    """One row per (group, topic, queue) the broker holds committed offsets for: broker offset, consumer
    offset, lag; ``order`` keeps only ordered topics (mqadmin brokerConsumeStats)."""
    resp = api.check(await admin.instance.invoke(broker_addr, RemotingCommand.request(
        RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "true" if order else "false"})))
    body = loads_mq_keys(resp.body) if resp.body else {}
    rows: list[dict[str, Any]] = []
    for entry in body.get("consumeStatsList") or []:
        for group, stats_list in entry.items():
            for stats in stats_list:
                for mq, ow in mq_table_entries(stats.get("offsetTable"), "offsetTable"):
                    broker_offset = int(ow.get("brokerOffset", 0))
                    consumer_offset = int(ow.get("consumerOffset", 0))
                    rows.append({"group": group, "topic": mq.topic, "brokerName": mq.broker_name,
                                 "queueId": mq.queue_id, "brokerOffset": broker_offset,
                                 "consumerOffset": consumer_offset, "lag": max(0, broker_offset - consumer_offset),
                                 "lastTimestamp": int(ow.get("lastTimestamp", 0))})
    rows.sort(key=lambda r: (r["group"], r["topic"], r["brokerName"], r["queueId"]))
    return rows


async def group_config(admin: Admin, group: str, *, cluster: str | None = None) -> list[dict[str, Any]]:
    """The subscription group's config on every master that has it (mqadmin getConsumerConfig)."""
    rows = []
    for b in await admin.brokers(cluster, masters_only=True):
        resp = api.check(await admin.instance.invoke(b.addr, RemotingCommand.request(
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)))
        table = (jsonx.loads(resp.body) if resp.body else {}).get("subscriptionGroupTable") or {}
        if group in table:
            rows.append({"brokerName": b.broker_name, "broker": b.addr, **table[group]})
    if not rows:
        raise ClientError(f"no master has the subscription group {group}")
    return rows


async def messages_in_range(admin: Admin, topic: str, *, broker_name: str | None = None,
                            queue_id: int | None = None, begin_ms: int = 0, end_ms: int | None = None,
                            limit: int | None = None) -> AsyncIterator[MessageExt]:
    """The messages of ``topic`` (or of one queue) stored between ``begin_ms`` and ``end_ms``, queue by queue in
    offset order (mqadmin printMsg / printMsgByQueue), at most ``limit`` of them."""
    route = await admin.topic_route(topic)
    queues = [mq for mq in routes.subscribe_queues(topic, route)
              if (broker_name is None or mq.broker_name == broker_name) and (queue_id is None or mq.queue_id == queue_id)]
    if not queues:
        raise ClientError(f"{topic} has no queue {broker_name or '*'}/{'*' if queue_id is None else queue_id}")
    core = admin._core()
    shown = 0
    for mq in sorted(queues, key=lambda q: (q.broker_name, q.queue_id)):
        if begin_ms:
            begin = await core.query_offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, timestamp=begin_ms)
        else:
            begin = await core.query_offset(RequestCode.GET_MIN_OFFSET, mq)
        end = await core.query_offset(RequestCode.GET_MAX_OFFSET, mq)
        next_offset = begin
        while next_offset < end:
            result = await core.pull(mq, next_offset, PRINT_PULL_BATCH, timeout_ms=admin.config.request_timeout_ms)
            if not result.messages:
                if result.next_begin_offset <= next_offset:
                    break
                next_offset = result.next_begin_offset
                continue
            for msg in result.messages:
                if end_ms is not None and msg.store_timestamp > end_ms:
                    next_offset = end
                    break
                yield msg
                shown += 1
                if limit is not None and shown >= limit:
                    return
            else:
                next_offset = result.next_begin_offset


async def _keyed_stats(admin: Admin, addr: str, name: str, key: str) -> tuple[int, float]:
    """(total since the broker started, rate over the last minute) of one VIEW_BROKER_STATS_DATA key; (0, 0.0)
    where the broker has not counted the key."""
    resp = await admin.instance.invoke(addr, RemotingCommand.request(
        RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key}))
    if resp.code != 0 or not resp.body:
        return 0, 0.0
    minute = (jsonx.loads(resp.body) or {}).get("statsMinute") or {}
    return int(minute.get("sum", 0)), float(minute.get("tps", 0.0))


async def stats_all(admin: Admin, *, topic: str | None = None, active_only: bool = False) -> list[dict[str, Any]]:
    """Per topic and consuming group, summed over the topic's masters: messages put and got since each broker
    started and their rates over the last minute (mqadmin statsAll; RocketMQ's 24-hour counts are totals since
    start here). System, retry and dead-letter topics are left out unless named."""
    from ferrymq.client import ops
    from ferrymq.common.topic import is_sys_topic

    topics = [topic] if topic else [t for t in await admin.topic_list()
                                     if not is_sys_topic(t) and not t.startswith(("%RETRY%", "%DLQ%"))]
    master_of = {b.broker_name: b.addr for b in await admin.brokers(masters_only=True)}
    rows: list[dict[str, Any]] = []
    for t in topics:
        try:
            route = await admin.topic_route(t)
        except TopicNotExistError:
            continue
        masters = [master_of[qd.broker_name] for qd in route.queue_datas if qd.broker_name in master_of]
        put_total, put_tps = 0, 0.0
        for addr in masters:
            n, tps = await _keyed_stats(admin, addr, "TOPIC_PUT_NUMS", t)
            put_total, put_tps = put_total + n, put_tps + tps
        groups = await ops.groups_consuming(admin, t)
        for group in groups or [""]:
            get_total, get_tps = 0, 0.0
            for addr in masters if group else []:
                n, tps = await _keyed_stats(admin, addr, "GROUP_GET_NUMS", f"{t}@{group}")
                get_total, get_tps = get_total + n, get_tps + tps
            if active_only and not (put_tps or get_tps):
                continue
            rows.append({"topic": t, "group": group, "inTps": round(put_tps, 2), "outTps": round(get_tps, 2),
                         "inTotal": put_total, "outTotal": get_total})
    return rows


async def broker_epochs(admin: Admin, broker_name: str) -> list[dict[str, Any]]:
    """Every registered replica's epoch entries of one controller-mode broker group (mqadmin getBrokerEpoch): one
    row per (replica, epoch) with the commit-log range the epoch's master wrote."""
    info = await admin.cluster_info()
    group = info["brokerAddrTable"].get(broker_name)
    if group is None:
        raise ClientError(f"no name server knows the broker group {broker_name!r}")
    rows: list[dict[str, Any]] = []
    for _bid, addr in sorted(group["brokerAddrs"].items()):
        resp = api.check(await admin.instance.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_EPOCH_CACHE)))
        body = jsonx.loads(resp.body) if resp.body else {}
        for entry in body.get("epochList") or []:
            rows.append({"brokerName": broker_name, "replicaId": body.get("brokerId"), "addr": addr,
                         "epoch": entry.get("epoch"), "startOffset": entry.get("startOffset"),
                         "endOffset": entry.get("endOffset"), "maxOffset": body.get("maxOffset")})
    return rows
