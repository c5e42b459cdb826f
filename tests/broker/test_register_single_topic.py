"""A topic created on a master reaches the name server alone (REGISTER_TOPIC_IN_NAMESRV), not by another
registration of the whole table: its route is served at once, and the registrations counter does not move."""

from __future__ import annotations

from typing import Any

from broker_helpers import Client, wait_for

from ferrymq.broker.app import BrokerController
from ferrymq.remoting.codes import RequestCode, ResponseCode


async def test_a_created_topic_is_registered_alone(broker: BrokerController, namesrv: Any, client: Client) -> None:
    ns = await Client().open(namesrv.addr)
    try:
        registrar = broker.registrar
        assert registrar is not None
        await wait_for(lambda: registrar.registrations >= 1, timeout_s=10, what="the first registration")
        full_before = registrar.registrations
        for i in range(20):
            resp = await client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {
                "topic": f"Alone{i}", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6})
            assert resp.code == ResponseCode.SUCCESS, resp.remark

        await wait_for(lambda: registrar.single_registrations >= 20, timeout_s=10, what="20 single registrations")
        for i in range(20):
            got = await ns.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": f"Alone{i}"})
            assert got.code == ResponseCode.SUCCESS, (i, got.remark)
        assert registrar.registrations == full_before and registrar.single_fallbacks == 0
    finally:
        ns.close()
