"""The console's actions (console/actions.py) against an in-process name server and broker, called directly:
a dead letter resent at once (its retry topic not yet known to the name server) lands in the retry topic,
bad input is refused with the reason and changes nothing, the broker's refusal of a key that is not
runtime-safe comes back as the reason."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ferrymq.client import Admin, Producer, new_message, ops, ops_admin
from ferrymq.common.message import decode_offset_msg_id
from ferrymq.console.actions import ConsoleActions
from ferrymq.console.data import ConsoleData
from ferrymq.errors import BrokerError, ClientError, TopicNotExistError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

TOPIC = "ActionsT"
GROUP = "actions-cg"


@pytest.fixture
async def actions(namesrv: Any, broker: Any) -> AsyncIterator[tuple[ConsoleActions, Admin, Any]]:
    async with Admin(namesrv.addr) as admin:
        await admin.create_topic(TOPIC, broker_addr=broker.broker_addr, read_queue_nums=2, write_queue_nums=2)
        await admin.wait_for_route(TOPIC)
        await admin.create_subscription_group(GROUP, broker_addr=broker.broker_addr)
        acts = ConsoleActions(admin, ConsoleData(admin))
        try:
            yield acts, admin, broker
        finally:
            await acts.close()


async def _dead_letters(admin: Admin, broker_addr: str, count: int) -> list[str]:
    """``count`` messages of TOPIC moved to %DLQ%GROUP as a consumer giving up on them would."""
    async with Producer(admin.config.name_servers, "actions-pg") as producer:
        sent = [await producer.send(new_message(TOPIC, f"dead-{i}", keys=f"dk{i}")) for i in range(count)]
    for result in sent:
        _ip, _port, phy_offset = decode_offset_msg_id(result.offset_msg_id)
        resp = await admin.instance.invoke(broker_addr, RemotingCommand.request(
            RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": phy_offset, "group": GROUP, "delayLevel": -1,
                                                 "originMsgId": result.offset_msg_id, "originTopic": TOPIC}))
        assert resp.code == 0, resp.remark
    dead = [m async for m in ops_admin.messages_in_range(admin, f"%DLQ%{GROUP}")]
    assert len(dead) == count
    return [m.offset_msg_id for m in dead]


async def test_dead_letters_resent_before_the_retry_topic_is_routed(actions: tuple[ConsoleActions, Admin, Any]
                                                                    ) -> None:
    acts, admin, broker = actions
    ids = await _dead_letters(admin, broker.broker_addr, 4)
    with pytest.raises(TopicNotExistError):
        await admin.topic_route(f"%RETRY%{GROUP}")  # the name server does not know it yet
    for offset_msg_id in ids:
        outcome = await acts.resend_dlq(GROUP, offset_msg_id, to_original=False)
        assert f"sent again to %RETRY%{GROUP}: SEND_OK" in outcome
    await admin.wait_for_route(f"%RETRY%{GROUP}")
    resent = [m async for m in ops_admin.messages_in_range(admin, f"%RETRY%{GROUP}")]
    assert sorted(m.body for m in resent) == [b"dead-0", b"dead-1", b"dead-2", b"dead-3"]
    assert all(m.properties["RETRY_TOPIC"] == TOPIC and "DELAY" not in m.properties for m in resent)
    outcome = await acts.resend_dlq(GROUP, ids[0], to_original=True)
    assert f"sent again to {TOPIC}: SEND_OK" in outcome


async def test_a_message_outside_the_groups_dlq_is_not_resent(actions: tuple[ConsoleActions, Admin, Any]) -> None:
    acts, admin, broker = actions
    async with Producer(admin.config.name_servers, "actions-pg") as producer:
        live = await producer.send(new_message(TOPIC, "alive"))
    with pytest.raises(ClientError, match="is not in %DLQ%"):
        await acts.resend_dlq(GROUP, live.offset_msg_id, to_original=False)


@pytest.mark.parametrize(("args", "needle"), [
    (("bad topic!", 4, 4, 6), "illegal characters"),
    (("GoodT", 0, 4, 6), "read queues must be 1..1024"),
    (("GoodT", 4, 5000, 6), "write queues must be 1..1024"),
    (("GoodT", 4, 4, 8), "perm must be"),
    (("GoodT", 4, 4, 1), "perm must be"),
])
async def test_bad_topic_input_is_refused(actions: tuple[ConsoleActions, Admin, Any], args: tuple[Any, ...],
                                          needle: str) -> None:
    acts, admin, _broker = actions
    with pytest.raises(ClientError, match=needle):
        await acts.create_topic(*args)
    assert "GoodT" not in await admin.topic_list()


async def test_the_brokers_refusal_of_a_config_key_is_the_reason(actions: tuple[ConsoleActions, Admin, Any]) -> None:
    acts, admin, broker = actions
    with pytest.raises(BrokerError, match="brokerName"):
        await acts.set_broker_config(broker.broker_addr, "brokerName", "renamed")
    assert (await ops.broker_config(admin, broker.broker_addr))["brokerName"] == "broker-a"
    with pytest.raises(ClientError, match="one word"):
        await acts.set_broker_config(broker.broker_addr, "a=b", "1")
    with pytest.raises(ClientError, match="no broker 127.0.0.1:1"):
        await acts.set_broker_config("127.0.0.1:1", "fileReservedTime", "1")
    outcome = await acts.set_broker_config(broker.broker_addr, "fileReservedTime", "50")
    assert "fileReservedTime=50 set" in outcome
    assert (await ops.broker_config(admin, broker.broker_addr))["fileReservedTime"] == "50"


async def test_elect_without_controllers_says_so(actions: tuple[ConsoleActions, Admin, Any]) -> None:
    acts, _admin, _broker = actions
    with pytest.raises(ClientError, match="no controller is known"):
        await acts.elect("broker-a", None)


async def test_a_test_send_needs_a_routed_topic(actions: tuple[ConsoleActions, Admin, Any]) -> None:
    acts, admin, broker = actions
    with pytest.raises(ClientError, match="does not route topic NoSuchT: create it first"):
        await acts.send_test("NoSuchT", "x")
    assert "NoSuchT" not in await admin.topic_list()  # not auto-created through TBW102
    await acts.create_topic("FreshT", 1, 1, 6)
    outcome = await acts.send_test("FreshT", "first", keys="fk")  # at once: it waits for the route
    assert "sent to FreshT: SEND_OK" in outcome and "FreshT/" not in outcome
    assert [m.body for m in await admin.query_messages_by_key("FreshT", "fk")] == [b"first"]
