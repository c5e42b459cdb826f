"""Local mode: ``enableGrpcServer=true`` makes the broker process serve RocketMQ 5 clients itself, and
``ferry proxy`` (cluster mode) runs as its own process; both with real processes and the real 5.x SDK."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sdk5_support import run_sdk_sync

from support.ports import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
from procs import (  # noqa: E402
    ProcessGroup,
    create_topic,
    ferry_argv,
    request,
    start_broker,
    start_namesrv,
    wait_route,
)

from ferrymq.remoting import signature  # noqa: E402
from ferrymq.remoting.codec import RemotingCommand  # noqa: E402
from ferrymq.remoting.codes import RequestCode, ResponseCode  # noqa: E402
from support.certs import make_certs  # noqa: E402

pytestmark = pytest.mark.acceptance

START_TIMEOUT_S = 60



def round_trip(sdk5_path: Path, home: Path, endpoints: str, topic: str, **sdk_args: object) -> None:
    produced = run_sdk_sync(sdk5_path, home, endpoints, "produce", topic=topic, count=5, prefix="L", **sdk_args)
    assert sum(1 for r in produced if r.get("ok")) == 5, produced[-3:]
    got = [r for r in run_sdk_sync(sdk5_path, home, endpoints, "simple", topic=topic, group=f"g_{uuid.uuid4().hex[:6]}",
                                   expect=5, timeout_s=40, **sdk_args) if "body" in r]
    assert sorted(r["body"] for r in got) == [f"L-{i}" for i in range(5)]


def test_broker_serves_grpc_in_local_mode(procs: ProcessGroup, sdk5_path: Path, tmp_path: Path) -> None:
    ns = start_namesrv(procs)
    grpc_port = free_port()
    broker = start_broker(procs, [ns.addr], enableGrpcServer=True, grpcServerPort=grpc_port)
    assert broker.proc is not None
    broker.proc.wait_log(rf"gRPC endpoint serving on 127\.0\.0\.1:{grpc_port}", timeout_s=START_TIMEOUT_S)
    topic = f"TL_{uuid.uuid4().hex[:6]}"
    create_topic(broker.addr, topic)
    wait_route(ns.addr, topic, timeout_s=START_TIMEOUT_S)
    round_trip(sdk5_path, tmp_path, f"127.0.0.1:{grpc_port}", topic)


def test_ferry_proxy_process(procs: ProcessGroup, sdk5_path: Path, tmp_path: Path) -> None:
    ns = start_namesrv(procs)
    broker = start_broker(procs, [ns.addr])
    port = free_port()
    proxy = procs.spawn("proxy", ferry_argv("proxy", "-n", ns.addr, "--listen", f"127.0.0.1:{port}"))
    proxy.wait_log(r"gRPC proxy serving", timeout_s=START_TIMEOUT_S)
    topic = f"TC_{uuid.uuid4().hex[:6]}"
    create_topic(broker.addr, topic)
    wait_route(ns.addr, topic, timeout_s=START_TIMEOUT_S)
    round_trip(sdk5_path, tmp_path, f"127.0.0.1:{port}", topic)


@pytest.mark.parametrize(("args", "fragment"), [
    (["--listen", "nonsense"], "--listen: expected HOST:PORT"),
    (["--listen", "127.0.0.1:99999"], "--listen: expected HOST:PORT"),
    ([], "Missing option '-n'"),
])
def test_ferry_proxy_usage_errors(args: list[str], fragment: str) -> None:
    argv = ferry_argv("proxy", *(["-n", "127.0.0.1:9876"] if args else []), *args)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and fragment in out.stderr, out.stderr


LOCAL_ACL = """
accounts:
  - accessKey: adminAK01
    secretKey: adminSK01
    admin: true
  - accessKey: appAK0001
    secretKey: appSK0001
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""


def test_local_mode_uses_the_brokers_acl_and_tls(procs: ProcessGroup, sdk5_path: Path, tmp_path: Path) -> None:
    """aclEnable and the TLS keys of broker.conf hold for the gRPC port too: the SDK over TLS with an
    account of the broker's plain_acl.yml works, a wrong secret does not (the endpoint's own calls to the
    broker sign with the ACL's admin account)."""
    certs = make_certs(tmp_path / "certs")
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(LOCAL_ACL)
    ns = start_namesrv(procs)
    grpc_port = free_port()
    broker = start_broker(procs, [ns.addr], enableGrpcServer=True, grpcServerPort=grpc_port, aclEnable=True,
                          aclFile=str(acl_file), tlsServerMode="permissive",
                          **{"tls.server.certPath": str(certs.server_cert),
                             "tls.server.keyPath": str(certs.server_key)})
    assert broker.proc is not None
    broker.proc.wait_log(rf"gRPC endpoint serving on 127\.0\.0\.1:{grpc_port}", timeout_s=START_TIMEOUT_S)
    topic = f"TA_{uuid.uuid4().hex[:6]}"
    cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})
    signature.sign(cmd.ext_fields, cmd.body, "adminAK01", "adminSK01")
    resp = request(broker.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, cmd.ext_fields)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    wait_route(ns.addr, topic, timeout_s=START_TIMEOUT_S)
    tls_env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(certs.ca)}
    endpoints = f"127.0.0.1:{grpc_port}"
    round_trip(sdk5_path, tmp_path, endpoints, topic, ak="appAK0001", sk="appSK0001", tls=True, env=tls_env)
    bad = run_sdk_sync(sdk5_path, tmp_path, endpoints, "produce", topic=topic, count=1, prefix="B", ak="appAK0001",
                       sk="notTheSecret", tls=True, rpc_s=3, timeout_s=20, env=tls_env, check=False)
    assert not any(r.get("ok") for r in bad), bad


def test_ferry_proxy_with_tls_config_and_acl_file(procs: ProcessGroup, sdk5_path: Path, tmp_path: Path) -> None:
    """``ferry proxy --tls-config FILE --acl-file plain_acl.yml``: the gRPC port serves TLS with the remoting
    TLS keys of FILE and checks 5.x clients against the accounts."""
    certs = make_certs(tmp_path / "certs")
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(LOCAL_ACL)
    tls_file = tmp_path / "tls.properties"
    tls_file.write_text(f"tlsServerMode=enforcing\ntls.server.certPath={certs.server_cert}\n"
                        f"tls.server.keyPath={certs.server_key}\n")
    ns = start_namesrv(procs)
    broker = start_broker(procs, [ns.addr])
    port = free_port()
    proxy = procs.spawn("proxy", ferry_argv("proxy", "-n", ns.addr, "--listen", f"127.0.0.1:{port}",
                                            "--tls-config", str(tls_file), "--acl-file", str(acl_file)))
    proxy.wait_log(r"gRPC proxy serving", timeout_s=START_TIMEOUT_S)
    topic = f"TP_{uuid.uuid4().hex[:6]}"
    create_topic(broker.addr, topic)
    wait_route(ns.addr, topic, timeout_s=START_TIMEOUT_S)
    tls_env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(certs.ca)}
    round_trip(sdk5_path, tmp_path, f"127.0.0.1:{port}", topic, ak="appAK0001", sk="appSK0001", tls=True,
               env=tls_env)
    bad = run_sdk_sync(sdk5_path, tmp_path, f"127.0.0.1:{port}", "produce", topic=topic, count=1, prefix="B",
                       ak="appAK0001", sk="notTheSecret", tls=True, rpc_s=3, timeout_s=20, env=tls_env, check=False)
    assert not any(r.get("ok") for r in bad), bad


@pytest.mark.parametrize(("args", "fragment"), [
    (["--tls-config", "/nonexistent/tls.properties"], "--tls-config"),
    (["--acl-file", "/nonexistent/plain_acl.yml"], "aclFile"),
])
def test_ferry_proxy_bad_tls_or_acl_file(args: list[str], fragment: str) -> None:
    out = subprocess.run(ferry_argv("proxy", "-n", "127.0.0.1:9876", "--listen", f"127.0.0.1:{free_port()}", *args),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "config error" in out.stderr and fragment in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
