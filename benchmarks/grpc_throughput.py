"""Throughput of RocketMQ 5 clients through the gRPC proxy beside ferrymq's own client on the remoting port,
in one run on one host.

    python benchmarks/grpc_throughput.py [--count 3000] [--size 1024] [--sdk-dir DIR]

Starts a name server, a broker and ``ferry proxy`` as subprocesses (127.0.0.1, free ports, a temp dir), then
measures, each on its own topic:

* gRPC: the 5.x Python SDK (PyPI ``rocketmq-python-client==5.1.2``, installed with ``pip --target`` into
  ``--sdk-dir``, default the test suite's cache) in a subprocess: ``Producer.send`` one message at a time,
  then a ``SimpleConsumer`` receiving batches of 32 and acknowledging each message (``ack_async``, the
  batch's acks awaited before the next receive);
* remoting: ``ferrymq.client.Producer.send`` one message at a time, then a ``PushConsumer`` (batches of 32
  pulled, offsets committed by the client).

Both producers wait for each answer before the next send (one message in flight), so the rows compare the
per-message cost of each path. The broker also serves its own gRPC endpoint (local mode), measured as a third
row. ``--handlers`` measures only the proxy's handlers, called on the servicer without gRPC, in one process
with a name server and a broker (CPU per message from ``time.process_time``).

Figures and where the time goes: benchmarks/RESULTS.md, "gRPC endpoint (issue 27)". In short: the 0.5x
target is not met (0.16-0.29x produce, 0.02-0.04x consume on a busy 2-core machine); the proxy's Python
handlers are under 10% of its CPU, a grpc.aio unary call costs ~200 us of server CPU and as much in the SDK,
and the 5.x SimpleConsumer acknowledges each message with its own call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SDK_REQUIREMENT = "rocketmq-python-client==5.1.2"
#: how long a process gets to start serving
START_TIMEOUT_S = 60
#: SimpleConsumer batch and invisible time
RECEIVE_BATCH = 32
INVISIBLE_S = 30

SDK_SCRIPT = r'''
import json, sys, time
from concurrent.futures import wait
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
a = json.loads(sys.argv[1])
conf = ClientConfiguration(a["endpoints"], Credentials(), request_timeout=10)
body = b"x" * a["size"]
producer = Producer(conf, (a["topic"],))
producer.startup()
msg = Message(); msg.topic = a["topic"]; msg.body = body
producer.send(msg)  # warm-up (routes, connection); consumed below too
t0 = time.perf_counter()
for _ in range(a["count"] - 1):
    m = Message(); m.topic = a["topic"]; m.body = body
    producer.send(m)
produce_s = time.perf_counter() - t0
producer.shutdown()
consumer = SimpleConsumer(conf, a["group"], {a["topic"]: FilterExpression("*")}, await_duration=2)
consumer.startup()
acked = 0
t0 = time.perf_counter()
while acked < a["count"]:
    msgs = consumer.receive(a["batch"], a["invisible_s"])
    futures = [consumer.ack_async(m) for m in msgs]
    wait([f for f in futures if f is not None])
    acked += len(msgs)
consume_s = time.perf_counter() - t0
consumer.shutdown()
print(json.dumps({"produce_msgs": a["count"] - 1, "produce_s": produce_s, "consume_msgs": acked,
                  "consume_s": consume_s}))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_sdk(sdk_dir: Path) -> Path:
    if (sdk_dir / ".complete").exists():
        return sdk_dir
    sdk_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(sdk_dir), SDK_REQUIREMENT],
                   check=True)
    (sdk_dir / ".complete").write_text(SDK_REQUIREMENT)
    return sdk_dir


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not listening on {port}")


def ferry(*args: str) -> list[str]:
    return [sys.executable, "-m", "ferrymq.cli", *args]


async def remoting_run(ns_addr: str, topic: str, group: str, count: int, size: int) -> dict[str, float]:
    from ferrymq.client.consumer.push import PushConsumer
    from ferrymq.client.producer import Producer
    from ferrymq.client.values import ConsumeStatus
    from ferrymq.common.message import Message

    body = b"x" * size
    async with Producer(ns_addr, "bench_pg") as producer:
        await producer.send(Message(topic, body))  # warm-up
        t0 = time.perf_counter()
        for _ in range(count - 1):
            await producer.send(Message(topic, body))
        produce_s = time.perf_counter() - t0
    done = asyncio.Event()
    seen = 0

    async def listener(msgs: list[Any]) -> ConsumeStatus:
        nonlocal seen
        seen += len(msgs)
        if seen >= count:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(ns_addr, group, consume_from_where="CONSUME_FROM_FIRST_OFFSET", consume_batch_size=32,
                            rebalance_interval_ms=500)
    consumer.subscribe(topic, "*")
    consumer.register_message_listener(listener)
    t0 = time.perf_counter()
    await consumer.start()
    try:
        await asyncio.wait_for(done.wait(), 300)
    finally:
        consume_s = time.perf_counter() - t0
        await consumer.close()
    return {"produce_msgs": count - 1, "produce_s": produce_s, "consume_msgs": seen, "consume_s": consume_s}


async def create_topic(ns_addr: str, broker_addr: str, topic: str) -> None:
    from ferrymq.client.admin import Admin

    async with Admin(ns_addr) as admin:
        await admin.create_topic(topic, broker_addr=broker_addr, read_queue_nums=4, write_queue_nums=4)
        deadline = time.monotonic() + START_TIMEOUT_S
        while topic not in await admin.topic_list():
            if time.monotonic() > deadline:
                raise TimeoutError(f"route of {topic}")
            await asyncio.sleep(0.1)


class _Context:
    """What the handlers read of a grpc.aio ServicerContext."""

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return [("x-mq-client-id", "bench-client"), ("x-mq-language", "PYTHON")]

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def time_remaining(self) -> float:
        return 30.0


async def handlers_run(count: int, size: int) -> dict[str, float]:
    """The proxy's own cost without gRPC: SendMessage, then ReceiveMessage (32) + one AckMessage per message,
    called directly on the servicer, with a name server, broker and proxy in this one event loop (so the CPU
    per message includes the broker's side of each send and pull)."""
    import uuid

    from ferrymq.broker.app import BrokerController
    from ferrymq.broker.config import BrokerConfig
    from ferrymq.namesrv.app import NameServer
    from ferrymq.proxy.config import ProxyConfig
    from ferrymq.proxy.server import ProxyServer
    from ferrymq.proxy.v2 import definition_pb2 as pb
    from ferrymq.proxy.v2 import service_pb2 as spb

    work = tempfile.mkdtemp(prefix="grpcbench-inproc-")
    ns = NameServer("127.0.0.1", 0)
    await ns.start()
    broker = BrokerController(BrokerConfig(listen_port=0, listen_host="127.0.0.1", broker_ip1="127.0.0.1",
                                           store_path_root_dir=work, namesrv_addr=[ns.addr], fast_listen_enable=False))
    await broker.start()
    proxy = ProxyServer(ProxyConfig(ns.addr, listen_port=0))
    await proxy.start()
    try:
        await create_topic(ns.addr, broker.broker_addr, "BenchInProc")
        svc, ctx, body = proxy.service, _Context(), b"x" * size
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                await svc.instance.update_route("BenchInProc")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

        def send_request() -> Any:
            return spb.SendMessageRequest(messages=[pb.Message(
                topic=pb.Resource(name="BenchInProc"), body=body, system_properties=pb.SystemProperties(
                    message_id=uuid.uuid4().hex.upper(), body_encoding=pb.IDENTITY, message_type=pb.NORMAL))])

        requests = [send_request() for _ in range(count)]
        t0, c0 = time.perf_counter(), time.process_time()
        for req in requests:
            answer = await svc.SendMessage(req, ctx)
            assert answer.status.code == pb.OK, answer.status
        produce_s, produce_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        receive = spb.ReceiveMessageRequest(group=pb.Resource(name="bench_inproc"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name="BenchInProc"), broker=pb.Broker(name=broker.config.broker_name), id=-1),
            batch_size=RECEIVE_BATCH)
        receive.invisible_duration.FromSeconds(INVISIBLE_S)
        receive.long_polling_timeout.FromSeconds(1)
        got = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while got < count:
            messages = [r.message async for r in svc.ReceiveMessage(receive, ctx) if r.HasField("message")]
            for m in messages:
                ack = await svc.AckMessage(spb.AckMessageRequest(
                    group=receive.group, topic=receive.message_queue.topic, entries=[spb.AckMessageEntry(
                        message_id=m.system_properties.message_id,
                        receipt_handle=m.system_properties.receipt_handle)]), ctx)
                assert ack.status.code == pb.OK, ack.status
            got += len(messages)
        consume_s, consume_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    finally:
        await proxy.stop()
        await broker.stop()
        await ns.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {"produce_msgs": count, "produce_s": produce_s, "produce_cpu_s": produce_cpu_s, "consume_msgs": got,
            "consume_s": consume_s, "consume_cpu_s": consume_cpu_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--handlers", action="store_true",
                        help="only the proxy's handlers in one process, without gRPC (CPU per message)")
    parser.add_argument("--sdk-dir", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                        / "ferrymq-tests" / SDK_REQUIREMENT.replace("==", "-"))
    args = parser.parse_args()
    if args.handlers:
        runs = [asyncio.run(handlers_run(args.count, args.size)) for _ in range(args.repeats)]
        for phase in ("produce", "consume"):
            rate = statistics.median(r[f"{phase}_msgs"] / r[f"{phase}_s"] for r in runs)
            cpu_us = statistics.median(r[f"{phase}_cpu_s"] * 1e6 / r[f"{phase}_msgs"] for r in runs)
            print(f"{phase}: {rate:.0f} msg/s, {cpu_us:.0f} us CPU per message (median of {args.repeats})")
        return
    sdk = ensure_sdk(args.sdk_dir)
    work = Path(tempfile.mkdtemp(prefix="grpcbench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ns_port, broker_port, grpc_port, local_port = free_port(), free_port(), free_port(), free_port()
        logs = work / "logs"
        logs.mkdir()

        def spawn(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(argv, stdout=open(logs / f"{name}.log", "wb"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
            procs.append(proc)
            return proc

        ns_addr = f"127.0.0.1:{ns_port}"
        wait_port(ns_port, spawn("namesrv", ferry("namesrv", "--listen", ns_addr)), "namesrv")
        conf = work / "broker.conf"
        conf.write_text(f"listenPort={broker_port}\nlistenHost=127.0.0.1\nbrokerIP1=127.0.0.1\n"
                        f"storePathRootDir={work / 'store'}\nnamesrvAddr={ns_addr}\nfastListenEnable=false\n"
                        f"haListenPort={free_port()}\nenableGrpcServer=true\ngrpcServerPort={local_port}\n")
        wait_port(broker_port, spawn("broker", ferry("broker", "-c", str(conf))), "broker")
        wait_port(grpc_port, spawn("proxy", ferry("proxy", "-n", ns_addr, "--listen", f"127.0.0.1:{grpc_port}",
                                                  "--log-level", "WARNING")), "proxy")
        wait_port(local_port, procs[1], "broker's gRPC endpoint")
        rows: dict[str, list[dict[str, float]]] = {"grpc": [], "local": [], "remoting": []}
        for run in range(args.repeats):
            for path in ("grpc", "local", "remoting"):
                topic, group = f"Bench_{path}_{run}", f"bench_{path}_{run}"
                asyncio.run(create_topic(ns_addr, f"127.0.0.1:{broker_port}", topic))
                if path in ("grpc", "local"):
                    env = {**os.environ, "PYTHONPATH": str(sdk), "HOME": str(work)}
                    port = grpc_port if path == "grpc" else local_port
                    out = subprocess.run([sys.executable, "-c", SDK_SCRIPT, json.dumps({
                        "endpoints": f"127.0.0.1:{port}", "topic": topic, "group": group, "count": args.count,
                        "size": args.size, "batch": RECEIVE_BATCH, "invisible_s": INVISIBLE_S})],
                        env=env, capture_output=True, text=True, timeout=900, check=True)
                    rows[path].append(json.loads(out.stdout.strip().splitlines()[-1]))
                else:
                    rows[path].append(asyncio.run(remoting_run(ns_addr, topic, group, args.count, args.size)))
                r = rows[path][-1]
                print(f"run {run} {path:9s} produce {r['produce_msgs'] / r['produce_s']:8.0f} msg/s   "
                      f"consume {r['consume_msgs'] / r['consume_s']:8.0f} msg/s", flush=True)
        med = {p: (statistics.median(r["produce_msgs"] / r["produce_s"] for r in rs),
                   statistics.median(r["consume_msgs"] / r["consume_s"] for r in rs)) for p, rs in rows.items()}
        print(f"\n{args.count} x {args.size} B, median of {args.repeats}")
        print("| path | produce msg/s | consume msg/s |\n|---|---|---|")
        print(f"| 5.x SDK -> gRPC proxy -> broker | {med['grpc'][0]:.0f} | {med['grpc'][1]:.0f} |")
        print(f"| 5.x SDK -> broker's gRPC endpoint (local mode) | {med['local'][0]:.0f} | {med['local'][1]:.0f} |")
        print(f"| ferrymq client -> broker (remoting) | {med['remoting'][0]:.0f} | {med['remoting'][1]:.0f} |")
        print(f"| gRPC proxy / remoting | {med['grpc'][0] / med['remoting'][0]:.2f}x | "
              f"{med['grpc'][1] / med['remoting'][1]:.2f}x |")
        print(f"| local mode / remoting | {med['local'][0] / med['remoting'][0]:.2f}x | "
              f"{med['local'][1] / med['remoting'][1]:.2f}x |")
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
