"""One function per request: typed header building and response parsing (protocol §2, §3).

Builders and parsers are pure (``build_*`` / ``parse_*``) and unit-tested against the capture shapes;
the ``async`` wrappers send through anything with ``invoke(addr, cmd, timeout_ms)``.

SEND_MESSAGE_V2 (310) / SEND_BATCH_MESSAGE (320) header keys (§2.5):

| key | field                 | key | field              |
|-----|-----------------------|-----|--------------------|
| a   | producerGroup         | h   | flag               |
| b   | topic                 | i   | properties         |
| c   | defaultTopic (TBW102) | j   | reconsumeTimes     |
| d   | defaultTopicQueueNums | k   | unitMode           |
| e   | queueId               | l   | maxReconsumeTimes  |
| f   | sysFlag               | m   | batch              |
| g   | bornTimestamp (ms)    | n   | brokerName         |

PULL sysFlag bits: 1 = commitOffset, 2 = suspend (long poll), 4 = subscription, 8 = classFilter.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Awaitable
from typing import Any, Protocol

from ferrymq.client.config import DEFAULT_TOPIC_QUEUE_NUMS
from ferrymq.client.values import (
    PULL_STATUS_BY_CODE,
    SEND_STATUS_BY_CODE,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from ferrymq.common import message_codec
from ferrymq.common.message import (
    PROPERTY_MAX_OFFSET,
    PROPERTY_MIN_OFFSET,
    SYSFLAG_COMPRESSED,
    MessageExt,
    decode_offset_msg_id,
    tags_hash_code,
)
from ferrymq.common.route import MessageQueue, TopicRouteData
from ferrymq.common.topic import DEFAULT_TOPIC
from ferrymq.errors import BrokerError, ProtocolError, for_code
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import FLAG_ONEWAY, RemotingCommand, to_wire_str
from ferrymq.remoting.codes import RequestCode, ResponseCode

PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
PULL_FLAG_CLASS_FILTER = 0x8

#: How long the broker may hold a long poll, and the client-side wait for it (both clients: 15 s / 30 s).
BROKER_SUSPEND_MAX_TIME_MS = 15_000
CONSUMER_TIMEOUT_WHEN_SUSPEND_MS = 30_000
#: QUERY_MESSAGE: how many messages one broker returns at most (defaultQueryMaxNum).
QUERY_MAX_NUM = 32
SUB_ALL = "*"
_SEND_MESSAGE_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_BATCH_MESSAGE = int(RequestCode.SEND_BATCH_MESSAGE)


class Remote(Protocol):
    def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int) -> Awaitable[RemotingCommand]: ...


def check(resp: RemotingCommand, *ok: int) -> RemotingCommand:
    """Raise the mapped BrokerError unless the response code is one of ``ok`` (default SUCCESS)."""
    if resp.code not in (ok or (ResponseCode.SUCCESS,)):
        raise for_code(resp.code, resp.remark)
    return resp


def _req_int(resp: RemotingCommand, key: str) -> int:
    value = resp.get_int(key)
    if value is None:
        raise ProtocolError(f"response to code has no {key!r} field")
    return value


# ---- subscription expressions ------------------------------------------------------------------
def parse_tags(expression: str | None) -> list[str]:
    """``"TagA || TagB"`` → ["TagA", "TagB"]; ``*``/empty → [] (everything)."""
    if not expression or expression.strip() in ("", SUB_ALL):
        return []
    return [t.strip() for t in expression.split("||") if t.strip()]


def subscription_data(topic: str, expression: str, sub_version: int,
                      expression_type: str = "TAG") -> dict[str, Any]:
    """SubscriptionData JSON; a SQL92 expression travels whole in ``subString`` with no tags."""
    if expression_type.upper() != "TAG":
        return {"classFilterMode": False, "codeSet": [], "expressionType": expression_type,
                "subString": expression, "subVersion": sub_version, "tagsSet": [], "topic": topic}
    tags = parse_tags(expression)
    return {
        "classFilterMode": False,
        "codeSet": [tags_hash_code(t) for t in tags],
        "expressionType": "TAG",
        "subString": expression if tags else SUB_ALL,
        "subVersion": sub_version,
        "tagsSet": tags,
        "topic": topic,
    }


def build_check_client_config(client_id: str, group: str, subscription: dict[str, Any]) -> RemotingCommand:
    """CHECK_CLIENT_CONFIG (46): a broker compiles a non-TAG subscription (CheckClientRequestBody)."""
    body = {"clientId": client_id, "group": group, "subscriptionData": subscription}
    return RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG, {}, jsonx.dumps(body))


# ---- name server ----------------------------------------------------------------------------------
def build_get_route(topic: str) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": True})


def parse_route(resp: RemotingCommand) -> TopicRouteData:
    check(resp)
    if not resp.body:
        raise ProtocolError("route answer without a body")
    return TopicRouteData.from_json(jsonx.loads(resp.body))


# ---- send -------------------------------------------------------------------------------------------
def build_send(
    *,
    producer_group: str,
    topic: str,
    queue_id: int,
    sys_flag: int,
    born_timestamp_ms: int,
    flag: int,
    properties: str,
    body: bytes,
    reconsume_times: int = 0,
    max_reconsume_times: int | None = None,
    batch: bool = False,
    broker_name: str | None = None,
    default_topic: str = DEFAULT_TOPIC,
    default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
    oneway: bool = False,
) -> RemotingCommand:
    return send_command(producer_group, topic, queue_id, sys_flag, born_timestamp_ms, flag, properties, body,
                        reconsume_times, max_reconsume_times, batch, broker_name, default_topic,
                        default_topic_queue_nums, oneway)


def send_command(producer_group: str, topic: str, queue_id: int, sys_flag: int, born_timestamp_ms: int, flag: int,
                 properties: str, body: bytes, reconsume_times: int, max_reconsume_times: int | None, batch: bool,
                 broker_name: str | None, default_topic: str, default_topic_queue_nums: int,
                 oneway: bool) -> RemotingCommand:
    """``build_send`` with every argument positional (the producer's per-send call: no keyword matching)."""
    code = _SEND_BATCH_MESSAGE if batch else _SEND_MESSAGE_V2
    if (type(producer_group) is not str or type(topic) is not str or type(default_topic) is not str
            or type(properties) is not str or (broker_name is not None and type(broker_name) is not str)):
        return RemotingCommand.request(code, {
            "a": producer_group, "b": topic, "c": default_topic, "d": default_topic_queue_nums, "e": queue_id,
            "f": sys_flag, "g": born_timestamp_ms, "h": flag, "i": properties, "j": reconsume_times, "k": False,
            "l": max_reconsume_times, "m": True if batch else None, "n": broker_name,
        }, body, oneway=oneway)
    # what RemotingCommand.request makes of the fields above (None dropped, values as wire strings), built
    # directly: this runs once per send
    fields = {
        "a": producer_group,
        "b": topic,
        "c": default_topic,
        "d": str(default_topic_queue_nums) if type(default_topic_queue_nums) is int
        else to_wire_str(default_topic_queue_nums),
        "e": str(queue_id) if type(queue_id) is int else to_wire_str(queue_id),
        "f": str(sys_flag) if type(sys_flag) is int else to_wire_str(sys_flag),
        "g": str(born_timestamp_ms) if type(born_timestamp_ms) is int else to_wire_str(born_timestamp_ms),
        "h": str(flag) if type(flag) is int else to_wire_str(flag),
        "i": properties,
        "j": str(reconsume_times) if type(reconsume_times) is int else to_wire_str(reconsume_times),
        "k": "false",
    }
    if max_reconsume_times is not None:
        fields["l"] = to_wire_str(max_reconsume_times)
    if batch:
        fields["m"] = "true"
    if broker_name is not None:
        fields["n"] = broker_name
    return RemotingCommand(code, fields, body, 0, FLAG_ONEWAY if oneway else 0)


def parse_send(resp: RemotingCommand, mq: MessageQueue, uniq_key: str) -> SendResult:
    status = SEND_STATUS_BY_CODE.get(resp.code)
    if status is None:
        raise for_code(resp.code, resp.remark)
    ext = resp.ext_fields
    raw_queue_id = ext.get("queueId")
    raw_offset = ext.get("queueOffset")
    try:  # plain decimal strings (the usual case); anything else goes through get_int
        queue_id = mq.queue_id if raw_queue_id is None else int(raw_queue_id)
        queue_offset = -1 if raw_offset is None else int(raw_offset)
    except ValueError:
        return _parse_send_general(resp, status, mq, uniq_key)
    return SendResult(
        status, uniq_key, ext.get("msgId") or "",
        mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id),
        queue_offset,
    )


def _parse_send_general(resp: RemotingCommand, status: SendStatus, mq: MessageQueue, uniq_key: str) -> SendResult:
    """parse_send for answers whose numbers are not plain decimal strings (``get_int`` rules)."""
    queue_id = resp.get_int("queueId")
    return SendResult(
        status=status,
        msg_id=uniq_key,
        offset_msg_id=resp.get_str("msgId") or "",
        message_queue=MessageQueue(mq.topic, mq.broker_name, mq.queue_id if queue_id is None else queue_id),
        queue_offset=resp.get_int("queueOffset", -1) or 0,
    )


# ---- pull -------------------------------------------------------------------------------------------
def build_pull(
    *,
    group: str,
    mq: MessageQueue,
    queue_offset: int,
    max_nums: int,
    sys_flag: int,
    commit_offset: int,
    suspend_timeout_ms: int,
    subscription: str,
    sub_version: int,
    expression_type: str = "TAG",
) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": group,
        "topic": mq.topic,
        "queueId": mq.queue_id,
        "queueOffset": queue_offset,
        "maxMsgNums": max_nums,
        "sysFlag": sys_flag,
        "commitOffset": commit_offset,
        "suspendTimeoutMillis": suspend_timeout_ms,
        "subscription": subscription,
        "subVersion": sub_version,
        "expressionType": expression_type,
    })


def decode_messages(body: bytes, *, decompress: bool = True) -> list[MessageExt]:
    """Records of a PULL/QUERY body; zlib bodies (sysFlag bit 0) are inflated."""
    msgs = list(message_codec.iter_records(body))
    if decompress:
        for m in msgs:
            if m.sys_flag & SYSFLAG_COMPRESSED:
                try:
                    m.body = zlib.decompress(m.body)
                except zlib.error as exc:
                    raise ProtocolError(f"cannot inflate message body at {m.phy_offset}: {exc}") from None
                m.sys_flag &= ~SYSFLAG_COMPRESSED
    return msgs


def parse_pull(resp: RemotingCommand, *, decode: bool = True, tags: list[str] | None = None) -> PullResult:
    status = PULL_STATUS_BY_CODE.get(resp.code)
    if status is None:
        raise for_code(resp.code, resp.remark)
    result = PullResult(
        status=status,
        next_begin_offset=_req_int(resp, "nextBeginOffset"),
        min_offset=resp.get_int("minOffset", 0) or 0,
        max_offset=resp.get_int("maxOffset", 0) or 0,
        suggest_which_broker_id=resp.get_int("suggestWhichBrokerId", 0) or 0,
    )
    if status is PullStatus.FOUND:
        result.raw_body = resp.body
        if decode:
            msgs = decode_messages(resp.body)
            if tags:  # the broker filters by hash code; drop hash collisions here
                wanted = set(tags)
                msgs = [m for m in msgs if m.tags in wanted]
            for m in msgs:
                m.properties[PROPERTY_MIN_OFFSET] = str(result.min_offset)
                m.properties[PROPERTY_MAX_OFFSET] = str(result.max_offset)
            result.messages = msgs
    return result


# ---- offsets ----------------------------------------------------------------------------------------
def build_queue_offset_query(code: int, mq: MessageQueue, **extra: Any) -> RemotingCommand:
    return RemotingCommand.request(code, {"topic": mq.topic, "queueId": mq.queue_id, **extra})


def build_query_consumer_offset(group: str, mq: MessageQueue) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET,
                                   {"consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id})


def parse_query_consumer_offset(resp: RemotingCommand) -> int:
    """Committed offset, or -1 when the broker has none (QUERY_NOT_FOUND)."""
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return -1
    check(resp)
    return _req_int(resp, "offset")


def build_update_consumer_offset(group: str, mq: MessageQueue, offset: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "commitOffset": offset})


# ---- consumer group ----------------------------------------------------------------------------------
def build_heartbeat(client_id: str, producer_groups: list[str], consumers: list[dict[str, Any]]) -> RemotingCommand:
    body: dict[str, Any] = {"clientID": client_id, "consumerDataSet": consumers,
                            "producerDataSet": [{"groupName": g} for g in producer_groups]}
    return RemotingCommand.request(RequestCode.HEART_BEAT, {}, jsonx.dumps(body))


def build_unregister(client_id: str, *, producer_group: str | None = None,
                     consumer_group: str | None = None) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, {
        "clientID": client_id, "producerGroup": producer_group, "consumerGroup": consumer_group})


def build_get_consumer_list(group: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})


def parse_consumer_list(resp: RemotingCommand) -> list[str]:
    check(resp)
    if not resp.body:
        return []
    return [str(c) for c in (jsonx.loads(resp.body).get("consumerIdList") or [])]


def build_send_back(*, group: str, phy_offset: int, delay_level: int, origin_msg_id: str, origin_topic: str,
                    max_reconsume_times: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "offset": phy_offset, "group": group, "delayLevel": delay_level, "originMsgId": origin_msg_id,
        "originTopic": origin_topic, "unitMode": False, "maxReconsumeTimes": max_reconsume_times})


def build_lock(code: int, group: str, client_id: str, mqs: list[MessageQueue]) -> RemotingCommand:
    body = {"clientId": client_id, "consumerGroup": group, "mqSet": [mq.to_json() for mq in mqs]}
    return RemotingCommand.request(code, {}, jsonx.dumps(body))


def parse_lock(resp: RemotingCommand) -> set[MessageQueue]:
    check(resp)
    if not resp.body:
        return set()
    return {MessageQueue.from_json(o) for o in (jsonx.loads(resp.body).get("lockOKMQSet") or [])}


# ---- admin --------------------------------------------------------------------------------------------
def build_create_topic(topic: str, *, read_queue_nums: int, write_queue_nums: int, perm: int, order: bool,
                       topic_sys_flag: int = 0) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": DEFAULT_TOPIC, "readQueueNums": read_queue_nums,
        "writeQueueNums": write_queue_nums, "perm": perm, "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": topic_sys_flag, "order": order})


#: largest TCP port (the port field of an offset msgId is an int32)
MAX_PORT = 65_535


def build_view_message(offset_msg_id: str) -> tuple[str, RemotingCommand]:
    """(broker address, request) for an offset msgId."""
    try:
        ip, port, phy_offset = decode_offset_msg_id(offset_msg_id)
    except ValueError as exc:
        raise ValueError(f"not an offset message id: {offset_msg_id!r} ({exc})") from None
    if not 0 < port <= MAX_PORT or phy_offset < 0:
        raise ValueError(f"not an offset message id: {offset_msg_id!r} (port {port}, offset {phy_offset}); "
                         "a client msgId (UNIQ_KEY) is found with Admin.find_message")
    return f"{ip}:{port}", RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": phy_offset})


def build_query_message(topic: str, key: str, max_num: int, begin_ms: int = 0,
                        end_ms: int | None = None, unique_key: bool = False) -> RemotingCommand:
    fields: dict[str, Any] = {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin_ms,
                              "endTimestamp": end_ms if end_ms is not None else int(time.time() * 1000) + 60_000}
    if unique_key:
        fields["_UNIQUE_KEY_QUERY"] = True
    return RemotingCommand.request(RequestCode.QUERY_MESSAGE, fields)


def parse_kv_table(resp: RemotingCommand) -> dict[str, str]:
    check(resp)
    if not resp.body:
        return {}
    return {str(k): str(v) for k, v in (jsonx.loads(resp.body).get("table") or {}).items()}


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, BrokerError) and exc.code == ResponseCode.QUERY_NOT_FOUND
