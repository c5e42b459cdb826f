"""``apache.rocketmq.v2.MessagingService`` served on top of ferrymq's 4.x client (routes from the name
servers, SEND_MESSAGE_V2, PULL_MESSAGE, consumer offsets).

Every RPC answers: a v2 ``Status`` for expected outcomes (``translate.status_of_error`` maps broker codes
and faults), gRPC UNIMPLEMENTED for the RPCs this proxy does not serve (the generated servicer's default).
docs/grpc.md lists what each RPC does here and where it differs from RocketMQ's proxy.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from ferrymq.acl.config import AclConfig
from ferrymq.client import api, routes
from ferrymq.client.config import ClientConfig, parse_name_servers
from ferrymq.client.consumer.core import ConsumerCore
from ferrymq.client.instance import ClientInstance
from ferrymq.client.producer import Producer
from ferrymq.client.values import PullStatus, SendStatus
from ferrymq.common.aio import wait_event
from ferrymq.common.message import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_ROLLBACK,
    decode_offset_msg_id,
)
from ferrymq.common.message_codec import RecordFormatError, decode_record
from ferrymq.common.route import MASTER_ID, TopicRouteData
from ferrymq.common.route import MessageQueue as RemotingQueue
from ferrymq.common.timer import RecallHandle
from ferrymq.errors import FerryError, TopicNotExistError
from ferrymq.proxy import translate as tr
from ferrymq.proxy.auth import GrpcAuth
from ferrymq.proxy.config import ProxyConfig
from ferrymq.proxy.loopback import LocalBroker, LoopbackPool
from ferrymq.proxy.pop import PopEntry, PopQueue, SerialSource
from ferrymq.proxy.presence import Presence, PresenceRegistry
from ferrymq.proxy.pull import PullRpcs
from ferrymq.proxy.renew import RenewRegistry
from ferrymq.proxy.v2 import definition_pb2 as pb
from ferrymq.proxy.v2 import service_pb2 as spb
from ferrymq.proxy.v2 import service_pb2_grpc as sgrpc
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

log = logging.getLogger(__name__)

#: messages one PULL asks for while filling a queue's pop state
PULL_BATCH = 32
#: a receive that took messages of a queue pulls its next batch in the background while fewer than this many
#: never-delivered messages of it are held
PREFETCH_LOW_WATERMARK = PULL_BATCH
#: the largest ReceiveMessage batch (RocketMQ's proxy: 32)
MAX_RECEIVE_BATCH = 32
#: invisible duration when a ReceiveMessage names none and asks for no auto-renewal
DEFAULT_INVISIBLE_MS = 30_000
#: the auto-renewal task looks for due messages at least this often (it sleeps until the earliest is due)
RENEW_LOOP_MAX_SLEEP_MS = 1_000
#: long-polling time when a ReceiveMessage names none
DEFAULT_LONG_POLLING_MS = 20_000
#: the part of the gRPC deadline kept free for the answer to travel back
DEADLINE_MARGIN_MS = 1_000
#: while nothing is ready, the broker long poll on one queue lasts at most this long before the other
#: queues of the broker group are looked at again
RECEIVE_POLL_SLICE_MS = 1_000
#: remoting request timeout of the proxy's own calls (pull, offsets, send-back)
REMOTING_TIMEOUT_MS = 5_000
#: a message whose move to the dead-letter queue failed is offered again after this long
DEAD_LETTER_RETRY_MS = 10_000
#: gRPC metadata key carrying the 5.x client id
CLIENT_ID_KEY = "x-mq-client-id"
#: gRPC metadata key carrying the 5.x client's language
LANGUAGE_KEY = "x-mq-language"
#: Telemetry answers: producer retry policy (RocketMQ's proxy defaults)
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1_000
PRODUCER_BACKOFF_MULTIPLIER = 2.0
#: push consumers' receive batch (Subscription.receive_batch_size)
PUSH_RECEIVE_BATCH = 32
#: the first delay level a retry waits (RocketMQ: a retry starts at level 3, 10 s)
FIRST_RETRY_DELAY_LEVEL = 3
#: server commands (check-backs) queued for one Telemetry stream at most
TELEMETRY_OUTBOX_MAX = 1024
#: 5.x resolution -> END_TRANSACTION commitOrRollback
TRANSACTION_END_KIND = {pb.COMMIT: SYSFLAG_TRANSACTION_COMMIT, pb.ROLLBACK: SYSFLAG_TRANSACTION_ROLLBACK}


@dataclass(slots=True)
class _ClientInfo:
    client_type: int = pb.CLIENT_TYPE_UNSPECIFIED
    group: str = ""
    subscriptions: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: topics a producer publishes (its Telemetry settings): check-backs of their half messages go to it
    topics: frozenset[str] = frozenset()
    #: commands for the client's open Telemetry stream (None: no stream open)
    outbox: asyncio.Queue[spb.TelemetryCommand | None] | None = None
    #: the client opened a Telemetry stream once: from then on it is alive only while one is open
    telemetry_opened: bool = False


class _GroupHooks:
    """Makes a 5.x consumer group visible to the brokers as a CONSUME_ACTIVELY consumer of the proxy's
    client (``ferry consumer ...`` verbs list it); rebalancing is the proxy's own business."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.topics: dict[str, tuple[str, str]] = {}

    def consumer_data(self) -> dict[str, Any]:
        return {"consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_ACTIVELY",
                "groupName": self.group, "messageModel": "CLUSTERING", "unitMode": False,
                "subscriptionDataSet": [api.subscription_data(t, e, 0, k) for t, (e, k) in self.topics.items()]}

    def subscribed_topics(self) -> set[str]:
        return set(self.topics)

    def rebalance_now(self) -> None:
        return None

    def running_info(self) -> dict[str, Any]:
        return {"properties": {"consumeType": "CONSUME_ACTIVELY"}, "subscriptionSet": [],
                "mqTable": {}, "statusTable": {}}

    async def reset_offsets(self, topic: str, offsets: dict[RemotingQueue, int]) -> None:
        return None


PopKey = tuple[str, str, str, int]  # group, topic, broker name, queue id


class MessagingService(PullRpcs, sgrpc.MessagingServiceServicer):
    def __init__(self, config: ProxyConfig, *, clock_ms: Any = None,
                 acl_source: Callable[[], AclConfig | None] | None = None,
                 local_broker: LocalBroker | None = None) -> None:
        """``local_broker``: the broker this process runs (local mode): requests to it go through an
        in-memory connection (loopback.py) instead of a socket."""
        self.config = config
        #: checks 5.x clients' signatures and rights (acl_source None: no ACL, every call runs)
        self.auth = GrpcAuth(acl_source or (lambda: None))
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        client_config = ClientConfig(parse_name_servers(config.namesrv_addr), access_key=config.access_key,
                                     secret_key=config.secret_key, tls=config.tls)
        client_config.instance_name = f"grpc-proxy-{secrets.token_hex(4)}"
        self.instance = ClientInstance(client_config)
        if local_broker is not None:
            self.instance.pool = LoopbackPool.replacing(self.instance.pool, local_broker)
        self.producer = Producer.bound_to(self.instance, config.producer_group)
        #: receipt handles name this process: a handle from an earlier run is refused
        self.epoch = secrets.token_hex(4)
        #: key of the transaction ids' MACs (translate.TransactionId)
        self.tx_key = secrets.token_bytes(16)
        #: brokers this proxy heartbeated as the producer of half messages (see ``_known_as_producer``)
        self._heartbeated: set[str] = set()
        self.serials = SerialSource()
        self.pop_queues: dict[PopKey, PopQueue] = {}
        self._pop_locks: dict[PopKey, asyncio.Lock] = {}
        self._cores: dict[str, ConsumerCore] = {}
        self._dirty: set[PopKey] = set()
        #: (visible_at_ms, serial, key, queue_offset) of deliveries that were the last attempt: once due they
        #: move to the dead-letter queue even when no receive comes (``_sweep_dead``)
        self._last_attempts: list[tuple[int, int, PopKey, int]] = []
        #: messages received with auto_renew, kept invisible while their client lives (renew.py)
        self.renewals = RenewRegistry(invisible_ms=config.auto_renew_invisible_ms, ahead_ms=config.renew_ahead_ms,
                                      max_ms=config.renew_max_ms)
        self._clients: dict[str, _ClientInfo] = {}
        #: each 5.x client as a client of the brokers (ferry verbs and metrics list it)
        self.presence = PresenceRegistry(self.instance, config.producer_group, clock_ms=self.clock_ms,
                                         on_check_transaction=self._on_check_transaction)
        #: (topic, broker name) -> (the route they were worked out from, readable queue ids)
        self._queue_ids: dict[tuple[str, str], tuple[TopicRouteData, list[int]]] = {}
        #: broker name -> pulls from it that failed: each pop queue of that broker writes its offset again
        #: (``_fill``), as the broker may have restarted or been replaced and lost the last ones
        self._pull_failures: dict[str, int] = {}
        #: queues with a background pull under way (``_prefetch``)
        self._prefetching: set[PopKey] = set()
        #: set when this proxy stored a message of the topic (wakes waiting receives)
        self._arrivals: dict[str, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        #: the address routes and assignments name (set by the server once it listens)
        self.advertised_host = config.listen_host
        self.advertised_port = config.listen_port

    # ---- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.instance.start()
        self.instance.pool.dispatcher.register(RequestCode.CHECK_TRANSACTION_STATE, self._on_check_transaction)
        self._tasks.append(asyncio.create_task(self._commit_loop(), name="ferrymq-grpc-commit"))
        self._tasks.append(asyncio.create_task(self._renew_loop(), name="ferrymq-grpc-renew"))

    async def close(self) -> None:
        self._closing = True
        await self.presence.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.commit_offsets()
        except Exception as exc:  # the brokers may be gone already
            log.warning("final offset commit failed: %s", exc)
        await self.instance.close()

    # ---- helpers ---------------------------------------------------------------------------------------
    def _client_id(self, context: grpc.aio.ServicerContext) -> str:
        for key, value in context.invocation_metadata() or ():
            if key == CLIENT_ID_KEY:
                return str(value)
        return ""

    def _presence(self, client_id: str, context: Any) -> Presence | None:
        if not client_id:
            return None
        language = ""
        for key, value in context.invocation_metadata() or ():
            if key == LANGUAGE_KEY:
                language = str(value)
        return self.presence.seen(client_id, language)

    def _denied(self, rpc: str, request: Any, context: Any) -> pb.Status | None:
        """The status refusing ``request`` under the ACL (auth.py), None when it may run."""
        if not self.auth.enabled:
            return None
        denial = self.auth.check(rpc, context.invocation_metadata() or (), context.peer(), request)
        if denial is None:
            return None
        log.debug("%s refused: %s", rpc, denial.message)
        return denial.status()

    def _core(self, group: str) -> ConsumerCore:
        core = self._cores.get(group)
        if core is None:
            core = self._cores[group] = ConsumerCore(self.instance, group)
        return core

    def _hooks(self, group: str) -> _GroupHooks:
        hooks = self.instance.consumers.get(group)
        if not isinstance(hooks, _GroupHooks):
            hooks = _GroupHooks(group)
            self.instance.consumers[group] = hooks
        return hooks

    async def _route(self, topic: str) -> TopicRouteData:
        return await self.instance.get_route(topic)

    def _arrival(self, topic: str) -> asyncio.Event:
        event = self._arrivals.get(topic)
        if event is None:
            event = self._arrivals[topic] = asyncio.Event()
        return event

    # ---- QueryRoute ------------------------------------------------------------------------------------
    async def QueryRoute(self, request: spb.QueryRouteRequest, context: Any) -> spb.QueryRouteResponse:
        denied = self._denied("QueryRoute", request, context)
        if denied is not None:
            return spb.QueryRouteResponse(status=denied)
        topic = request.topic.name
        if not topic:
            return spb.QueryRouteResponse(status=tr.status(pb.ILLEGAL_TOPIC, "topic is empty"))
        try:
            route = await self.instance.update_route(topic)
        except TopicNotExistError:
            return spb.QueryRouteResponse(status=tr.status(pb.TOPIC_NOT_FOUND, f"topic {topic} does not exist"))
        except FerryError as exc:
            return spb.QueryRouteResponse(status=tr.status_of_error(exc))
        endpoints = request.endpoints if len(request.endpoints.addresses) else self.own_endpoints(context)
        queues = tr.route_queues(request.topic, self._queue_perms(route), endpoints)
        return spb.QueryRouteResponse(status=tr.status(), message_queues=queues)

    def own_endpoints(self, context: Any) -> pb.Endpoints:
        """The address routes name when the client did not say which one it used."""
        return tr.endpoints_of(self.advertised_host, self.advertised_port)

    @staticmethod
    def _queue_perms(route: TopicRouteData) -> list[tuple[str, int, int]]:
        out = []
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            bd = route.broker(qd.broker_name)
            if bd is None:
                continue
            writable = bd.master_addr() is not None
            for queue_id in range(max(qd.read_queue_nums, qd.write_queue_nums)):
                perm = 0
                if queue_id < qd.read_queue_nums:
                    perm |= qd.perm & 4
                if queue_id < qd.write_queue_nums and writable:
                    perm |= qd.perm & 2
                out.append((qd.broker_name, queue_id, perm))
        return out

    # ---- Heartbeat / NotifyClientTermination ------------------------------------------------------------
    async def Heartbeat(self, request: spb.HeartbeatRequest, context: Any) -> spb.HeartbeatResponse:
        denied = self._denied("Heartbeat", request, context)
        if denied is not None:
            return spb.HeartbeatResponse(status=denied)
        client_id = self._client_id(context)
        info = self._clients.setdefault(client_id, _ClientInfo())
        info.client_type = request.client_type
        if request.HasField("group") and request.group.name:
            info.group = request.group.name
        presence = self._presence(client_id, context)
        if presence is not None:
            self.presence.heartbeat_soon(presence)
        return spb.HeartbeatResponse(status=tr.status())

    async def NotifyClientTermination(self, request: spb.NotifyClientTerminationRequest,
                                      context: Any) -> spb.NotifyClientTerminationResponse:
        denied = self._denied("NotifyClientTermination", request, context)
        if denied is not None:
            return spb.NotifyClientTerminationResponse(status=denied)
        client_id = self._client_id(context)
        self._clients.pop(client_id, None)
        await self._release(client_id)
        await self.presence.forget(client_id)
        return spb.NotifyClientTerminationResponse(status=tr.status())

    # ---- Telemetry ---------------------------------------------------------------------------------------
    async def Telemetry(self, request_iterator: AsyncIterator[spb.TelemetryCommand],
                        context: Any) -> AsyncIterator[spb.TelemetryCommand]:
        """Answers the client's commands and carries the server's (transaction check-backs) on one stream:
        a reader task puts the answers into the client's outbox, which this generator drains."""
        client_id = self._client_id(context)
        outbox: asyncio.Queue[spb.TelemetryCommand | None] = asyncio.Queue(maxsize=TELEMETRY_OUTBOX_MAX)
        info = self._clients.setdefault(client_id, _ClientInfo())
        info.outbox = outbox
        info.telemetry_opened = True

        async def read() -> None:
            try:
                async for command in request_iterator:
                    answer = self._telemetry_answer(client_id, command, context)
                    if answer is not None:
                        await outbox.put(answer)
            except Exception as exc:  # the client went away
                log.debug("telemetry stream of %s ended: %s", client_id, exc)
            finally:
                await outbox.put(None)

        reader = asyncio.create_task(read(), name="ferrymq-grpc-telemetry")
        try:
            while (command := await outbox.get()) is not None:
                yield command
        finally:
            # first, before any await: grpc may cancel the handler again while it cleans up, and the client must
            # count as gone all the same (auto-renewal, check-backs and the presence sweep read it)
            current = self._clients.get(client_id)
            if current is not None and current.outbox is outbox:
                current.outbox = None
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    def _telemetry_answer(self, client_id: str, command: spb.TelemetryCommand,
                          context: Any) -> spb.TelemetryCommand | None:
        denied = self._denied("Telemetry", command, context)
        if denied is not None:
            return spb.TelemetryCommand(status=denied)
        which = command.WhichOneof("command")
        if which == "settings":
            answer = spb.TelemetryCommand(status=tr.status(), settings=self.settings_for(client_id, command.settings))
            presence = self._presence(client_id, context)
            info = self._clients.get(client_id)
            if presence is not None and info is not None:
                presence.group = info.group if command.settings.WhichOneof("pub_sub") == "subscription" else ""
                presence.subscriptions = dict(info.subscriptions)
                presence.topics = info.topics
                self.presence.heartbeat_soon(presence, force=True)
            return answer
        if which in ("thread_stack_trace", "verify_message_result"):
            log.debug("telemetry %s from %s ignored", which, client_id)
            return None
        return spb.TelemetryCommand(status=tr.status(pb.NOT_IMPLEMENTED, f"telemetry {which} not served"))

    def settings_for(self, client_id: str, settings: pb.Settings) -> pb.Settings:
        """The settings answer: the client's own, completed with what the server decides (retry policy,
        FIFO flag, batch size, limits), as RocketMQ's proxy does."""
        info = self._clients.setdefault(client_id, _ClientInfo())
        info.client_type = settings.client_type
        out = pb.Settings()
        out.CopyFrom(settings)
        if settings.WhichOneof("pub_sub") == "subscription":
            sub = settings.subscription
            group = sub.group.name
            info.group = group
            hooks = self._hooks(group)
            for entry in sub.subscriptions:
                expr = tr.filter_of(entry.expression)
                info.subscriptions[entry.topic.name] = expr
                hooks.topics[entry.topic.name] = expr
            fifo = group in self.config.fifo_groups
            out.subscription.fifo = fifo
            out.subscription.receive_batch_size = PUSH_RECEIVE_BATCH
            if not sub.HasField("long_polling_timeout"):
                out.subscription.long_polling_timeout.CopyFrom(tr.to_duration(DEFAULT_LONG_POLLING_MS))
            out.backoff_policy.max_attempts = self.config.max_delivery_attempts
            if fifo:
                backoff = out.backoff_policy.exponential_backoff
                backoff.initial.CopyFrom(tr.to_duration(1_000))
                backoff.max.CopyFrom(tr.to_duration(60_000))
                backoff.multiplier = 2.0
            else:
                levels = self.config.delay_levels_ms[FIRST_RETRY_DELAY_LEVEL - 1:] or self.config.delay_levels_ms
                out.backoff_policy.customized_backoff.next.extend(tr.to_duration(ms) for ms in levels)
        else:
            info.topics = frozenset(t.name for t in settings.publishing.topics)
            out.publishing.max_body_size = self.config.max_body_bytes
            out.publishing.validate_message_type = True
            out.backoff_policy.max_attempts = PRODUCER_MAX_ATTEMPTS
            backoff = out.backoff_policy.exponential_backoff
            backoff.initial.CopyFrom(tr.to_duration(PRODUCER_BACKOFF_INITIAL_MS))
            backoff.max.CopyFrom(tr.to_duration(PRODUCER_BACKOFF_MAX_MS))
            backoff.multiplier = PRODUCER_BACKOFF_MULTIPLIER
        return out

    # ---- SendMessage -------------------------------------------------------------------------------------
    async def SendMessage(self, request: spb.SendMessageRequest, context: Any) -> spb.SendMessageResponse:
        denied = self._denied("SendMessage", request, context)
        if denied is not None:
            return spb.SendMessageResponse(status=denied)
        if not request.messages:
            return spb.SendMessageResponse(status=tr.status(pb.BAD_REQUEST, "no message to send"))
        entries = [await self._send_one(m) for m in request.messages]
        codes = {e.status.code for e in entries}
        if len(entries) == 1 or len(codes) > 1:
            overall = entries[0].status if len(entries) == 1 else tr.status(pb.MULTIPLE_RESULTS, "see entries")
        else:
            overall = entries[0].status
        return spb.SendMessageResponse(status=overall, entries=entries)

    async def _send_one(self, message: pb.Message) -> spb.SendResultEntry:
        try:
            out = tr.to_remoting_message(message, now_ms=self.clock_ms(), producer_group=self.config.producer_group,
                                         max_body_bytes=self.config.max_body_bytes)
            queue = None
            if out.message_group is not None:
                mqs, _ = await self.producer.publish_queues(out.message.topic)
                queue = tr.fifo_queue(out.message_group, mqs)
            result = await self.producer.send(out.message, queue=queue)
        except Exception as exc:
            log.debug("send of %s failed: %s", message.system_properties.message_id, exc)
            return spb.SendResultEntry(status=tr.status_of_error(exc), message_id=message.system_properties.message_id)
        code = {SendStatus.SEND_OK: pb.OK, SendStatus.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
                SendStatus.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT,
                SendStatus.SLAVE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE}[result.status]
        entry = spb.SendResultEntry(status=tr.status(code, result.status.value), message_id=out.message_id,
                                    offset=result.queue_offset)
        if out.transactional:
            entry.transaction_id = tr.TransactionId(result.offset_msg_id, result.queue_offset).encode(
                self.tx_key, out.message.topic)
            await self._known_as_producer(result.offset_msg_id)
        elif out.deliver_ms is not None:  # a timer message: recallable until it is due (RecallMessage)
            entry.recall_handle = RecallHandle(out.message.topic, result.message_queue.broker_name, out.deliver_ms,
                                               out.message_id).encode()
        else:
            self._arrival(out.message.topic).set()
        return entry

    # ---- RecallMessage -----------------------------------------------------------------------------------
    async def RecallMessage(self, request: spb.RecallMessageRequest, context: Any) -> spb.RecallMessageResponse:
        """The broker's RECALL_MESSAGE (370) at the master of the broker group the handle names."""
        denied = self._denied("RecallMessage", request, context)
        if denied is not None:
            return spb.RecallMessageResponse(status=denied)
        topic = request.topic.name
        try:
            try:
                handle = RecallHandle.decode(request.recall_handle)
            except ValueError as exc:
                raise tr.TranslateError(pb.BAD_REQUEST, str(exc)) from None
            addrs = routes.broker_table(await self._route(topic)).get(handle.broker_name) or {}
            addr = addrs.get(MASTER_ID)
            if addr is None:
                raise tr.TranslateError(pb.NOT_FOUND, f"broker group {handle.broker_name} of the handle has no "
                                                      f"master serving topic {topic}")
            cmd = RemotingCommand.request(RequestCode.RECALL_MESSAGE, {
                "producerGroup": self.config.producer_group, "topic": topic,
                "recallHandle": request.recall_handle})
            resp = api.check(await self.instance.invoke(addr, cmd, REMOTING_TIMEOUT_MS))
        except Exception as exc:
            log.debug("RecallMessage of topic %s failed: %s", topic, exc)
            return spb.RecallMessageResponse(status=tr.status_of_error(exc))
        return spb.RecallMessageResponse(status=tr.status(), message_id=resp.ext_fields.get("msgId") or
                                         handle.message_id)

    # ---- transactions ------------------------------------------------------------------------------------
    async def _known_as_producer(self, offset_msg_id: str) -> None:
        """The broker asks a live producer of the half message's group (the proxy's) about undecided ones:
        be known to the broker that stored it now, not at the next periodic heartbeat."""
        ip, port, _ = decode_offset_msg_id(offset_msg_id)
        addr = f"{ip}:{port}"
        if addr not in self._heartbeated:
            await self.instance.send_heartbeats()
            self._heartbeated.add(addr)

    async def EndTransaction(self, request: spb.EndTransactionRequest,
                             context: Any) -> spb.EndTransactionResponse:
        denied = self._denied("EndTransaction", request, context)
        if denied is not None:
            return spb.EndTransactionResponse(status=denied)
        try:
            tid = tr.TransactionId.decode(request.transaction_id, self.tx_key, request.topic.name)
            kind = TRANSACTION_END_KIND.get(request.resolution)
            if kind is None:
                raise tr.TranslateError(pb.BAD_REQUEST,
                                        "resolution must be COMMIT or ROLLBACK")
            ip, port, phy_offset = decode_offset_msg_id(tid.offset_msg_id)
            cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, {
                "producerGroup": self.config.producer_group, "tranStateTableOffset": tid.queue_offset,
                "commitLogOffset": phy_offset, "commitOrRollback": kind,
                "fromTransactionCheck": "true" if request.source == pb.SOURCE_SERVER_CHECK else "false",
                "msgId": request.message_id, "transactionId": request.message_id})
            api.check(await self.instance.invoke(f"{ip}:{port}", cmd, REMOTING_TIMEOUT_MS))
        except Exception as exc:
            log.debug("EndTransaction %s failed: %s", request.transaction_id, exc)
            return spb.EndTransactionResponse(status=tr.status_of_error(exc))
        if kind == SYSFLAG_TRANSACTION_COMMIT:
            self._arrival(request.topic.name).set()
        return spb.EndTransactionResponse(status=tr.status())

    def _on_check_transaction(self, conn: Any, cmd: RemotingCommand) -> None:
        """CHECK_TRANSACTION_STATE from a broker about a half message sent through this proxy: asked of a
        5.x producer publishing its topic, over that client's Telemetry stream
        (RecoverOrphanedTransactionCommand); its EndTransaction answer settles it. No such producer: the
        broker asks again at its next check round."""
        try:
            half = decode_record(cmd.body)
        except RecordFormatError as exc:
            log.warning("CHECK_TRANSACTION_STATE with an unreadable message: %s", exc)
            return None
        message = tr.half_to_grpc_message(half)
        topic = message.topic.name
        try:
            queue_offset = int(cmd.ext_fields.get("tranStateTableOffset", half.queue_offset))
        except ValueError:
            return None
        tid = tr.TransactionId(cmd.ext_fields.get("offsetMsgId") or half.offset_msg_id, queue_offset)
        command = spb.TelemetryCommand(recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
            message=message, transaction_id=tid.encode(self.tx_key, topic)))
        candidates = [c for c in self._clients.values() if c.outbox is not None and topic in c.topics]
        if not candidates:
            log.info("no 5.x producer of topic %s connected to ask about half message %s", topic,
                     message.system_properties.message_id)
            return None
        client = candidates[queue_offset % len(candidates)]
        assert client.outbox is not None
        try:
            client.outbox.put_nowait(command)
        except asyncio.QueueFull:
            log.info("telemetry stream full: check-back of %s not sent", message.system_properties.message_id)
        return None

    # ---- QueryAssignment ---------------------------------------------------------------------------------
    async def QueryAssignment(self, request: spb.QueryAssignmentRequest,
                              context: Any) -> spb.QueryAssignmentResponse:
        """One assignment per broker group with readable queues (a ReceiveMessage pops from every queue of
        its broker group, as RocketMQ's proxy does)."""
        denied = self._denied("QueryAssignment", request, context)
        if denied is not None:
            return spb.QueryAssignmentResponse(status=denied)
        topic = request.topic.name
        try:
            route = await self._route(topic)
        except TopicNotExistError:
            return spb.QueryAssignmentResponse(status=tr.status(pb.TOPIC_NOT_FOUND, f"topic {topic} does not exist"))
        except FerryError as exc:
            return spb.QueryAssignmentResponse(status=tr.status_of_error(exc))
        endpoints = request.endpoints if len(request.endpoints.addresses) else self.own_endpoints(context)
        brokers = sorted({mq.broker_name for mq in routes.subscribe_queues(topic, route)})
        assignments = [pb.Assignment(message_queue=pb.MessageQueue(
            topic=request.topic, id=-1, permission=pb.READ_WRITE,  # type: ignore[arg-type]
            broker=pb.Broker(name=name, id=0, endpoints=endpoints),
            accept_message_types=tr.ACCEPTED_MESSAGE_TYPES)) for name in brokers]  # type: ignore[arg-type]
        return spb.QueryAssignmentResponse(status=tr.status(), assignments=assignments)

    # ---- ReceiveMessage ------------------------------------------------------------------------------------
    async def ReceiveMessage(self, request: spb.ReceiveMessageRequest,
                             context: Any) -> AsyncIterator[spb.ReceiveMessageResponse]:
        group, topic = request.group.name, request.message_queue.topic.name
        broker_name = request.message_queue.broker.name
        denied = self._denied("ReceiveMessage", request, context)
        if denied is not None:
            yield spb.ReceiveMessageResponse(status=denied)
            return
        if not group:
            yield spb.ReceiveMessageResponse(status=tr.status(pb.ILLEGAL_CONSUMER_GROUP, "consumer group is empty"))
            return
        client_id = self._client_id(context)
        auto_renew = request.auto_renew and bool(client_id)
        if auto_renew:  # as RocketMQ's proxy: the requested duration is replaced by the auto-renew one
            invisible_ms = self.config.auto_renew_invisible_ms
        elif request.HasField("invisible_duration"):
            invisible_ms = tr.duration_ms(request.invisible_duration)
        else:
            invisible_ms = DEFAULT_INVISIBLE_MS
        if invisible_ms <= 0:
            yield spb.ReceiveMessageResponse(status=tr.status(pb.ILLEGAL_INVISIBLE_TIME, "invisible duration <= 0"))
            return
        poll_ms = (tr.duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout")
                   else DEFAULT_LONG_POLLING_MS)
        remaining = context.time_remaining()
        if remaining is not None:
            poll_ms = min(poll_ms, max(0, int(remaining * 1000) - DEADLINE_MARGIN_MS))
        batch = max(1, min(request.batch_size or MAX_RECEIVE_BATCH, MAX_RECEIVE_BATCH))
        expression = tr.filter_of(request.filter_expression if request.HasField("filter_expression") else None)
        self._hooks(group).topics.setdefault(topic, expression)
        try:
            deliveries = await self._receive(group, topic, broker_name, request.message_queue.id, batch,
                                             invisible_ms, poll_ms, expression)
        except Exception as exc:
            log.debug("receive %s/%s failed: %s", group, topic, exc)
            yield spb.ReceiveMessageResponse(status=tr.status_of_error(exc))
            return
        if not deliveries:
            yield spb.ReceiveMessageResponse(status=tr.status(pb.MESSAGE_NOT_FOUND, "no new message"))
            return
        if auto_renew:
            now = self.clock_ms()
            for key, delivery in deliveries:
                self.renewals.add(client_id, key, delivery.entry.message.queue_offset, delivery.serial, now_ms=now,
                                  visible_at_ms=delivery.entry.visible_at_ms)
        answered = False
        try:
            yield spb.ReceiveMessageResponse(status=tr.status())
            yield spb.ReceiveMessageResponse(delivery_timestamp=tr.to_timestamp(self.clock_ms()))
            for key, delivery in deliveries:
                handle = tr.ReceiptHandle(self.epoch, delivery.serial, key[3], delivery.entry.message.queue_offset,
                                          key[2]).encode()
                response = spb.ReceiveMessageResponse()
                tr.to_grpc_message(delivery.entry.message, receipt_handle=handle, invisible_ms=invisible_ms,
                                   delivery_attempt=delivery.attempt, into=response.message)
                yield response
            answered = True
        finally:
            if auto_renew and not answered:  # the call broke off: the client may not hold these messages
                for key, delivery in deliveries:
                    self.renewals.discard(key, delivery.entry.message.queue_offset)

    async def _readable_queue_ids(self, topic: str, broker_name: str) -> list[int]:
        """The readable queue ids of ``topic`` on ``broker_name``, worked out once per route the client
        instance holds (a refreshed route is a new object)."""
        route = await self._route(topic)
        cached = self._queue_ids.get((topic, broker_name))
        if cached is not None and cached[0] is route:
            return cached[1]
        ids = [mq.queue_id for mq in routes.subscribe_queues(topic, route) if mq.broker_name == broker_name]
        self._queue_ids[(topic, broker_name)] = (route, ids)
        if not ids:
            raise tr.TranslateError(pb.TOPIC_NOT_FOUND, f"topic {topic} has no readable queue on {broker_name}")
        return ids

    async def _pop_queue(self, key: PopKey) -> PopQueue:
        pq = self.pop_queues.get(key)
        if pq is not None:
            return pq
        async with self._lock(key):
            pq = self.pop_queues.get(key)
            if pq is None:
                group, topic, broker_name, queue_id = key
                mq = RemotingQueue(topic, broker_name, queue_id)
                core = self._core(group)
                start = await core.fetch_committed_offset(mq)
                if start < 0:  # a new group reads the queue from its first message
                    start = await core.query_offset(RequestCode.GET_MIN_OFFSET, mq)
                pq = self.pop_queues[key] = PopQueue(start, fifo=group in self.config.fifo_groups)
            return pq

    def _lock(self, key: PopKey) -> asyncio.Lock:
        lock = self._pop_locks.get(key)
        if lock is None:
            lock = self._pop_locks[key] = asyncio.Lock()
        return lock

    async def _fill(self, key: PopKey, pq: PopQueue, expression: tuple[str, str], *, block_ms: int = 0,
                    prefetch: bool = False) -> None:
        """Pull more of the queue when nothing held is ready (``block_ms``: a broker long poll); ``prefetch``:
        when fewer than PREFETCH_LOW_WATERMARK never-delivered messages are held."""
        failures = self._pull_failures.get(key[2], 0)
        if pq.failures_seen != failures:  # a pull from the queue's broker failed since its offset was written
            pq.failures_seen = failures
            pq.recommit()
            self._dirty.add(key)
        lock = self._lock(key)
        if lock.locked() and block_ms == 0:
            return  # another receive is pulling this queue
        async with lock:
            now = self.clock_ms()
            if pq.room() <= 0 or pq.blocked(now) or (pq.fresh >= PREFETCH_LOW_WATERMARK if prefetch
                                                     else pq.has_ready(now)):
                return
            mq = RemotingQueue(key[1], key[2], key[3])
            try:
                result = await self._core(key[0]).pull(
                    mq, pq.pull_offset, min(PULL_BATCH, pq.room()), sub_expression=expression[0],
                    expression_type=expression[1], block=block_ms > 0, suspend_timeout_ms=block_ms,
                    timeout_ms=block_ms + REMOTING_TIMEOUT_MS)
            except Exception:  # the broker may be restarting or failing over: it may lose the last offsets
                self._pull_failures[key[2]] = self._pull_failures.get(key[2], 0) + 1
                raise
            if result.status is PullStatus.FOUND:
                pq.add_pulled(result.messages, result.next_begin_offset)
                self._arrival(key[1]).set()  # a receive waiting while this pull ran looks again
            elif result.status is PullStatus.OFFSET_ILLEGAL:
                if result.max_offset < pq.pull_offset:  # the queue got shorter: another broker took over
                    pq.rewind(result.max_offset)
                else:
                    pq.reset_pull_offset(result.next_begin_offset)
                self._dirty.add(key)
            elif result.next_begin_offset > pq.pull_offset:  # filtered out: progress all the same
                pq.add_pulled([], result.next_begin_offset)
                self._dirty.add(key)

    def _prefetch(self, key: PopKey, pq: PopQueue, expression: tuple[str, str]) -> None:
        """Pull the next batch of a queue in the background while the client works on this one, so the next
        receive finds messages held instead of waiting for a broker round trip."""
        if key in self._prefetching or pq.fresh >= PREFETCH_LOW_WATERMARK or pq.room() <= 0 or self._closing:
            return
        self._prefetching.add(key)

        async def run() -> None:
            try:
                await self._fill(key, pq, expression, prefetch=True)
            except Exception as exc:  # the next receive pulls again
                log.debug("prefetch of %s failed: %s", key, exc)
            finally:
                self._prefetching.discard(key)

        self._tasks.append(asyncio.create_task(run(), name="ferrymq-grpc-prefetch"))

    async def _receive(self, group: str, topic: str, broker_name: str, start_queue_id: int, batch: int,
                       invisible_ms: int, poll_ms: int,
                       expression: tuple[str, str]) -> list[tuple[PopKey, Any]]:
        ids = await self._readable_queue_ids(topic, broker_name)
        first = start_queue_id if start_queue_id in ids else ids[0]
        pivot = ids.index(first)
        ids = ids[pivot:] + ids[:pivot]
        deadline = self.clock_ms() + poll_ms
        arrival = self._arrival(topic)
        while True:
            arrival.clear()
            out: list[tuple[PopKey, Any]] = []
            for queue_id in ids:
                key = (group, topic, broker_name, queue_id)
                pq = await self._pop_queue(key)
                await self._fill(key, pq, expression)
                taken, dead = pq.take(self.clock_ms(), batch - len(out), invisible_ms,
                                      self.config.max_delivery_attempts, self.serials)
                out.extend((key, d) for d in taken)
                if taken:
                    self._prefetch(key, pq, expression)
                for d in taken:
                    if d.attempt >= self.config.max_delivery_attempts:
                        heapq.heappush(self._last_attempts, (d.entry.visible_at_ms, d.serial, key,
                                                             d.entry.message.queue_offset))
                for entry in dead:
                    self._tasks.append(asyncio.create_task(self._to_dead_letter(key, entry.message.queue_offset)))
                if len(out) >= batch:
                    break
            if out:
                return out
            now = self.clock_ms()
            if now >= deadline or self._closing:
                return out
            wait_ms = min(deadline - now, RECEIVE_POLL_SLICE_MS)
            for queue_id in ids:
                due = self.pop_queues[(group, topic, broker_name, queue_id)].next_visible_ms()
                if due is not None:
                    wait_ms = max(1, min(wait_ms, due - now))
            key = (group, topic, broker_name, ids[0])
            pq = self.pop_queues[key]
            if not self._lock(key).locked() and pq.room() > 0 and not pq.blocked(now):
                long_poll = asyncio.ensure_future(self._fill(key, pq, expression, block_ms=wait_ms))
                woken = asyncio.ensure_future(arrival.wait())
                try:
                    await asyncio.wait({long_poll, woken}, timeout=(wait_ms + REMOTING_TIMEOUT_MS) / 1000,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (long_poll, woken):
                        task.cancel()
                    await asyncio.gather(long_poll, woken, return_exceptions=True)
            else:
                await wait_event(arrival, wait_ms / 1000)

    # ---- AckMessage / ChangeInvisibleDuration / ForwardMessageToDeadLetterQueue ---------------------------------
    def _held(self, group: str, topic: str, handle_text: str) -> tuple[PopKey, PopQueue, tr.ReceiptHandle]:
        handle = tr.ReceiptHandle.decode(handle_text)
        if handle.epoch != self.epoch:
            raise tr.TranslateError(pb.INVALID_RECEIPT_HANDLE,
                                    "receipt handle of an earlier proxy run (the message is delivered again)")
        key = (group, topic, handle.broker_name, handle.queue_id)
        pq = self.pop_queues.get(key)
        if pq is None:
            raise tr.TranslateError(pb.INVALID_RECEIPT_HANDLE, "receipt handle names no queue of this group")
        return key, pq, handle

    async def AckMessage(self, request: spb.AckMessageRequest, context: Any) -> spb.AckMessageResponse:
        denied = self._denied("AckMessage", request, context)
        if denied is not None:
            return spb.AckMessageResponse(status=denied)
        group, topic = request.group.name, request.topic.name
        results = []
        for entry in request.entries:
            try:
                key, pq, handle = self._held(group, topic, entry.receipt_handle)
                if not pq.ack(handle.queue_offset, handle.serial):
                    raise tr.TranslateError(pb.INVALID_RECEIPT_HANDLE,
                                            "receipt handle expired (acknowledged already or delivered again)")
                self.renewals.discard(key, handle.queue_offset)
                self._dirty.add(key)
                st = tr.status()
            except tr.TranslateError as exc:
                st = tr.status_of_error(exc)
            results.append(spb.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                                     status=st))
        return spb.AckMessageResponse(status=self._overall([r.status for r in results]), entries=results)

    @staticmethod
    def _overall(statuses: list[pb.Status]) -> pb.Status:
        if not statuses:
            return tr.status(pb.BAD_REQUEST, "no entry")
        if len(statuses) == 1 or all(s.code == pb.OK for s in statuses):
            return statuses[0]
        return tr.status(pb.MULTIPLE_RESULTS, "see entries")

    async def ChangeInvisibleDuration(self, request: spb.ChangeInvisibleDurationRequest,
                                      context: Any) -> spb.ChangeInvisibleDurationResponse:
        denied = self._denied("ChangeInvisibleDuration", request, context)
        if denied is not None:
            return spb.ChangeInvisibleDurationResponse(status=denied)
        try:
            key, pq, handle = self._held(request.group.name, request.topic.name, request.receipt_handle)
            duration = tr.duration_ms(request.invisible_duration)
            if duration < 0:
                raise tr.TranslateError(pb.ILLEGAL_INVISIBLE_TIME, "invisible duration < 0")
            serial = pq.change_invisible(handle.queue_offset, handle.serial, self.clock_ms() + duration, self.serials)
            if serial is None:
                raise tr.TranslateError(pb.INVALID_RECEIPT_HANDLE,
                                        "receipt handle expired (acknowledged already or delivered again)")
        except tr.TranslateError as exc:
            return spb.ChangeInvisibleDurationResponse(status=tr.status_of_error(exc))
        self.renewals.discard(key, handle.queue_offset)  # the client decides its invisible time from now on
        entry = pq.entries[handle.queue_offset]
        if entry.attempt >= self.config.max_delivery_attempts:
            heapq.heappush(self._last_attempts, (entry.visible_at_ms, serial, key, handle.queue_offset))
        new_handle = tr.ReceiptHandle(self.epoch, serial, handle.queue_id, handle.queue_offset, handle.broker_name)
        return spb.ChangeInvisibleDurationResponse(status=tr.status(), receipt_handle=new_handle.encode())

    async def ForwardMessageToDeadLetterQueue(self, request: spb.ForwardMessageToDeadLetterQueueRequest,
                                              context: Any) -> spb.ForwardMessageToDeadLetterQueueResponse:
        denied = self._denied("ForwardMessageToDeadLetterQueue", request, context)
        if denied is not None:
            return spb.ForwardMessageToDeadLetterQueueResponse(status=denied)
        try:
            key, pq, handle = self._held(request.group.name, request.topic.name, request.receipt_handle)
            entry = pq.entries.get(handle.queue_offset)
            if entry is None or entry.serial != handle.serial:
                raise tr.TranslateError(pb.INVALID_RECEIPT_HANDLE, "receipt handle expired")
            await self._to_dead_letter(key, handle.queue_offset, raise_errors=True)
        except Exception as exc:
            return spb.ForwardMessageToDeadLetterQueueResponse(status=tr.status_of_error(exc))
        return spb.ForwardMessageToDeadLetterQueueResponse(status=tr.status())

    async def _to_dead_letter(self, key: PopKey, queue_offset: int, *, raise_errors: bool = False) -> None:
        """Move a held message to ``%DLQ%<group>`` (the broker's CONSUMER_SEND_MSG_BACK with delay level -1)
        and forget it; on failure it stays held and is offered again after its invisible time."""
        pq = self.pop_queues.get(key)
        entry = pq.entries.get(queue_offset) if pq is not None else None
        if pq is None or entry is None:
            return
        group, _, broker_name, _ = key
        msg = entry.message
        try:
            addr = self.instance.master_addr(broker_name)
            if addr is None:
                raise tr.TranslateError(pb.INTERNAL_SERVER_ERROR, f"broker {broker_name} has no master")
            cmd = api.build_send_back(group=group, phy_offset=msg.phy_offset, delay_level=-1,
                                      origin_msg_id=tr.message_id_of(msg), origin_topic=msg.topic,
                                      max_reconsume_times=self.config.max_delivery_attempts)
            api.check(await self.instance.invoke(addr, cmd, REMOTING_TIMEOUT_MS))
        except Exception as exc:
            log.warning("moving %s offset %d to the dead-letter queue failed: %s", key, queue_offset, exc)
            if raise_errors:
                raise
            return
        pq.remove(queue_offset)
        self.renewals.discard(key, queue_offset)
        self._dirty.add(key)

    # ---- offsets ---------------------------------------------------------------------------------------------
    async def commit_offsets(self) -> None:
        """Write each changed queue's acknowledged progress as the group's consumer offset."""
        dirty, self._dirty = self._dirty, set()
        for key in dirty:
            pq = self.pop_queues.get(key)
            if pq is None:
                continue
            offset = pq.commit_offset()
            if offset == pq.committed_offset:
                continue
            group, topic, broker_name, queue_id = key
            try:
                await self._core(group).commit_offset(RemotingQueue(topic, broker_name, queue_id), offset)
            except Exception as exc:
                log.debug("offset commit of %s failed: %s", key, exc)
                self._dirty.add(key)
                continue
            pq.committed_offset = offset

    def _sweep_dead(self) -> None:
        """Move last attempts that expired unacknowledged to the dead-letter queue."""
        now = self.clock_ms()
        heap = self._last_attempts
        while heap and heap[0][0] <= now:
            _, serial, key, queue_offset = heapq.heappop(heap)
            pq = self.pop_queues.get(key)
            entry = pq.entries.get(queue_offset) if pq is not None else None
            if entry is None or entry.serial != serial:
                continue  # acknowledged, or its invisible time changed since
            if entry.visible_at_ms > now:  # renewed (auto_renew) since: due later
                heapq.heappush(heap, (entry.visible_at_ms, serial, key, queue_offset))
                continue
            entry.visible_at_ms = now + DEAD_LETTER_RETRY_MS  # not offered again while it moves
            self._tasks.append(asyncio.create_task(self._to_dead_letter(key, queue_offset)))

    async def _commit_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.config.offset_commit_interval_ms / 1000)
            self._sweep_dead()
            for client_id in await self.presence.sweep():
                info = self._clients.get(client_id)
                if info is not None and info.outbox is None:
                    del self._clients[client_id]
                    await self._release(client_id)
            try:
                await self.commit_offsets()
            except Exception as exc:
                log.warning("offset commit round failed: %s", exc)
            self._tasks = [t for t in self._tasks if not t.done()]

    # ---- auto-renewal (ReceiveMessage auto_renew) ----------------------------------------------------------------
    def _entry(self, key: PopKey, queue_offset: int) -> PopEntry | None:
        pq = self.pop_queues.get(key)
        return pq.entries.get(queue_offset) if pq is not None else None

    def _client_alive(self, client_id: str) -> bool:
        """Known (not terminated, not expired) and, once it opened a Telemetry stream, holding one open: a live
        5.x client keeps its stream open, a killed one's closes with its connection."""
        info = self._clients.get(client_id)
        return info is not None and (info.outbox is not None or not info.telemetry_opened)

    async def _release(self, client_id: str) -> None:
        """The client ended or went silent: its auto-renewed messages become visible again shortly."""
        total, more = 0, True
        while more:
            released, more = self.renewals.release_client(client_id, self.clock_ms(), self._entry)
            total += released
            if more:
                await asyncio.sleep(0)  # a bounded round at a time
        if total:
            log.info("%d auto-renewed messages of 5.x client %s released", total, client_id)

    def renew_due(self) -> bool:
        """Renew the auto-renewed messages due now, one bounded round; True when more are due."""
        return self.renewals.run_due(self.clock_ms(), self._entry, self._client_alive).more

    async def _renew_loop(self) -> None:
        while not self._closing:
            if self.renew_due():
                await asyncio.sleep(0)  # more are due: let other work run between rounds
                continue
            due = self.renewals.next_due_ms()
            wait_ms = RENEW_LOOP_MAX_SLEEP_MS if due is None else max(1, min(RENEW_LOOP_MAX_SLEEP_MS,
                                                                              due - self.clock_ms()))
            await asyncio.sleep(wait_ms / 1000)
