"""5.x clients made visible to the brokers as clients of their own, so ``ferry consumer connection``,
``ferry producer connection``, ``ferry consumer progress`` and the brokers' client metrics list each one
with its 5.x client id, beside the 4.x clients.

A broker tells clients of a group apart by connection, so each 5.x client gets a remoting connection of its
own to each master broker serving its topics (its own ``ConnectionPool``), carrying only HEART_BEAT:

| heartbeat field      | value                                                                                      |
|----------------------|--------------------------------------------------------------------------------------------|
| clientID             | the 5.x client id (gRPC metadata ``x-mq-client-id``)                                         |
| consumerDataSet      | consumers: the group, ``CONSUME_ACTIVELY`` (the proxy pulls; no rebalance), CLUSTERING, its subscriptions |
| producerDataSet      | producers: the proxy's producer group (the group their messages are sent under)             |
| command language     | the client's ``x-mq-language`` (``JAVA``, ``PYTHON``, ...; ``OTHER`` when not a plain word)  |

The connection answers what a broker asks a client: CHECK_TRANSACTION_STATE goes to the proxy's check-back
(any 5.x producer of the topic answers), GET_CONSUMER_RUNNING_INFO a short running info naming the proxy,
NOTIFY_CONSUMER_IDS_CHANGED is acknowledged. The heartbeat is sent when the client starts (its Telemetry
settings) and then at most every ``PRESENCE_HEARTBEAT_INTERVAL_MS`` on its own Heartbeat calls; a client
that ends (NotifyClientTermination) or stays silent for ``CLIENT_EXPIRY_MS`` loses its connections, so the
brokers drop it at once.

Cost: one connection per 5.x client per master broker of its topics, in the proxy and in those brokers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ferrymq.client import api, routes
from ferrymq.client.instance import ClientInstance
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Dispatcher
from ferrymq.remoting.pool import ConnectionPool

log = logging.getLogger(__name__)

#: a 5.x client's heartbeat toward the brokers is repeated at most this often (brokers expire a channel
#: after 120 s without one)
PRESENCE_HEARTBEAT_INTERVAL_MS = 20_000
#: a 5.x client silent (no call) this long is forgotten and its connections closed
CLIENT_EXPIRY_MS = 120_000
#: remoting timeout of a presence heartbeat
PRESENCE_TIMEOUT_MS = 5_000
#: the languages a heartbeat may name (RocketMQ's LanguageCode); others are sent as OTHER
KNOWN_LANGUAGES = frozenset(("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO",
                             "PHP", "OMS", "RUST", "NODE_JS"))


@dataclass(slots=True)
class Presence:
    """What a broker should know of one 5.x client."""

    client_id: str
    language: str = "OTHER"
    #: consumer group ("" for producers)
    group: str = ""
    #: topic -> (expression, expression type) of a consumer
    subscriptions: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: topics of a producer
    topics: frozenset[str] = frozenset()
    last_seen_ms: int = 0
    last_heartbeat_ms: int = 0
    pool: ConnectionPool | None = None


def language_of(metadata_value: str) -> str:
    value = metadata_value.strip().upper()
    return value if value in KNOWN_LANGUAGES else "OTHER"


class PresenceRegistry:
    """Heartbeats of 5.x clients toward the brokers, each on connections of its own."""

    def __init__(self, instance: ClientInstance, producer_group: str, *, clock_ms: Callable[[], int],
                 on_check_transaction: Callable[[Any, RemotingCommand], None]) -> None:
        self.instance = instance
        self.producer_group = producer_group
        self.clock_ms = clock_ms
        self._on_check_transaction = on_check_transaction
        self.clients: dict[str, Presence] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def seen(self, client_id: str, language: str) -> Presence:
        presence = self.clients.get(client_id)
        if presence is None:
            presence = self.clients[client_id] = Presence(client_id, language_of(language))
        presence.last_seen_ms = self.clock_ms()
        return presence

    def heartbeat_soon(self, presence: Presence, *, force: bool = False) -> None:
        """Send the client's heartbeat in the background (``force``: its settings changed)."""
        now = self.clock_ms()
        if not force and now - presence.last_heartbeat_ms < PRESENCE_HEARTBEAT_INTERVAL_MS:
            return
        if not presence.group and not presence.topics:
            return
        presence.last_heartbeat_ms = now
        task = asyncio.create_task(self._heartbeat(presence), name="ferrymq-grpc-presence")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatcher(self, presence: Presence) -> Dispatcher:
        d = Dispatcher()
        d.register(RequestCode.CHECK_TRANSACTION_STATE, self._on_check_transaction)
        d.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, lambda conn, cmd: cmd.response(ResponseCode.SUCCESS))

        def running_info(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
            info = {"properties": {"consumeType": "CONSUME_ACTIVELY", "grpcProxyClientId": self.instance.client_id,
                                   "language": presence.language},
                    "subscriptionSet": [api.subscription_data(t, e, 0, k)
                                        for t, (e, k) in presence.subscriptions.items()],
                    "mqTable": {}, "statusTable": {}}
            return cmd.response(ResponseCode.SUCCESS, body=jsonx.dumps(info))

        d.register(RequestCode.GET_CONSUMER_RUNNING_INFO, running_info)
        return d

    async def _heartbeat(self, presence: Presence) -> None:
        topics = set(presence.subscriptions) | set(presence.topics)
        addrs: set[str] = set()
        for topic in topics:
            try:
                route = await self.instance.get_route(topic)
            except Exception as exc:
                log.debug("no route of %s for the presence of %s: %s", topic, presence.client_id, exc)
                continue
            addrs.update(routes.all_addrs(route.broker_datas, masters_only=True))
        if not addrs:
            return
        if presence.pool is None:
            presence.pool = ConnectionPool(self._dispatcher(presence), ssl_context=self.instance.pool.ssl_context)
        consumers = []
        if presence.group:
            consumers.append({"consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_ACTIVELY",
                              "groupName": presence.group, "messageModel": "CLUSTERING", "unitMode": False,
                              "subscriptionDataSet": [api.subscription_data(t, e, 0, k)
                                                      for t, (e, k) in presence.subscriptions.items()]})
        producers = [self.producer_group] if presence.topics else []
        pool = presence.pool

        async def one(addr: str) -> None:
            cmd = self.instance._stamp(api.build_heartbeat(presence.client_id, producers, consumers))
            cmd.language = presence.language
            try:
                api.check(await pool.invoke(addr, cmd, PRESENCE_TIMEOUT_MS))
            except Exception as exc:
                log.debug("presence heartbeat of %s to %s failed: %s", presence.client_id, addr, exc)

        await asyncio.gather(*(one(a) for a in sorted(addrs)))

    async def forget(self, client_id: str) -> None:
        presence = self.clients.pop(client_id, None)
        if presence is not None and presence.pool is not None:
            await presence.pool.close()

    async def sweep(self) -> list[str]:
        """Forget clients silent for CLIENT_EXPIRY_MS; their ids."""
        now = self.clock_ms()
        gone = [c for c, p in self.clients.items() if now - p.last_seen_ms > CLIENT_EXPIRY_MS]
        for client_id in gone:
            await self.forget(client_id)
        return gone

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for client_id in list(self.clients):
            await self.forget(client_id)
