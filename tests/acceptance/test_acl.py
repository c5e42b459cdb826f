"""ACL (aclEnable=true, plain_acl.yml) against a real broker process: the C++ client with right and wrong
secrets, our client per permission, admin request codes, whitelisting by reload, and a bad file at start."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from procs import (
    Cluster,
    ProcessGroup,
    ferry_argv,
    free_port,
    request,
    wait_for,
    wait_route,
    write_properties,
)

from ferrymq.client import Message, Producer
from ferrymq.client.consumer.pull import PullConsumer
from ferrymq.common.route import MessageQueue
from ferrymq.errors import NoPermissionError
from ferrymq.remoting import signature
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.acceptance

TOPIC = "AclTopic"
OTHER_TOPIC = "AclOtherTopic"
GROUP = "AclGroup"
ADMIN = ("aclAdmin1", "aclAdminSecret1")
PUB = ("aclPub01", "aclPubSecret1")
SUB = ("aclSub01", "aclSubSecret1")
JS = ("aclJsUser1", "aclJsSecret1")
JS_GROUP = "AclJsGroup"
ACL_YML = f"""
globalWhiteRemoteAddresses:
  - 10.255.255.*
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {PUB[0]}
    secretKey: {PUB[1]}
    defaultTopicPerm: DENY
    topicPerms:
      - {TOPIC}=PUB
  - accessKey: {SUB[0]}
    secretKey: {SUB[1]}
    topicPerms:
      - {TOPIC}=SUB
      - {OTHER_TOPIC}=SUB
    groupPerms:
      - {GROUP}=SUB
  - accessKey: {JS[0]}
    secretKey: {JS[1]}
    topicPerms:
      - {TOPIC}=PUB|SUB
    groupPerms:
      - {JS_GROUP}=SUB
"""
#: admin codes the broker serves, each with a harmless header
BROKER_ADMIN_REQUESTS: list[tuple[int, dict[str, str]]] = [
    (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "AclScratch", "defaultTopic": "TBW102", "readQueueNums": "1",
                                           "writeQueueNums": "1", "perm": "6", "topicFilterType": "SINGLE_TAG"}),
    (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "AclScratch"}),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}),
    (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "AclScratchGroup"}),
    (RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, {"accessKey": "aclScratch1", "secretKey": "aclScratchSecret"}),
    (RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {}),
    (RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, {"globalWhiteAddrs": "10.255.255.*"}),
    (RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, {}),
    (RequestCode.UPDATE_BROKER_CONFIG, {}),
    (222, {"topic": "AclTopic", "group": "AclGroup", "timestamp": "0", "isForce": "true"}),  # reset offsets
    (329, {}),  # DELETE_EXPIRED_COMMITLOG
    (RequestCode.CLONE_GROUP_OFFSET, {"srcGroup": GROUP, "destGroup": "AclScratchGroup", "topic": TOPIC}),
    (RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, {}),
    (RequestCode.CLEAN_UNUSED_TOPIC, {}),
]


def signed_request(addr: str, code: int, fields: dict[str, str], keys: tuple[str, str] | None,
                   body: bytes = b"") -> RemotingCommand:
    cmd = RemotingCommand.request(code, fields, body)
    if keys is not None:
        signature.sign(cmd.ext_fields, cmd.body, *keys)
    return request(addr, code, cmd.ext_fields, cmd.body)


@pytest.fixture
def acl_cluster(cluster: Callable[..., Cluster], procs: ProcessGroup) -> Cluster:
    acl_file = procs.base_dir / "plain_acl.yml"
    acl_file.write_text(ACL_YML)
    c = cluster(aclEnable=True, aclFile=str(acl_file))
    c.extra["acl_file"] = acl_file
    for topic in (TOPIC, OTHER_TOPIC):
        fields = dict(BROKER_ADMIN_REQUESTS[0][1], topic=topic, readQueueNums="2", writeQueueNums="2")
        resp = signed_request(c.broker_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, fields, ADMIN)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        wait_route(c.ns_addr, topic, timeout_s=45, broker_name=c.broker.broker_name, alive=c.alive)
    return c


def test_cpp_client_right_and_wrong_secret(acl_cluster: Cluster, run_script: Callable[..., dict[str, Any]],
                                           tmp_path: Path) -> None:
    base = {"namesrv": acl_cluster.ns_addr, "topic": TOPIC, "group": "acl_cpp_pg", "count": 3,
            "tags": ["TagA"], "deadline_s": 60, "timeout_ms": 3000}
    good = run_script("cpp", "produce", dict(base, prefix="good", access_key=PUB[0], secret_key=PUB[1],
                                             out=str(tmp_path / "good.jsonl")), timeout_s=120)
    assert good["sent_ok"] == 3, good
    bad = run_script("cpp", "produce", dict(base, prefix="bad", access_key=PUB[0], secret_key="notTheSecret",
                                            out=str(tmp_path / "bad.jsonl")), timeout_s=120)
    assert bad["sent_ok"] == 0 and bad["failed"] == 3, bad
    denied_topic = run_script("cpp", "produce", dict(base, topic=OTHER_TOPIC, prefix="other", access_key=PUB[0],
                                                     secret_key=PUB[1], out=str(tmp_path / "other.jsonl")),
                              timeout_s=120)
    assert denied_topic["sent_ok"] == 0, denied_topic
    assert "signature check failed for AccessKey" in signed_request(
        acl_cluster.broker_addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"},
        (PUB[0], "notTheSecret")).remark


def test_cpp21_client_right_and_wrong_secret(acl_cluster: Cluster, run_script: Callable[..., dict[str, Any]],
                                             tmp_path: Path) -> None:
    """The Apache C++ client 2.1 signs like 1.x: its sends with the right secret are stored, with a wrong one or
    to a topic without PUB refused; its pull consumer with SUB credentials reads them."""
    base = {"namesrv": acl_cluster.ns_addr, "topic": TOPIC, "group": "acl_cpp21_pg", "count": 3,
            "tags": ["TagA"], "deadline_s": 60, "timeout_ms": 3000}
    good = run_script("cpp21", "send", dict(base, prefix="good21", access_key=PUB[0], secret_key=PUB[1],
                                            out=str(tmp_path / "good.jsonl")), timeout_s=120)
    assert good["sent_ok"] == 3, good
    bad = run_script("cpp21", "send", dict(base, prefix="bad21", access_key=PUB[0], secret_key="notTheSecret",
                                           out=str(tmp_path / "bad.jsonl")), timeout_s=120)
    assert bad["sent_ok"] == 0 and bad["failed"] == 3, bad
    denied_topic = run_script("cpp21", "send", dict(base, topic=OTHER_TOPIC, prefix="other21", access_key=PUB[0],
                                                    secret_key=PUB[1], out=str(tmp_path / "other.jsonl")),
                              timeout_s=120)
    assert denied_topic["sent_ok"] == 0, denied_topic
    out = tmp_path / "pull.jsonl"
    pulled = run_script("cpp21", "pull", {"namesrv": acl_cluster.ns_addr, "topic": TOPIC, "group": GROUP,
                                          "expect_seqs": [0, 1, 2], "out": str(out), "timeout_s": 30,
                                          "access_key": SUB[0], "secret_key": SUB[1]}, timeout_s=90)
    assert pulled["met"], pulled
    assert {json.loads(line)["body"] for line in out.read_text().splitlines()} >= {
        f"good21-body-{i}-" for i in range(3)}


async def _client_session(ns_addr: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with Producer(ns_addr, "acl_py_pg", access_key=PUB[0], secret_key=PUB[1]) as producer:
        out["pub_send"] = (await producer.send(Message(TOPIC, b"hello"))).status.name
        try:
            await producer.send(Message(OTHER_TOPIC, b"nope"))
        except NoPermissionError as exc:
            out["pub_other"] = str(exc)
    async with Producer(ns_addr, "acl_py_pg2", access_key=SUB[0], secret_key=SUB[1]) as producer:
        try:
            await producer.send(Message(TOPIC, b"nope"))
        except NoPermissionError as exc:
            out["sub_send"] = str(exc)
    for name, keys in (("sub", SUB), ("pub", PUB)):
        consumer = PullConsumer(ns_addr, GROUP, access_key=keys[0], secret_key=keys[1])
        await consumer.start()
        try:
            queues = await consumer.fetch_subscribe_message_queues(TOPIC)
            found = 0
            for mq in queues:
                found += len((await consumer.pull(MessageQueue(mq.topic, mq.broker_name, mq.queue_id), 0)).messages)
            out[f"{name}_pulled"] = found
        except NoPermissionError as exc:
            out[f"{name}_pull_error"] = str(exc)
        finally:
            await consumer.close()
    return out


def test_our_client_per_permission(acl_cluster: Cluster) -> None:
    out = asyncio.run(_client_session(acl_cluster.ns_addr))
    assert out["pub_send"] == "SEND_OK"
    assert "no PUB permission on topic AclOtherTopic" in out["pub_other"]
    assert "no PUB permission on topic AclTopic" in out["sub_send"]
    assert out["sub_pulled"] == 1, out
    assert "no SUB permission" in out["pub_pull_error"], out
    unsigned = request(acl_cluster.broker_addr, RequestCode.PULL_MESSAGE, {"topic": TOPIC, "consumerGroup": GROUP})
    assert unsigned.code == ResponseCode.NO_PERMISSION and "no AccessKey" in (unsigned.remark or "")


@pytest.mark.parametrize(("code", "fields"), BROKER_ADMIN_REQUESTS)
def test_admin_codes_need_admin(acl_cluster: Cluster, code: int, fields: dict[str, str]) -> None:
    body = {RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: b'{"groupName":"AclScratchGroup"}',
            RequestCode.UPDATE_BROKER_CONFIG: b"brokerPermission=6\n"}.get(code, b"")
    for keys in (PUB, SUB):
        resp = signed_request(acl_cluster.broker_addr, code, fields, keys, body)
        assert resp.code == ResponseCode.NO_PERMISSION, (code, keys, resp.code, resp.remark)
        assert "needs an admin account" in (resp.remark or "")
    resp = signed_request(acl_cluster.broker_addr, code, fields, ADMIN, body)
    assert resp.code == ResponseCode.SUCCESS, (code, resp.remark)


def test_replay_under_another_code_and_shifted_numbers_are_refused(acl_cluster: Cluster) -> None:
    addr = acl_cluster.broker_addr
    fields = dict(BROKER_ADMIN_REQUESTS[0][1], topic="AclReplayTopic")
    create = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
    signature.sign(create.ext_fields, create.body, *ADMIN)
    assert request(addr, create.code, create.ext_fields).code == ResponseCode.SUCCESS
    replay = request(addr, RequestCode.DELETE_TOPIC_IN_BROKER, create.ext_fields)  # the same signed header
    assert replay.code == ResponseCode.NO_PERMISSION and "not defined for request code 215" in (replay.remark or "")
    assert "AclReplayTopic" in json.loads(request(addr, RequestCode.GET_ALL_TOPIC_CONFIG, create.ext_fields).body
                                          or b"{}").get("topicConfigTable", {})
    pull = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": 0, "queueOffset": 123, "maxMsgNums": 32, "sysFlag": 4,
        "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0})
    signature.sign(pull.ext_fields, pull.body, *SUB)
    shifted = dict(pull.ext_fields, queueId="01", queueOffset="23")  # signs like queueId=0, queueOffset=123
    resp = request(addr, RequestCode.PULL_MESSAGE, shifted)
    assert resp.code == ResponseCode.NO_PERMISSION and "not a canonical decimal" in (resp.remark or "")


def test_whitelist_by_reload_and_broken_reload_keeps_last_good(acl_cluster: Cluster) -> None:
    addr = acl_cluster.broker_addr
    acl_file: Path = acl_cluster.extra["acl_file"]
    fields = {"topic": TOPIC, "queueId": "0"}
    assert request(addr, RequestCode.GET_MAX_OFFSET, fields).code == ResponseCode.NO_PERMISSION
    acl_file.write_text(ACL_YML.replace("10.255.255.*", "127.0.0.*"))
    wait_for(lambda: request(addr, RequestCode.GET_MAX_OFFSET, fields).code == ResponseCode.SUCCESS,
             timeout_s=20, what="the whitelist to be reloaded", alive=acl_cluster.alive)
    acl_file.write_text(ACL_YML.replace("admin: true", "admin: maybe"))
    assert acl_cluster.broker.proc is not None
    proc = acl_cluster.broker.proc

    def refused_and_kept() -> bool:
        # the file is looked at when a request arrives (at most once a second)
        ok = request(addr, RequestCode.GET_MAX_OFFSET, fields).code == ResponseCode.SUCCESS
        return ok and "not reloaded, keeping the last good ACL: accounts[0].admin" in proc.log_text()

    wait_for(refused_and_kept, timeout_s=20, what="the broken file to be refused", alive=acl_cluster.alive)


def test_malformed_acl_file_stops_the_broker(tmp_path: Path) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL_YML.replace(f"{TOPIC}=PUB", f"{TOPIC}=WRITE"))
    conf = write_properties(tmp_path / "broker.conf", {
        "brokerName": f"acl-{uuid.uuid4().hex[:6]}", "listenPort": free_port(broker=True), "listenHost": "127.0.0.1",
        "storePathRootDir": str(tmp_path / "store"), "namesrvAddr": "127.0.0.1:1", "aclEnable": "true"})
    cp = subprocess.run(ferry_argv("broker", "-c", str(conf)), capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2, cp.stderr
    lines = [ln for ln in cp.stderr.splitlines() if ln.startswith("config error")]
    assert lines == ["config error: accounts[1].topicPerms[0]: expected one of DENY, PUB, SUB, PUB|SUB; got 'WRITE'"]


def _ferry_json(*args: str, keys: tuple[str, str] | None = ADMIN) -> tuple[int, Any, str]:
    creds = ["--access-key", keys[0], "--secret-key", keys[1]] if keys is not None else []
    cp = subprocess.run(ferry_argv(*creds, *args, "--json"), capture_output=True, text=True, timeout=60)
    out = json.loads(cp.stdout) if cp.returncode == 0 and cp.stdout.strip() else None
    return cp.returncode, out, cp.stderr


def test_ferry_acl_verbs_manage_the_file_remotely(acl_cluster: Cluster) -> None:
    ns, addr = acl_cluster.ns_addr, acl_cluster.broker_addr
    new = ("aclNewUser1", "aclNewSecret1")

    async def send_as(keys: tuple[str, str]) -> str:
        async with Producer(ns, "acl_verbs_pg", access_key=keys[0], secret_key=keys[1]) as producer:
            try:
                return (await producer.send(Message(TOPIC, b"v"))).status.name
            except NoPermissionError as exc:
                return str(exc)

    rc, _, err = _ferry_json("acl", "update", new[0], "--secret", new[1], "-n", ns, keys=PUB)
    assert rc != 0 and "needs an admin account" in err
    rc, versions, err = _ferry_json("acl", "versions", "-n", ns)
    assert rc == 0, err
    counter = versions[0]["counter"]
    rc, out, err = _ferry_json("acl", "update", new[0], "--secret", new[1], "--topic-perm", f"{TOPIC}=PUB", "-n", ns)
    assert rc == 0 and out == [{"accessKey": new[0], "broker": addr}], err
    assert asyncio.run(send_as(new)) == "SEND_OK"
    rc, accounts, err = _ferry_json("acl", "list", "-n", ns)
    assert rc == 0, err
    mine = [a for a in accounts if a["accessKey"] == new[0]]
    assert len(mine) == 1 and mine[0]["secretKey"] == "******" and mine[0]["topicPerms"] == f"{TOPIC}=PUB"
    assert _ferry_json("acl", "versions", "-n", ns)[1][0]["counter"] == counter + 1

    # a change that would break the file is refused and the file stays as it was
    rc, _, err = _ferry_json("acl", "update", "shortSecretUser", "--secret", "12", "-n", ns)
    assert rc != 0 and "secretKey" in err and "at least 6 characters" in err
    assert _ferry_json("acl", "versions", "-n", ns)[1][0]["counter"] == counter + 1

    rc, _, err = _ferry_json("acl", "update", new[0], "--topic-perm", f"{TOPIC}=DENY", "-n", ns)
    assert rc == 0, err
    assert "no PUB permission on topic AclTopic" in asyncio.run(send_as(new))
    rc, _, err = _ferry_json("acl", "delete", new[0], "-n", ns)
    assert rc == 0, err
    assert f"no ACL account for AccessKey {new[0]}" in asyncio.run(send_as(new))
    rc, _, err = _ferry_json("acl", "delete", new[0], "-n", ns)
    assert rc != 0 and "no account with accessKey" in err

    fields = {"topic": TOPIC, "queueId": "0"}
    assert request(addr, RequestCode.GET_MAX_OFFSET, fields).code == ResponseCode.NO_PERMISSION
    assert _ferry_json("acl", "white-addrs", "127.0.0.1", "-n", ns)[0] == 0
    assert request(addr, RequestCode.GET_MAX_OFFSET, fields).code == ResponseCode.SUCCESS  # in force at once
    assert _ferry_json("acl", "white-addrs", "-n", ns)[0] == 0
    assert request(addr, RequestCode.GET_MAX_OFFSET, fields).code == ResponseCode.NO_PERMISSION


def test_acl_codes_on_a_broker_without_acl(cluster: Callable[..., Cluster]) -> None:
    c = cluster()
    resp = request(c.broker_addr, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "aclEnable is false" in (resp.remark or "")


def test_alions_with_right_and_wrong_secret(acl_cluster: Cluster, run_script: Callable[..., dict[str, Any]]) -> None:
    base = {"namesrv": acl_cluster.ns_addr, "topic": TOPIC, "producerGroup": "acl_js_pg", "consumerGroup": JS_GROUP,
            "prefix": "js", "expression": "*", "logDir": str(acl_cluster.group.base_dir / "logs")}
    good = run_script("node", "alions_roundtrip", dict(base, count=5, timeoutMs=60_000, accessKeyId=JS[0],
                                                       accessKeySecret=JS[1]), timeout_s=120)
    assert "fatal" not in good and not good["sendErrors"], good
    assert [s["status"] for s in good["sent"]] == ["SEND_OK"] * 5
    assert good["met"] and sorted(r["seq"] for r in good["received"]) == list(range(5)), good["errors"][:5]
    bad = run_script("node", "alions_roundtrip", dict(base, count=2, timeoutMs=20_000, accessKeyId=JS[0],
                                                      accessKeySecret="notTheSecret"), timeout_s=120)
    assert bad.get("sent", []) == [] and len(bad.get("sendErrors", [])) == 2, bad
    assert "signature check failed for AccessKey aclJsUser1" in bad["errors"], bad["errors"][:3]
