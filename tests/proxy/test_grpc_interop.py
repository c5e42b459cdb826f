"""4.x <-> 5.x interop through a broker serving gRPC in local mode, with real processes and real clients:
the C++ 1.x client (PyPI ``rocketmq==0.4.4``) producing to a 5.x Python SimpleConsumer, a 5.x Python
producer to the npm ali-ons (4.x remoting) consumer, and the npm 5.x client ``rocketmq-client-nodejs``
sending and receiving through gRPC."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sdk5_support import run_sdk_sync

from support.ports import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
from procs import (  # noqa: E402
    CPP_SCRIPTS_DIR,
    NODE_DIR,
    ProcessGroup,
    cpp_env,
    cpp_script_argv,
    create_topic,
    start_broker,
    start_namesrv,
    wait_route,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(400)]

START_TIMEOUT_S = 60
NODE5_REQUIREMENT = "rocketmq-client-nodejs@1.0.8"
#: npm's time to install the 5.x Node client
NPM_INSTALL_TIMEOUT_S = 600
#: a client script's time to finish
SCRIPT_TIMEOUT_S = 180
HERE = Path(__file__).resolve().parent



@dataclass
class LocalStack:
    namesrv_addr: str
    broker_addr: str
    endpoints: str

    def topic(self, prefix: str) -> str:
        topic = f"{prefix}_{uuid.uuid4().hex[:8]}"
        create_topic(self.broker_addr, topic)
        wait_route(self.namesrv_addr, topic, timeout_s=START_TIMEOUT_S)
        return topic


@pytest.fixture
def local_stack(procs: ProcessGroup) -> LocalStack:
    ns = start_namesrv(procs)
    grpc_port = free_port()
    broker = start_broker(procs, [ns.addr], enableGrpcServer=True, grpcServerPort=grpc_port)
    assert broker.proc is not None
    broker.proc.wait_log(rf"gRPC endpoint serving on 127\.0\.0\.1:{grpc_port}", timeout_s=START_TIMEOUT_S)
    return LocalStack(ns.addr, broker.addr, f"127.0.0.1:{grpc_port}")


def run_json(argv: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run a client script; its last stdout line parsed (a crash or a timeout fails the test)."""
    with open(log, "wb") as err:
        cp = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                            timeout=SCRIPT_TIMEOUT_S, start_new_session=True)
    out = cp.stdout.decode(errors="replace").strip()
    assert cp.returncode == 0 and out, f"{argv[1]} exited {cp.returncode}: {out[-2000:]} {log.read_text()[-2000:]}"
    return dict(json.loads(out.splitlines()[-1]))


def test_cpp_producer_to_sdk5_simple_consumer(local_stack: LocalStack, sdk5_path: Path, tmp_path: Path) -> None:
    topic = local_stack.topic("TCpp")
    out = tmp_path / "cpp-produce.jsonl"
    summary = run_json(cpp_script_argv("produce", {
        "namesrv": local_stack.namesrv_addr, "topic": topic, "group": "cpp_pg", "count": 10, "prefix": "c",
        "tags": ["TagA", "TagB"], "out": str(out), "deadline_s": 120}), cwd=CPP_SCRIPTS_DIR, env=cpp_env(tmp_path),
        log=tmp_path / "cpp.log")
    assert summary["sent_ok"] == 10, summary
    cpp_ids = {json.loads(line)["seq"]: json.loads(line)["msg_id"] for line in out.read_text().splitlines()}
    got = [r for r in run_sdk_sync(sdk5_path, tmp_path, local_stack.endpoints, "simple", topic=topic, group="g5",
                                   expect=10, timeout_s=60) if "body" in r]
    assert len(got) == 10
    for r in got:
        seq = int(r["props"]["seq"])
        # the C++ client's fields read the same through gRPC (see cpp_scripts/_cpp_common.py)
        assert r["body"] == f"c-body-{seq}-"
        assert r["tag"] == ["TagA", "TagB"][seq % 2]
        assert r["keys"] == [f"c-key-{seq}"]
        assert r["props"] == {"seq": str(seq), "myprop": f"c-v-{seq}"}
        assert r["message_id"] == cpp_ids[seq]
    assert sorted(int(r["props"]["seq"]) for r in got) == list(range(10))


def test_sdk5_producer_to_alions_consumer(local_stack: LocalStack, sdk5_path: Path, tmp_path: Path) -> None:
    assert (NODE_DIR / "node_modules" / "ali-ons").is_dir(), (
        "ali-ons is not installed: run `npm --prefix tests/acceptance/node install --no-audit --no-fund`")
    topic = local_stack.topic("TOns")
    produced = run_sdk_sync(sdk5_path, tmp_path, local_stack.endpoints, "produce", topic=topic, count=10, prefix="o",
                            tag="TagO", keys=True, props={"myprop": "v5"})
    ids = {f"o-{r['seq']}": r["message_id"] for r in produced if r.get("ok")}
    assert len(ids) == 10, produced[-3:]
    res = run_json(["node", str(HERE / "alions_consume.js"), json.dumps({
        "namesrv": local_stack.namesrv_addr, "topic": topic, "consumerGroup": "ons_cg", "expect": 10,
        "expression": "TagO", "timeoutMs": 90_000, "logDir": str(tmp_path)})], cwd=HERE, env=dict(os.environ),
        log=tmp_path / "alions.log")
    assert res.get("met"), res
    assert sorted(r["body"] for r in res["received"]) == sorted(ids)
    for r in res["received"]:
        seq = r["body"].split("-")[1]
        assert r["tags"] == "TagO"
        assert r["keys"] == f"k{seq}"
        assert r["props"]["myprop"] == "v5"
        assert r["props"]["UNIQ_KEY"] == ids[r["body"]]  # the 5.x message id is the 4.x unique key


@pytest.fixture(scope="session")
def node5_modules() -> Path:
    """node_modules holding the npm 5.x client (installed once into a cache folder of its own)."""
    if shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail("npm is needed for the 5.x Node client test")
        pytest.skip("npm not installed")
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ferrymq-tests"
    target = base / NODE5_REQUIREMENT.replace("@", "-")
    if (target / ".complete").exists():
        return target / "node_modules"
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    proc = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(tmp), NODE5_REQUIREMENT],
                          capture_output=True, text=True, timeout=NPM_INSTALL_TIMEOUT_S)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        message = f"cannot install {NODE5_REQUIREMENT}: {proc.stderr.strip()[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    (tmp / ".complete").write_text(NODE5_REQUIREMENT)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target / "node_modules"


def test_node5_client_round_trip(local_stack: LocalStack, node5_modules: Path, tmp_path: Path) -> None:
    topic = local_stack.topic("TNode5")
    res = run_json(["node", str(HERE / "node5_roundtrip.js"), json.dumps({
        "moduleDir": str(node5_modules), "endpoints": local_stack.endpoints, "topic": topic, "group": "node5_cg",
        "count": 10, "prefix": "n", "timeoutMs": 90_000})], cwd=HERE, env=dict(os.environ),
        log=tmp_path / "node5.log")
    assert not res["sendErrors"], res["sendErrors"][:3]
    assert res.get("met"), res
    ids = {f"n-{s['seq']}": s["messageId"] for s in res["sent"]}
    assert sorted(r["body"] for r in res["received"]) == sorted(ids)
    for r in res["received"]:
        seq = r["body"].split("-")[1]
        assert (r["tag"], r["keys"], r["props"]) == ("TagN", [f"n-key-{seq}"], {"seq": seq})
        assert r["messageId"] == ids[r["body"]]
