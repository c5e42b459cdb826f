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
from procs import ProcessGroup, create_topic, ferry_argv, start_broker, start_namesrv, wait_route  # noqa: E402

pytestmark = pytest.mark.acceptance

START_TIMEOUT_S = 60


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    group = ProcessGroup(tmp_path)
    try:
        yield group
    finally:
        group.stop_all()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(group.dump())


def round_trip(sdk5_path: Path, home: Path, endpoints: str, topic: str) -> None:
    produced = run_sdk_sync(sdk5_path, home, endpoints, "produce", topic=topic, count=5, prefix="L")
    assert sum(1 for r in produced if r.get("ok")) == 5, produced[-3:]
    got = [r for r in run_sdk_sync(sdk5_path, home, endpoints, "simple", topic=topic, group=f"g_{uuid.uuid4().hex[:6]}",
                                   expect=5, timeout_s=40) if "body" in r]
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
