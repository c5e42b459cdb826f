"""Admin and metadata codes (protocol §2.4, §3.5, §6.6, §6.9).

| code | request                           | answer                                                  |
|------|-----------------------------------|---------------------------------------------------------|
| 17   | UPDATE_AND_CREATE_TOPIC           | SUCCESS (journaled first); registers within 100 ms      |
| 215  | DELETE_TOPIC_IN_BROKER            | SUCCESS                                                 |
| 200  | UPDATE_AND_CREATE_SUBSCRIPTIONGROUP | SUCCESS                                               |
| 207  | DELETE_SUBSCRIPTIONGROUP          | SUCCESS                                                 |
| 21   | GET_ALL_TOPIC_CONFIG              | TopicConfigSerializeWrapper JSON (none when unchanged)  |
| 43   | GET_ALL_CONSUMER_OFFSET           | {"offsetTable":{"t@g":{"0":n}}} (encoded in steps)      |
| 45   | GET_ALL_DELAY_OFFSET              | {"offsetTable":{"1":n}}                                 |
| 201  | GET_ALL_SUBSCRIPTIONGROUP_CONFIG  | {"dataVersion":…,"subscriptionGroupTable":…} (likewise; encoded in steps) |
| 28   | GET_BROKER_RUNTIME_INFO           | {"table":{k: str}}                                      |
| 30/31| GET_MAX_OFFSET / GET_MIN_OFFSET   | header offset                                           |
| 29   | SEARCH_OFFSET_BY_TIMESTAMP        | header offset                                           |
| 32   | GET_EARLIEST_MSG_STORETIME        | header timestamp                                        |
| 202  | GET_TOPIC_STATS_INFO              | {"offsetTable":{MQ:{"lastUpdateTimestamp","maxOffset","minOffset"}}} |
| 208  | GET_CONSUME_STATS                 | {"consumeTps":0.0,"offsetTable":{MQ:{"brokerOffset","consumerOffset","lastTimestamp"}}} |
| 203  | GET_CONSUMER_CONNECTION_LIST      | ConsumerConnection JSON                                 |

MQ is a MessageQueue object ``{"brokerName":s,"queueId":i,"topic":s}`` in key position: the tables keyed by
MessageQueue are written the way fastjson writes a ``Map<MessageQueue, X>`` (``jsonx.object_keyed``), which
is what Java admin tools decode. That is not strict JSON; ``ferrymq.client.jsonmq`` reads it.

* GET_TOPIC_STATS_INFO: one entry per write queue; ``lastUpdateTimestamp`` is the store timestamp of the
  queue's last message (0 for an empty queue).
* GET_CONSUME_STATS: without ``topic``, every topic the group has committed offsets for; one entry per
  read queue; ``lastTimestamp`` is the store timestamp of the last consumed message (0 when none).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ferrymq.broker.headers import get_int, get_str
from ferrymq.broker.subscription_manager import SubscriptionGroupConfig
from ferrymq.common.topic import DEFAULT_TOPIC, TopicConfig, validate_topic
from ferrymq.errors import ProtocolError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import AdminContext

log = logging.getLogger(__name__)

SLAVE_MODIFY_REMARK = ("Can't modify topic or subscription group from slave broker, please execute it from "
                       "master broker.")


#: ferrymq extension of GET_ALL_TOPIC_CONFIG / GET_ALL_SUBSCRIPTIONGROUP_CONFIG: a slave sends the data version
#: it holds ("counter:timestamp"); when it is the current one the answer has no body and ``unchanged=true``, so
#: a slave can ask every half second at the cost of one small frame. Other brokers ignore the field.
KNOWN_VERSION_FIELD = "knownDataVersion"
UNCHANGED_FIELD = "unchanged"


def version_token(version: Any) -> str:
    return f"{version.counter}:{version.timestamp}"


def _unchanged(cmd: RemotingCommand, version: Any) -> bool:
    known = cmd.ext_fields.get(KNOWN_VERSION_FIELD)
    return known is not None and known == version_token(version)


def _bad(cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
    return cmd.response(R.SYSTEM_ERROR, remark=str(exc))


#: most queues one topic may have on one broker
TOPIC_QUEUE_NUMS_MAX = 1024
#: every permission bit set (PRIORITY | READ | WRITE | INHERIT)
PERM_ALL_BITS = 0xF


def _validate_queue_config(read_q: int, write_q: int, perm: int, sys_flag: int) -> str | None:
    """None when the numbers make a usable topic config, else the reason."""
    for name, value in (("readQueueNums", read_q), ("writeQueueNums", write_q)):
        if not 0 <= value <= TOPIC_QUEUE_NUMS_MAX:
            return f"{name} {value} is outside [0, {TOPIC_QUEUE_NUMS_MAX}]"
    if not 0 <= perm <= PERM_ALL_BITS:
        return f"perm {perm} is outside [0, {PERM_ALL_BITS}]"
    if not 0 <= sys_flag <= 0x7FFFFFFF:
        return f"topicSysFlag {sys_flag} is outside the int range"
    return None


class AdminProcessor:
    def __init__(self, ctx: AdminContext) -> None:
        self.ctx = ctx

    def register(self, d: Any) -> None:
        C = RequestCode
        for code, fn in (
            (C.UPDATE_AND_CREATE_TOPIC, self.update_topic), (C.DELETE_TOPIC_IN_BROKER, self.delete_topic),
            (C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, self.update_group),
            (C.DELETE_SUBSCRIPTIONGROUP, self.delete_group),
            (C.GET_ALL_TOPIC_CONFIG, self.all_topics), (C.GET_ALL_CONSUMER_OFFSET, self.all_offsets),
            (C.GET_ALL_DELAY_OFFSET, self.all_delay_offsets), (C.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self.all_groups),
            (C.GET_BROKER_RUNTIME_INFO, self.runtime_info), (C.GET_MAX_OFFSET, self.max_offset),
            (C.GET_MIN_OFFSET, self.min_offset), (C.SEARCH_OFFSET_BY_TIMESTAMP, self.search_offset),
            (C.GET_EARLIEST_MSG_STORETIME, self.earliest_time), (C.GET_TOPIC_STATS_INFO, self.topic_stats),
            (C.GET_CONSUME_STATS, self.consume_stats), (C.GET_CONSUMER_CONNECTION_LIST, self.consumer_connections),
        ):
            d.register(code, fn)

    # ---- topics / groups -------------------------------------------------------------------
    def update_topic(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        if self.ctx.config.is_slave:
            return cmd.response(R.SYSTEM_ERROR, remark=SLAVE_MODIFY_REMARK)
        try:
            topic = get_str(cmd, "topic")
            read_q = get_int(cmd, "readQueueNums", 16)
            write_q = get_int(cmd, "writeQueueNums", 16)
            perm = get_int(cmd, "perm", 6)
            sys_flag = get_int(cmd, "topicSysFlag", 0)
        except ProtocolError as exc:
            return _bad(cmd, exc)
        reason = validate_topic(topic) or _validate_queue_config(read_q, write_q, perm, sys_flag)
        if reason is not None:
            return cmd.response(R.SYSTEM_ERROR, remark=reason)
        if topic == DEFAULT_TOPIC:
            return cmd.response(R.SYSTEM_ERROR, remark=f"The topic[{topic}] is conflict with system topic.")
        order = (cmd.ext_fields.get("order") or "").lower() in ("true", "1")
        tc = TopicConfig(topic, read_q, write_q, perm, cmd.ext_fields.get("topicFilterType") or "SINGLE_TAG",
                         sys_flag, order)
        self.ctx.topics.update(tc)
        return cmd.response(R.SUCCESS)

    def delete_topic(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            topic = get_str(cmd, "topic")
        except ProtocolError as exc:
            return _bad(cmd, exc)
        self.ctx.topics.delete(topic)
        self.ctx.offsets.remove_topic(topic)
        self.ctx.store.delete_topic(topic)
        return cmd.response(R.SUCCESS)

    def update_group(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        if self.ctx.config.is_slave:
            return cmd.response(R.SYSTEM_ERROR, remark=SLAVE_MODIFY_REMARK)
        try:
            obj = jsonx.loads(cmd.body)
            cfg = SubscriptionGroupConfig.from_json(obj)
        except (ValueError, KeyError, TypeError) as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=f"bad subscription group body: {exc}")
        self.ctx.groups.update(cfg)
        return cmd.response(R.SUCCESS)

    def delete_group(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.ext_fields.get("groupName") or ""
        self.ctx.groups.delete(group)
        return cmd.response(R.SUCCESS)

    # ---- slave sync bodies -------------------------------------------------------------------
    def all_topics(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        if _unchanged(cmd, self.ctx.topics.data_version):
            return cmd.response(R.SUCCESS, {UNCHANGED_FIELD: "true"})
        # joined from the kept per-topic fragments: no encode of every topic on the event loop
        return cmd.response(R.SUCCESS, body=self.ctx.topics.wrapper_json())

    async def all_offsets(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(R.SUCCESS, body=await self.ctx.offsets.table_json())

    def all_delay_offsets(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(R.SUCCESS, body=jsonx.dumps(self.ctx.schedule.encode()))  # one entry per delay level

    async def all_groups(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        if _unchanged(cmd, self.ctx.groups.data_version):
            return cmd.response(R.SUCCESS, {UNCHANGED_FIELD: "true"})
        return cmd.response(R.SUCCESS, body=await self.ctx.groups.table_json())

    def runtime_info(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(R.SUCCESS, body=jsonx.dumps({"table": self.ctx.runtime_info()}))

    # ---- offsets -----------------------------------------------------------------------------------
    def _topic_queue(self, cmd: RemotingCommand) -> tuple[str, int]:
        return get_str(cmd, "topic"), get_int(cmd, "queueId")

    def max_offset(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            topic, qid = self._topic_queue(cmd)
        except ProtocolError as exc:
            return _bad(cmd, exc)
        return cmd.response(R.SUCCESS, {"offset": self.ctx.store.get_max_offset_in_queue(topic, qid)})

    def min_offset(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            topic, qid = self._topic_queue(cmd)
        except ProtocolError as exc:
            return _bad(cmd, exc)
        return cmd.response(R.SUCCESS, {"offset": self.ctx.store.get_min_offset_in_queue(topic, qid)})

    def search_offset(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            topic, qid = self._topic_queue(cmd)
            ts = get_int(cmd, "timestamp")
        except ProtocolError as exc:
            return _bad(cmd, exc)
        return cmd.response(R.SUCCESS, {"offset": self.ctx.store.get_offset_in_queue_by_time(topic, qid, ts)})

    def earliest_time(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            topic, qid = self._topic_queue(cmd)
        except ProtocolError as exc:
            return _bad(cmd, exc)
        return cmd.response(R.SUCCESS, {"timestamp": self.ctx.store.get_earliest_message_time(topic, qid)})

    # ---- stats ---------------------------------------------------------------------------------------
    def _mq(self, topic: str, qid: int) -> dict[str, Any]:
        return {"brokerName": self.ctx.config.broker_name, "queueId": qid, "topic": topic}

    def topic_stats(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            topic = get_str(cmd, "topic")
        except ProtocolError as exc:
            return _bad(cmd, exc)
        tc = self.ctx.topics.get(topic)
        if tc is None:
            return cmd.response(R.TOPIC_NOT_EXIST, remark=f"topic[{topic}] not exist")
        store = self.ctx.store
        table = []
        for qid in range(tc.write_queue_nums):
            max_off = store.get_max_offset_in_queue(topic, qid)
            last = store.get_message_store_timestamp(topic, qid, max_off - 1) if max_off > 0 else 0
            table.append((self._mq(topic, qid), {
                "lastUpdateTimestamp": max(0, last), "maxOffset": max(0, max_off),
                "minOffset": max(0, store.get_min_offset_in_queue(topic, qid))}))
        return cmd.response(R.SUCCESS, body=jsonx.dumps({"offsetTable": jsonx.object_keyed(table)}))

    def consume_stats(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.ext_fields.get("consumerGroup") or ""
        only_topic = cmd.ext_fields.get("topic") or ""
        topics = [only_topic] if only_topic else sorted(self.ctx.offsets.topics_of_group(group))
        store = self.ctx.store
        table = []
        for topic in topics:
            tc = self.ctx.topics.get(topic)
            if tc is None:
                continue
            for qid in range(tc.read_queue_nums):
                broker_off = max(0, store.get_max_offset_in_queue(topic, qid))
                consumer_off = max(0, self.ctx.offsets.query(group, topic, qid))
                last = store.get_message_store_timestamp(topic, qid, consumer_off - 1) if consumer_off > 0 else 0
                table.append((self._mq(topic, qid), {
                    "brokerOffset": broker_off, "consumerOffset": consumer_off, "lastTimestamp": max(0, last)}))
        return cmd.response(R.SUCCESS, body=jsonx.dumps({"consumeTps": 0.0,
                                                         "offsetTable": jsonx.object_keyed(table)}))

    def consumer_connections(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.ext_fields.get("consumerGroup") or ""
        info = self.ctx.consumers.get(group)
        if info is None:
            return cmd.response(R.CONSUMER_NOT_ONLINE, remark=f"the consumer group[{group}] not online")
        body = {
            "connectionSet": [{"clientId": ch.client_id, "clientAddr": getattr(ch.conn, "peer_addr", ""),
                               "language": ch.language, "version": ch.version} for ch in info.channels.values()],
            "subscriptionTable": {t: s.to_json() for t, s in info.subscriptions.items()},
            "consumeType": info.consume_type, "messageModel": info.message_model,
            "consumeFromWhere": info.consume_from_where,
        }
        return cmd.response(R.SUCCESS, body=jsonx.dumps(body))
