"""Request-reply on the client (RocketMQ 4.6+): the requester's table of waiting requests, the handler of
the broker's PUSH_REPLY_MESSAGE_TO_CLIENT (326), and the reply a responder builds.

    requester                         broker                              responder
    send(request: CORRELATION_ID,  ─▶ stores it like any message  ─▶  consumes it, then
         REPLY_TO_CLIENT=<client id>,                                  Producer.reply(request, body):
         TTL=<timeout ms>)                                             SEND_REPLY_MESSAGE_V2 (325) to
    ◀─ PUSH_REPLY_MESSAGE_TO_CLIENT (326) on the requester's ◀──────  <cluster>_REPLY_TOPIC with the
       own connection, matched by CORRELATION_ID                      three properties + MSG_TYPE=reply

The push reaches the requester only through a broker it heartbeats (the broker finds the connection by the
client id), so ``Producer.request`` first learns the routes of the request topic and of the reply topics of
its clusters, and heartbeats the brokers it did not heartbeat yet.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import zlib
from typing import Any

from ferrymq.common.message import (
    PROPERTY_CLUSTER,
    PROPERTY_CORRELATION_ID,
    PROPERTY_MESSAGE_REPLY_TO_CLIENT,
    PROPERTY_MESSAGE_TTL,
    PROPERTY_MESSAGE_TYPE,
    PROPERTY_REPLY_MESSAGE_ARRIVE_TIME,
    REPLY_MESSAGE_FLAG,
    SYSFLAG_COMPRESSED,
    Message,
    MessageExt,
    host_to_bytes,
    reply_topic,
    string_to_properties,
)
from ferrymq.errors import ClientError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode

log = logging.getLogger(__name__)

#: requests one client may wait on at once (each holds a future until its reply or its timeout)
REQUESTS_IN_FLIGHT_MAX = 10_000
#: largest reply body inflated from a compressed push
REPLY_BODY_BYTES_MAX = 64 * 1024 * 1024


def new_correlation_id() -> str:
    return str(uuid.uuid4())


class ReplyWaiters:
    """Futures of the requests waiting for their reply, by CORRELATION_ID (one table per client instance)."""

    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future[MessageExt]] = {}

    def __len__(self) -> int:
        return len(self._futures)

    def expect(self, correlation_id: str) -> asyncio.Future[MessageExt]:
        if len(self._futures) >= REQUESTS_IN_FLIGHT_MAX:
            raise ClientError(f"{REQUESTS_IN_FLIGHT_MAX} requests are already waiting for a reply")
        fut: asyncio.Future[MessageExt] = asyncio.get_running_loop().create_future()
        self._futures[correlation_id] = fut
        return fut

    def discard(self, correlation_id: str) -> None:
        self._futures.pop(correlation_id, None)

    def on_push(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """PUSH_REPLY_MESSAGE_TO_CLIENT: complete the waiting request; a reply nobody waits for (timed out,
        or for another process) is logged and acknowledged."""
        try:
            msg = decode_pushed_reply(cmd)
        except (ValueError, zlib.error) as exc:
            log.warning("bad reply message pushed by %s: %s", getattr(conn, "peer_addr", "?"), exc)
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark="process reply message fail")
        correlation_id = msg.properties.get(PROPERTY_CORRELATION_ID, "")
        fut = self._futures.pop(correlation_id, None)
        if fut is None:
            log.warning("reply message matches no waiting request: CORRELATION_ID %s", correlation_id)
        elif not fut.done():
            fut.set_result(msg)
        return cmd.response(ResponseCode.SUCCESS)

    def fail_all(self, exc: BaseException) -> None:
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(exc)
        self._futures.clear()


def _host(text: str | None) -> bytes:
    host, _, port = (text or "").rpartition(":")
    try:
        return host_to_bytes(host, int(port))
    except (ValueError, OSError):
        return host_to_bytes("0.0.0.0", 0)


def decode_pushed_reply(cmd: RemotingCommand) -> MessageExt:
    """The reply message of a 326 request (header fields of ReplyMessageRequestHeader, body inflated when
    sysFlag says compressed); ARRIVE_TIME is set to now."""
    f = cmd.ext_fields
    sys_flag = int(f.get("sysFlag") or 0)
    body = cmd.body
    if sys_flag & SYSFLAG_COMPRESSED:
        inflater = zlib.decompressobj()
        body = inflater.decompress(body, REPLY_BODY_BYTES_MAX)
        if inflater.unconsumed_tail:
            raise ValueError(f"reply body inflates beyond {REPLY_BODY_BYTES_MAX} bytes")
    props = string_to_properties(f.get("properties"))
    props[PROPERTY_REPLY_MESSAGE_ARRIVE_TIME] = str(int(time.time() * 1000))
    return MessageExt(
        topic=f.get("topic") or "", body=body, flag=int(f.get("flag") or 0), properties=props,
        queue_id=int(f.get("queueId") or 0), queue_offset=0, phy_offset=0, store_size=0, body_crc=0,
        sys_flag=sys_flag, born_timestamp=int(f.get("bornTimestamp") or 0), born_host=_host(f.get("bornHost")),
        store_timestamp=int(f.get("storeTimestamp") or 0), store_host=_host(f.get("storeHost")),
        reconsume_times=int(f.get("reconsumeTimes") or 0), prepared_transaction_offset=0,
    )


def mark_request(msg: Message, client_id: str, timeout_ms: int) -> str:
    """Set the request properties (a fresh CORRELATION_ID, REPLY_TO_CLIENT, TTL); returns the id."""
    correlation_id = new_correlation_id()
    msg.properties[PROPERTY_CORRELATION_ID] = correlation_id
    msg.properties[PROPERTY_MESSAGE_REPLY_TO_CLIENT] = client_id
    msg.properties[PROPERTY_MESSAGE_TTL] = str(timeout_ms)
    return correlation_id


def create_reply_message(request: Message | MessageExt, body: bytes | str) -> Message:
    """The reply to a received request (RocketMQ's ``MessageUtil.createReplyMessage``): topic
    ``<cluster>_REPLY_TOPIC`` of the request's CLUSTER, its CORRELATION_ID, REPLY_TO_CLIENT and TTL, and
    MSG_TYPE=reply."""
    props = request.properties
    cluster = props.get(PROPERTY_CLUSTER)
    if not cluster:
        raise ClientError(f"cannot reply: the request has no {PROPERTY_CLUSTER} property (not received from a "
                          "broker?)")
    reply_to = props.get(PROPERTY_MESSAGE_REPLY_TO_CLIENT)
    correlation_id = props.get(PROPERTY_CORRELATION_ID)
    if not reply_to or not correlation_id:
        raise ClientError(f"cannot reply: the message is not a request (no {PROPERTY_MESSAGE_REPLY_TO_CLIENT} / "
                          f"{PROPERTY_CORRELATION_ID})")
    reply_props = {
        PROPERTY_MESSAGE_TYPE: REPLY_MESSAGE_FLAG,
        PROPERTY_CORRELATION_ID: correlation_id,
        PROPERTY_MESSAGE_REPLY_TO_CLIENT: reply_to,
    }
    ttl = props.get(PROPERTY_MESSAGE_TTL)
    if ttl is not None:
        reply_props[PROPERTY_MESSAGE_TTL] = ttl
    return Message(reply_topic(cluster), body.encode() if isinstance(body, str) else bytes(body), 0, reply_props)
