"""The ACL table (acl/rules.py: request code -> right, defined header fields, numeric fields) against an
in-process broker with ``aclEnable=true`` over raw signed remoting frames: every row, a signed request replayed
under another code, shifted field boundaries, END_TRANSACTION by another account, secrets of
GET_BROKER_CONFIG; and the table against the broker's handlers, docs/security.md and real clients' frames."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ferrymq.acl.checker import check
from ferrymq.acl.config import parse_acl
from ferrymq.acl.rules import (
    BY_CODE,
    CANONICAL_INT,
    COMMON_FIELDS,
    FLAG_VALUES,
    RULES,
    Right,
    docs_table,
    shape_error,
)
from ferrymq.broker.app import BrokerController
from ferrymq.client import api
from ferrymq.common.message import decode_offset_msg_id
from ferrymq.common.route import MessageQueue
from ferrymq.remoting import signature
from ferrymq.remoting.codec import RemotingCommand, decode_json_header
from ferrymq.remoting.codes import RequestCode as C
from ferrymq.remoting.codes import ResponseCode as R
from ferrymq.remoting.connection import Connection, connect
from support.inproc import broker_config
from support.shared import CAPTURES, REPO_ROOT
from support.wire import pull, records, send_v1

TOPIC = "RuleTopic"
OTHER_TOPIC = "RuleOtherTopic"
GROUP = "RuleGroup"
OTHER_GROUP = "RuleOtherGroup"
ADMIN = ("ruleAdmin1", "ruleAdminSecret")
USER = ("ruleUser01", "ruleUserSecret")  # PUB|SUB on TOPIC, SUB on GROUP, nothing else
NOBODY = ("ruleNobody", "ruleNobodySecret")  # a valid account with no rights
OTHER = ("ruleOther1", "ruleOtherSecret")  # PUB|SUB on OTHER_TOPIC and SUB on OTHER_GROUP only
ACL = f"""
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {USER[0]}
    secretKey: {USER[1]}
    topicPerms: [{TOPIC}=PUB|SUB]
    groupPerms: [{GROUP}=SUB]
  - accessKey: {NOBODY[0]}
    secretKey: {NOBODY[1]}
  - accessKey: {OTHER[0]}
    secretKey: {OTHER[1]}
    topicPerms: [{OTHER_TOPIC}=PUB|SUB]
    groupPerms: [{OTHER_GROUP}=SUB]
"""
HA_SECRET = "ha-secret-never-on-the-wire"


def signed(code: int, fields: dict[str, Any], keys: tuple[str, str] | None, body: bytes = b"") -> RemotingCommand:
    cmd = RemotingCommand.request(code, fields, body)
    if keys is not None:
        signature.sign(cmd.ext_fields, cmd.body, *keys)
    return cmd


class Wire:
    def __init__(self, conn: Connection, broker: BrokerController) -> None:
        self.conn = conn
        self.broker = broker

    async def send(self, cmd: RemotingCommand) -> RemotingCommand:
        return await self.conn.invoke(cmd, 5000)

    async def call(self, code: int, fields: dict[str, Any], keys: tuple[str, str] | None = USER,
                   body: bytes = b"") -> RemotingCommand:
        return await self.send(signed(code, fields, keys, body))


@pytest.fixture
async def wire(tmp_path: Path) -> AsyncIterator[Wire]:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    broker = BrokerController(broker_config(str(tmp_path / "store"), None, acl_enable=True, acl_file=str(acl_file),
                                            ha_secret=HA_SECRET))
    await broker.start()
    conn = await connect(broker.broker_addr)
    try:
        w = Wire(conn, broker)
        for topic in (TOPIC, OTHER_TOPIC):
            created = await w.call(C.UPDATE_AND_CREATE_TOPIC, _create_fields(topic), ADMIN)
            assert created.code == R.SUCCESS, created.remark
        yield w
    finally:
        conn.close()
        await broker.stop()


def _create_fields(topic: str) -> dict[str, Any]:
    return dict(api.build_create_topic(topic, read_queue_nums=2, write_queue_nums=2, perm=6, order=False).ext_fields)


# ---- the table against the code, the docs and real clients ------------------------------------------------

def test_every_code_the_broker_answers_has_one_row(tmp_path: Path) -> None:
    broker = BrokerController(broker_config(str(tmp_path / "store")))
    assert set(broker.dispatcher.codes()) == set(BY_CODE)


def test_docs_table_is_the_code_table() -> None:
    text = (REPO_ROOT / "docs" / "security.md").read_text()
    assert docs_table() in text, "docs/security.md: paste acl.rules.docs_table() into 'Request codes'"


def _client_frames() -> list[RemotingCommand]:
    out = []
    for name in ("capture_cpp.jsonl", "capture_alions.jsonl", "capture_cpp_slave_only.jsonl"):
        path = CAPTURES / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            obj = json.loads(line)
            if obj.get("kind") != "frame" or "header_raw" not in obj or obj.get("role") == "ns":
                continue
            cmd = decode_json_header(obj["header_raw"].encode(), bytes.fromhex(obj.get("body_hex") or ""))
            if not cmd.is_response:
                out.append(cmd)
    return out


def test_real_clients_and_our_client_pass_the_shape_check() -> None:
    frames = _client_frames()
    if not frames:
        pytest.skip("captures not available")
    mq = MessageQueue(TOPIC, "b", 1)
    ours = [api.build_create_topic(TOPIC, read_queue_nums=4, write_queue_nums=4, perm=6, order=True),
            api.build_update_consumer_offset(GROUP, mq, -1), api.build_unregister("c", consumer_group=GROUP),
            api.build_send_back(group=GROUP, phy_offset=5, delay_level=0, origin_msg_id="m", origin_topic=TOPIC,
                                max_reconsume_times=16),
            api.build_lock(C.LOCK_BATCH_MQ, GROUP, "c", [mq]), api.build_lock(C.UNLOCK_BATCH_MQ, GROUP, "c", [mq])]
    for cmd in frames + ours:
        rule = BY_CODE.get(cmd.code)
        if rule is not None:
            signature.sign(cmd.ext_fields, cmd.body, *USER)
            assert shape_error(rule, cmd.ext_fields) is None, (cmd.code, cmd.ext_fields)


# ---- every row through a broker ---------------------------------------------------------------------------

def _row_request(code: int) -> tuple[dict[str, Any], bytes]:
    """A request of ``code`` naming TOPIC and GROUP wherever its rule reads a topic or group."""
    rule = BY_CODE[code]
    fields: dict[str, Any] = {}
    if rule.topic_key:
        fields[rule.topic_key] = TOPIC
    if rule.group_key:
        fields[rule.group_key] = GROUP
    if rule.right is Right.SUB_TOPIC_GROUP or code == C.QUERY_CONSUMER_OFFSET:
        fields["queueId"] = 0
    if code == C.UPDATE_CONSUMER_OFFSET:
        fields["commitOffset"] = 0
    body = b""
    if rule.right is Right.SUB_HEARTBEAT:
        body = orjson.dumps({"clientID": "c", "producerDataSet": [], "consumerDataSet": [
            {"groupName": GROUP, "subscriptionDataSet": [{"topic": TOPIC}]}]})
    if rule.right is Right.SUB_LOCK:
        body = orjson.dumps({"consumerGroup": GROUP, "clientId": "c",
                             "mqSet": [{"topic": TOPIC, "brokerName": "b", "queueId": 0}]})
    return fields, body


@pytest.mark.parametrize("code", sorted(BY_CODE), ids=lambda c: BY_CODE[c].name)
async def test_each_row_through_the_broker(wire: Wire, code: int) -> None:
    rule = BY_CODE[code]
    fields, body = _row_request(code)
    unsigned = await wire.call(code, fields, None, body)
    assert unsigned.code == R.NO_PERMISSION and "no AccessKey" in (unsigned.remark or "")
    nobody = await wire.call(code, fields, NOBODY, body)
    user = await wire.call(code, fields, USER, body)
    if rule.right is Right.ADMIN:
        for resp in (nobody, user):
            assert resp.code == R.NO_PERMISSION and "needs an admin account" in (resp.remark or ""), resp.remark
    elif rule.right in (Right.SIGNED, Right.PUB_HALF_TOPIC) or (rule.group_optional and not fields):
        assert nobody.code != R.NO_PERMISSION, nobody.remark
        assert user.code != R.NO_PERMISSION, user.remark
    else:
        assert nobody.code == R.NO_PERMISSION and "permission on" in (nobody.remark or ""), nobody.remark
        assert user.code != R.NO_PERMISSION, user.remark
        other = await wire.call(code, fields, OTHER, body)
        assert other.code == R.NO_PERMISSION, other.remark
    admin = await wire.call(code, fields, ADMIN, body)
    assert admin.code != R.NO_PERMISSION, admin.remark


async def test_issue_repros_of_non_admin_accounts(wire: Wire) -> None:
    # CLONE_GROUP_OFFSET onto a group the account has no rights on
    commit = await wire.call(C.UPDATE_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 0,
                                                        "commitOffset": 5})
    assert commit.code == R.SUCCESS, commit.remark
    clone = await wire.call(C.CLONE_GROUP_OFFSET, {"srcGroup": GROUP, "destGroup": OTHER_GROUP, "topic": TOPIC,
                                                   "offline": "false"})
    assert clone.code == R.NO_PERMISSION
    assert wire.broker.offsets.query(OTHER_GROUP, TOPIC, 0) < 0
    # LOCK_BATCH_MQ of another group's queues
    lock = orjson.dumps({"consumerGroup": OTHER_GROUP, "clientId": "thief",
                         "mqSet": [{"topic": OTHER_TOPIC, "brokerName": "b", "queueId": 0}]})
    assert (await wire.call(C.LOCK_BATCH_MQ, {}, USER, lock)).code == R.NO_PERMISSION
    assert (await wire.call(C.LOCK_BATCH_MQ, {}, OTHER, lock)).code == R.SUCCESS
    for code in (C.CLEAN_EXPIRED_CONSUMEQUEUE, C.CLEAN_UNUSED_TOPIC):
        assert (await wire.call(code, {})).code == R.NO_PERMISSION


# ---- item 2: replay under another code ---------------------------------------------------------------------

async def test_signed_create_topic_replayed_as_another_code_is_refused(wire: Wire) -> None:
    create = signed(C.UPDATE_AND_CREATE_TOPIC, _create_fields("RuleReplayTopic"), ADMIN)
    assert (await wire.send(create)).code == R.SUCCESS
    strict = [r.code for r in RULES if r.fields is not None and r.code != C.UPDATE_AND_CREATE_TOPIC]
    for code in strict:
        replay = RemotingCommand.request(code, dict(create.ext_fields), create.body)
        resp = await wire.send(replay)
        assert resp.code == R.NO_PERMISSION and "not defined for request code" in (resp.remark or ""), (code, resp)
    assert wire.broker.topics.get("RuleReplayTopic") is not None


# ---- item 3: shifted field boundaries ----------------------------------------------------------------------

def _shifts(fields: dict[str, str], max_chars: int = 3) -> list[dict[str, str]]:
    """Every header that signs like ``fields``: a boundary between two neighbours (in signed order) moved by up
    to ``max_chars`` characters either way."""
    keys = sorted(k for k in fields if k not in signature.UNSIGNED_KEYS)
    out = []
    for left, right in zip(keys, keys[1:], strict=False):
        joined = fields[left] + fields[right]
        cut = len(fields[left])
        for moved in range(-max_chars, max_chars + 1):
            if moved == 0 or not 0 <= cut + moved <= len(joined):
                continue
            out.append(dict(fields, **{left: joined[:cut + moved], right: joined[cut + moved:]}))
    return out


def _typed_fields(code: int) -> set[str]:
    rule = BY_CODE[code]
    return set(rule.numeric) | set(rule.flags)


def _non_canonical(code: int, fields: dict[str, str]) -> bool:
    rule = BY_CODE[code]
    return (any(k in fields and not CANONICAL_INT.match(fields[k]) for k in rule.numeric)
            or any(k in fields and fields[k] not in FLAG_VALUES for k in rule.flags)
            or fields.get("OnsChannel", "x")[-1:] in tuple("0123456789+-"))


SHIFT_CASES: list[tuple[int, dict[str, Any]]] = [
    (C.SEND_MESSAGE, send_v1(TOPIC, 1, producerGroup="pg", maxReconsumeTimes=16)),
    (C.SEND_MESSAGE_V2, {"a": "pg", "b": TOPIC, "c": "TBW102", "d": 4, "e": 1, "f": 0, "g": 1700000000000, "h": 0,
                         "i": "TAGS\x01TagA\x02", "j": 0, "k": "false", "l": 16, "m": "false"}),
    (C.PULL_MESSAGE, pull(TOPIC, GROUP, queue_id=0, offset=123, suspend_ms=0, sys_flag=4)),
    (C.QUERY_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 10}),
    (C.UPDATE_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": 0, "commitOffset": 123}),
    (C.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 10}),
    (C.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": TOPIC, "queueId": 0, "timestamp": 1700000000000}),
]


@pytest.mark.parametrize(("code", "fields"), SHIFT_CASES, ids=lambda v: BY_CODE[v].name if isinstance(v, int) else "")
async def test_shifted_boundaries_of_every_numeric_field_are_refused(wire: Wire, code: int,
                                                                     fields: dict[str, Any]) -> None:
    original = signed(code, fields, USER)
    base = dict(original.ext_fields)
    variants = _shifts(base)
    touched: set[str] = set()
    refused = 0
    for variant in variants:
        if not _non_canonical(code, variant):
            continue  # both sides still well-formed: indistinguishable without TLS (docs/security.md)
        touched |= {k for k in variant if variant[k] != base[k]} & _typed_fields(code)
        cmd = RemotingCommand.request(code, variant, original.body)
        assert signature.verify(cmd.ext_fields, cmd.body, USER[1])  # the shift keeps the signature valid
        resp = await wire.send(cmd)
        assert resp.code == R.NO_PERMISSION, (variant, resp.code, resp.remark)
        assert "canonical" in (resp.remark or "") or "true, false" in (resp.remark or "") \
            or "OnsChannel" in (resp.remark or ""), resp.remark
        refused += 1
    assert refused > 0
    present = {k for k in _typed_fields(code) if k in base}
    assert touched == present, f"numeric fields whose boundary was never shifted: {present - touched}"


async def test_the_issue_pull_shift_is_refused(wire: Wire) -> None:
    for i in range(3):
        sent = await wire.call(C.SEND_MESSAGE, send_v1(TOPIC, 1, properties=f"TAGS\x01t{i}\x02"), USER, b"m")
        assert sent.code == R.SUCCESS, sent.remark
    cmd = signed(C.PULL_MESSAGE, pull(TOPIC, GROUP, queue_id=0, offset=123, suspend_ms=0, sys_flag=4), USER)
    cmd.ext_fields.update(queueId="01", queueOffset="23")  # "0"+"123" == "01"+"23"
    assert signature.verify(cmd.ext_fields, cmd.body, USER[1])
    resp = await wire.send(cmd)
    assert resp.code == R.NO_PERMISSION and "queueId='01'" in (resp.remark or ""), resp.remark
    cmd.ext_fields.update(queueId="1", queueOffset="0")  # the honest request for queue 1 is served
    signature.sign(cmd.ext_fields, cmd.body, *USER)
    resp = await wire.send(cmd)
    assert resp.code == R.SUCCESS and len(records(resp.body)) == 3


# ---- item 1: END_TRANSACTION --------------------------------------------------------------------------------

def _end(phy: int, qo: int, kind: int, group: str = "txPg") -> dict[str, Any]:
    return {"producerGroup": group, "tranStateTableOffset": qo, "commitLogOffset": phy, "commitOrRollback": kind,
            "fromTransactionCheck": "false", "msgId": "x", "transactionId": "x"}


async def test_end_transaction_needs_pub_on_the_real_topic_and_one_decision(wire: Wire) -> None:
    half = await wire.call(C.SEND_MESSAGE, send_v1(TOPIC, 1, properties="TRAN_MSG\x01true\x02PGROUP\x01txPg\x02",
                                                   producerGroup="txPg", sysFlag=4), USER, b"tx-body")
    assert half.code == R.SUCCESS, half.remark
    _, _, phy = decode_offset_msg_id(half.ext_fields["msgId"])
    qo = int(half.ext_fields["queueOffset"])
    for keys in (OTHER, NOBODY):  # signed accounts without PUB on the half message's topic
        resp = await wire.call(C.END_TRANSACTION, _end(phy, qo, 12), keys)
        assert resp.code == R.NO_PERMISSION and f"PUB permission on topic {TOPIC}" in (resp.remark or "")
    assert (await wire.call(C.END_TRANSACTION, _end(phy, qo, 8, group="notTheGroup"))).code == R.SYSTEM_ERROR
    assert (await wire.call(C.END_TRANSACTION, _end(phy, qo, 8))).code == R.SUCCESS
    assert (await wire.call(C.END_TRANSACTION, _end(phy, qo, 8))).code == R.SUCCESS  # the same decision again
    second = await wire.call(C.END_TRANSACTION, _end(phy, qo, 12))
    assert second.code == R.TRANSACTION_FAILED and "already committed" in (second.remark or "")
    wire.broker.writer.reput_now()
    got = await wire.call(C.PULL_MESSAGE, pull(TOPIC, GROUP, queue_id=1, suspend_ms=0, sys_flag=4))
    assert got.code == R.SUCCESS and [m.body for m in records(got.body)] == [b"tx-body"]


# ---- item 4: secrets ----------------------------------------------------------------------------------------

async def test_get_broker_config_never_answers_a_secret(wire: Wire) -> None:
    for keys in (NOBODY, ADMIN):
        resp = await wire.call(C.GET_BROKER_CONFIG, {}, keys)
        assert resp.code == R.SUCCESS
        text = resp.body.decode()
        assert HA_SECRET not in text and "haSecret=******\n" in text
    echo = await wire.call(C.UPDATE_BROKER_CONFIG, {}, ADMIN, b"haSecret=******\n")
    assert echo.code == R.SYSTEM_ERROR and "haSecret" in (echo.remark or "")
    assert wire.broker.config.ha_secret == HA_SECRET


def test_unit_check_agrees_on_common_fields() -> None:
    acl = parse_acl(ACL)
    fields = {"topic": TOPIC, "ns": "n", "bname": "b", "lo": "false"}
    assert check(acl, "127.0.0.1", signed(C.DELETE_TOPIC_IN_BROKER, fields, ADMIN)) is None
    assert {"ns", "nsd", "bname", "oway", "lo"} <= COMMON_FIELDS
