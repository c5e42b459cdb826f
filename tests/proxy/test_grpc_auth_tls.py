"""ACL and TLS on the gRPC endpoint: the real 5.x SDK with right and wrong credentials against the same
``plain_acl.yml`` accounts as the remoting port, the exact status of each refusal through the generated
stubs, and the SDK over TLS with the remoting port's TLS settings."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from ferrymq.common.tls import ClientAuth, TlsMode, TlsServerSettings
from ferrymq.proxy.auth import ALGORITHM, parse_authorization, peer_ip, sign
from ferrymq.proxy.v2 import definition_pb2 as pb
from ferrymq.proxy.v2 import service_pb2 as spb
from ferrymq.proxy.v2 import service_pb2_grpc as sgrpc
from support.certs import CertSet, make_certs

pytestmark = pytest.mark.acceptance

TOPIC = "AclTopic"
OTHER_TOPIC = "AclOther"
GROUP = "aclGroup"
PRODUCER = ("producerAK", "producerSK1")
CONSUMER = ("consumerAK", "consumerSK1")

ACL_TEXT = f"""
accounts:
  - accessKey: {PRODUCER[0]}
    secretKey: {PRODUCER[1]}
    topicPerms: ["{TOPIC}=PUB"]
  - accessKey: {CONSUMER[0]}
    secretKey: {CONSUMER[1]}
    topicPerms: ["{TOPIC}=SUB", "{OTHER_TOPIC}=SUB"]
    groupPerms: ["{GROUP}=SUB"]
"""


def metadata(ak: str, sk: str, *, date_time: str | None = None, upper: bool = False) -> list[tuple[str, str]]:
    date_time = date_time or datetime.now().strftime("%Y%m%dT%H%M%SZ")
    signature = sign(sk, date_time)
    if upper:
        signature = signature.upper()
    return [("x-mq-date-time", date_time),
            ("authorization", f"{ALGORITHM} Credential={ak}, SignedHeaders=x-mq-date-time, Signature={signature}")]


def test_authorization_parsing() -> None:
    assert parse_authorization(f"{ALGORITHM} Credential=ak1234, SignedHeaders=x-mq-date-time, Signature=ab") == (
        "ak1234", "ab")
    assert parse_authorization(f"{ALGORITHM} Credential=ak1234/2026/rmq, Signature=ab") == ("ak1234", "ab")
    assert parse_authorization("Basic xyz") is None
    assert parse_authorization(f"{ALGORITHM} Credential=, Signature=ab") is None
    assert parse_authorization("") is None
    assert peer_ip("ipv4:127.0.0.1:5000") == "127.0.0.1"
    assert peer_ip("ipv6:[::1]:5000") == "::1"


class TestAcl:
    @pytest.fixture
    def proxy_settings(self, tmp_path: Path) -> dict[str, Any]:
        path = tmp_path / "plain_acl.yml"
        path.write_text(ACL_TEXT)
        return {"acl_path": str(path)}

    async def test_sdk_with_right_and_wrong_credentials(self, grpc_stack: Any) -> None:
        await grpc_stack.create_topic(TOPIC)
        await grpc_stack.create_topic(OTHER_TOPIC)
        ak, sk = PRODUCER
        produced = await grpc_stack.sdk("produce", topic=TOPIC, count=5, prefix="a", ak=ak, sk=sk)
        assert sum(1 for r in produced if r.get("ok")) == 5, produced[-3:]
        got = [r for r in await grpc_stack.sdk("simple", topic=TOPIC, group=GROUP, expect=5, ak=CONSUMER[0],
                                               sk=CONSUMER[1], timeout_s=60) if "body" in r]
        assert sorted(r["body"] for r in got) == [f"a-{i}" for i in range(5)]
        # a wrong secret: every send is refused as unauthenticated
        bad = await grpc_stack.sdk("produce", topic=TOPIC, count=1, prefix="x", ak=ak, sk="wrongSecret", rpc_s=3,
                                   timeout_s=30, check=False)
        assert not any(r.get("ok") for r in bad), bad
        # (the SDK reports the refused QueryRoute as a route it cannot fetch; the right key got the route)
        assert "route" in str(bad) or "signature check failed" in str(bad), bad[-2:]
        # the right account without PUB on the other topic
        forbidden = await grpc_stack.sdk("produce", topic=OTHER_TOPIC, count=1, prefix="y", ak=ak, sk=sk, rpc_s=3,
                                         timeout_s=30, check=False)
        assert not any(r.get("ok") for r in forbidden), forbidden
        assert "no PUB permission on topic" in str(forbidden), forbidden[-2:]
        # nothing of the refused sends was stored
        assert grpc_stack.broker.store.get_max_offset_in_queue(OTHER_TOPIC, 0) == 0
        # the producer's account may not consume
        denied = await grpc_stack.sdk("simple", topic=TOPIC, group=GROUP, expect=1, ak=ak, sk=sk, rpc_s=3,
                                      await_s=1, timeout_s=10, check=False)
        assert not [r for r in denied if "body" in r]
        assert "permission" in str(denied), denied[-2:]

    async def test_each_refusal_has_its_status(self, grpc_stack: Any) -> None:
        await grpc_stack.create_topic(TOPIC)
        async with grpc.aio.insecure_channel(grpc_stack.endpoints) as channel:
            stub = sgrpc.MessagingServiceStub(channel)
            message = pb.Message(topic=pb.Resource(name=TOPIC), body=b"z",
                                 system_properties=pb.SystemProperties(message_id=uuid.uuid4().hex.upper(),
                                                                       body_encoding=pb.IDENTITY,
                                                                       message_type=pb.NORMAL))
            send = spb.SendMessageRequest(messages=[message])

            async def code_of(meta: list[tuple[str, str]]) -> int:
                return (await stub.SendMessage(send, metadata=meta, timeout=10)).status.code

            assert await code_of([]) == pb.UNAUTHORIZED
            assert await code_of(metadata("noSuchAK", "whatever")) == pb.UNAUTHORIZED
            assert await code_of(metadata(PRODUCER[0], "wrongSecret")) == pb.UNAUTHORIZED
            assert await code_of(metadata(CONSUMER[0], CONSUMER[1])) == pb.FORBIDDEN  # SUB only
            assert await code_of(metadata(*PRODUCER)) == pb.OK
            assert await code_of(metadata(*PRODUCER, upper=True)) == pb.OK  # the Java SDK's upper-case hex
            # consumer RPCs need SUB on topic and group
            receive = spb.ReceiveMessageRequest(group=pb.Resource(name="otherGroup"), message_queue=pb.MessageQueue(
                topic=pb.Resource(name=TOPIC)), batch_size=1)
            answers = [r async for r in stub.ReceiveMessage(receive, metadata=metadata(*CONSUMER), timeout=10)]
            assert answers[0].status.code == pb.FORBIDDEN and "group otherGroup" in answers[0].status.message
            ack = await stub.AckMessage(spb.AckMessageRequest(group=pb.Resource(name=GROUP), topic=pb.Resource(
                name=TOPIC), entries=[spb.AckMessageEntry(receipt_handle="x")]), metadata=metadata(*PRODUCER),
                timeout=10)
            assert ack.status.code == pb.FORBIDDEN
            # the route is open to any signed account, as the name server's route query is
            route = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=TOPIC)),
                                          metadata=metadata(*CONSUMER), timeout=10)
            assert route.status.code == pb.OK
            route = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), timeout=10)
            assert route.status.code == pb.UNAUTHORIZED


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return make_certs(tmp_path_factory.mktemp("certs"))


class TestTls:
    @pytest.fixture
    def proxy_settings(self, certs: CertSet) -> dict[str, Any]:
        return {"tls_server": TlsServerSettings(TlsMode.ENFORCING, str(certs.server_cert), str(certs.server_key))}

    async def test_sdk_over_tls(self, grpc_stack: Any, certs: CertSet) -> None:
        topic = f"TLS_{uuid.uuid4().hex[:6]}"
        await grpc_stack.create_topic(topic)
        grpc_stack.env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(certs.ca)
        produced = await grpc_stack.sdk("produce", topic=topic, count=5, prefix="s", tls=True)
        assert sum(1 for r in produced if r.get("ok")) == 5, produced[-3:]
        got = [r for r in await grpc_stack.sdk("simple", topic=topic, group="tlsGroup", expect=5, tls=True,
                                               timeout_s=60) if "body" in r]
        assert sorted(r["body"] for r in got) == [f"s-{i}" for i in range(5)]
        # a plain client gets nothing through
        plain = await grpc_stack.sdk("produce", topic=topic, count=1, prefix="p", rpc_s=3, timeout_s=20,
                                     check=False)
        assert not any(r.get("ok") for r in plain)

    async def test_untrusted_server_certificate_is_refused(self, grpc_stack: Any, certs: CertSet) -> None:
        async with grpc.aio.secure_channel(grpc_stack.endpoints, grpc.ssl_channel_credentials(
                certs.other_ca.read_bytes())) as channel:
            stub = sgrpc.MessagingServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="x")), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.secure_channel(grpc_stack.endpoints, grpc.ssl_channel_credentials(
                certs.ca.read_bytes())) as channel:
            stub = sgrpc.MessagingServiceStub(channel)
            route = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="x")), timeout=5)
            assert route.status.code == pb.TOPIC_NOT_FOUND


class TestMutualTls:
    @pytest.fixture
    def proxy_settings(self, certs: CertSet) -> dict[str, Any]:
        return {"tls_server": TlsServerSettings(TlsMode.ENFORCING, str(certs.server_cert), str(certs.server_key),
                                                str(certs.ca), ClientAuth.REQUIRE)}

    async def test_client_certificate_required(self, grpc_stack: Any, certs: CertSet) -> None:
        request = spb.QueryRouteRequest(topic=pb.Resource(name="x"))
        async with grpc.aio.secure_channel(grpc_stack.endpoints, grpc.ssl_channel_credentials(
                certs.ca.read_bytes())) as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await sgrpc.MessagingServiceStub(channel).QueryRoute(request, timeout=5)
        creds = grpc.ssl_channel_credentials(certs.ca.read_bytes(), certs.client_key.read_bytes(),
                                             certs.client_cert.read_bytes())
        async with grpc.aio.secure_channel(grpc_stack.endpoints, creds) as channel:
            route = await sgrpc.MessagingServiceStub(channel).QueryRoute(request, timeout=5)
            assert route.status.code == pb.TOPIC_NOT_FOUND
