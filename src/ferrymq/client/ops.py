"""Operations calls on top of ``Admin`` (the ``ferry`` incident verbs): runtime broker config, connections,
offset reset / skip / clone, write permission of a broker group, who consumes what, manual cleanup.

Each function takes a started ``Admin``. The request codes are the broker's and name server's
(broker/processors/ops.py, broker/processors/broker_config.py)."""

from __future__ import annotations

from typing import Any

from ferrymq.client import api
from ferrymq.client.admin import Admin
from ferrymq.client.jsonmq import mq_keyed_map
from ferrymq.common.properties import parse_properties
from ferrymq.common.route import MessageQueue
from ferrymq.errors import BrokerError, ClientError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode

#: INVOKE_BROKER_TO_RESET_OFFSET timestamp meaning "each queue's max offset"
RESET_TO_MAX_TIMESTAMP = -1


# ---- runtime config ----------------------------------------------------------------------------------------
async def broker_config(admin: Admin, broker_addr: str) -> dict[str, str]:
    """GET_BROKER_CONFIG: every key of the broker's configuration with its current value."""
    resp = api.check(await admin.instance.invoke(broker_addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG)))
    return parse_properties(resp.body.decode("utf-8")) if resp.body else {}


async def update_broker_config(admin: Admin, broker_addr: str, updates: dict[str, str]) -> str:
    """UPDATE_BROKER_CONFIG; the config file the broker wrote the keys to ("" when it has none). BrokerError
    (the remark naming the refused keys) when the broker refused the update; then nothing changed."""
    body = "".join(f"{k}={v}\n" for k, v in updates.items()).encode()
    resp = api.check(await admin.instance.invoke(broker_addr, RemotingCommand.request(
        RequestCode.UPDATE_BROKER_CONFIG, {}, body)))
    return resp.get_str("persisted") or ""


# ---- connections ---------------------------------------------------------------------------------------------
async def producer_connections(admin: Admin, group: str) -> list[dict[str, Any]]:
    """GET_PRODUCER_CONNECTION_LIST of every broker: one row per (broker, client connection)."""
    rows: list[dict[str, Any]] = []
    for b in await admin.brokers():
        resp = await admin.instance.invoke(b.addr, RemotingCommand.request(
            RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group}))
        if resp.code != ResponseCode.SUCCESS:
            continue
        for c in (jsonx.loads(resp.body).get("connectionSet") or []) if resp.body else []:
            rows.append({"broker": b.broker_name, "brokerAddr": b.addr, "clientId": c.get("clientId", ""),
                         "clientAddr": c.get("clientAddr", ""), "language": c.get("language", ""),
                         "version": c.get("version", "")})
    if not rows:
        raise ClientError(f"no producer of group {group} is connected to any broker")
    return rows


async def consumer_connections(admin: Admin, group: str) -> dict[str, Any]:
    """GET_CONSUMER_CONNECTION_LIST of the masters, merged: connections (with the broker they were seen on),
    subscriptions, consume type, message model."""
    out: dict[str, Any] = {"connections": [], "subscriptions": {}}
    for b in await admin.brokers(masters_only=True):
        resp = await admin.instance.invoke(b.addr, RemotingCommand.request(
            RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group}))
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            continue
        obj = jsonx.loads(resp.body)
        for c in obj.get("connectionSet") or []:
            out["connections"].append({"broker": b.broker_name, "clientId": c.get("clientId", ""),
                                       "clientAddr": c.get("clientAddr", ""), "language": c.get("language", ""),
                                       "version": c.get("version", "")})
        for topic, sub in (obj.get("subscriptionTable") or {}).items():
            out["subscriptions"][topic] = sub.get("subString", "") if isinstance(sub, dict) else str(sub)
        for k in ("consumeType", "messageModel", "consumeFromWhere"):
            out.setdefault(k, obj.get(k))
    if not out["connections"]:
        raise ClientError(f"consumer group {group} is not online on any master")
    return out


# ---- offsets -------------------------------------------------------------------------------------------------
async def _topic_masters(admin: Admin, topic: str) -> list[tuple[str, str]]:
    route = await admin.topic_route(topic)
    masters = [(bd.broker_name, bd.master_addr()) for bd in route.broker_datas]
    out = [(name, addr) for name, addr in masters if addr]
    if not out:
        raise ClientError(f"no master of topic {topic} is online")
    return out


async def reset_offset(admin: Admin, group: str, topic: str, timestamp_ms: int, *,
                       force: bool = True) -> list[dict[str, Any]]:
    """INVOKE_BROKER_TO_RESET_OFFSET on every master of ``topic``: each queue's committed offset becomes the
    first message stored at or after ``timestamp_ms`` (``RESET_TO_MAX_TIMESTAMP``: the queue's max offset);
    without ``force`` only when that rewinds. Rows: topic, brokerName, queueId, offset, clientsNotified."""
    rows: list[dict[str, Any]] = []
    for _name, addr in await _topic_masters(admin, topic):
        resp = api.check(await admin.instance.invoke(addr, RemotingCommand.request(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            {"topic": topic, "group": group, "timestamp": timestamp_ms, "isForce": str(force).lower()})))
        told = resp.get_int("clientsNotified") or 0
        for mq, offset in mq_keyed_map(resp.body or b"{}", "offsetTable"):
            rows.append({"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id,
                         "offset": int(offset), "clientsNotified": told})
    rows.sort(key=lambda r: (r["brokerName"], r["queueId"]))
    return rows


async def clone_offset(admin: Admin, src_group: str, dest_group: str, topic: str | None = None) -> list[dict[str, Any]]:
    """CLONE_GROUP_OFFSET on every master (of ``topic``'s route when given): ``dest_group`` gets the committed
    offsets of ``src_group``. Rows: brokerName, clonedQueues."""
    targets = await _topic_masters(admin, topic) if topic else [
        (b.broker_name, b.addr) for b in await admin.brokers(masters_only=True)]
    rows = []
    for name, addr in targets:
        resp = api.check(await admin.instance.invoke(addr, RemotingCommand.request(
            RequestCode.CLONE_GROUP_OFFSET, {"srcGroup": src_group, "destGroup": dest_group, "topic": topic or "",
                                             "offline": "false"})))
        rows.append({"brokerName": name, "clonedQueues": resp.get_int("clonedQueues") or 0})
    return rows


def offsets_of(rows: list[dict[str, Any]]) -> dict[MessageQueue, int]:
    return {MessageQueue(r["topic"], r["brokerName"], r["queueId"]): r["offset"] for r in rows}


# ---- write permission ----------------------------------------------------------------------------------------
async def _perm_on_all_namesrv(admin: Admin, code: RequestCode, broker_name: str, count_field: str
                               ) -> list[dict[str, Any]]:
    results = await admin.instance.invoke_all_namesrv(
        lambda: RemotingCommand.request(code, {"brokerName": broker_name}))
    rows: list[dict[str, Any]] = []
    for ns, r in zip(admin.instance.name_servers, results, strict=True):
        if isinstance(r, BaseException):
            rows.append({"namesrv": ns, "topics": None, "error": f"{type(r).__name__}: {r}"})
            continue
        try:
            api.check(r)
        except BrokerError as exc:
            rows.append({"namesrv": ns, "topics": None, "error": str(exc)})
            continue
        rows.append({"namesrv": ns, "topics": r.get_int(count_field) or 0, "error": ""})
    return rows


async def wipe_write_perm(admin: Admin, broker_name: str) -> list[dict[str, Any]]:
    """WIPE_WRITE_PERM_OF_BROKER on every name server: producers stop choosing ``broker_name``'s queues."""
    return await _perm_on_all_namesrv(admin, RequestCode.WIPE_WRITE_PERM_OF_BROKER, broker_name, "wipeTopicCount")


async def add_write_perm(admin: Admin, broker_name: str) -> list[dict[str, Any]]:
    """ADD_WRITE_PERM_OF_BROKER on every name server (undoes ``wipe_write_perm``)."""
    return await _perm_on_all_namesrv(admin, RequestCode.ADD_WRITE_PERM_OF_BROKER, broker_name, "addTopicCount")


# ---- who consumes what ---------------------------------------------------------------------------------------
async def groups_consuming(admin: Admin, topic: str) -> list[str]:
    """QUERY_TOPIC_CONSUME_BY_WHO on every master of ``topic``: groups with offsets for it or subscribing."""
    groups: set[str] = set()
    for _name, addr in await _topic_masters(admin, topic):
        resp = api.check(await admin.instance.invoke(addr, RemotingCommand.request(
            RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic})))
        groups |= set(jsonx.loads(resp.body).get("groupList") or []) if resp.body else set()
    return sorted(groups)


async def topics_of_group(admin: Admin, group: str) -> list[str]:
    """QUERY_TOPICS_BY_CONSUMER on every master."""
    topics: set[str] = set()
    for b in await admin.brokers(masters_only=True):
        resp = api.check(await admin.instance.invoke(b.addr, RemotingCommand.request(
            RequestCode.QUERY_TOPICS_BY_CONSUMER, {"group": group})))
        topics |= set(jsonx.loads(resp.body).get("topicList") or []) if resp.body else set()
    return sorted(topics)


# ---- cleanup -------------------------------------------------------------------------------------------------
async def delete_expired_commitlog(admin: Admin, cluster: str | None = None,
                                   broker_addr: str | None = None) -> list[dict[str, Any]]:
    """DELETE_EXPIRED_COMMITLOG on one broker or every broker (of ``cluster``): expired segments
    (fileReservedTime) go now instead of at the next expiry round. Rows: brokerName, addr, deletedFiles."""
    targets = [("", broker_addr)] if broker_addr else [(b.broker_name, b.addr) for b in await admin.brokers(cluster)]
    rows = []
    for name, addr in targets:
        resp = api.check(await admin.instance.invoke(addr, RemotingCommand.request(
            RequestCode.DELETE_EXPIRED_COMMITLOG)))
        rows.append({"brokerName": name, "addr": addr, "deletedFiles": resp.get_int("deletedFiles") or 0})
    return rows
