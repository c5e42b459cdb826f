"""More operations calls on top of ``Admin``: consumer status and running info asked of the clients
themselves, every producer of a broker, subscription groups, the name server's KV table and runtime config,
a message by queue offset, and the consume-queue cleanups (broker/processors/client_query.py, ops.py,
namesrv/config_processor.py)."""

from __future__ import annotations

from typing import Any

from ferrymq.client import api
from ferrymq.client.admin import Admin
from ferrymq.client.jsonmq import _MQ_PREFIX, loads_mq_keys
from ferrymq.client.ops import _topic_masters
from ferrymq.common.message import MessageExt
from ferrymq.common.properties import parse_properties
from ferrymq.common.route import MessageQueue
from ferrymq.errors import ClientError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode


# ---- consumers, asked through the broker ---------------------------------------------------------------------
async def consumer_status(admin: Admin, group: str, topic: str) -> list[dict[str, Any]]:
    """INVOKE_BROKER_TO_GET_CONSUMER_STATUS on each master of the topic: every live consumer's own offsets.
    Rows: clientId, brokerName, queueId, offset (as the client holds it, -1 = none yet)."""
    rows: list[dict[str, Any]] = []
    errors = []
    for name, addr in await _topic_masters(admin, topic):
        resp = await admin.instance.invoke(addr, RemotingCommand.request(
            RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": topic, "group": group}))
        if resp.code != ResponseCode.SUCCESS:
            errors.append(f"{name}: {resp.remark}")
            continue
        table = (jsonx.loads(resp.body).get("consumerTable") or {}) if resp.body else {}
        for client_id, status in sorted(table.items()):
            for entry in (status or {}).get("messageQueueTable") or []:
                if entry.get("brokerName") == name:
                    rows.append({"clientId": client_id, "brokerName": name, "queueId": int(entry["queueId"]),
                                 "offset": int(entry["offset"])})
    if not rows and errors:
        raise ClientError("; ".join(errors))
    return sorted(rows, key=lambda r: (r["brokerName"], r["queueId"], r["clientId"]))


async def consumer_running_info(admin: Admin, group: str, client_id: str) -> dict[str, Any]:
    """GET_CONSUMER_RUNNING_INFO forwarded by a master the client is connected to: the client's own report
    (properties, subscriptionSet, mqTable, statusTable)."""
    reasons = []
    for b in await admin.brokers(masters_only=True):
        resp = await admin.instance.invoke(b.addr, RemotingCommand.request(
            RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": group, "clientId": client_id,
                                                    "jstackEnable": "false"}))
        if resp.code == ResponseCode.SUCCESS and resp.body:
            info: dict[str, Any] = _readable_mq_keys(loads_mq_keys(resp.body))
            info["broker"] = b.broker_name
            return info
        reasons.append(f"{b.broker_name}: {resp.remark}")
    raise ClientError(f"no broker could ask consumer {client_id} of {group}: {'; '.join(reasons)}")


def _readable_mq_keys(obj: Any) -> Any:
    """A parsed ConsumerRunningInfo with its MessageQueue-keyed maps keyed ``topic/brokerName/queueId``."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(k, str) and k.startswith(_MQ_PREFIX):
                mq = MessageQueue.from_json(jsonx.loads(k[len(_MQ_PREFIX):]))
                k = f"{mq.topic}/{mq.broker_name}/{mq.queue_id}"
            out[k] = _readable_mq_keys(v)
        return out
    if isinstance(obj, list):
        return [_readable_mq_keys(v) for v in obj]
    return obj


async def all_producers(admin: Admin, broker_addr: str) -> list[dict[str, Any]]:
    """GET_ALL_PRODUCER_INFO: every producer connection of the broker, by group."""
    resp = api.check(await admin.instance.invoke(broker_addr, RemotingCommand.request(
        RequestCode.GET_ALL_PRODUCER_INFO)))
    data = (jsonx.loads(resp.body).get("data") or {}) if resp.body else {}
    return [dict(p, group=group) for group, producers in sorted(data.items()) for p in producers]


# ---- groups ----------------------------------------------------------------------------------------------------
async def delete_group(admin: Admin, group: str, cluster: str | None = None,
                       broker_addr: str | None = None) -> list[str]:
    """DELETE_SUBSCRIPTIONGROUP on one broker or every master (of ``cluster``)."""
    addrs = [broker_addr] if broker_addr else [b.addr for b in await admin.brokers(cluster, masters_only=True)]
    if not addrs:
        raise ClientError("no master broker found")
    for addr in addrs:
        api.check(await admin.instance.invoke(addr, RemotingCommand.request(
            RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": group})))
    return addrs


# ---- name server ---------------------------------------------------------------------------------------------------
async def _each_namesrv(admin: Admin, code: int, fields: dict[str, Any], body: bytes = b"") -> list[RemotingCommand]:
    results = await admin.instance.invoke_all_namesrv(lambda: RemotingCommand.request(code, fields, body))
    out = []
    for addr, r in zip(admin.instance.name_servers, results, strict=True):
        if isinstance(r, BaseException):
            raise ClientError(f"name server {addr}: {r}")
        out.append(api.check(r))
    return out


async def kv_set(admin: Admin, namespace: str, key: str, value: str) -> int:
    """PUT_KV_CONFIG on every name server; how many took it."""
    return len(await _each_namesrv(admin, RequestCode.PUT_KV_CONFIG,
                                   {"namespace": namespace, "key": key, "value": value}))


async def kv_delete(admin: Admin, namespace: str, key: str) -> int:
    return len(await _each_namesrv(admin, RequestCode.DELETE_KV_CONFIG, {"namespace": namespace, "key": key}))


async def kv_get(admin: Admin, namespace: str, key: str) -> str | None:
    resp = await admin.instance.invoke_namesrv(RemotingCommand.request(
        RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key}))
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    return api.check(resp).get_str("value")


async def namesrv_config(admin: Admin) -> list[dict[str, str]]:
    """GET_NAMESRV_CONFIG of every name server: rows nameServer, key, value."""
    rows: list[dict[str, str]] = []
    for addr, resp in zip(admin.instance.name_servers,
                          await _each_namesrv(admin, RequestCode.GET_NAMESRV_CONFIG, {}), strict=True):
        props = parse_properties(resp.body.decode("utf-8")) if resp.body else {}
        rows.extend({"nameServer": addr, "key": k, "value": v} for k, v in sorted(props.items()))
    return rows


async def update_namesrv_config(admin: Admin, updates: dict[str, str]) -> list[dict[str, str]]:
    """UPDATE_NAMESRV_CONFIG on every name server; rows nameServer, persisted (the file written, or "")."""
    body = "".join(f"{k}={v}\n" for k, v in updates.items()).encode()
    return [{"nameServer": addr, "persisted": resp.get_str("persisted") or ""}
            for addr, resp in zip(admin.instance.name_servers,
                                  await _each_namesrv(admin, RequestCode.UPDATE_NAMESRV_CONFIG, {}, body), strict=True)]


# ---- messages and cleanup ----------------------------------------------------------------------------------------
async def message_at(admin: Admin, topic: str, broker_name: str, queue_id: int, queue_offset: int) -> MessageExt:
    """The message at ``queue_offset`` of one queue (mqadmin queryMsgByOffset)."""
    core = admin._core()
    result = await core.pull(MessageQueue(topic, broker_name, queue_id), queue_offset, 1,
                             timeout_ms=admin.config.request_timeout_ms)
    for msg in result.messages:
        if msg.queue_offset == queue_offset:
            return msg
    raise ClientError(f"no message at offset {queue_offset} of {topic}/{broker_name}/{queue_id} "
                      f"({result.status.name}, next offset {result.next_begin_offset})")


async def _cleanup(admin: Admin, code: int, count_field: str, cluster: str | None,
                   broker_addr: str | None) -> list[dict[str, Any]]:
    targets = [("", broker_addr)] if broker_addr else [(b.broker_name, b.addr) for b in await admin.brokers(cluster)]
    rows = []
    for name, addr in targets:
        resp = api.check(await admin.instance.invoke(addr, RemotingCommand.request(code)))
        rows.append({"brokerName": name, "addr": addr, count_field: resp.get_int(count_field) or 0})
    return rows


async def clean_expired_consume_queues(admin: Admin, cluster: str | None = None,
                                       broker_addr: str | None = None) -> list[dict[str, Any]]:
    """CLEAN_EXPIRED_CONSUMEQUEUE on one broker or every broker: consume-queue and index files that point
    only below the commit log's first byte."""
    return await _cleanup(admin, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, "deletedFiles", cluster, broker_addr)


async def clean_unused_topics(admin: Admin, cluster: str | None = None,
                              broker_addr: str | None = None) -> list[dict[str, Any]]:
    """CLEAN_UNUSED_TOPIC: consume queues of topics a broker no longer has a config for."""
    return await _cleanup(admin, RequestCode.CLEAN_UNUSED_TOPIC, "deletedTopics", cluster, broker_addr)
