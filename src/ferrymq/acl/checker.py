"""Whether an account may run a request: the signature, then the rights of acl/rules.py (THE table code ->
required right; docs/security.md shows it), then the shape of the signed header (fields the code defines,
canonical numbers). Codes the table does not list (the name server's) need an admin account when they are
in ``ADMIN_CODES`` and a valid signature otherwise.

A topic named ``%RETRY%g`` or ``%DLQ%g`` is judged by the perm of group ``g``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ferrymq.acl.config import Account, AclConfig
from ferrymq.acl.perm import Perm, grants
from ferrymq.acl.rules import BY_CODE, NAMESRV_ADMIN_CODES, Right, Rule, shape_error
from ferrymq.remoting import jsonx, signature
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode as C

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"

#: ACL management codes (50..54: update/delete an account, ACL info, global white addresses, the whole ACL)
ACL_ADMIN_CODES = frozenset(range(int(C.UPDATE_AND_CREATE_ACL_CONFIG), int(C.GET_BROKER_CLUSTER_ACL_CONFIG) + 1))
#: UPDATE_NAMESRV_CONFIG
UPDATE_NAMESRV_CONFIG_CODE = int(C.UPDATE_NAMESRV_CONFIG)
#: RocketMQ's offset-reset codes (INVOKE_BROKER_TO_RESET_OFFSET 222)
RESET_OFFSET_CODES = frozenset((int(C.RESET_CONSUMER_CLIENT_OFFSET), int(C.INVOKE_BROKER_TO_RESET_OFFSET)))
#: every code that needs an admin account: the broker's (rules.py) and the name server's
ADMIN_CODES = frozenset(code for code, rule in BY_CODE.items() if rule.right is Right.ADMIN) | NAMESRV_ADMIN_CODES \
    | RESET_OFFSET_CODES
#: what a name server with aclEnable checks (all need an admin account); reads and broker registration are open
NAMESRV_GUARDED_CODES = NAMESRV_ADMIN_CODES


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
    """The topic/group rights ``cmd`` needs before its handler runs (ValueError when its header or body cannot
    be read). END_TRANSACTION's topic is only known to its handler (``half_topic_denial``)."""
    rule = BY_CODE.get(cmd.code)
    if rule is None:
        return []
    return _needs(rule, cmd)


def _needs(rule: Rule, cmd: RemotingCommand) -> list[Need]:
    ext = cmd.ext_fields
    right = rule.right
    if right is Right.PUB_TOPIC:
        return [topic_need(_required(ext, rule.topic_key), Perm.PUB)]
    if right is Right.SUB_TOPIC_GROUP:
        return [topic_need(_required(ext, rule.topic_key), Perm.SUB),
                Need(_required(ext, rule.group_key), Perm.SUB, True)]
    if right is Right.SUB_TOPIC:
        return [topic_need(_required(ext, rule.topic_key), Perm.SUB)]
    if right is Right.SUB_GROUP:
        group = ext.get(rule.group_key)
        if not group and rule.group_optional:
            return []
        return [Need(_required(ext, rule.group_key), Perm.SUB, True)]
    if right is Right.SUB_HEARTBEAT:
        return _heartbeat_needs(cmd.body)
    if right is Right.SUB_LOCK:
        return _lock_needs(cmd.body)
    return []


def _required(ext: dict[str, str], key: str) -> str:
    value = ext.get(key)
    if not value:
        raise ValueError(f"header field {key} missing")
    return value


def _json_body(body: bytes, what: str) -> object:
    try:
        return jsonx.loads(body) if body else {}
    except Exception as exc:  # orjson raises its own decode error type
        raise ValueError(f"{what} body is not JSON: {exc}") from None


def _heartbeat_needs(body: bytes) -> list[Need]:
    data = _json_body(body, "heartbeat")
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


def _lock_needs(body: bytes) -> list[Need]:
    data = _json_body(body, "lock")
    if not isinstance(data, dict) or not data.get("consumerGroup"):
        raise ValueError("the lock body names no consumerGroup")
    needs = [Need(str(data["consumerGroup"]), Perm.SUB, True)]
    topics = {str(mq.get("topic")) for mq in data.get("mqSet") or [] if isinstance(mq, dict) and mq.get("topic")}
    needs.extend(topic_need(topic, Perm.SUB) for topic in sorted(topics))
    return needs


def _owned(account: Account, need: Need) -> Perm:
    if need.is_group:
        return account.group_perms.get(need.name, account.default_group_perm)
    return account.topic_perms.get(need.name, account.default_topic_perm)


def _missing(account: Account, needs: list[Need], code: int) -> str | None:
    return missing_right(account, needs, f"request code {code}")


def missing_right(account: Account, needs: list[Need], what: str) -> str | None:
    """None when ``account`` has every right of ``needs``, else the reason naming the first one missing
    (``what`` names the request in it)."""
    for need in needs:
        if not grants(_owned(account, need), need.perm):
            kind = "group" if need.is_group else "topic"
            return (f"AccessKey {account.access_key} has no {need.perm.name} permission on {kind} {need.name} "
                    f"({what})")
    return None


def is_white(acl: AclConfig, peer_ip: str, account: Account | None) -> bool:
    """Whether ``peer_ip`` skips the signature and rights checks: a global white address, or the account's
    own ``whiteRemoteAddress``."""
    if any(matcher(peer_ip) for matcher in acl.global_white):
        return True
    return account is not None and account.white_remote_address is not None and account.white_remote_address(peer_ip)


def _caller(acl: AclConfig, peer_ip: str, cmd: RemotingCommand) -> Account | None:
    """The account of a request that passed ``check`` (None: a whitelisted address, which skips every check)."""
    for matcher in acl.global_white:
        if matcher(peer_ip):
            return None
    account = acl.accounts.get(cmd.ext_fields.get(signature.ACCESS_KEY) or "")
    if account is None or (account.white_remote_address is not None and account.white_remote_address(peer_ip)):
        return None
    return account


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
    rule = BY_CODE.get(cmd.code)
    if rule is not None:
        bad_shape = shape_error(rule, ext)
        if bad_shape is not None:
            return bad_shape
    if cmd.code in ADMIN_CODES and not account.admin:
        return f"request code {cmd.code} needs an admin account; AccessKey {access_key} is not one"
    if account.admin or rule is None:
        return None
    try:
        needs = _needs(rule, cmd)
    except ValueError as exc:
        return f"cannot tell the rights request code {cmd.code} needs: {exc}"
    return _missing(account, needs, cmd.code)


def half_topic_denial(acl: AclConfig, peer_ip: str, cmd: RemotingCommand, real_topic: str,
                      producer_group: str) -> str | None:
    """END_TRANSACTION of a request that passed ``check``: None when its caller has PUB on the half message's
    real topic (and no DENY on its producer group where the account lists that group), else the reason."""
    account = _caller(acl, peer_ip, cmd)
    if account is None or account.admin:
        return None
    reason = _missing(account, [topic_need(real_topic, Perm.PUB)], cmd.code)
    if reason is not None:
        return reason
    listed = account.group_perms.get(producer_group) if producer_group else None
    if listed is not None and listed & Perm.DENY:
        return (f"AccessKey {account.access_key} is denied producer group {producer_group} "
                f"(request code {cmd.code})")
    return None
