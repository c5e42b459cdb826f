"""plain_acl.yml parsing, the signature scheme (checked against real client frames), and the rights check."""

from __future__ import annotations

import json
import os

import orjson
import pytest

from ferrymq.acl.checker import ADMIN_CODES, check
from ferrymq.acl.config import parse_acl
from ferrymq.acl.guard import AclGuard
from ferrymq.acl.perm import Perm, parse_address_pattern
from ferrymq.errors import ConfigError
from ferrymq.remoting import signature
from ferrymq.remoting.codec import RemotingCommand, decode_json_header
from ferrymq.remoting.codes import RequestCode, ResponseCode
from support.shared import CAPTURES

ACL_TEXT = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: pubUser1
    secretKey: pubSecret1
    defaultTopicPerm: DENY
    topicPerms:
      - TopicA=PUB
  - accessKey: subUser1
    secretKey: subSecret1
    topicPerms: [TopicA=SUB]
    groupPerms: [GroupA=SUB]
  - accessKey: adminUser
    secretKey: adminSecret
    admin: true
  - accessKey: officeUser
    secretKey: officeSecret
    whiteRemoteAddress: 192.168.1.{1,2}
"""
PEER = "127.0.0.1"


def signed(code: int, fields: dict[str, str], body: bytes = b"", *, ak: str, sk: str) -> RemotingCommand:
    cmd = RemotingCommand.request(code, fields, body)
    signature.sign(cmd.ext_fields, cmd.body, ak, sk)
    return cmd


@pytest.mark.parametrize("name", ["capture_cpp.jsonl", "capture_alions.jsonl"])
def test_signature_matches_real_clients(name: str) -> None:
    """The C++ client and ali-ons signed these frames with an empty secret key."""
    path = CAPTURES / name
    checked = 0
    for line in path.read_text().splitlines():
        obj = json.loads(line)
        if obj.get("kind") != "frame" or "header_raw" not in obj:
            continue
        cmd = decode_json_header(obj["header_raw"].encode(), bytes.fromhex(obj.get("body_hex") or ""))
        if cmd.is_response or signature.SIGNATURE not in cmd.ext_fields:
            continue
        assert signature.verify(cmd.ext_fields, cmd.body, ""), (cmd.code, cmd.ext_fields)
        assert not signature.verify(cmd.ext_fields, cmd.body, "x")
        checked += 1
    assert checked > 10


def test_sign_and_verify_round_trip() -> None:
    cmd = signed(RequestCode.SEND_MESSAGE_V2, {"b": "TopicA", "a": "pg"}, b"body", ak="pubUser1", sk="pubSecret1")
    assert signature.verify(cmd.ext_fields, cmd.body, "pubSecret1")
    cmd.body = b"bodY"
    assert not signature.verify(cmd.ext_fields, cmd.body, "pubSecret1")


def test_send_needs_pub_on_topic() -> None:
    acl = parse_acl(ACL_TEXT)
    ok = signed(RequestCode.SEND_MESSAGE_V2, {"b": "TopicA"}, b"x", ak="pubUser1", sk="pubSecret1")
    assert check(acl, PEER, ok) is None
    other = signed(RequestCode.SEND_MESSAGE_V2, {"b": "TopicB"}, b"x", ak="pubUser1", sk="pubSecret1")
    assert "no PUB permission on topic TopicB" in (check(acl, PEER, other) or "")
    by_sub = signed(RequestCode.SEND_MESSAGE, {"topic": "TopicA"}, b"x", ak="subUser1", sk="subSecret1")
    assert "no PUB permission on topic TopicA" in (check(acl, PEER, by_sub) or "")


def test_pull_needs_sub_on_topic_and_group_and_retry_topics_use_the_group() -> None:
    acl = parse_acl(ACL_TEXT)
    pull = {"topic": "TopicA", "consumerGroup": "GroupA", "queueId": "0"}
    assert check(acl, PEER, signed(RequestCode.PULL_MESSAGE, pull, ak="subUser1", sk="subSecret1")) is None
    bad_group = dict(pull, consumerGroup="GroupB")
    reason = check(acl, PEER, signed(RequestCode.PULL_MESSAGE, bad_group, ak="subUser1", sk="subSecret1"))
    assert "group GroupB" in (reason or "")
    retry = dict(pull, topic="%RETRY%GroupA")
    assert check(acl, PEER, signed(RequestCode.PULL_MESSAGE, retry, ak="subUser1", sk="subSecret1")) is None
    dlq = dict(pull, topic="%DLQ%GroupB")
    assert "group GroupB" in (check(acl, PEER, signed(RequestCode.PULL_MESSAGE, dlq, ak="subUser1",
                                                      sk="subSecret1")) or "")
    reason = check(acl, PEER, signed(RequestCode.UPDATE_CONSUMER_OFFSET, pull, ak="pubUser1", sk="pubSecret1"))
    assert "no SUB permission" in (reason or "")


def test_heartbeat_needs_sub_on_its_groups_and_topics() -> None:
    acl = parse_acl(ACL_TEXT)
    body = orjson.dumps({"clientID": "c", "producerDataSet": [], "consumerDataSet": [
        {"groupName": "GroupA", "subscriptionDataSet": [{"topic": "TopicA"}, {"topic": "%RETRY%GroupA"}]}]})
    assert check(acl, PEER, signed(RequestCode.HEART_BEAT, {}, body, ak="subUser1", sk="subSecret1")) is None
    assert check(acl, PEER, signed(RequestCode.HEART_BEAT, {}, body, ak="pubUser1", sk="pubSecret1"))


def test_missing_or_wrong_signature_and_unknown_key() -> None:
    acl = parse_acl(ACL_TEXT)
    plain = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "TopicA", "queueId": "0"})
    assert "no AccessKey" in (check(acl, PEER, plain) or "")
    wrong = signed(RequestCode.GET_MAX_OFFSET, {"topic": "TopicA"}, ak="pubUser1", sk="wrongSecret")
    assert "signature check failed for AccessKey pubUser1" in (check(acl, PEER, wrong) or "")
    unknown = signed(RequestCode.GET_MAX_OFFSET, {"topic": "TopicA"}, ak="nobody1", sk="whatever")
    assert "no ACL account" in (check(acl, PEER, unknown) or "")
    no_sig = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"AccessKey": "pubUser1"})
    assert "no Signature" in (check(acl, PEER, no_sig) or "")


@pytest.mark.parametrize("code", sorted(ADMIN_CODES))
def test_admin_codes_need_an_admin_account(code: int) -> None:
    acl = parse_acl(ACL_TEXT)
    fields: dict[str, str] = {}  # (fields a code does not define are refused: test_acl_rules.py)
    assert check(acl, PEER, signed(code, fields, ak="adminUser", sk="adminSecret")) is None
    assert "needs an admin account" in (check(acl, PEER, signed(code, fields, ak="pubUser1", sk="pubSecret1")) or "")


def test_whitelisted_addresses_skip_the_checks() -> None:
    acl = parse_acl(ACL_TEXT)
    plain = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T"})
    assert check(acl, "10.10.103.7", plain) is None
    assert check(acl, "10.10.104.7", plain) is not None
    office = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T", "AccessKey": "officeUser"})
    assert check(acl, "192.168.1.2", office) is None
    assert check(acl, "192.168.1.3", office) is not None


def test_address_patterns() -> None:
    assert parse_address_pattern("*")("1.2.3.4")
    assert parse_address_pattern("10.1.1-20.*")("10.1.7.9")
    assert not parse_address_pattern("10.1.1-20.*")("10.1.21.9")
    assert parse_address_pattern("::1")("::1")
    with pytest.raises(ValueError):
        parse_address_pattern("10.1.300.*")


@pytest.mark.parametrize(("text", "key"), [
    ("accounts:\n  - accessKey: abcdefg\n    secretKey: abcdefg\n    defaultTopicPerm: WRITE\n",
     "accounts[0].defaultTopicPerm"),
    ("accounts:\n  - accessKey: abcdefg\n", "accounts[0].secretKey"),
    ("accounts:\n  - accessKey: abc\n    secretKey: abcdefg\n", "accounts[0].accessKey"),
    ("accounts:\n  - accessKey: abcdefg\n    secretKey: abcdefg\n    topicPerms: [TopicA]\n",
     "accounts[0].topicPerms[0]"),
    ("accounts:\n  - accessKey: abcdefg\n    secretKey: abcdefg\n    admin: yes please\n", "accounts[0].admin"),
    ("globalWhiteRemoteAddresses: [10.1.x.1]\n", "globalWhiteRemoteAddresses[0]"),
    ("acounts: []\n", "acounts"),
    ("accounts: [\n", "plain_acl.yml"),
])
def test_bad_files_name_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_acl(text)
    assert info.value.key == key


def test_perms_parse() -> None:
    acl = parse_acl(ACL_TEXT)
    assert acl.accounts["subUser1"].topic_perms == {"TopicA": Perm.SUB}
    assert acl.accounts["adminUser"].admin


def test_guard_reloads_on_change_and_keeps_the_last_good_acl(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "plain_acl.yml")
    with open(path, "w") as fh:
        fh.write(ACL_TEXT)
    guard = AclGuard(path, reload_interval_s=0)
    assert "pubUser1" in guard.acl.accounts
    with open(path, "w") as fh:
        fh.write("accounts:\n  - accessKey: newUser1\n    secretKey: newSecret1\n")
    os.utime(path, ns=(1, 1))
    guard.maybe_reload()
    assert set(guard.acl.accounts) == {"newUser1"}
    with open(path, "w") as fh:
        fh.write("accounts:\n  - accessKey: newUser1\n")
    os.utime(path, ns=(2, 2))
    guard.maybe_reload()
    assert set(guard.acl.accounts) == {"newUser1"}
    assert guard.last_reload_error is not None and "accounts[0].secretKey" in guard.last_reload_error


def test_guard_answers_no_permission_with_the_reason(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "plain_acl.yml")
    with open(path, "w") as fh:
        fh.write(ACL_TEXT)
    guard = AclGuard(path)
    calls: list[int] = []
    handler = guard.guarded(lambda conn, cmd: calls.append(cmd.code) or cmd.response(0))

    class Peer:
        peer_addr = "127.0.0.1:5555"

    denied = handler(Peer(), RemotingCommand.request(RequestCode.PULL_MESSAGE, {"topic": "TopicA"}))  # type: ignore[arg-type]
    assert denied.code == ResponseCode.NO_PERMISSION and "no AccessKey" in denied.remark
    allowed = handler(Peer(), signed(RequestCode.GET_MAX_OFFSET, {"topic": "TopicA"}, ak="pubUser1",  # type: ignore[arg-type]
                                      sk="pubSecret1"))
    assert allowed.code == 0 and calls == [RequestCode.GET_MAX_OFFSET]
