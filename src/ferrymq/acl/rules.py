"""THE table of what each request code the broker answers needs under ACL (``aclEnable=true``), read by the
check in front of the handlers (acl/checker.py); docs/security.md shows the same table (a test compares them).

One row per request code:

| column   | meaning                                                                                       |
|----------|-----------------------------------------------------------------------------------------------|
| right    | what the caller needs (``Right``): any valid signature, an admin account, PUB/SUB on a topic or group |
| fields   | the header fields the code defines. When given, a signed request carrying any other field (besides ``COMMON_FIELDS``) is refused: RocketMQ 4.x signatures do not cover the request code, so a request signed for one code and replayed under another is told apart by its fields. ``None``: not checked (codes whose client field sets vary) |
| numeric  | header fields that hold a decimal integer; in a signed request each must be canonical (``-?[1-9][0-9]*`` or ``0``) |
| flags    | header fields that hold a boolean; in a signed request each must be ``true``, ``false``, ``1`` or ``0`` |

Why the last two: the signature covers the concatenated header values in key order without separators, so
``queueId=0, queueOffset=123`` and ``queueId=01, queueOffset=23`` sign alike. Leading zeros, signs and spaces
are refused; a shift that leaves both values canonical (``1|23`` to ``12|3``) cannot be told apart (see
docs/security.md, "What remains possible without TLS").

``OnsChannel`` is not checked by RocketMQ but is signed and sorts right before the first lower-case field: a
signed request whose ``OnsChannel`` ends with a digit or a sign is refused too (it could have taken them
from the next field).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from ferrymq.remoting.codes import RequestCode as C


class Right(enum.Enum):
    """What a caller needs; the text is the docs table's wording."""

    SIGNED = "a valid signature (any account)"
    ADMIN = "an admin account"
    PUB_TOPIC = "PUB on the topic"
    SUB_TOPIC = "SUB on the topic"
    SUB_TOPIC_GROUP = "SUB on the topic and the consumer group"
    SUB_GROUP = "SUB on the consumer group"
    SUB_HEARTBEAT = "SUB on every consumer group and subscribed topic of the body"
    SUB_LOCK = "SUB on the body's consumer group and on the topic of every queue"
    PUB_HALF_TOPIC = "PUB on the half message's real topic"


#: fields any request may carry: the signature's own, Java's SecurityToken, and Java 5.x clients'
#: RpcRequestHeader / TopicRequestHeader fields (namespace, namespaced, broker name, oneway, logical queue)
COMMON_FIELDS = frozenset(("AccessKey", "Signature", "OnsChannel", "SecurityToken", "_UNIQUE_KEY_QUERY",
                           "ns", "nsd", "bname", "oway", "lo"))
#: the OnsChannel field (signed, not checked, sorts before the lower-case fields)
ONS_CHANNEL = "OnsChannel"
CANONICAL_INT = re.compile(r"(?:0|-?[1-9][0-9]*)\Z")
FLAG_VALUES = frozenset(("true", "false", "1", "0"))


@dataclass(frozen=True, slots=True)
class Rule:
    code: int
    right: Right
    #: the header field naming the topic (PUB_TOPIC, SUB_TOPIC, SUB_TOPIC_GROUP)
    topic_key: str = ""
    #: the header field naming the consumer group (SUB_TOPIC_GROUP, SUB_GROUP)
    group_key: str = ""
    #: SUB_GROUP only when the group field is present and not empty
    group_optional: bool = False
    fields: frozenset[str] | None = None
    numeric: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    #: what the docs table adds to the right
    note: str = ""

    @property
    def name(self) -> str:
        return C(self.code).name


def _f(*names: str) -> frozenset[str]:
    return frozenset(names)


_SEND_V1_NUMERIC = ("defaultTopicQueueNums", "queueId", "sysFlag", "bornTimestamp", "flag", "reconsumeTimes",
                    "maxReconsumeTimes")
_SEND_V1_FLAGS = ("unitMode", "batch")
_SEND_V2_NUMERIC = ("d", "e", "f", "g", "h", "j", "l")
_SEND_V2_FLAGS = ("k", "m")
_PULL_NUMERIC = ("queueId", "queueOffset", "maxMsgNums", "sysFlag", "commitOffset", "suspendTimeoutMillis",
                 "subVersion")
_ADMIN = Right.ADMIN
_SIGNED = Right.SIGNED

RULES: tuple[Rule, ...] = (
    Rule(C.SEND_MESSAGE, Right.PUB_TOPIC, topic_key="topic", numeric=_SEND_V1_NUMERIC, flags=_SEND_V1_FLAGS),
    Rule(C.PULL_MESSAGE, Right.SUB_TOPIC_GROUP, topic_key="topic", group_key="consumerGroup",
         numeric=_PULL_NUMERIC),
    Rule(C.QUERY_MESSAGE, Right.SUB_TOPIC, topic_key="topic", numeric=("maxNum", "beginTimestamp", "endTimestamp")),
    Rule(C.QUERY_BROKER_OFFSET, _SIGNED),
    Rule(C.QUERY_CONSUMER_OFFSET, Right.SUB_TOPIC_GROUP, topic_key="topic", group_key="consumerGroup",
         numeric=("queueId",)),
    Rule(C.UPDATE_CONSUMER_OFFSET, Right.SUB_TOPIC_GROUP, topic_key="topic", group_key="consumerGroup",
         fields=_f("consumerGroup", "topic", "queueId", "commitOffset"), numeric=("queueId", "commitOffset")),
    Rule(C.UPDATE_AND_CREATE_TOPIC, _ADMIN,
         fields=_f("topic", "defaultTopic", "readQueueNums", "writeQueueNums", "perm", "topicFilterType",
                   "topicSysFlag", "order", "attributes"),
         numeric=("readQueueNums", "writeQueueNums", "perm", "topicSysFlag"), flags=("order",)),
    Rule(C.GET_ALL_TOPIC_CONFIG, _SIGNED, note="slaves' metadata sync: whitelist the slaves' addresses"),
    Rule(C.GET_TOPIC_CONFIG_LIST, _SIGNED),
    Rule(C.UPDATE_BROKER_CONFIG, _ADMIN, fields=_f()),
    Rule(C.GET_BROKER_CONFIG, _SIGNED, fields=_f(), note="secret values (haSecret, any *secret*/*password* key) "
                                                          "are answered as ******"),
    Rule(C.GET_BROKER_RUNTIME_INFO, _SIGNED),
    Rule(C.GET_BROKER_EPOCH_CACHE, _SIGNED, note="controller mode"),
    Rule(C.SEARCH_OFFSET_BY_TIMESTAMP, _SIGNED, numeric=("queueId", "timestamp")),
    Rule(C.GET_MAX_OFFSET, _SIGNED, numeric=("queueId",)),
    Rule(C.GET_MIN_OFFSET, _SIGNED, numeric=("queueId",)),
    Rule(C.GET_EARLIEST_MSG_STORETIME, _SIGNED, numeric=("queueId",)),
    Rule(C.VIEW_MESSAGE_BY_ID, _SIGNED, numeric=("offset",), note="any message by its commit-log offset"),
    Rule(C.HEART_BEAT, Right.SUB_HEARTBEAT, note="producer groups need nothing"),
    Rule(C.UNREGISTER_CLIENT, Right.SUB_GROUP, group_key="consumerGroup", group_optional=True,
         fields=_f("clientID", "producerGroup", "consumerGroup"), note="when a consumer group is given"),
    Rule(C.CONSUMER_SEND_MSG_BACK, Right.SUB_GROUP, group_key="group",
         fields=_f("offset", "group", "delayLevel", "originMsgId", "originTopic", "unitMode", "maxReconsumeTimes"),
         numeric=("offset", "delayLevel", "maxReconsumeTimes"), flags=("unitMode",)),
    Rule(C.END_TRANSACTION, Right.PUB_HALF_TOPIC,
         fields=_f("producerGroup", "tranStateTableOffset", "commitLogOffset", "commitOrRollback",
                   "fromTransactionCheck", "msgId", "transactionId"),
         numeric=("tranStateTableOffset", "commitLogOffset", "commitOrRollback"), flags=("fromTransactionCheck",),
         note="checked when the half message is found; the producer group must be the half message's, and not "
              "DENY where the account lists it; a second, different decision is refused"),
    Rule(C.GET_CONSUMER_LIST_BY_GROUP, Right.SUB_GROUP, group_key="consumerGroup", group_optional=True),
    Rule(C.LOCK_BATCH_MQ, Right.SUB_LOCK, fields=_f()),
    Rule(C.UNLOCK_BATCH_MQ, Right.SUB_LOCK, fields=_f()),
    Rule(C.GET_ALL_CONSUMER_OFFSET, _SIGNED, note="slaves' metadata sync"),
    Rule(C.GET_ALL_DELAY_OFFSET, _SIGNED, note="slaves' metadata sync"),
    Rule(C.CHECK_CLIENT_CONFIG, _SIGNED),
    Rule(C.UPDATE_AND_CREATE_ACL_CONFIG, _ADMIN,
         fields=_f("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm", "defaultGroupPerm",
                   "topicPerms", "groupPerms")),
    Rule(C.DELETE_ACL_CONFIG, _ADMIN, fields=_f("accessKey")),
    Rule(C.GET_BROKER_CLUSTER_ACL_INFO, _ADMIN, fields=_f()),
    Rule(C.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, _ADMIN, fields=_f("globalWhiteAddrs", "aclFileFullPath")),
    Rule(C.GET_BROKER_CLUSTER_ACL_CONFIG, _ADMIN, fields=_f()),
    Rule(C.GET_TIMER_CHECK_POINT, _SIGNED, note="slaves' metadata sync"),
    Rule(C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, _ADMIN, fields=_f()),
    Rule(C.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, _SIGNED, note="slaves' metadata sync"),
    Rule(C.GET_TOPIC_STATS_INFO, _SIGNED),
    Rule(C.GET_CONSUMER_CONNECTION_LIST, _SIGNED),
    Rule(C.GET_PRODUCER_CONNECTION_LIST, _SIGNED),
    Rule(C.DELETE_SUBSCRIPTIONGROUP, _ADMIN, fields=_f("groupName", "removeOffset", "cleanOffset"),
         flags=("removeOffset", "cleanOffset")),
    Rule(C.GET_CONSUME_STATS, _SIGNED),
    Rule(C.DELETE_TOPIC_IN_BROKER, _ADMIN, fields=_f("topic")),
    Rule(C.INVOKE_BROKER_TO_RESET_OFFSET, _ADMIN, fields=_f("topic", "group", "timestamp", "isForce", "queueId",
                                                            "offset"),
         numeric=("timestamp", "queueId", "offset"), flags=("isForce",)),
    Rule(C.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, _SIGNED),
    Rule(C.QUERY_TOPIC_CONSUME_BY_WHO, _SIGNED),
    Rule(C.CLEAN_EXPIRED_CONSUMEQUEUE, _ADMIN, fields=_f()),
    Rule(C.GET_CONSUMER_RUNNING_INFO, _SIGNED),
    Rule(C.SEND_MESSAGE_V2, Right.PUB_TOPIC, topic_key="b", numeric=_SEND_V2_NUMERIC, flags=_SEND_V2_FLAGS),
    Rule(C.CLONE_GROUP_OFFSET, _ADMIN, fields=_f("srcGroup", "destGroup", "topic", "offline"), flags=("offline",)),
    Rule(C.VIEW_BROKER_STATS_DATA, _SIGNED),
    Rule(C.CLEAN_UNUSED_TOPIC, _ADMIN, fields=_f()),
    Rule(C.GET_BROKER_CONSUME_STATS, _SIGNED),
    Rule(C.SEND_BATCH_MESSAGE, Right.PUB_TOPIC, topic_key="b", numeric=_SEND_V2_NUMERIC, flags=_SEND_V2_FLAGS),
    Rule(C.SEND_REPLY_MESSAGE, Right.PUB_TOPIC, topic_key="topic", numeric=_SEND_V1_NUMERIC, flags=_SEND_V1_FLAGS),
    Rule(C.SEND_REPLY_MESSAGE_V2, Right.PUB_TOPIC, topic_key="b", numeric=_SEND_V2_NUMERIC, flags=_SEND_V2_FLAGS),
    Rule(C.GET_ALL_PRODUCER_INFO, _SIGNED),
    Rule(C.DELETE_EXPIRED_COMMITLOG, _ADMIN, fields=_f()),
    Rule(C.QUERY_TOPICS_BY_CONSUMER, _SIGNED),
    Rule(C.RECALL_MESSAGE, Right.PUB_TOPIC, topic_key="topic", fields=_f("producerGroup", "topic", "recallHandle")),
)
BY_CODE: dict[int, Rule] = {int(r.code): r for r in RULES}
assert len(BY_CODE) == len(RULES), "one row per request code"

#: name-server codes that need an admin account (acl/checker.py NAMESRV_GUARDED_CODES; the name server's
#: reads and broker registration are not in this table)
NAMESRV_ADMIN_CODES = frozenset((int(C.PUT_KV_CONFIG), int(C.DELETE_KV_CONFIG), int(C.DELETE_TOPIC_IN_NAMESRV),
                                 int(C.WIPE_WRITE_PERM_OF_BROKER), int(C.ADD_WRITE_PERM_OF_BROKER),
                                 int(C.UPDATE_NAMESRV_CONFIG)))


def shape_error(rule: Rule, ext: dict[str, str]) -> str | None:
    """Why a signed request's header cannot be taken as signed for ``rule``'s code (None: it can)."""
    if rule.fields is not None:
        extra = sorted(k for k in ext if k not in rule.fields and k not in COMMON_FIELDS)
        if extra:
            return (f"header field(s) {', '.join(extra)} are not defined for request code {rule.code} "
                    f"({rule.name}): refused, a request signed for another code is not accepted under this one")
    for key in rule.numeric:
        value = ext.get(key)
        if value is not None and not CANONICAL_INT.match(value):
            return (f"header field {key}={value[:40]!r} of request code {rule.code} is not a canonical decimal "
                    "integer (no leading zeros, '+', spaces or empty value in a signed request)")
    for key in rule.flags:
        value = ext.get(key)
        if value is not None and value not in FLAG_VALUES:
            return (f"header field {key}={value[:40]!r} of request code {rule.code} is not true, false, 1 or 0 "
                    "(a signed request's flags are written exactly)")
    channel = ext.get(ONS_CHANNEL)
    if channel and channel[-1] in "0123456789+-":
        return (f"header field {ONS_CHANNEL}={channel[:40]!r} ends with a digit or a sign: refused in a signed "
                "request (it could have been moved from the next field)")
    return None


def docs_table() -> str:
    """The markdown table of docs/security.md ("Request codes and the rights they need")."""
    lines = ["| code | name | needs | header fields checked (signed requests) |", "|---|---|---|---|"]
    for rule in sorted(RULES, key=lambda r: int(r.code)):
        needs = rule.right.value
        if rule.topic_key or rule.group_key:
            keys = ", ".join(f"`{k}`" for k in (rule.topic_key, rule.group_key) if k)
            needs += f" ({keys})"
        if rule.note:
            needs += f"; {rule.note}"
        checked = []
        if rule.fields is not None:
            checked.append("only " + (", ".join(f"`{f}`" for f in sorted(rule.fields)) or "no fields"))
        if rule.numeric:
            checked.append("canonical " + ", ".join(f"`{f}`" for f in rule.numeric))
        if rule.flags:
            checked.append("flags " + ", ".join(f"`{f}`" for f in rule.flags))
        lines.append(f"| {int(rule.code)} | {rule.name} | {needs} | {'; '.join(checked)} |")
    return "\n".join(lines)
