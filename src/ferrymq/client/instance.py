"""The per-client hub (like RocketMQ's MQClientInstance): name servers, routes, heartbeats, connections.

* Name servers: a sticky choice, moving to the next address when a call fails at the transport level
  (connect failure, closed connection, timeout). An answer carrying a code is never retried elsewhere.
* Routes: cached per topic, refreshed every ``poll_name_server_interval_ms`` and at once after a
  connection to a broker drops.
* Heartbeats every ``heartbeat_broker_interval_ms``: producer-only clients to masters, clients with
  consumers to every broker address (slaves too).
* Connections: one per address (``ConnectionPool``); a failed connect to an address blocks new attempts
  for a capped exponential backoff with jitter, so callers fail fast and move on.
* Broker → client requests: NOTIFY_CONSUMER_IDS_CHANGED (rebalance now), GET_CONSUMER_RUNNING_INFO
  (answered), RESET_CONSUMER_CLIENT_OFFSET, PUSH_REPLY_MESSAGE_TO_CLIENT (``request_reply.ReplyWaiters``).
* ``close()`` sends UNREGISTER_CLIENT for every group to every broker it heartbeats.
* Shared by producers (``acquire_shared`` / ``release_shared``): producers of one process and event loop
  that give the same ``instance_name`` with equal options use one started instance, as RocketMQ's Java
  producers with one ``instanceName`` share one ``MQClientInstance``: one connection per broker for all of
  them, so their requests and the broker's answers travel together (fewer writes and reads per message).
  The last producer to close closes the instance; an earlier one unregisters only its group.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from ferrymq.client import api, routes
from ferrymq.client.config import CLIENT_LANGUAGE, CLIENT_VERSION, ClientConfig
from ferrymq.client.jsonmq import dumps_mq_keys
from ferrymq.client.request_reply import ReplyWaiters
from ferrymq.common.aio import wait_event
from ferrymq.common.route import MASTER_ID, MessageQueue, TopicRouteData
from ferrymq.errors import ClientError, ConnectError, RemotingError, TopicNotExistError
from ferrymq.remoting import jsonx, signature
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection
from ferrymq.remoting.pool import ConnectionPool

if TYPE_CHECKING:
    from ferrymq.client.producer import Producer

log = logging.getLogger(__name__)

#: Timeout of the UNREGISTER_CLIENT calls made while closing.
UNREGISTER_TIMEOUT_MS = 1_000
#: Producer group of the instance's internal producer (consumers re-send failed messages through it).
CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
#: route poll period while a broker whose connection dropped is still listed by the name server
DOWN_BROKER_ROUTE_RETRY_MS = 1_000


class ConsumerHooks(Protocol):
    """What a consumer registers with its instance."""

    group: str

    def consumer_data(self) -> dict[str, Any]: ...
    def subscribed_topics(self) -> set[str]: ...
    def rebalance_now(self) -> None: ...
    def running_info(self) -> dict[str, Any]:
        """ConsumerRunningInfo; a dict keyed by MessageQueue (``mqTable``) is written in fastjson's shape."""
    def reset_offsets(self, topic: str, offsets: dict[MessageQueue, int]) -> Awaitable[None]: ...


#: How long close() keeps cancelling background tasks before giving up on them.
TASK_CANCEL_TIMEOUT_S = 5.0
_CANCEL_RETRY_S = 0.05


async def cancel_and_wait(tasks: list[asyncio.Task[Any]], timeout_s: float = TASK_CANCEL_TIMEOUT_S) -> None:
    """Cancel tasks and wait for them, cancelling again while they run: on Python 3.11 ``wait_for`` can
    swallow a cancellation that races with its inner future finishing."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = {t for t in tasks if not t.done()}
    while pending and loop.time() < deadline:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=_CANCEL_RETRY_S)
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: no "exception was never retrieved" noise
    if pending:
        log.warning("%d background tasks did not stop within %.1f s", len(pending), timeout_s)


class Backoff:
    """Capped exponential backoff with full jitter (in ms)."""

    def __init__(self, base_ms: int, max_ms: int) -> None:
        self.base_ms = base_ms
        self.max_ms = max_ms
        self.attempts = 0

    def next_delay_ms(self) -> float:
        self.attempts += 1
        cap = min(self.max_ms, self.base_ms * (2 ** min(self.attempts - 1, 20)))
        return cap / 2 + random.random() * cap / 2

    def reset(self) -> None:
        self.attempts = 0


class ClientInstance:
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.client_id = config.client_id
        self.pool = ConnectionPool(connect_timeout_ms=config.connect_timeout_ms, on_close=self._on_conn_closed,
                                   ssl_context=config.tls.context() if config.tls is not None else None)
        self.name_servers = list(config.name_servers)
        self._ns_index = random.randrange(len(self.name_servers))
        self.routes: dict[str, TopicRouteData] = {}
        self.broker_addrs: dict[str, dict[int, str]] = {}
        self.producer_groups: set[str] = set()
        #: transactional producers by group (CHECK_TRANSACTION_STATE is answered by the group's producer)
        self.transaction_checkers: dict[str, Any] = {}
        self.consumers: dict[str, ConsumerHooks] = {}
        self._backoff: dict[str, tuple[Backoff, float]] = {}
        #: one connect attempt per address at a time (see ``connection``)
        self._connect_locks: dict[str, asyncio.Lock] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._refresh_now = asyncio.Event()
        #: broker addresses whose connection dropped or failed while a route still lists them
        self._down_brokers: set[str] = set()
        self._route_locks: dict[str, asyncio.Lock] = {}
        self._inner_producer: Producer | None = None
        self.started = False
        self.closing = False
        d = self.pool.dispatcher
        d.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_ids_changed)
        d.register(RequestCode.GET_CONSUMER_RUNNING_INFO, self._on_running_info)
        d.register(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, self._on_reset_offset)
        d.register(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, self._on_consumer_status)
        #: requests of ``Producer.request`` waiting for their reply
        self.replies = ReplyWaiters()
        d.register(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, self.replies.on_push)

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.started:
            return
        self.started = True
        self._tasks = [
            asyncio.create_task(self._route_loop(), name="ferrymq-route"),
            asyncio.create_task(self._heartbeat_loop(), name="ferrymq-heartbeat"),
        ]

    async def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.replies.fail_all(ClientError("client closed while waiting for a reply"))
        self._refresh_now.set()
        await cancel_and_wait(self._tasks)
        await self._unregister_all()
        await self.pool.close()

    async def _unregister_all(self) -> None:
        calls = []
        for group in self.producer_groups:
            for addr in self.heartbeat_addrs(masters_only=True):
                calls.append(self._quiet_invoke(addr, api.build_unregister(self.client_id, producer_group=group)))
        for group in self.consumers:
            for addr in self.heartbeat_addrs(masters_only=False):
                calls.append(self._quiet_invoke(addr, api.build_unregister(self.client_id, consumer_group=group)))
        if calls:
            await asyncio.gather(*calls)

    async def unregister_producer(self, group: str) -> None:
        """A producer of ``group`` stops using this (shared) instance that lives on: leave the group out of the
        heartbeats and send UNREGISTER_CLIENT for it to the masters (best effort)."""
        self.producer_groups.discard(group)
        calls = [self._quiet_invoke(addr, api.build_unregister(self.client_id, producer_group=group))
                 for addr in self.heartbeat_addrs(masters_only=True)]
        if calls:
            await asyncio.gather(*calls)

    async def _quiet_invoke(self, addr: str, cmd: RemotingCommand) -> None:
        try:
            await self.invoke(addr, cmd, UNREGISTER_TIMEOUT_MS)
        except Exception as exc:  # best effort at shutdown
            log.debug("unregister at %s failed: %s", addr, exc)

    def inner_producer(self) -> Producer:
        """The instance's internal producer (group ``CLIENT_INNER_PRODUCER``), created on first use; it
        shares this instance's connections and routes and stops with it."""
        if self._inner_producer is None:
            from ferrymq.client.producer import Producer

            self._inner_producer = Producer.bound_to(self, CLIENT_INNER_PRODUCER_GROUP)
        return self._inner_producer

    # ---- transport -----------------------------------------------------------------------------------
    def _stamp(self, cmd: RemotingCommand) -> RemotingCommand:
        cmd.language = CLIENT_LANGUAGE
        cmd.version = CLIENT_VERSION
        if self.config.access_key:
            signature.sign(cmd.ext_fields, cmd.body, self.config.access_key, self.config.secret_key)
        return cmd

    async def connection(self, addr: str) -> Connection:
        """The open connection to ``addr``, connecting if needed; ConnectError while its backoff runs.

        One attempt per address at a time: callers that arrive while an attempt is under way wait for
        it and then read its outcome (the open connection, or the backoff it set), so each refused
        connect counts as one failure and the backoff state is only changed by the caller that tried."""
        lock = self._connect_locks.get(addr)
        if lock is None:
            lock = self._connect_locks[addr] = asyncio.Lock()
        async with lock:
            conn = self.pool.open_connection(addr)
            if conn is None:
                entry = self._backoff.get(addr)
                if entry is not None and time.monotonic() < entry[1]:
                    raise ConnectError(f"cannot connect to {addr}: backing off after a failed attempt")
                try:
                    conn = await self.pool.get(addr)
                except ConnectError:
                    backoff = entry[0] if entry else Backoff(self.config.reconnect_backoff_base_ms,
                                                             self.config.reconnect_backoff_max_ms)
                    self._backoff[addr] = (backoff, time.monotonic() + backoff.next_delay_ms() / 1000)
                    self._note_broker_down(addr)
                    raise
            self._backoff.pop(addr, None)
            self._down_brokers.discard(addr)
            return conn

    def ready_connection(self, addr: str) -> Connection | None:
        """The open connection to ``addr`` when using it needs no bookkeeping (no backoff entry, not marked
        down), else None: then ``await connection(addr)``, which connects and updates that state."""
        if addr in self._backoff or addr in self._down_brokers:
            return None
        return self.pool.open_connection(addr)

    def is_suspect(self, addr: str) -> bool:
        """True while the last attempt to reach ``addr`` failed (its reconnect backoff is running)."""
        return addr in self._backoff

    def _is_broker_addr(self, addr: str) -> bool:
        return any(addr in addrs.values() for addrs in self.broker_addrs.values())

    def _note_broker_down(self, addr: str) -> None:
        if self.closing or not self._is_broker_addr(addr):
            return
        self._down_brokers.add(addr)
        self._refresh_now.set()

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int | None = None) -> RemotingCommand:
        conn = self.ready_connection(addr)
        if conn is None:
            conn = await self.connection(addr)
        return await conn.invoke(self._stamp(cmd), timeout_ms or self.config.request_timeout_ms)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        conn = await self.connection(addr)
        conn.invoke_oneway(self._stamp(cmd))

    async def invoke_namesrv(self, cmd: RemotingCommand, timeout_ms: int | None = None) -> RemotingCommand:
        """Sticky name server choice; move on (and retry) only on transport failures."""
        last: RemotingError | None = None
        for _ in range(len(self.name_servers)):
            addr = self.name_servers[self._ns_index % len(self.name_servers)]
            try:
                return await self.invoke(addr, cmd, timeout_ms)
            except RemotingError as exc:
                last = exc
                self._ns_index += 1
                log.info("name server %s failed (%s); trying the next one", addr, exc)
        assert last is not None
        raise last

    async def invoke_all_namesrv(self, cmd_factory: Callable[[], RemotingCommand],
                                 timeout_ms: int | None = None) -> list[RemotingCommand | BaseException]:
        async def one(addr: str) -> RemotingCommand:
            return await self.invoke(addr, cmd_factory(), timeout_ms)
        return list(await asyncio.gather(*(one(a) for a in self.name_servers), return_exceptions=True))

    def _on_conn_closed(self, addr: str, conn: Connection) -> None:
        if self.closing:
            return
        if self._is_broker_addr(addr):
            log.info("connection to broker %s dropped; refreshing routes", addr)
            self._note_broker_down(addr)

    # ---- routes ----------------------------------------------------------------------------------------
    async def fetch_route(self, topic: str) -> TopicRouteData:
        """Ask the name server (no cache); TopicNotExistError when it answers 17."""
        return api.parse_route(await self.invoke_namesrv(api.build_get_route(topic)))

    async def update_route(self, topic: str) -> TopicRouteData:
        lock = self._route_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            route = await self.fetch_route(topic)
            self.routes[topic] = route
            self._rebuild_broker_addrs()
            return route

    async def get_route(self, topic: str) -> TopicRouteData:
        route = self.routes.get(topic)
        if route is None:
            route = await self.update_route(topic)
        return route

    def _rebuild_broker_addrs(self) -> None:
        table: dict[str, dict[int, str]] = {}
        for route in self.routes.values():
            table.update(routes.broker_table(route))
        self.broker_addrs = table

    def interesting_topics(self) -> set[str]:
        topics = set(self.routes)
        for c in self.consumers.values():
            topics |= c.subscribed_topics()
        return topics

    async def refresh_all_routes(self) -> None:
        for topic in sorted(self.interesting_topics()):
            try:
                await self.update_route(topic)
            except TopicNotExistError:
                log.debug("route of %s: topic not in the name server", topic)
            except Exception as exc:
                log.debug("route of %s not refreshed: %s", topic, exc)

    async def _route_loop(self) -> None:
        """Poll routes every ``poll_name_server_interval_ms``; while a dropped broker is still listed (the
        name server may not have noticed yet), poll every ``DOWN_BROKER_ROUTE_RETRY_MS`` instead."""
        while not self.closing:
            interval_ms = (DOWN_BROKER_ROUTE_RETRY_MS if self._down_brokers
                           else self.config.poll_name_server_interval_ms)
            await wait_event(self._refresh_now, interval_ms / 1000)
            self._refresh_now.clear()
            await self.refresh_all_routes()
            self._down_brokers = {a for a in self._down_brokers if self._is_broker_addr(a)}

    def trigger_route_refresh(self) -> None:
        self._refresh_now.set()

    def find_broker(self, broker_name: str, broker_id: int = MASTER_ID, *,
                    only_this: bool = False) -> tuple[str, int] | None:
        return routes.pick_addr(self.broker_addrs.get(broker_name, {}), broker_id, only_this=only_this)

    def master_addr(self, broker_name: str) -> str | None:
        return self.broker_addrs.get(broker_name, {}).get(MASTER_ID)

    def admin_addr(self, broker_name: str) -> str | None:
        """The master, or the lowest-id slave when the master is gone (offset commits, queries)."""
        found = self.find_broker(broker_name)
        return found[0] if found else None

    # ---- heartbeats -----------------------------------------------------------------------------------
    def heartbeat_addrs(self, *, masters_only: bool) -> list[str]:
        out: list[str] = []
        for addrs in self.broker_addrs.values():
            for bid, addr in sorted(addrs.items()):
                if masters_only and bid != MASTER_ID:
                    continue
                if addr not in out:
                    out.append(addr)
        return out

    def build_heartbeat(self) -> RemotingCommand:
        return api.build_heartbeat(self.client_id, sorted(self.producer_groups),
                                   [c.consumer_data() for c in self.consumers.values()])

    async def send_heartbeats(self) -> None:
        if not self.producer_groups and not self.consumers:
            return
        addrs = self.heartbeat_addrs(masters_only=not self.consumers)

        async def one(addr: str) -> None:
            try:
                api.check(await self.invoke(addr, self.build_heartbeat()))
            except Exception as exc:
                log.debug("heartbeat to %s failed: %s", addr, exc)
        await asyncio.gather(*(one(a) for a in addrs))

    async def _heartbeat_loop(self) -> None:
        interval_s = self.config.heartbeat_broker_interval_ms / 1000
        while not self.closing:
            await asyncio.sleep(interval_s)
            await self.send_heartbeats()

    # ---- broker → client requests --------------------------------------------------------------------
    def _on_ids_changed(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        consumer = self.consumers.get(cmd.get_str("consumerGroup") or "")
        if consumer is not None:
            consumer.rebalance_now()
        return cmd.response(ResponseCode.SUCCESS)

    def _on_running_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        consumer = self.consumers.get(cmd.get_str("consumerGroup") or "")
        if consumer is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR,
                                remark=f"The Consumer Group <{cmd.get_str('consumerGroup')}> not exist in this consumer")
        return cmd.response(ResponseCode.SUCCESS, body=dumps_mq_keys(consumer.running_info()))

    def _on_consumer_status(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_STATUS_FROM_CLIENT (221): this consumer's offsets of the topic, as it holds them now."""
        group = cmd.get_str("group") or ""
        consumer = self.consumers.get(group)
        if consumer is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark=f"no consumer of group {group} in this client")
        offsets = getattr(consumer, "offsets_of", None)
        table = offsets(cmd.get_str("topic") or "") if offsets is not None else {}
        # a list (the C++ client's offset-table shape), so the broker can read it as plain JSON
        rows = [dict(mq.to_json(), offset=offset) for mq, offset in table.items()]
        return cmd.response(ResponseCode.SUCCESS, body=jsonx.dumps({"messageQueueTable": rows}))

    async def _on_reset_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.get_str("group") or ""
        topic = cmd.get_str("topic") or ""
        consumer = self.consumers.get(group)
        if consumer is not None and cmd.body:
            await consumer.reset_offsets(topic, parse_offset_table(cmd.body))
        return cmd.response(ResponseCode.SUCCESS)


def parse_offset_table(body: bytes) -> dict[MessageQueue, int]:
    """``{"offsetTable": ...}`` as a list of ``{topic, brokerName, queueId, offset}`` (C++ shape) or a map
    keyed by MessageQueue objects (fastjson shape, not valid JSON)."""
    from ferrymq.client.jsonmq import mq_keyed_map

    out: dict[MessageQueue, int] = {}
    for mq, value in mq_keyed_map(body, "offsetTable"):
        out[mq] = int(value["offset"] if isinstance(value, dict) else value)
    return out


# ---- instances shared by producers ---------------------------------------------------------------------
class _Shared:
    __slots__ = ("loop", "instance", "users")

    def __init__(self, loop: asyncio.AbstractEventLoop, instance: ClientInstance) -> None:
        self.loop = weakref.ref(loop)
        self.instance = instance
        #: the producers using the instance now
        self.users: list[object] = []


#: (id of the event loop, client id) -> the started instance producers of that loop share under that client id
_SHARED: dict[tuple[int, str], _Shared] = {}


async def acquire_shared(config: ClientConfig, user: object) -> ClientInstance:
    """The started instance of ``config``'s client id in the running loop when its options equal ``config``'s,
    else a new started one (registered for sharing when no instance of that client id is registered)."""
    loop = asyncio.get_running_loop()
    key = (id(loop), config.client_id)
    entry = _SHARED.get(key)
    if entry is not None and entry.loop() is not loop:  # a loop that is gone, its id reused
        del _SHARED[key]
        entry = None
    if entry is not None and not entry.instance.closing and entry.instance.config == config:
        entry.users.append(user)
        return entry.instance
    instance = ClientInstance(config)
    if entry is None or entry.instance.closing:
        # registered before it starts, so producers starting meanwhile share it too
        entry = _SHARED[key] = _Shared(loop, instance)
        entry.users.append(user)
    try:
        await instance.start()
    except BaseException:
        if _SHARED.get(key) is entry and entry.instance is instance:
            del _SHARED[key]
        raise
    return instance


def release_shared(instance: ClientInstance, user: object) -> list[object]:
    """``user`` (running in the instance's loop) stops using ``instance``: the others that still use it (none:
    the caller closes it)."""
    key = (id(asyncio.get_running_loop()), instance.client_id)
    entry = _SHARED.get(key)
    if entry is None or entry.instance is not instance:
        return []  # not shared: its own producer's
    if user in entry.users:
        entry.users.remove(user)
    if not entry.users:
        del _SHARED[key]
    return list(entry.users)
