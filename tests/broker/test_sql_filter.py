"""SQL92 subscriptions on the broker: the pull header's subscription, the heartbeat's, CHECK_CLIENT_CONFIG,
enablePropertyFilter off, and bad selectors (23 / 27 with the error position)."""

from __future__ import annotations

from typing import Any

import pytest
from broker_helpers import BROKER_SETTINGS, Client, pull, records, send_v1

from ferrymq.remoting import jsonx
from ferrymq.remoting.codes import ResponseCode as R

SELECTOR = "a BETWEEN 3 AND 6 AND TAGS = 'TagA'"


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    return dict(BROKER_SETTINGS, enable_property_filter=True)


async def _send_ten(client: Client, topic: str) -> None:
    for i in range(10):
        tag = "TagA" if i % 2 else "TagB"
        resp = await client.call(10, send_v1(topic, 0, f"TAGS\x01{tag}\x02a\x01{i}\x02"), f"m{i}".encode())
        assert resp.code == R.SUCCESS, resp.remark


def _sql_pull(topic: str, sub: str, **extra: Any) -> dict[str, Any]:
    return pull(topic, sys_flag=4, sub=sub, expressionType="SQL92", **extra)


async def test_pull_with_sql92_subscription(broker, client: Client) -> None:
    await _send_ten(client, "Sql")
    got = await client.call(11, _sql_pull("Sql", SELECTOR))
    assert got.code == R.SUCCESS, got.remark
    assert [m.body for m in records(got.body)] == [b"m3", b"m5"]
    assert got.ext_fields["nextBeginOffset"] == "10"  # the skipped entries are passed too
    none = await client.call(11, _sql_pull("Sql", "a > 100"))
    assert none.code == R.PULL_RETRY_IMMEDIATELY and none.ext_fields["nextBeginOffset"] == "10"


async def test_bad_selector_is_23_with_the_position(broker, client: Client) -> None:
    await _send_ten(client, "SqlBad")
    got = await client.call(11, _sql_pull("SqlBad", "a BETWEEN 3 AND AND"))
    assert got.code == R.SUBSCRIPTION_PARSE_FAILED
    assert "line 1, column 17" in got.remark and "AND" in got.remark


async def test_disabled_property_filter_answers_1(broker, client: Client) -> None:
    await _send_ten(client, "SqlOff")
    broker.config.enable_property_filter = False
    got = await client.call(11, _sql_pull("SqlOff", SELECTOR))
    assert got.code == R.SYSTEM_ERROR
    assert "does not support consumer to filter message by SQL92" in got.remark
    assert "enablePropertyFilter" in got.remark
    check = await client.call(46, body=jsonx.dumps({"clientId": "c", "group": "g", "subscriptionData": {
        "topic": "SqlOff", "subString": SELECTOR, "expressionType": "SQL92"}}))
    assert check.code == R.SYSTEM_ERROR
    tags = await client.call(11, pull("SqlOff", sys_flag=4, sub="TagA"))  # tag filtering is unaffected
    assert tags.code == R.SUCCESS and len(records(tags.body)) == 5


async def test_heartbeat_subscription_and_check_client_config(broker, client: Client) -> None:
    await _send_ten(client, "SqlHb")

    async def heartbeat(sub: str, version: int) -> None:
        hb = {"clientID": "1-127.0.0.1@sql", "consumerDataSet": [{
            "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
            "groupName": "cgsql", "messageModel": "CLUSTERING", "subscriptionDataSet": [{
                "classFilterMode": False, "codeSet": [], "expressionType": "SQL92", "subString": sub,
                "subVersion": version, "tagsSet": [], "topic": "SqlHb"}]}]}
        assert (await client.call(34, body=jsonx.dumps(hb))).code == R.SUCCESS

    await heartbeat(SELECTOR, 1)
    # a Java push consumer pulls with the flags commitOffset|suspend, without the subscription
    got = await client.call(11, pull("SqlHb", group="cgsql", sys_flag=0, sub="", subVersion=1,
                                     expressionType="SQL92"))
    assert got.code == R.SUCCESS, got.remark
    assert [m.body for m in records(got.body)] == [b"m3", b"m5"]

    await heartbeat("a >", 2)
    bad = await client.call(11, pull("SqlHb", group="cgsql", sys_flag=0, subVersion=2, expressionType="SQL92"))
    assert bad.code == R.FILTER_DATA_NOT_EXIST and "line 1, column 4" in bad.remark

    def check(sub: str, expression_type: str = "SQL92") -> dict[str, Any]:
        return {"clientId": "1-127.0.0.1@sql", "group": "cgsql", "subscriptionData": {
            "topic": "SqlHb", "subString": sub, "expressionType": expression_type}}
    ok = await client.call(46, body=jsonx.dumps(check(SELECTOR)))
    assert ok.code == R.SUCCESS
    failed = await client.call(46, body=jsonx.dumps(check("a = NULL")))
    assert failed.code == R.SUBSCRIPTION_PARSE_FAILED and "column 3" in failed.remark
    tag = await client.call(46, body=jsonx.dumps(check("a = NULL", "TAG")))
    assert tag.code == R.SUCCESS
