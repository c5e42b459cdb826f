"""Authentication and rights of 5.x clients on the gRPC endpoint, against the same ``plain_acl.yml`` accounts
as the remoting port (acl/checker.py does the account lookup and the rights test).

The 5.x SDKs sign every call with gRPC metadata:

| metadata key      | value                                                                                  |
|-------------------|----------------------------------------------------------------------------------------|
| x-mq-date-time    | the client's clock, ``yyyyMMdd'T'HHmmss'Z'`` (the text signed; not checked against ours) |
| authorization     | ``MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time, Signature=<hex>`` |

``Signature`` is hex(HMAC-SHA1(secretKey, x-mq-date-time value)): lower case (Python, Node) or upper case
(Java); both are accepted. ``Credential`` may carry ``/``-separated scope after the access key (older SDKs);
the access key is the part before the first ``/``.

What each RPC needs (``RPC_RIGHTS``; the ``Right`` wording of acl/rules.py, docs/grpc.md shows the table):
SendMessage and RecallMessage PUB on each topic; EndTransaction PUB on the half message's topic; the consumer
calls SUB on topic and group; Telemetry settings of a consumer SUB on its group and every subscribed topic (as
the remoting HEART_BEAT); QueryRoute, Heartbeat, NotifyClientTermination and a producer's Telemetry a valid
signature. A white address (``globalWhiteRemoteAddresses``, the account's ``whiteRemoteAddress``) skips the
checks, as on the remoting port.

The signature covers only the date text, so a recorded call's metadata can be replayed with other content
(as with RocketMQ's proxy): serve the gRPC port with TLS where that matters (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ferrymq.acl.checker import Need, is_white, missing_right, topic_need
from ferrymq.acl.config import AclConfig
from ferrymq.acl.perm import Perm
from ferrymq.acl.rules import Right
from ferrymq.proxy.v2 import definition_pb2 as pb

AUTHORIZATION_KEY = "authorization"
DATE_TIME_KEY = "x-mq-date-time"
#: the algorithm word the SDKs put first in ``authorization``
ALGORITHM = "MQv2-HMAC-SHA1"
CREDENTIAL_FIELD = "Credential"
SIGNED_HEADERS_FIELD = "SignedHeaders"
SIGNATURE_FIELD = "Signature"

#: THE table: the right each RPC needs (how its topic and group are found: ``needs_of``)
RPC_RIGHTS: dict[str, Right] = {
    "QueryRoute": Right.SIGNED,
    "Heartbeat": Right.SIGNED,
    "NotifyClientTermination": Right.SIGNED,
    "Telemetry": Right.SUB_HEARTBEAT,
    "SendMessage": Right.PUB_TOPIC,
    "RecallMessage": Right.PUB_TOPIC,
    "EndTransaction": Right.PUB_HALF_TOPIC,
    "QueryAssignment": Right.SUB_TOPIC_GROUP,
    "ReceiveMessage": Right.SUB_TOPIC_GROUP,
    "AckMessage": Right.SUB_TOPIC_GROUP,
    "ChangeInvisibleDuration": Right.SUB_TOPIC_GROUP,
    "ForwardMessageToDeadLetterQueue": Right.SUB_TOPIC_GROUP,
    "PullMessage": Right.SUB_TOPIC_GROUP,
    "UpdateOffset": Right.SUB_TOPIC_GROUP,
    "GetOffset": Right.SUB_TOPIC_GROUP,
    "QueryOffset": Right.SUB_TOPIC_GROUP,
    "SyncLiteSubscription": Right.SUB_TOPIC_GROUP,
}


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a call may not run: ``code`` is UNAUTHORIZED (who is calling is not proven) or FORBIDDEN."""

    code: int
    message: str

    def status(self) -> pb.Status:
        return pb.Status(code=self.code, message=self.message)  # type: ignore[arg-type]


def parse_authorization(text: str) -> tuple[str, str] | None:
    """(access key, signature) of an ``authorization`` value; None when it is not of the SDKs' form."""
    algorithm, _, rest = text.strip().partition(" ")
    if algorithm != ALGORITHM:
        return None
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    credential = fields.get(CREDENTIAL_FIELD, "")
    signature = fields.get(SIGNATURE_FIELD, "")
    if not credential or not signature:
        return None
    return credential.split("/", 1)[0], signature


def sign(secret_key: str, date_time: str) -> str:
    """hex(HMAC-SHA1(secret key, date text)), as the SDKs compute it."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def needs_of(rpc: str, request: Any) -> list[Need]:
    """The topic/group rights ``request`` of ``rpc`` needs (Telemetry: the settings command)."""
    right = RPC_RIGHTS.get(rpc, Right.SIGNED)
    if right in (Right.PUB_TOPIC, Right.PUB_HALF_TOPIC):
        if rpc == "SendMessage":
            topics = sorted({m.topic.name for m in request.messages})
        else:
            topics = [request.topic.name]
        return [topic_need(t, Perm.PUB) for t in topics if t]
    if right is Right.SUB_TOPIC_GROUP:
        needs = []
        fields = request.DESCRIPTOR.fields_by_name
        if "topic" in fields:
            topic = request.topic.name
        elif "message_queue" in fields:
            topic = request.message_queue.topic.name
        else:
            topic = ""
        if topic:
            needs.append(topic_need(topic, Perm.SUB))
        group = request.group.name if "group" in fields else ""
        if group:
            needs.append(Need(group, Perm.SUB, True))
        return needs
    if right is Right.SUB_HEARTBEAT:  # a Telemetry settings command of a consumer
        if request.WhichOneof("command") != "settings":
            return []
        settings = request.settings
        if settings.WhichOneof("pub_sub") != "subscription":
            return []
        sub = settings.subscription
        out = [Need(sub.group.name, Perm.SUB, True)] if sub.group.name else []
        out.extend(topic_need(e.topic.name, Perm.SUB) for e in sub.subscriptions if e.topic.name)
        return out
    return []


def peer_ip(peer: str) -> str:
    """The address of a gRPC peer text (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``)."""
    _, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0] if rest.count(":") >= 1 else rest
    return host.strip("[]")


class GrpcAuth:
    """Checks calls against the ACL ``acl_source`` answers (None: ACL off, every call runs)."""

    def __init__(self, acl_source: Callable[[], AclConfig | None]) -> None:
        self._acl_source = acl_source

    @property
    def enabled(self) -> bool:
        return self._acl_source() is not None

    def check(self, rpc: str, metadata: Iterable[tuple[str, Any]], peer: str, request: Any) -> Denial | None:
        """None when ``request`` of ``rpc`` may run, else why not."""
        acl = self._acl_source()
        if acl is None:
            return None
        ip = peer_ip(peer)
        if is_white(acl, ip, None):
            return None
        meta = {key: str(value) for key, value in metadata}
        parsed = parse_authorization(meta.get(AUTHORIZATION_KEY, ""))
        if parsed is None:
            return Denial(pb.UNAUTHORIZED, f"no {ALGORITHM} authorization in the {rpc} call from {ip}")
        access_key, signature = parsed
        account = acl.accounts.get(access_key)
        if account is None:
            return Denial(pb.UNAUTHORIZED, f"no ACL account for AccessKey {access_key}")
        if is_white(acl, ip, account):
            return None
        date_time = meta.get(DATE_TIME_KEY, "")
        if not date_time:
            return Denial(pb.UNAUTHORIZED, f"no {DATE_TIME_KEY} in the {rpc} call for AccessKey {access_key}")
        if not hmac.compare_digest(sign(account.secret_key, date_time), signature.lower()):
            return Denial(pb.UNAUTHORIZED, f"signature check failed for AccessKey {access_key}")
        if account.admin:
            return None
        reason = missing_right(account, needs_of(rpc, request), f"RPC {rpc}")
        return None if reason is None else Denial(pb.FORBIDDEN, reason)
