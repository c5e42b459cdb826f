"""Auto-renewal of messages received with ``auto_renew`` (5.x PushConsumers), sans-IO: the renewal registry on
pop queues under a fake clock, and the proxy's RPCs against a scripted queue instead of a broker
(test_grpc_renew_sdk5.py runs the real 5.x PushConsumer)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_grpc_failover_pop import BROKER, GROUP, KEY, TOPIC, ScriptedQueue, stored

from ferrymq.errors import ConfigError
from ferrymq.proxy.config import DEFAULT_AUTO_RENEW_INVISIBLE_MS, DEFAULT_RENEW_AHEAD_MS, ProxyConfig
from ferrymq.proxy.pop import PopEntry, PopQueue, SerialSource
from ferrymq.proxy.renew import RELEASE_INVISIBLE_MS, RenewRegistry
from ferrymq.proxy.service import DEFAULT_INVISIBLE_MS, MessagingService
from ferrymq.proxy.v2 import definition_pb2 as pb
from ferrymq.proxy.v2 import service_pb2 as spb

INVISIBLE_MS, AHEAD_MS, MAX_MS = 60_000, 10_000, 3 * 3_600_000
ALIVE = {"c1": True, "c2": True}


def registry() -> RenewRegistry:
    return RenewRegistry(invisible_ms=INVISIBLE_MS, ahead_ms=AHEAD_MS, max_ms=MAX_MS)


def held_queue(count: int, now_ms: int) -> tuple[PopQueue, list[Any]]:
    pq = PopQueue(0)
    pq.add_pulled([stored(i, f"m{i}") for i in range(count)], count)
    taken, _ = pq.take(now_ms, count, INVISIBLE_MS, 17, SerialSource())
    return pq, taken


def lookup_in(pq: PopQueue) -> Any:
    def lookup(key: Any, queue_offset: int) -> PopEntry | None:
        return pq.entries.get(queue_offset)
    return lookup


def add_all(reg: RenewRegistry, pq: PopQueue, taken: list[Any], now_ms: int, client_id: str = "c1") -> None:
    for d in taken:
        reg.add(client_id, KEY, d.entry.message.queue_offset, d.serial, now_ms=now_ms,
                visible_at_ms=d.entry.visible_at_ms)


def test_a_renewed_message_stays_invisible_and_its_first_handle_still_acks() -> None:
    reg, now = registry(), 0
    pq, taken = held_queue(3, now)
    add_all(reg, pq, taken, now)
    for _ in range(20):  # 20 minutes of a slow callback, the registry run every 5 s
        now += 5_000
        reg.run_due(now, lookup_in(pq), ALIVE.__contains__)
        assert not pq.has_ready(now), f"delivered again at {now} ms"
    assert all(e.visible_at_ms - now > INVISIBLE_MS - AHEAD_MS - 5_000 for e in pq.entries.values())
    assert all(pq.ack(d.entry.message.queue_offset, d.serial) for d in taken)  # the handle the client got
    assert reg.run_due(now + INVISIBLE_MS, lookup_in(pq), ALIVE.__contains__).renewed == 0
    assert len(reg) == 0


def test_renewal_happens_ahead_of_the_invisible_time_in_steps_of_it() -> None:
    reg = registry()
    pq, taken = held_queue(1, 0)
    add_all(reg, pq, taken, 0)
    assert reg.next_due_ms() == INVISIBLE_MS - AHEAD_MS
    assert reg.run_due(INVISIBLE_MS - AHEAD_MS - 1, lookup_in(pq), ALIVE.__contains__).renewed == 0
    assert reg.run_due(INVISIBLE_MS - AHEAD_MS, lookup_in(pq), ALIVE.__contains__).renewed == 1
    assert pq.entries[0].visible_at_ms == 2 * INVISIBLE_MS - AHEAD_MS


def test_renewal_ends_after_the_maximum_renew_time() -> None:
    reg = RenewRegistry(invisible_ms=INVISIBLE_MS, ahead_ms=AHEAD_MS, max_ms=5 * 60_000)
    pq, taken = held_queue(1, 0)
    add_all(reg, pq, taken, 0)
    now = 0
    while reg.next_due_ms() is not None:
        now = reg.next_due_ms() or now
        reg.run_due(now, lookup_in(pq), ALIVE.__contains__)
    assert len(reg) == 0
    visible_at = pq.entries[0].visible_at_ms
    assert 5 * 60_000 <= visible_at <= 5 * 60_000 + INVISIBLE_MS
    assert pq.has_ready(visible_at)  # delivered again once the last renewal ran out


def test_a_client_gone_silently_is_not_renewed_and_its_messages_come_back_within_one_step() -> None:
    reg, alive = registry(), {"c1": True}
    pq, taken = held_queue(2, 0)
    add_all(reg, pq, taken, 0)
    reg.run_due(INVISIBLE_MS - AHEAD_MS, lookup_in(pq), alive.__contains__)
    del alive["c1"]  # its Telemetry stream closed (the process was killed)
    due = reg.next_due_ms()
    assert due is not None
    out = reg.run_due(due, lookup_in(pq), alive.__contains__)
    assert out.ended == 2 and out.renewed == 0 and len(reg) == 0
    assert pq.has_ready(due + AHEAD_MS)


def test_releasing_a_client_makes_only_its_messages_visible_soon() -> None:
    reg = registry()
    pq, taken = held_queue(4, 0)
    add_all(reg, pq, taken[:2], 0, "c1")
    add_all(reg, pq, taken[2:], 0, "c2")
    assert reg.release_client("c1", 1_000, lookup_in(pq)) == (2, False)
    assert reg.held_of("c1") == 0 and reg.held_of("c2") == 2
    ready = [o for o, e in pq.entries.items() if e.visible_at_ms <= 1_000 + RELEASE_INVISIBLE_MS]
    assert ready == [0, 1]
    assert reg.run_due(INVISIBLE_MS - AHEAD_MS, lookup_in(pq), ALIVE.__contains__).renewed == 2


def test_a_message_acked_changed_or_delivered_again_is_not_renewed() -> None:
    reg, serials = registry(), SerialSource()
    pq, taken = held_queue(3, 0)
    serials.value = 100
    add_all(reg, pq, taken, 0)
    assert pq.ack(0, taken[0].serial)  # acked without telling the registry: dropped when due
    assert pq.change_invisible(1, taken[1].serial, 5_000, serials) is not None
    assert reg.discard(KEY, 2)
    out = reg.run_due(INVISIBLE_MS, lookup_in(pq), ALIVE.__contains__)
    assert out.renewed == 0 and out.ended == 2 and len(reg) == 0
    assert pq.entries[1].visible_at_ms == 5_000 and pq.entries[2].visible_at_ms == INVISIBLE_MS


def test_a_release_is_done_in_bounded_rounds() -> None:
    reg = registry()
    pq, taken = held_queue(10, 0)
    add_all(reg, pq, taken, 0)
    assert reg.release_client("c1", 1_000, lookup_in(pq), limit=4) == (4, True)
    assert reg.release_client("c1", 1_000, lookup_in(pq), limit=4) == (4, True)
    assert reg.release_client("c1", 1_000, lookup_in(pq), limit=4) == (2, False)
    assert len(reg) == 0 and reg.held_of("c1") == 0
    assert all(e.visible_at_ms == 1_000 + RELEASE_INVISIBLE_MS for e in pq.entries.values())


def test_a_round_renews_at_most_its_limit_and_touches_only_due_records() -> None:
    reg = registry()
    pq, taken = held_queue(1_000, 0)
    add_all(reg, pq, taken[:600], 0)
    for d in taken[600:]:  # delivered 30 s later
        d.entry.visible_at_ms += 30_000
    add_all(reg, pq, taken[600:], 30_000)
    looked: list[int] = []

    def lookup(key: Any, queue_offset: int) -> PopEntry | None:
        looked.append(queue_offset)
        return pq.entries.get(queue_offset)

    out = reg.run_due(INVISIBLE_MS - AHEAD_MS, lookup, ALIVE.__contains__, limit=256)
    assert out.renewed == 256 and out.more
    out = reg.run_due(INVISIBLE_MS - AHEAD_MS, lookup, ALIVE.__contains__, limit=1_000)
    assert out.renewed == 344 and not out.more
    assert sorted(looked) == list(range(600))  # the 400 not due were not looked at


def test_the_renew_times_must_fit_the_invisible_time() -> None:
    with pytest.raises(ValueError):
        RenewRegistry(invisible_ms=10_000, ahead_ms=10_000, max_ms=1)
    with pytest.raises(ConfigError, match="grpcRenewAheadTimeMillis"):
        ProxyConfig("127.0.0.1:9876", auto_renew_invisible_ms=5_000, renew_ahead_ms=5_000).validate()
    with pytest.raises(ConfigError, match="grpcRenewMaxTimeMillis"):
        ProxyConfig("127.0.0.1:9876", renew_max_ms=-1).validate()
    ProxyConfig("127.0.0.1:9876").validate()
    assert (DEFAULT_AUTO_RENEW_INVISIBLE_MS, DEFAULT_RENEW_AHEAD_MS) == (60_000, 10_000)


# ---- the proxy's RPCs -----------------------------------------------------------------------------------------
class FakeContext:
    def __init__(self, client_id: str) -> None:
        self.client_id = client_id

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return [("x-mq-client-id", self.client_id), ("x-mq-language", "PYTHON")]

    def time_remaining(self) -> float | None:
        return None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Iterator[MessagingService]:
    svc = MessagingService(ProxyConfig("127.0.0.1:9876"), clock_ms=clock)

    async def queue_ids(topic: str, broker_name: str) -> list[int]:
        return [0]

    monkeypatch.setattr(svc, "_readable_queue_ids", queue_ids)
    svc._cores[GROUP] = ScriptedQueue([f"m{i}" for i in range(4)])  # type: ignore[assignment]
    yield svc


async def receive(service: MessagingService, client_id: str, *, auto_renew: bool,
                  invisible_ms: int | None = None) -> list[pb.Message]:
    request = spb.ReceiveMessageRequest(group=pb.Resource(name=GROUP), auto_renew=auto_renew, batch_size=32)
    request.message_queue.topic.name = TOPIC
    request.message_queue.broker.name = BROKER
    request.long_polling_timeout.SetInParent()  # 0: answer at once
    if invisible_ms is not None:
        request.invisible_duration.seconds = invisible_ms // 1000
    out = []
    async for response in service.ReceiveMessage(request, FakeContext(client_id)):
        if response.WhichOneof("content") == "message":
            out.append(response.message)
    return out


async def ack(service: MessagingService, client_id: str, message: pb.Message) -> pb.Status:
    request = spb.AckMessageRequest(group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC), entries=[
        spb.AckMessageEntry(message_id=message.system_properties.message_id,
                            receipt_handle=message.system_properties.receipt_handle)])
    response = await service.AckMessage(request, FakeContext(client_id))
    return response.status


def connect(service: MessagingService, client_id: str, *, telemetry_open: bool = True) -> None:
    """The client as the proxy knows it after its Heartbeat and Telemetry settings."""
    from ferrymq.proxy.service import _ClientInfo

    info = service._clients.setdefault(client_id, _ClientInfo())
    info.telemetry_opened = True
    info.outbox = object() if telemetry_open else None  # type: ignore[assignment]


async def test_a_push_consumers_messages_stay_invisible_while_it_lives_and_ack_with_their_first_handle(
        service: MessagingService, clock: Clock) -> None:
    connect(service, "c1")
    got = await receive(service, "c1", auto_renew=True)
    assert [m.body.decode() for m in got] == ["m0", "m1", "m2", "m3"]
    assert got[0].system_properties.invisible_duration.seconds == DEFAULT_AUTO_RENEW_INVISIBLE_MS // 1000
    for _ in range(30):  # 5 minutes in 10 s steps, five times the invisible time
        clock.now_ms += 10_000
        service.renew_due()
        assert await receive(service, "c2", auto_renew=False) == [], f"delivered again after {clock.now_ms} ms"
    for m in got:
        assert (await ack(service, "c1", m)).code == pb.OK
    assert len(service.renewals) == 0


async def test_without_auto_renew_the_message_comes_back_after_its_invisible_time(
        service: MessagingService, clock: Clock) -> None:
    connect(service, "c1")
    got = await receive(service, "c1", auto_renew=False)
    assert len(got) == 4 and len(service.renewals) == 0
    clock.now_ms += DEFAULT_INVISIBLE_MS
    service.renew_due()
    assert len(await receive(service, "c2", auto_renew=False)) == 4


async def test_a_terminated_clients_messages_are_delivered_again_a_second_later(
        service: MessagingService, clock: Clock) -> None:
    connect(service, "c1")
    assert len(await receive(service, "c1", auto_renew=True)) == 4
    request = spb.NotifyClientTerminationRequest(group=pb.Resource(name=GROUP))
    assert (await service.NotifyClientTermination(request, FakeContext("c1"))).status.code == pb.OK
    clock.now_ms += RELEASE_INVISIBLE_MS
    again = await receive(service, "c2", auto_renew=False)
    assert [m.system_properties.delivery_attempt for m in again] == [2, 2, 2, 2]


async def test_a_client_whose_telemetry_stream_closed_is_not_renewed(
        service: MessagingService, clock: Clock) -> None:
    connect(service, "c1")
    assert len(await receive(service, "c1", auto_renew=True)) == 4
    connect(service, "c1", telemetry_open=False)  # SIGKILL: the stream ended with the connection
    clock.now_ms += DEFAULT_AUTO_RENEW_INVISIBLE_MS - DEFAULT_RENEW_AHEAD_MS
    service.renew_due()
    assert len(service.renewals) == 0
    clock.now_ms += DEFAULT_RENEW_AHEAD_MS
    assert len(await receive(service, "c2", auto_renew=False)) == 4


async def test_change_invisible_duration_ends_renewal(service: MessagingService, clock: Clock) -> None:
    connect(service, "c1")
    got = await receive(service, "c1", auto_renew=True)
    request = spb.ChangeInvisibleDurationRequest(group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC),
                                                 receipt_handle=got[0].system_properties.receipt_handle,
                                                 message_id=got[0].system_properties.message_id)
    request.invisible_duration.seconds = 5
    response = await service.ChangeInvisibleDuration(request, FakeContext("c1"))
    assert response.status.code == pb.OK
    assert len(service.renewals) == 3
    clock.now_ms += 5_000
    assert [m.body.decode() for m in await receive(service, "c2", auto_renew=False)] == ["m0"]


async def test_a_last_attempt_renewed_is_not_moved_to_the_dead_letter_queue_while_held(
        service: MessagingService, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    service.config.max_delivery_attempts = 1
    moved: list[int] = []

    async def to_dead_letter(key: Any, queue_offset: int, **_: Any) -> None:
        moved.append(queue_offset)

    monkeypatch.setattr(service, "_to_dead_letter", to_dead_letter)
    connect(service, "c1")
    assert len(await receive(service, "c1", auto_renew=True)) == 4
    for _ in range(12):
        clock.now_ms += 10_000
        service.renew_due()
        service._sweep_dead()
    assert moved == []
    connect(service, "c1", telemetry_open=False)
    clock.now_ms += DEFAULT_AUTO_RENEW_INVISIBLE_MS
    service.renew_due()
    clock.now_ms += DEFAULT_AUTO_RENEW_INVISIBLE_MS
    service._sweep_dead()
    for task in service._tasks:
        await task
    assert sorted(moved) == [0, 1, 2, 3]


def test_the_settings_reach_the_proxy_and_bad_ones_are_refused_in_one_line() -> None:
    from click.testing import CliRunner

    from ferrymq.broker.config import from_properties
    from ferrymq.cli.proxy import command

    result = CliRunner().invoke(command, ["-n", "127.0.0.1:1", "--listen", "127.0.0.1:0",
                                          "--auto-renew-invisible-ms", "5000", "--renew-ahead-ms", "5000"])
    assert result.exit_code != 0 and "grpcRenewAheadTimeMillis" in result.output
    assert len(result.output.strip().splitlines()) == 1
    cfg = from_properties({"grpcAutoRenewInvisibleTimeMillis": "20000", "grpcRenewAheadTimeMillis": "4000",
                           "grpcRenewMaxTimeMillis": "60000"})
    assert (cfg.grpc_auto_renew_invisible_time_ms, cfg.grpc_renew_ahead_time_ms, cfg.grpc_renew_max_time_ms) == (
        20_000, 4_000, 60_000)
    with pytest.raises(ConfigError, match="grpcRenewAheadTimeMillis"):
        from_properties({"grpcAutoRenewInvisibleTimeMillis": "3000", "grpcRenewAheadTimeMillis": "3000"}).validate()


async def test_a_telemetry_stream_cancelled_twice_still_marks_its_client_gone(service: MessagingService) -> None:
    """grpc may cancel a stream's handler again while it cleans up (the client's connection dropped): the client
    must count as gone all the same, or a SIGKILLed PushConsumer's messages would be renewed for ever."""
    import asyncio

    never = asyncio.Event()

    async def requests() -> Any:
        await never.wait()
        yield spb.TelemetryCommand()

    async def stream() -> None:
        async for _ in service.Telemetry(requests(), FakeContext("c1")):
            pass

    task = asyncio.create_task(stream())
    while service._clients.get("c1") is None or service._clients["c1"].outbox is None:
        await asyncio.sleep(0)
    assert service._client_alive("c1")
    task.cancel()
    await asyncio.sleep(0)  # the handler is in its clean-up now, waiting for its reader to end
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not service._client_alive("c1")
