"""Operations codes: who is connected, who consumes what, offsets reset and cloned, manual cleanup, stats.

| code | request                       | header in                          | answer                                           |
|------|-------------------------------|------------------------------------|--------------------------------------------------|
| 13   | QUERY_BROKER_OFFSET           |                                    | header minOffset, maxOffset (commit log phy offsets), offset = maxOffset |
| 22   | GET_TOPIC_CONFIG_LIST         |                                    | TopicConfigSerializeWrapper JSON (as 21)         |
| 204  | GET_PRODUCER_CONNECTION_LIST  | producerGroup                      | {"connectionSet":[{clientId,clientAddr,language,version}]} |
| 222  | INVOKE_BROKER_TO_RESET_OFFSET | topic, group, timestamp, isForce   | {"offsetTable":{MQ:offset}}; stored offsets set, live clients told (220) |
| 300  | QUERY_TOPIC_CONSUME_BY_WHO    | topic                              | {"groupList":[...]}                              |
| 314  | CLONE_GROUP_OFFSET            | srcGroup, destGroup, topic, offline | SUCCESS, header clonedQueues                    |
| 315  | VIEW_BROKER_STATS_DATA        | statsName, statsKey                | BrokerStatsData {statsMinute,statsHour,statsDay: {sum,tps,avgpt}} |
| 317  | GET_BROKER_CONSUME_STATS      | isOrder                            | {"brokerAddr","totalDiff","consumeStatsList":[{group:[ConsumeStats]}]} |
| 306  | CLEAN_EXPIRED_CONSUMEQUEUE    |                                    | SUCCESS, header deletedFiles (consume queue and index files below the commit log) |
| 316  | CLEAN_UNUSED_TOPIC            |                                    | SUCCESS, header deletedTopics (consume queues of topics no longer configured) |
| 329  | DELETE_EXPIRED_COMMITLOG      |                                    | SUCCESS, header deletedFiles                     |
| 343  | QUERY_TOPICS_BY_CONSUMER      | group                              | {"topicList":[...],"brokerAddr":s}               |

INVOKE_BROKER_TO_RESET_OFFSET, per queue of the topic: the target is the first message stored at or after
``timestamp`` (the consume queue's time lookup), or the queue's max offset for ``timestamp`` = -1 (skip the
backlog). With ``isForce`` the target replaces the committed offset; without, only when it is smaller (a
rewind). Unlike RocketMQ, whose broker only forwards the table to the live consumers, the broker also commits
the new offsets itself, so a reset works with no consumer online; the live consumers of the group get
RESET_CONSUMER_CLIENT_OFFSET (220) with the same table (our client and Java's drop their queues, store the
offsets and rebalance).

QUERY_TOPIC_CONSUME_BY_WHO: the groups with committed offsets for the topic and the online groups
subscribing to it. QUERY_TOPICS_BY_CONSUMER: the topics the group has committed offsets for, and those its
online consumers subscribe to.

VIEW_BROKER_STATS_DATA knows TOPIC_PUT_NUMS / TOPIC_PUT_SIZE (key: topic), GROUP_GET_NUMS / GROUP_GET_SIZE
(key: ``topic@group``) and BROKER_PUT_NUMS / BROKER_GET_NUMS (key: cluster name): ``sum`` is the count since start
(RocketMQ: in the last minute/hour/day; ferrymq keeps totals), ``tps`` the broker-wide 10 s / 1 min / 10 min rate
for the BROKER_* names and the key's rate over the last minute (in all three periods) for the others, ``avgpt``
0. Other names: SYSTEM_ERROR naming it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from ferrymq.broker.headers import get_int, get_str
from ferrymq.broker.stats import MINUTE_GET_BYTES, MINUTE_GET_MSGS, MINUTE_PUT_BYTES, MINUTE_PUT_MSGS
from ferrymq.common.topic import is_sys_topic
from ferrymq.errors import ProtocolError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import OpsContext

log = logging.getLogger(__name__)

#: the timestamp of INVOKE_BROKER_TO_RESET_OFFSET meaning "the queue's max offset" (skip the backlog)
RESET_TO_MAX_TIMESTAMP = -1
#: remark of an offset change asked of a slave
SLAVE_OFFSETS_REMARK = "consumer offsets are changed on the master broker, not on a slave"
#: GET_BROKER_CONSUME_STATS: queues looked up in the store between two yields to the event loop
BROKER_CONSUME_STATS_STEP_QUEUES = 200
#: VIEW_BROKER_STATS_DATA names served
STATS_TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
STATS_TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
STATS_BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
STATS_BROKER_GET_NUMS = "BROKER_GET_NUMS"
STATS_GROUP_GET_NUMS = "GROUP_GET_NUMS"
STATS_GROUP_GET_SIZE = "GROUP_GET_SIZE"
#: keyed stats name -> (BrokerStats.minute table index, key is "topic@group")
_KEYED_STATS: dict[str, tuple[int, bool]] = {
    STATS_TOPIC_PUT_NUMS: (MINUTE_PUT_MSGS, False), STATS_TOPIC_PUT_SIZE: (MINUTE_PUT_BYTES, False),
    STATS_GROUP_GET_NUMS: (MINUTE_GET_MSGS, True), STATS_GROUP_GET_SIZE: (MINUTE_GET_BYTES, True),
}


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "1")


class OpsProcessor:
    def __init__(self, ctx: OpsContext) -> None:
        self.ctx = ctx

    def register(self, d: Any) -> None:
        C = RequestCode
        for code, fn in (
            (C.QUERY_BROKER_OFFSET, self.broker_offset), (C.GET_TOPIC_CONFIG_LIST, self.topic_config_list),
            (C.GET_PRODUCER_CONNECTION_LIST, self.producer_connections),
            (C.INVOKE_BROKER_TO_RESET_OFFSET, self.reset_offset),
            (C.QUERY_TOPIC_CONSUME_BY_WHO, self.consumed_by_who), (C.CLONE_GROUP_OFFSET, self.clone_offset),
            (C.VIEW_BROKER_STATS_DATA, self.stats_data), (C.GET_BROKER_CONSUME_STATS, self.broker_consume_stats),
            (C.DELETE_EXPIRED_COMMITLOG, self.delete_expired_commitlog),
            (C.CLEAN_EXPIRED_CONSUMEQUEUE, self.clean_expired_consume_queues),
            (C.CLEAN_UNUSED_TOPIC, self.clean_unused_topics),
            (C.QUERY_TOPICS_BY_CONSUMER, self.topics_by_consumer),
        ):
            d.register(code, fn)

    def _mq(self, topic: str, qid: int) -> dict[str, Any]:
        return {"brokerName": self.ctx.config.broker_name, "queueId": qid, "topic": topic}

    # ---- broker ------------------------------------------------------------------------------------
    def broker_offset(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        store = self.ctx.store
        hi = store.max_phy_offset
        return cmd.response(R.SUCCESS, {"offset": hi, "maxOffset": hi, "minOffset": store.min_phy_offset})

    def topic_config_list(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(R.SUCCESS, body=self.ctx.topics.wrapper_json())  # joined from per-topic fragments

    def delete_expired_commitlog(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        deleted = self.ctx.store.delete_expired_files()
        log.info("DELETE_EXPIRED_COMMITLOG from %s: %d segment(s) deleted", getattr(conn, "peer_addr", "?"),
                 deleted)
        return cmd.response(R.SUCCESS, {"deletedFiles": deleted})

    def clean_expired_consume_queues(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        deleted = self.ctx.store.clean_expired_consume_queues()
        log.info("CLEAN_EXPIRED_CONSUMEQUEUE from %s: %d file(s) deleted", getattr(conn, "peer_addr", "?"), deleted)
        return cmd.response(R.SUCCESS, {"deletedFiles": deleted})

    def clean_unused_topics(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """Consume queues of topics this broker no longer has a config for (deleted topics whose files stayed,
        e.g. deleted while the broker was a slave); system and retry/DLQ topics are kept."""
        stale = [t for t in self.ctx.store.topic_queue_ids()
                 if self.ctx.topics.get(t) is None and not is_sys_topic(t) and not t.startswith(("%", "RMQ_SYS_"))]
        for topic in stale:
            self.ctx.store.delete_topic(topic)
            log.info("CLEAN_UNUSED_TOPIC: consume queues of %s deleted", topic)
        return cmd.response(R.SUCCESS, {"deletedTopics": len(stale)})

    # ---- connections --------------------------------------------------------------------------------
    def producer_connections(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.ext_fields.get("producerGroup") or ""
        channels = self.ctx.producers.channels(group)
        if not channels:
            return cmd.response(R.SYSTEM_ERROR, remark=f"the producer group[{group}] not exist")
        body = {"connectionSet": [{"clientId": ch.client_id, "clientAddr": getattr(ch.conn, "peer_addr", ""),
                                   "language": ch.language, "version": ch.version} for ch in channels]}
        return cmd.response(R.SUCCESS, body=jsonx.dumps(body))

    # ---- who consumes what ----------------------------------------------------------------------------
    def consumed_by_who(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            topic = get_str(cmd, "topic")
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        groups = self.ctx.offsets.groups_of_topic(topic) | set(self.ctx.consumers.groups_subscribing(topic))
        return cmd.response(R.SUCCESS, body=jsonx.dumps({"groupList": sorted(groups)}))

    def topics_by_consumer(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            group = get_str(cmd, "group")
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        topics = set(self.ctx.offsets.topics_of_group(group))
        info = self.ctx.consumers.get(group)
        if info is not None:
            topics |= set(info.subscriptions)
        return cmd.response(R.SUCCESS, body=jsonx.dumps({"topicList": sorted(topics),
                                                         "brokerAddr": self.ctx.broker_addr}))

    # ---- offsets ------------------------------------------------------------------------------------
    def reset_offset(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        ctx = self.ctx
        if ctx.config.is_slave:
            return cmd.response(R.SYSTEM_ERROR, remark=SLAVE_OFFSETS_REMARK)
        try:
            topic = get_str(cmd, "topic")
            group = get_str(cmd, "group")
            timestamp = get_int(cmd, "timestamp")
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        force = _true(cmd.ext_fields.get("isForce"))
        tc = ctx.topics.get(topic)
        if tc is None:
            return cmd.response(R.TOPIC_NOT_EXIST, remark=f"topic[{topic}] not exist")
        store = ctx.store
        table: list[tuple[dict[str, Any], int]] = []
        for qid in range(max(tc.read_queue_nums, tc.write_queue_nums)):
            committed = ctx.offsets.query(group, topic, qid)
            if timestamp == RESET_TO_MAX_TIMESTAMP:
                target = store.get_max_offset_in_queue(topic, qid)
            else:
                target = store.get_offset_in_queue_by_time(topic, qid, timestamp)
            new = target if force or committed < 0 or target < committed else committed
            ctx.offsets.commit(group, topic, qid, new)
            table.append((self._mq(topic, qid), new))
        body = jsonx.dumps({"offsetTable": jsonx.object_keyed(table)})
        told = self._tell_clients(group, cmd.ext_fields, body)
        log.info("offsets of %s on %s reset to timestamp %d (force=%s) from %s; %d client(s) told", group, topic,
                 timestamp, force, getattr(conn, "peer_addr", "?"), told)
        return self._persisted(cmd.response(R.SUCCESS, {"clientsNotified": told}, body=body))

    async def _persisted(self, answer: RemotingCommand) -> RemotingCommand:
        """``answer`` once the offsets are in consumerOffset.json (a snapshot built in steps and written by a
        worker thread: the whole table is never encoded in one block on the event loop)."""
        await self.ctx.offsets.snapshot_now()
        return answer

    def _tell_clients(self, group: str, header: dict[str, str], body: bytes) -> int:
        info = self.ctx.consumers.get(group)
        if info is None:
            return 0
        told = 0
        fields: dict[str, Any] = {k: header[k] for k in ("topic", "group", "timestamp", "isForce") if k in header}
        for ch in list(info.channels.values()):
            if getattr(ch.conn, "closed", True):
                continue
            try:
                ch.conn.invoke_oneway(RemotingCommand.request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, fields,
                                                              body))
                told += 1
            except Exception as exc:
                log.warning("RESET_CONSUMER_CLIENT_OFFSET to %s failed: %s", ch.client_id, exc)
        return told

    def clone_offset(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        ctx = self.ctx
        if ctx.config.is_slave:
            return cmd.response(R.SYSTEM_ERROR, remark=SLAVE_OFFSETS_REMARK)
        try:
            src = get_str(cmd, "srcGroup")
            dest = get_str(cmd, "destGroup")
        except ProtocolError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=str(exc))
        only = cmd.ext_fields.get("topic") or ""
        topics = [only] if only else sorted(ctx.offsets.topics_of_group(src))
        cloned = 0
        for topic in topics:
            for qid, offset in sorted(ctx.offsets.table.get(ctx.offsets.key(topic, src), {}).items()):
                ctx.offsets.commit(dest, topic, qid, offset)
                cloned += 1
        log.info("offsets of %s cloned to %s (%d queue(s))", src, dest, cloned)
        return self._persisted(cmd.response(R.SUCCESS, {"clonedQueues": cloned}))

    # ---- stats --------------------------------------------------------------------------------------
    def stats_data(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        name = cmd.ext_fields.get("statsName") or ""
        key = cmd.ext_fields.get("statsKey") or ""
        stats = self.ctx.stats
        rates: tuple[float, ...] = (0.0, 0.0, 0.0)
        keyed = _KEYED_STATS.get(name)
        if keyed is not None:
            table, topic_key = keyed
            lookup: Any = key
            if topic_key:  # GROUP_GET_*: key "topic@group", RocketMQ's statsKey of the group stats
                topic, sep, group = key.partition("@")
                lookup = (topic, group) if sep else None
            totals = stats.minute.tables[table]
            if lookup not in totals:
                return cmd.response(R.SYSTEM_ERROR, remark=f"The stats <{name}> <{key}> not exist")
            total = totals[lookup]
            minute_rate = stats.minute.rate(table, lookup, stats.clock_ms())
            rates = (minute_rate, minute_rate, minute_rate)
        elif name == STATS_BROKER_PUT_NUMS and key == self.ctx.config.broker_cluster_name:
            total, rates = stats.put_msgs_total, stats.put_tps()
        elif name == STATS_BROKER_GET_NUMS and key == self.ctx.config.broker_cluster_name:
            total, rates = stats.get_msgs_total, stats.get_tps()
        else:
            return cmd.response(R.SYSTEM_ERROR, remark=f"The stats <{name}> <{key}> not exist")
        body = {period: {"sum": total, "tps": round(rate, 2), "avgpt": 0.0}
                for period, rate in zip(("statsMinute", "statsHour", "statsDay"), rates, strict=True)}
        return cmd.response(R.SUCCESS, body=jsonx.dumps(body))

    async def broker_consume_stats(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """Every committed offset with its queue's figures, group by group (sorted): BROKER_CONSUME_STATS_STEP_QUEUES
        queues between two yields to the event loop (a store look-up per queue; 100,000 queues in one block held
        the loop for a second)."""
        ctx = self.ctx
        only_order = _true(cmd.ext_fields.get("isOrder"))
        store = ctx.store
        offsets = ctx.offsets
        stats_list: list[dict[str, Any]] = []
        total_diff = 0
        looked_up = 0
        for group in sorted(offsets.groups_with_offsets()):
            rows: list[tuple[dict[str, Any], dict[str, int]]] = []
            for topic in sorted(offsets.topics_of_group(group)):
                tc = ctx.topics.get(topic)
                queues = offsets.table.get(offsets.key(topic, group))
                if tc is None or not queues or is_sys_topic(topic) or (only_order and not tc.order):
                    continue
                for qid, committed in sorted(queues.items()):
                    looked_up += 1
                    if looked_up % BROKER_CONSUME_STATS_STEP_QUEUES == 0:
                        await asyncio.sleep(0)
                    broker_off = max(0, store.get_max_offset_in_queue(topic, qid))
                    consumer_off = max(0, committed)
                    last = store.get_message_store_timestamp(topic, qid, consumer_off - 1) if consumer_off > 0 else 0
                    total_diff += max(0, broker_off - consumer_off)
                    rows.append((self._mq(topic, qid), {"brokerOffset": broker_off, "consumerOffset": consumer_off,
                                                        "lastTimestamp": max(0, last)}))
            if rows:  # encoded at once: a group's rows do not stay alive as objects until the end
                stats_list.append({group: [{"consumeTps": 0.0, "offsetTable": jsonx.object_keyed(rows)}]})
        body = {"brokerAddr": ctx.broker_addr, "totalDiff": total_diff, "consumeStatsList": stats_list}
        return cmd.response(R.SUCCESS, body=jsonx.dumps(body))
