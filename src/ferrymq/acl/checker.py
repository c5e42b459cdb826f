"""Which rights a request needs (by request code) and whether an account has them.

| request codes                                              | needs                                   |
|------------------------------------------------------------|-----------------------------------------|
| SEND_MESSAGE 10, SEND_REPLY_MESSAGE 324                    | PUB on ``topic``                        |
| SEND_MESSAGE_V2 310, SEND_BATCH_MESSAGE 320, SEND_REPLY_MESSAGE_V2 325 | PUB on ``b`` (the topic)    |
| PULL_MESSAGE 11                                            | SUB on ``topic`` and ``consumerGroup``  |
| QUERY/UPDATE_CONSUMER_OFFSET 14/15                         | SUB on ``topic`` and ``consumerGroup``  |
| QUERY_MESSAGE 12                                           | SUB on ``topic``                        |
| CONSUMER_SEND_MSG_BACK 36                                  | SUB on ``group``                        |
| GET_CONSUMER_LIST_BY_GROUP 38, UNREGISTER_CLIENT 35        | SUB on ``consumerGroup`` (when given)   |
| HEART_BEAT 34                                              | SUB on every consumer group and subscribed topic of the body |
| ADMIN_CODES (below)                                        | an ``admin`` account                    |
| anything else                                              | a valid signature                       |

A topic named ``%RETRY%g`` or ``%DLQ%g`` is judged by the perm of group ``g``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ferrymq.acl.config import Account, AclConfig
from ferrymq.acl.perm import Perm, grants
from ferrymq.remoting import jsonx, signature
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode as C

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"

#: ACL management codes (50..54: update/delete an account, ACL info, global white addresses, the whole ACL)
ACL_ADMIN_CODES = frozenset(range(int(C.UPDATE_AND_CREATE_ACL_CONFIG), int(C.GET_BROKER_CLUSTER_ACL_CONFIG) + 1))
#: UPDATE_NAMESRV_CONFIG
UPDATE_NAMESRV_CONFIG_CODE = 318
#: RocketMQ's offset-reset codes (INVOKE_BROKER_TO_RESET_OFFSET 222) and the commitlog purge (329)
RESET_OFFSET_CODES = frozenset((int(C.RESET_CONSUMER_CLIENT_OFFSET), 222))
ADMIN_CODES = frozenset({
    int(C.UPDATE_AND_CREATE_TOPIC), int(C.DELETE_TOPIC_IN_BROKER), int(C.DELETE_TOPIC_IN_NAMESRV),
    int(C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP), int(C.DELETE_SUBSCRIPTIONGROUP),
    int(C.UPDATE_BROKER_CONFIG), int(C.PUT_KV_CONFIG), int(C.DELETE_KV_CONFIG),
    int(C.WIPE_WRITE_PERM_OF_BROKER), int(C.ADD_WRITE_PERM_OF_BROKER), 329, UPDATE_NAMESRV_CONFIG_CODE,
}) | ACL_ADMIN_CODES | RESET_OFFSET_CODES
#: what a name server with aclEnable checks (all need an admin account); reads and broker registration are open
NAMESRV_GUARDED_CODES = frozenset({
    int(C.PUT_KV_CONFIG), int(C.DELETE_KV_CONFIG), int(C.DELETE_TOPIC_IN_NAMESRV), int(C.WIPE_WRITE_PERM_OF_BROKER),
    int(C.ADD_WRITE_PERM_OF_BROKER), UPDATE_NAMESRV_CONFIG_CODE})

_SEND_TOPIC_KEY = {int(C.SEND_MESSAGE): "topic", int(C.SEND_REPLY_MESSAGE): "topic",
                   int(C.SEND_MESSAGE_V2): "b", int(C.SEND_BATCH_MESSAGE): "b", int(C.SEND_REPLY_MESSAGE_V2): "b"}
_TOPIC_AND_GROUP_CODES = frozenset((int(C.PULL_MESSAGE), int(C.QUERY_CONSUMER_OFFSET),
                                    int(C.UPDATE_CONSUMER_OFFSET)))
_GROUP_ONLY_KEY = {int(C.CONSUMER_SEND_MSG_BACK): "group", int(C.GET_CONSUMER_LIST_BY_GROUP): "consumerGroup",
                   int(C.UNREGISTER_CLIENT): "consumerGroup"}


@dataclass(frozen=True, slots=True)
class Need:
    """One right a request needs: ``perm`` on a topic (is_group False) or a consumer group."""

    name: str
    perm: Perm
    is_group: bool


def topic_need(topic: str, perm: Perm) -> Need:
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if topic.startswith(prefix):
            return Need(topic[len(prefix):], perm, True)
    return Need(topic, perm, False)


def needs_of(cmd: RemotingCommand) -> list[Need]:
    """The topic/group rights ``cmd`` needs (ValueError when its header or body cannot be read)."""
    code, ext = cmd.code, cmd.ext_fields
    key = _SEND_TOPIC_KEY.get(code)
    if key is not None:
        return [topic_need(_required(ext, key), Perm.PUB)]
    if code in _TOPIC_AND_GROUP_CODES:
        return [topic_need(_required(ext, "topic"), Perm.SUB), Need(_required(ext, "consumerGroup"), Perm.SUB, True)]
    if code == C.QUERY_MESSAGE:
        return [topic_need(_required(ext, "topic"), Perm.SUB)]
    key = _GROUP_ONLY_KEY.get(code)
    if key is not None:
        group = ext.get(key)
        return [Need(group, Perm.SUB, True)] if group else []
    if code == C.HEART_BEAT:
        return _heartbeat_needs(cmd.body)
    return []


def _required(ext: dict[str, str], key: str) -> str:
    value = ext.get(key)
    if not value:
        raise ValueError(f"header field {key} missing")
    return value


def _heartbeat_needs(body: bytes) -> list[Need]:
    try:
        data = jsonx.loads(body) if body else {}
    except Exception as exc:  # orjson raises its own decode error type
        raise ValueError(f"heartbeat body is not JSON: {exc}") from None
    needs: list[Need] = []
    for consumer in (data.get("consumerDataSet") or []) if isinstance(data, dict) else []:
        if not isinstance(consumer, dict):
            continue
        group = consumer.get("groupName")
        if group:
            needs.append(Need(str(group), Perm.SUB, True))
        for sub in consumer.get("subscriptionDataSet") or []:
            if isinstance(sub, dict) and sub.get("topic"):
                needs.append(topic_need(str(sub["topic"]), Perm.SUB))
    return needs


def _owned(account: Account, need: Need) -> Perm:
    if need.is_group:
        return account.group_perms.get(need.name, account.default_group_perm)
    return account.topic_perms.get(need.name, account.default_topic_perm)


def check(acl: AclConfig, peer_ip: str, cmd: RemotingCommand) -> str | None:
    """None when ``cmd`` from ``peer_ip`` may run, else the reason it may not (the answer's remark)."""
    for matcher in acl.global_white:
        if matcher(peer_ip):
            return None
    ext = cmd.ext_fields
    access_key = ext.get(signature.ACCESS_KEY)
    if not access_key:
        return f"no AccessKey in the request (code {cmd.code}) from {peer_ip}"
    account = acl.accounts.get(access_key)
    if account is None:
        return f"no ACL account for AccessKey {access_key}"
    if account.white_remote_address is not None and account.white_remote_address(peer_ip):
        return None
    if not ext.get(signature.SIGNATURE):
        return f"no Signature in the request for AccessKey {access_key}"
    if not signature.verify(ext, cmd.body, account.secret_key):
        return f"signature check failed for AccessKey {access_key}"
    if cmd.code in ADMIN_CODES and not account.admin:
        return f"request code {cmd.code} needs an admin account; AccessKey {access_key} is not one"
    if account.admin:
        return None
    try:
        needs = needs_of(cmd)
    except ValueError as exc:
        return f"cannot tell the rights request code {cmd.code} needs: {exc}"
    for need in needs:
        if not grants(_owned(account, need), need.perm):
            kind = "group" if need.is_group else "topic"
            return (f"AccessKey {access_key} has no {need.perm.name} permission on {kind} {need.name} "
                    f"(request code {cmd.code})")
    return None
