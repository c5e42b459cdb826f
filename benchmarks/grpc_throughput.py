"""Throughput of RocketMQ 5 clients through the gRPC proxy beside ferrymq's own client on the remoting port,
in one run on one host.

    python benchmarks/grpc_throughput.py [--count 3000] [--size 1024] [--repeats 3] [--ceiling]
        [--baseline-pythonpath OTHER_CHECKOUT/src] [--paths grpc,local,remoting,ceiling] [--sdk-dir DIR]

Starts a name server, a broker serving its own gRPC endpoint (local mode) and ``ferry proxy`` as subprocesses
(127.0.0.1, free ports, a temp dir), then measures, each on its own topic, the paths in turn (their order
reversed every other repeat):

* gRPC (``ferry proxy`` -> broker, and local mode): the 5.x Python SDK (PyPI ``rocketmq-python-client==5.1.2``,
  installed with ``pip --target`` into ``--sdk-dir``, default the test suite's cache) in a subprocess:
  ``Producer.send`` one message at a time, then a ``SimpleConsumer`` receiving batches of 32 and acknowledging
  each message (``ack_async``, the batch's acks awaited before the next receive);
* remoting: ``ferrymq.client.Producer.send`` one message at a time, then a ``PushConsumer`` (batches of 32
  pulled, offsets committed by the client);
* ``--ceiling``: the same SDK script against a zero-work gRPC server (``ceiling_handlers``: canned,
  pre-serialized answers, no broker behind it, on the same grpc.aio server and event loop as ferrymq's
  endpoint): the most any server could get out of that client;
* ``--baseline-pythonpath DIR``: a second name server, broker and proxy run from another checkout (e.g. the
  tree before a change), its paths interleaved with this tree's: before/after in one run.

Both producers wait for each answer before the next send (one message in flight), so the rows compare the
per-message cost of each path. Besides msg/s, the CPU per message of the client and of each server process
(from /proc) is printed. ``--handlers`` measures only the proxy's handlers, called on the servicer without
gRPC, in one process with a name server and a broker (CPU per message from ``time.process_time``), reaching
the broker through a TCP connection and through local mode's in-memory one, interleaved.

Figures and where the time goes: benchmarks/RESULTS.md, "gRPC endpoint (issue 27)".
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
import json, os, sys, time
from concurrent.futures import wait
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
a = json.loads(sys.argv[1])
def cpu():  # CPU seconds of this process and of each server process
    out = [time.process_time()]
    for pid in a["server_pids"]:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        out.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out
conf = ClientConfiguration(a["endpoints"], Credentials(), request_timeout=10)
body = b"x" * a["size"]
producer = Producer(conf, (a["topic"],))
producer.startup()
msg = Message(); msg.topic = a["topic"]; msg.body = body
producer.send(msg)  # warm-up (routes, connection); consumed below too
c0, t0 = cpu(), time.perf_counter()
for _ in range(a["count"] - 1):
    m = Message(); m.topic = a["topic"]; m.body = body
    producer.send(m)
produce_s, produce_cpu = time.perf_counter() - t0, [b - a for a, b in zip(c0, cpu())]
producer.shutdown()
consumer = SimpleConsumer(conf, a["group"], {a["topic"]: FilterExpression("*")}, await_duration=2)
consumer.startup()
acked = 0
c0, t0 = cpu(), time.perf_counter()
while acked < a["count"]:
    msgs = consumer.receive(a["batch"], a["invisible_s"])
    futures = [consumer.ack_async(m) for m in msgs]
    wait([f for f in futures if f is not None])
    acked += len(msgs)
consume_s, consume_cpu = time.perf_counter() - t0, [b - a for a, b in zip(c0, cpu())]
consumer.shutdown()
print(json.dumps({"produce_msgs": a["count"] - 1, "produce_s": produce_s, "consume_msgs": acked,
                  "consume_s": consume_s, "produce_cpu": produce_cpu, "consume_cpu": consume_cpu}))
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


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_now(server_pids: list[int]) -> list[float]:
    return [time.process_time(), *(proc_cpu_s(pid) for pid in server_pids)]


async def remoting_run(ns_addr: str, topic: str, group: str, count: int, size: int,
                       server_pids: list[int]) -> dict[str, Any]:
    from ferrymq.client.consumer.push import PushConsumer
    from ferrymq.client.producer import Producer
    from ferrymq.client.values import ConsumeStatus
    from ferrymq.common.message import Message

    body = b"x" * size
    async with Producer(ns_addr, "bench_pg") as producer:
        await producer.send(Message(topic, body))  # warm-up
        c0, t0 = cpu_now(server_pids), time.perf_counter()
        for _ in range(count - 1):
            await producer.send(Message(topic, body))
        produce_s = time.perf_counter() - t0
        produce_cpu = [b - a for a, b in zip(c0, cpu_now(server_pids), strict=True)]
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
    c0, t0 = cpu_now(server_pids), time.perf_counter()
    await consumer.start()
    try:
        await asyncio.wait_for(done.wait(), 300)
    finally:
        consume_s = time.perf_counter() - t0
        consume_cpu = [b - a for a, b in zip(c0, cpu_now(server_pids), strict=True)]
        await consumer.close()
    return {"produce_msgs": count - 1, "produce_s": produce_s, "consume_msgs": seen, "consume_s": consume_s,
            "produce_cpu": produce_cpu, "consume_cpu": consume_cpu}


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


async def handlers_run(count: int, size: int, *, loopback: bool) -> dict[str, float]:
    """The proxy's own cost without gRPC: SendMessage, then ReceiveMessage (32) + one AckMessage per message,
    called directly on the servicer, with a name server, broker and proxy in this one event loop (so the CPU
    per message includes the broker's side of each send and pull)."""
    import uuid

    from ferrymq.broker.app import BrokerController
    from ferrymq.broker.config import BrokerConfig
    from ferrymq.namesrv.app import NameServer
    from ferrymq.proxy.config import ProxyConfig
    from ferrymq.proxy.loopback import LocalBroker
    from ferrymq.proxy.server import ProxyServer
    from ferrymq.proxy.v2 import definition_pb2 as pb
    from ferrymq.proxy.v2 import service_pb2 as spb

    work = tempfile.mkdtemp(prefix="grpcbench-inproc-")
    ns = NameServer("127.0.0.1", 0)
    await ns.start()
    broker = BrokerController(BrokerConfig(listen_port=0, listen_host="127.0.0.1", broker_ip1="127.0.0.1",
                                           store_path_root_dir=work, namesrv_addr=[ns.addr], fast_listen_enable=False))
    await broker.start()
    proxy = ProxyServer(ProxyConfig(ns.addr, listen_port=0),
                        local_broker=LocalBroker(broker.broker_addr, broker.dispatcher, broker._on_connection_closed)
                        if loopback else None)
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


#: the service the zero-work server (``--ceiling``) answers
CEILING_SERVICE = "apache.rocketmq.v2.MessagingService"
#: table rows
PATH_NAMES = {"grpc": "5.x SDK -> `ferry proxy` -> broker", "local": "5.x SDK -> broker's gRPC endpoint (local mode)",
              "remoting": "ferrymq client -> broker (remoting)",
              "ceiling": "5.x SDK -> zero-work gRPC server (ceiling)"}


def ceiling_handlers(size: int) -> Any:
    """A ``MessagingService`` that does no broker work at all: routes naming itself, every SendMessage a
    canned OK, every ReceiveMessage the same pre-serialized batch of RECEIVE_BATCH messages of ``size`` bytes,
    every AckMessage OK, the client's Telemetry settings echoed. Hot answers are bytes serialized once (the
    handlers do not even parse their requests): the fastest a Python grpc.aio server can answer these calls,
    so the SDK's rate against it is the most any server could get out of that client."""
    import hashlib

    import grpc

    from ferrymq.proxy.v2 import definition_pb2 as pb
    from ferrymq.proxy.v2 import service_pb2 as spb

    ok = pb.Status(code=pb.OK, message="OK")
    body = b"x" * size
    now = time.time()
    send_ok = spb.SendMessageResponse(status=ok, entries=[spb.SendResultEntry(
        status=ok, message_id="0" * 32, offset=1)]).SerializeToString()
    ack_ok = spb.AckMessageResponse(status=ok).SerializeToString()
    heartbeat_ok = spb.HeartbeatResponse(status=ok).SerializeToString()
    bye_ok = spb.NotifyClientTerminationResponse(status=ok).SerializeToString()
    batch = [spb.ReceiveMessageResponse(status=ok).SerializeToString()]
    stamp = spb.ReceiveMessageResponse()
    stamp.delivery_timestamp.FromSeconds(int(now))
    batch.append(stamp.SerializeToString())
    for i in range(RECEIVE_BATCH):
        r = spb.ReceiveMessageResponse()
        m = r.message
        m.topic.name = "ceiling"
        m.body = body
        sp = m.system_properties
        sp.message_id = f"{i:032X}"
        sp.body_encoding = pb.IDENTITY
        sp.message_type = pb.NORMAL
        sp.born_timestamp.FromSeconds(int(now))
        sp.born_host = "127.0.0.1"
        sp.store_timestamp.FromSeconds(int(now))
        sp.store_host = "127.0.0.1:10911"
        sp.queue_id = 0
        sp.queue_offset = i
        sp.body_digest.type = pb.MD5
        sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()
        sp.receipt_handle = f"ceiling.{i}.0.{i}.broker-a"
        sp.invisible_duration.FromSeconds(INVISIBLE_S)
        sp.delivery_attempt = 1
        batch.append(r.SerializeToString())
    port = 0

    def endpoints() -> Any:
        return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=port)])

    async def query_route(request: Any, context: Any) -> Any:
        return spb.QueryRouteResponse(status=ok, message_queues=[pb.MessageQueue(
            topic=request.topic, id=q, permission=pb.READ_WRITE, broker=pb.Broker(name="broker-a", id=0,
                                                                                   endpoints=endpoints()),
            accept_message_types=[pb.NORMAL]) for q in range(4)])

    async def receive(request: bytes, context: Any) -> Any:
        for answer in batch:
            yield answer

    async def telemetry(requests: Any, context: Any) -> Any:
        async for command in requests:
            if command.WhichOneof("command") == "settings":
                yield spb.TelemetryCommand(status=ok, settings=command.settings)

    def raw(answer: bytes) -> Any:
        async def handler(request: bytes, context: Any) -> bytes:
            return answer
        return grpc.unary_unary_rpc_method_handler(handler, request_deserializer=None, response_serializer=None)

    handlers = {
        "QueryRoute": grpc.unary_unary_rpc_method_handler(
            query_route, request_deserializer=spb.QueryRouteRequest.FromString,
            response_serializer=spb.QueryRouteResponse.SerializeToString),
        "Heartbeat": raw(heartbeat_ok),
        "SendMessage": raw(send_ok),
        "ReceiveMessage": grpc.unary_stream_rpc_method_handler(receive),
        "AckMessage": raw(ack_ok),
        "NotifyClientTermination": raw(bye_ok),
        "Telemetry": grpc.stream_stream_rpc_method_handler(
            telemetry, request_deserializer=spb.TelemetryCommand.FromString,
            response_serializer=spb.TelemetryCommand.SerializeToString),
    }

    def set_port(bound: int) -> None:
        nonlocal port
        port = bound

    return grpc.method_handlers_generic_handler(CEILING_SERVICE, handlers), set_port


def path_name(path: str) -> str:
    kind, _, label = path.partition(" ")
    return f"{PATH_NAMES[kind]} {label}".rstrip()


async def serve_ceiling(port: int, size: int) -> None:
    """Run the zero-work server on 127.0.0.1:``port`` until SIGTERM (``--serve-ceiling``), with the same grpc
    server options as ferrymq's endpoint (proxy/server.py)."""
    import grpc

    from ferrymq.proxy.server import MAX_GRPC_MESSAGE_BYTES

    handler, set_port = ceiling_handlers(size)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
                                      ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
                                      ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    set_port(server.add_insecure_port(f"127.0.0.1:{port}"))
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--handlers", action="store_true",
                        help="only the proxy's handlers in one process, without gRPC (CPU per message)")
    parser.add_argument("--sdk-dir", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                        / "ferrymq-tests" / SDK_REQUIREMENT.replace("==", "-"))
    parser.add_argument("--ceiling", action="store_true",
                        help="also run the SDK against a zero-work gRPC server (the most any server could get)")
    parser.add_argument("--paths", default="",
                        help="comma-separated subset of grpc,local,remoting,ceiling to run (default: all)")
    parser.add_argument("--baseline-pythonpath", type=Path, default=None,
                        help="also run a second name server, broker and proxy with this PYTHONPATH (e.g. another "
                             "checkout's src/), interleaved with this tree's: before/after in one run")
    parser.add_argument("--serve-ceiling", type=int, default=None, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_ceiling is not None:
        from ferrymq.cli.broker import event_loop_factory

        # the event loop ferrymq's servers run on (uvloop when installed)
        loop_factory = asyncio.new_event_loop if os.environ.get("CEILING_ASYNCIO_LOOP") else event_loop_factory()
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve_ceiling(args.serve_ceiling, args.size))
        return
    if args.handlers:
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for run in range(args.repeats):  # the two ways to reach the broker interleaved, alternating first
            for loopback in ((False, True) if run % 2 == 0 else (True, False)):
                runs[loopback].append(asyncio.run(handlers_run(args.count, args.size, loopback=loopback)))
        for loopback, rs in runs.items():
            way = "in-memory connection (local mode)" if loopback else "TCP connection"
            for phase in ("produce", "consume"):
                rate = statistics.median(r[f"{phase}_msgs"] / r[f"{phase}_s"] for r in rs)
                cpu_us = statistics.median(r[f"{phase}_cpu_s"] * 1e6 / r[f"{phase}_msgs"] for r in rs)
                print(f"{way}: {phase}: {rate:.0f} msg/s, {cpu_us:.0f} us CPU per message (median of {args.repeats})")
        print(f"load average {os.getloadavg()[0]:.1f} (1 min, at the end)")
        return
    sdk = ensure_sdk(args.sdk_dir)
    work = Path(tempfile.mkdtemp(prefix="grpcbench-"))
    procs: list[subprocess.Popen[bytes]] = []
    logs = work / "logs"
    logs.mkdir()

    def spawn(name: str, argv: list[str], pythonpath: str | None = None) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        proc = subprocess.Popen(argv, stdout=open(logs / f"{name}.log", "wb"), stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
        procs.append(proc)
        return proc

    def start_stack(label: str, pythonpath: str | None) -> dict[str, Any]:
        """A name server, a broker serving its own gRPC endpoint (local mode) and ``ferry proxy``, all run with
        ``pythonpath`` (None: this tree)."""
        ns_port, broker_port, grpc_port, local_port = free_port(), free_port(), free_port(), free_port()
        ns_addr = f"127.0.0.1:{ns_port}"
        wait_port(ns_port, spawn(f"namesrv-{label}", ferry("namesrv", "--listen", ns_addr), pythonpath), "namesrv")
        conf = work / f"broker-{label}.conf"
        conf.write_text(f"listenPort={broker_port}\nlistenHost=127.0.0.1\nbrokerIP1=127.0.0.1\n"
                        f"storePathRootDir={work / ('store-' + label)}\nnamesrvAddr={ns_addr}\n"
                        f"fastListenEnable=false\nhaListenPort={free_port()}\nenableGrpcServer=true\n"
                        f"grpcServerPort={local_port}\n")
        broker = spawn(f"broker-{label}", ferry("broker", "-c", str(conf)), pythonpath)
        wait_port(broker_port, broker, "broker")
        proxy = spawn(f"proxy-{label}", ferry("proxy", "-n", ns_addr, "--listen", f"127.0.0.1:{grpc_port}",
                                              "--log-level", "WARNING"), pythonpath)
        wait_port(grpc_port, proxy, "proxy")
        wait_port(local_port, broker, "broker's gRPC endpoint")
        return {"ns_addr": ns_addr, "broker_addr": f"127.0.0.1:{broker_port}", "grpc": grpc_port,
                "local": local_port, "broker_pid": broker.pid, "proxy_pid": proxy.pid}

    try:
        stacks = {"": start_stack("this", None)}
        if args.baseline_pythonpath:
            stacks[" (baseline)"] = start_stack("baseline", str(args.baseline_pythonpath))
        ceiling_port = ceiling_pid = 0
        if args.ceiling:
            ceiling_port = free_port()
            ceiling = spawn("ceiling", [sys.executable, __file__, "--serve-ceiling", str(ceiling_port), "--size",
                                        str(args.size)])
            ceiling_pid = ceiling.pid
            wait_port(ceiling_port, ceiling, "zero-work gRPC server")
        paths = [f"{kind}{label}" for label in stacks for kind in ("grpc", "local")] + ["remoting"]
        if args.ceiling:
            paths.append("ceiling")
        if args.paths:
            wanted = {p.strip() for p in args.paths.split(",")}
            paths = [p for p in paths if p.split(" ")[0] in wanted]
        rows: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
        for run in range(args.repeats):
            order = paths if run % 2 == 0 else paths[::-1]  # alternate the order: no path always runs first
            for path in order:
                kind, _, label = path.partition(" ")
                stack = stacks[f" {label}" if label else ""]
                topic = f"Bench_{kind}_{'b' if label else 't'}_{run}"
                group = topic.lower()
                if kind != "ceiling":
                    asyncio.run(create_topic(stack["ns_addr"], stack["broker_addr"], topic))
                pids = {"ceiling": [ceiling_pid], "grpc": [stack["proxy_pid"], stack["broker_pid"]]}.get(
                    kind, [stack["broker_pid"]])
                if kind == "remoting":
                    rows[path].append(asyncio.run(remoting_run(stack["ns_addr"], topic, group, args.count,
                                                               args.size, pids)))
                else:
                    port = ceiling_port if kind == "ceiling" else stack[kind]
                    env = {**os.environ, "PYTHONPATH": str(sdk), "HOME": str(work)}
                    out = subprocess.run([sys.executable, "-c", SDK_SCRIPT, json.dumps({
                        "endpoints": f"127.0.0.1:{port}", "topic": topic, "group": group, "count": args.count,
                        "size": args.size, "batch": RECEIVE_BATCH, "invisible_s": INVISIBLE_S,
                        "server_pids": pids})],
                        env=env, capture_output=True, text=True, timeout=900, check=True)
                    rows[path].append(json.loads(out.stdout.strip().splitlines()[-1]))
                r = rows[path][-1]
                print(f"run {run} {path:22s} produce {r['produce_msgs'] / r['produce_s']:8.0f} msg/s   "
                      f"consume {r['consume_msgs'] / r['consume_s']:8.0f} msg/s", flush=True)
        med = {p: (statistics.median(r["produce_msgs"] / r["produce_s"] for r in rs),
                   statistics.median(r["consume_msgs"] / r["consume_s"] for r in rs)) for p, rs in rows.items()}
        print(f"\n{args.count} x {args.size} B, median of {args.repeats}, load average {os.getloadavg()[0]:.1f} "
              "(1 min, at the end)")
        print("| path | produce msg/s | consume msg/s | produce / remoting | consume / remoting |\n|---|---|---|---|---|")
        for path in paths:
            ratio = " | |"
            if "remoting" in med and path != "remoting":
                ratio = f" {med[path][0] / med['remoting'][0]:.2f}x | {med[path][1] / med['remoting'][1]:.2f}x |"
            print(f"| {path_name(path)} | {med[path][0]:.0f} | {med[path][1]:.0f} |{ratio}")
        print("\nCPU per message, us (median): client / server process(es) (proxy path: proxy + broker)")
        print("| path | produce | consume |\n|---|---|---|")
        for path, rs in rows.items():
            cells = []
            for phase in ("produce", "consume"):
                per = [statistics.median(r[f"{phase}_cpu"][i] * 1e6 / r[f"{phase}_msgs"] for r in rs)
                       for i in range(len(rs[0][f"{phase}_cpu"]))]
                cells.append(f"{per[0]:.0f} / " + " + ".join(f"{c:.0f}" for c in per[1:]))
            print(f"| {path_name(path)} | {cells[0]} | {cells[1]} |")
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
