"""Local mode's in-memory connection to its own broker (proxy/loopback.py): the transport pair on its own, then
a proxy given the in-process broker's dispatcher serving SendMessage, ReceiveMessage (a broker long poll
answered later) and AckMessage without a socket to that broker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from test_grpc_pull import create_topic, message

from ferrymq.client.producer import Producer
from ferrymq.common.message import Message
from ferrymq.errors import ConnectionClosedError
from ferrymq.proxy.loopback import LOOPBACK_PORT, LocalBroker, LoopbackPool, LoopbackTransport, connect_pair
from ferrymq.proxy.v2 import definition_pb2 as pb
from ferrymq.proxy.v2 import service_pb2 as spb
from ferrymq.proxy.v2 import service_pb2_grpc as sgrpc
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher
from support.aio import wait_for

BROKER_ADDR = "127.0.0.1:10911"
#: request codes of the unit tests' own dispatchers
ECHO, LATER, ASK_CLIENT = 9001, 9002, 9003
#: deadline of one call (generous: the CI machine is shared)
RPC_TIMEOUT_S = 60
#: a receive's long poll: the message sent meanwhile must end it well before this
LONG_POLL_S = 20


def pair(server_dispatcher: Dispatcher, client_dispatcher: Dispatcher | None = None) -> tuple[Connection, Connection]:
    client, server = Connection(client_dispatcher), Connection(server_dispatcher)
    connect_pair(client, server, BROKER_ADDR)
    return client, server


async def test_requests_answers_and_server_requests_cross_the_pair() -> None:
    answer_later: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    server_d = Dispatcher()
    server_d.register(ECHO, lambda conn, cmd: cmd.response(ResponseCode.SUCCESS, body=cmd.body))

    async def later(conn: Any, cmd: RemotingCommand) -> RemotingCommand:  # a long poll answered afterwards
        await answer_later
        return cmd.response(ResponseCode.SUCCESS, body=b"late")

    server_d.register(LATER, later)
    client_d = Dispatcher()
    client_d.register(ASK_CLIENT, lambda conn, cmd: cmd.response(ResponseCode.SUCCESS, body=b"client here"))
    client, server = pair(server_d, client_d)
    assert client.peer_addr == BROKER_ADDR and server.peer_addr == f"127.0.0.1:{LOOPBACK_PORT}"  # the broker's host

    pending = client.request(RemotingCommand.request(LATER, {}), 5_000)
    echoed = await client.invoke(RemotingCommand.request(ECHO, {}, body=b"x" * 100_000), 5_000)
    assert echoed.body == b"x" * 100_000
    assert not pending.done()
    asked = await server.invoke(RemotingCommand.request(ASK_CLIENT, {}), 5_000)  # e.g. a transaction check-back
    assert asked.body == b"client here"
    answer_later.set_result(None)
    assert (await pending).body == b"late"


async def test_bytes_reach_the_peer_on_the_next_loop_iteration_all_at_once() -> None:
    received: list[bytes] = []

    class Recorder(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            received.append(data)

    loop = asyncio.get_running_loop()
    peer = ("127.0.0.1", LOOPBACK_PORT)
    a, b = LoopbackTransport(loop, peer, peer), LoopbackTransport(loop, peer, peer)
    a.peer, b.peer = b, a
    b.protocol = Recorder()  # type: ignore[assignment]
    a.write(b"one")
    a.writelines([b"two", b"three"])
    assert received == [] and a.get_write_buffer_size() == len(b"onetwothree")  # never inside the writer's call
    await asyncio.sleep(0)
    assert received == [b"onetwothree"] and a.get_write_buffer_size() == 0


async def test_closing_one_end_closes_both_and_the_pool_opens_a_new_pair() -> None:
    server_d = Dispatcher()
    servers: list[Connection] = []

    async def never(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        servers.append(conn)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    server_d.register(LATER, never)
    server_d.register(ECHO, lambda conn, cmd: cmd.response(ResponseCode.SUCCESS, body=cmd.body))
    closed: list[str] = []
    broker_closed: list[Connection] = []
    pool = LoopbackPool(LocalBroker(BROKER_ADDR, server_d, broker_closed.append), Dispatcher(),
                        connect_timeout_ms=1_000, on_close=lambda addr, conn: closed.append(addr))
    first = await pool.get(BROKER_ADDR)
    assert pool.open_connection(BROKER_ADDR) is first and pool.connections() == {BROKER_ADDR: first}
    waiting = first.request(RemotingCommand.request(LATER, {}), 5_000)
    await wait_for(lambda: bool(servers), timeout_s=5, what="the request at the broker's end")
    servers[0].close()  # the broker's end goes away: the proxy's end learns it, its request fails
    with pytest.raises(ConnectionClosedError):
        await waiting
    assert first.closed and closed == [BROKER_ADDR] and pool.open_connection(BROKER_ADDR) is None
    assert broker_closed == servers  # the broker hears of its end's close as of a TCP connection's
    second = await pool.get(BROKER_ADDR)
    assert second is not first
    assert (await second.invoke(RemotingCommand.request(ECHO, {}, body=b"again"), 5_000)).body == b"again"
    await pool.close()
    await wait_for(lambda: second.closed and len(broker_closed) == 2, timeout_s=5, what="the pool's close")


@pytest.fixture
async def local_proxy(broker: Any, namesrv: Any) -> AsyncIterator[Any]:
    """A proxy in the broker's process as the broker runs it in local mode (cli/broker.py)."""
    from ferrymq.proxy.config import ProxyConfig
    from ferrymq.proxy.server import ProxyServer

    proxy = ProxyServer(ProxyConfig(namesrv.addr, listen_port=0), local_broker=LocalBroker(
        broker.broker_addr, broker.dispatcher, broker._on_connection_closed))
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


async def test_local_mode_reaches_its_broker_without_a_socket(local_proxy: Any, namesrv: Any, broker: Any) -> None:
    topic, group = f"Loop_{uuid.uuid4().hex[:8]}", f"loop_{uuid.uuid4().hex[:8]}"
    await create_topic(namesrv, broker, local_proxy, topic, queues=1)  # the long poll below is on its only queue
    async with grpc.aio.insecure_channel(f"127.0.0.1:{local_proxy.port}") as channel:
        stub = sgrpc.MessagingServiceStub(channel)
        sent = await stub.SendMessage(spb.SendMessageRequest(messages=[message(topic, "through the loopback")]),
                                      timeout=RPC_TIMEOUT_S)
        assert sent.status.code == pb.OK, sent.status
        pool = local_proxy.service.instance.pool
        conn = pool.open_connection(broker.broker_addr)
        assert isinstance(conn, Connection) and isinstance(conn._transport, LoopbackTransport)
        # no TCP connection from this process's proxy among the broker's accepted ones (the name server's and
        # the admin's are the only other clients of this test)
        proxy_ports = {c.local_addr for c in pool.connections().values() if c is not conn}
        assert not any(c.peer_addr in proxy_ports for c in broker.server.connections)

        request = spb.ReceiveMessageRequest(group=pb.Resource(name=group), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic), broker=pb.Broker(name=broker.config.broker_name), id=-1), batch_size=32)
        request.invisible_duration.FromSeconds(30)
        request.long_polling_timeout.FromSeconds(LONG_POLL_S)

        async def receive() -> list[pb.Message]:
            answers = [r async for r in stub.ReceiveMessage(request, timeout=RPC_TIMEOUT_S)]
            assert answers[0].status.code == pb.OK, answers[0].status
            return [r.message for r in answers if r.HasField("message")]

        first = await receive()
        assert [m.body for m in first] == [b"through the loopback"]
        for m in first:
            ack = await stub.AckMessage(spb.AckMessageRequest(
                group=request.group, topic=pb.Resource(name=topic), entries=[spb.AckMessageEntry(
                    message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle)]),
                timeout=RPC_TIMEOUT_S)
            assert ack.status.code == pb.OK, ack.status

        # a long poll held by the broker is answered over the loopback when a message comes from elsewhere
        waiting = asyncio.ensure_future(receive())
        await wait_for(lambda: broker.long_polling.parked_count > 0, timeout_s=RPC_TIMEOUT_S,
                       what="the receive's pull parked at the broker")
        async with Producer(namesrv.addr, "loop_pg") as producer:
            await producer.send(Message(topic, b"from a 4.x producer"))
        loop = asyncio.get_running_loop()
        started = loop.time()
        second = await asyncio.wait_for(waiting, LONG_POLL_S)
        assert [m.body for m in second] == [b"from a 4.x producer"]
        assert loop.time() - started < LONG_POLL_S / 2


async def test_the_broker_forgets_the_endpoints_registrations_when_the_pair_closes(local_proxy: Any, namesrv: Any,
                                                                                   broker: Any) -> None:
    await create_topic(namesrv, broker, local_proxy, f"Loop_{uuid.uuid4().hex[:8]}")  # the broker in a route
    instance = local_proxy.service.instance
    group = local_proxy.config.producer_group
    await instance.send_heartbeats()  # over the loopback: the broker registers the endpoint's producer group
    conn = instance.pool.open_connection(broker.broker_addr)
    assert conn is not None and isinstance(conn._transport, LoopbackTransport)
    assert [ch.client_id for ch in broker.producers.channels(group)] == [instance.client_id]
    conn.close()
    await wait_for(lambda: not broker.producers.channels(group), timeout_s=10,
                   what="the broker dropping the closed pair's producer registration")
