"""The Spark connector against a name server and broker with ACL on and TLS permissive (real processes):
reading and writing with accessKey/secretKey over TLS, refused without credentials or with the wrong account,
and bad security options failing at load() naming the option."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.certs import CertSet, make_certs

pytestmark = pytest.mark.spark

TOPIC = "SparkAclTopic"
GROUP = "spark-acl-group"
ADMIN = ("sparkAdmin1", "sparkAdminSecret")
READER = ("sparkReader", "sparkReaderSecret")
WRITER = ("sparkWriter", "sparkWriterSecret")
ACL_YML = f"""
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {READER[0]}
    secretKey: {READER[1]}
    topicPerms: ["{TOPIC}=SUB"]
    groupPerms: ["{GROUP}=SUB"]
  - accessKey: {WRITER[0]}
    secretKey: {WRITER[1]}
    topicPerms: ["{TOPIC}=PUB"]
"""
COUNT = 20


class SecureCluster:
    def __init__(self, ns_addr: str, certs: CertSet) -> None:
        self.ns_addr = ns_addr
        self.certs = certs

    def options(self, keys: tuple[str, str] | None, **extra: str) -> dict[str, str]:
        opts = {"nameServer": self.ns_addr, "tlsTrustCertPath": str(self.certs.ca), **extra}
        if keys is not None:
            opts.update(accessKey=keys[0], secretKey=keys[1])
        return opts


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    import asyncio

    from procs import (
        Namesrv,
        ProcessGroup,
        cluster_info,
        ferry_argv,
        free_port,
        port_answers,
        start_broker,
        wait_for,
        wait_route,
        write_properties,
    )

    from ferrymq.client import Admin, Producer, new_message
    from ferrymq.common.tls import TlsClientSettings

    base = tmp_path_factory.mktemp("spark-secure")
    certs = make_certs(base / "certs")
    tls_props = {"tlsServerMode": "permissive", "tls.server.certPath": str(certs.server_cert),
                 "tls.server.keyPath": str(certs.server_key)}
    (base / "plain_acl.yml").write_text(ACL_YML)
    group = ProcessGroup(base)
    try:
        port = free_port()
        conf = write_properties(base / "namesrv.conf", dict(tls_props, listenHost="127.0.0.1", listenPort=port))
        proc = group.spawn("namesrv", ferry_argv("namesrv", "-c", str(conf)))
        ns = Namesrv(proc, port)
        wait_for(lambda: port_answers(port) and cluster_info(ns.addr) is not None, timeout_s=60,
                 what="name server", alive=[proc])
        broker = start_broker(group, [ns.addr], name="broker", aclEnable=True,
                              aclFile=str(base / "plain_acl.yml"), **tls_props)
        tls = TlsClientSettings(trust_cert_path=str(certs.ca))

        async def setup() -> None:
            async with Admin(ns.addr, access_key=ADMIN[0], secret_key=ADMIN[1], tls=tls) as admin:
                await admin.create_topic(TOPIC, broker_addr=broker.addr, read_queue_nums=2, write_queue_nums=2)
            async with Producer(ns.addr, "spark-acl-pg", access_key=WRITER[0], secret_key=WRITER[1],
                                tls=tls) as producer:
                for i in range(COUNT):
                    await producer.send(new_message(TOPIC, f"m{i}"))

        wait_route(ns.addr, "TBW102", timeout_s=30)
        asyncio.run(setup())
        yield SecureCluster(ns.addr, certs)
    except BaseException:
        print(group.dump())
        raise
    finally:
        group.stop_all()


def test_read_and_write_with_credentials_over_tls(spark: Any, secure: SecureCluster, tmp_path: Path) -> None:
    rows = (spark.read.format("rocketmq").options(**secure.options(READER, subscribe=TOPIC, group=GROUP)).load()
            .select("value").collect())
    assert sorted(bytes(r.value).decode() for r in rows) == sorted(f"m{i}" for i in range(COUNT))

    df = spark.createDataFrame([(f"w{i}",) for i in range(5)], "value string")
    df.write.format("rocketmq").mode("append").options(**secure.options(WRITER, topic=TOPIC)).save()
    total = spark.read.format("rocketmq").options(**secure.options(READER, subscribe=TOPIC, group=GROUP)).load()
    assert total.count() == COUNT + 5


def test_refused_without_the_right_account(spark: Any, secure: SecureCluster) -> None:
    with pytest.raises(Exception, match="no AccessKey|NO_PERMISSION|NoPermission"):
        spark.read.format("rocketmq").options(**secure.options(None, subscribe=TOPIC, group=GROUP)).load().count()
    with pytest.raises(Exception, match="no SUB permission"):
        spark.read.format("rocketmq").options(**secure.options(WRITER, subscribe=TOPIC, group=GROUP)).load().count()
    df = spark.createDataFrame([("nope",)], "value string")
    with pytest.raises(Exception, match="no PUB permission"):
        df.write.format("rocketmq").mode("append").options(**secure.options(READER, topic=TOPIC)).save()


def test_bad_security_options_fail_at_load(spark: Any, secure: SecureCluster) -> None:
    from pyspark.errors import AnalysisException

    cases = {
        "secretKey": {"accessKey": READER[0]},
        "tlsTrustCertPath": {"tlsTrustCertPath": "/nonexistent/ca.pem"},
        "tlsKeyPath": {"tlsCertPath": str(secure.certs.client_cert)},
        "tls": {"tls": "false", "tlsTrustCertPath": str(secure.certs.ca)},
    }
    for named, options in cases.items():
        with pytest.raises(AnalysisException, match=f"ConfigError: {named}"):
            spark.read.format("rocketmq").options(nameServer=secure.ns_addr, subscribe=TOPIC, **options).load()
