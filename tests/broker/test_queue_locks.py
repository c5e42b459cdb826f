"""LOCK_BATCH_MQ (41) / UNLOCK_BATCH_MQ (42) of orderly consumers, and UNREGISTER_CLIENT (35) releasing what the
leaving client still holds, through raw remoting clients of an in-process broker."""

from __future__ import annotations

import json

from broker_helpers import Client

from ferrymq.broker.app import BrokerController
from ferrymq.remoting import jsonx
from ferrymq.remoting.codes import RequestCode as C
from ferrymq.remoting.codes import ResponseCode as R

GROUP = "lock-group"
OTHER_GROUP = "lock-other-group"
TOPIC = "LockTopic"
QUEUES = 4


def _mqs(broker: BrokerController, queue_ids: range | list[int]) -> list[dict[str, object]]:
    return [{"topic": TOPIC, "brokerName": broker.config.broker_name, "queueId": q} for q in queue_ids]


def _heartbeat(client_id: str, *groups: str) -> bytes:
    return json.dumps({"clientID": client_id, "consumerDataSet": [
        {"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
         "subscriptionDataSet": [{"topic": TOPIC, "subString": "*"}]} for g in groups]}).encode()


async def _lock(client: Client, broker: BrokerController, group: str, client_id: str, queue_ids: range) -> set[int]:
    body = jsonx.dumps({"consumerGroup": group, "clientId": client_id, "mqSet": _mqs(broker, queue_ids)})
    resp = await client.call(C.LOCK_BATCH_MQ, {}, body)
    assert resp.code == R.SUCCESS, resp.remark
    return {int(m["queueId"]) for m in jsonx.loads(resp.body)["lockOKMQSet"]}


async def _consumer(broker: BrokerController, client_id: str, *groups: str) -> Client:
    c = await Client().open(broker.broker_addr)
    assert (await c.call(C.HEART_BEAT, {}, _heartbeat(client_id, *groups))).code == R.SUCCESS
    return c


async def test_a_leaving_client_releases_the_locks_its_unlock_left_out(broker: BrokerController) -> None:
    """The C++ 2.1 client's unlock-all at shutdown leaves out the first queue of each broker (rocketmq-client-cpp
    2.1.0 src/consumer/Rebalance.cpp:273-278); its UNREGISTER_CLIENT right after releases that one too, so a
    restarted orderly consumer gets every queue at once instead of after the 60 s lock lifetime."""
    old = await _consumer(broker, "cid-old", GROUP, OTHER_GROUP)
    new = await _consumer(broker, "cid-new", GROUP, OTHER_GROUP)
    try:
        assert await _lock(old, broker, GROUP, "cid-old", range(QUEUES)) == set(range(QUEUES))
        assert await _lock(old, broker, OTHER_GROUP, "cid-old", range(QUEUES)) == set(range(QUEUES))
        assert await _lock(new, broker, GROUP, "cid-new", range(QUEUES)) == set()

        unlock = jsonx.dumps({"consumerGroup": GROUP, "clientId": "cid-old", "mqSet": _mqs(broker, range(1, QUEUES))})
        assert (await old.call(C.UNLOCK_BATCH_MQ, {}, unlock)).code == R.SUCCESS
        assert await _lock(new, broker, GROUP, "cid-new", range(QUEUES)) == set(range(1, QUEUES))

        bye = {"clientID": "cid-old", "consumerGroup": GROUP}
        assert (await old.call(C.UNREGISTER_CLIENT, bye)).code == R.SUCCESS
        assert await _lock(new, broker, GROUP, "cid-new", range(QUEUES)) == set(range(QUEUES))
        # only that group's locks: the old client still consumes OTHER_GROUP
        assert await _lock(new, broker, OTHER_GROUP, "cid-new", range(QUEUES)) == set()
    finally:
        old.close()
        new.close()


async def test_an_unregister_releases_only_the_locks_of_its_own_client(broker: BrokerController) -> None:
    holder = await _consumer(broker, "cid-holder", GROUP)
    leaver = await _consumer(broker, "cid-leaver", GROUP)
    try:
        assert await _lock(holder, broker, GROUP, "cid-holder", range(2)) == {0, 1}
        assert await _lock(leaver, broker, GROUP, "cid-leaver", range(2, QUEUES)) == {2, 3}
        # an unregister naming another client id, on the leaver's connection, releases the leaver's own locks only
        bye = {"clientID": "cid-holder", "consumerGroup": GROUP}
        assert (await leaver.call(C.UNREGISTER_CLIENT, bye)).code == R.SUCCESS
        assert await _lock(leaver, broker, GROUP, "cid-other", range(QUEUES)) == {2, 3}
    finally:
        holder.close()
        leaver.close()
