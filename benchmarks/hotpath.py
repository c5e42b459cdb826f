"""Hot-path driver (private to the perf work; ``ferry bench`` is the user-facing tool).

    python benchmarks/hotpath.py echo      [--conns 16] [--secs 5] [--depth 1]
    python benchmarks/hotpath.py produce   [--conns 16] [--secs 5] [--size 1024] [--role ASYNC_MASTER]
    python benchmarks/hotpath.py batch     [--conns 4] [--batch 64]
    python benchmarks/hotpath.py sync      [--conns 1|16]           (SYNC_MASTER + 1 slave)
    python benchmarks/hotpath.py consume   [--conns 16] [--backlog 400000]
    python benchmarks/hotpath.py catchup   [--gib 1.0]              (empty slave catching up)
    python benchmarks/hotpath.py restart   [--gib 1.0]              (SIGKILL, restart, time to serve)
    python benchmarks/hotpath.py client    [--conns 16]             (ferrymq.client Producer.send)
    python benchmarks/hotpath.py inproc    [--kind send|batch] [--requests N] [--batch 64] [--metrics-port 0]
                                           (in-process: pre-encoded frames fed to a broker Connection
                                            with a fake transport; process CPU per request/message)

Servers run as subprocesses (``python -m ferrymq.cli ...``); load comes from a separate process
speaking raw remoting frames (uvloop Protocol, pre-encoded requests, N in flight per connection).
``--profile out.svg`` (or ``.txt`` for raw folded stacks) runs ``py-spy record`` against the (master, or
catching-up slave) broker during the measurement; ``--pin 0 --pin-client 1`` pins servers/load with taskset;
``restart --keep`` keeps the store directory. Every workload prints the server's CPU time per request
(utime+stime over the run): the stable figure on a shared machine. Results: benchmarks/PROFILE-NOTES.md.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing as mp
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ferrymq.client import api
from ferrymq.common.message import PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, properties_to_string
from ferrymq.common.message_codec import encode_batch_body
from ferrymq.common.route import MessageQueue
from ferrymq.remoting.codec import RemotingCommand, decode_frame, encode
from ferrymq.remoting.codes import RequestCode

TOPIC = "HotPath"
QUEUES = 16
_LEN = struct.Struct(">i")


# ---------------------------------------------------------------------------------------------------------
# processes
def free_port(n: int = 1) -> int:
    """A port p with p-2 .. p+n-1 free (broker: fast port p-2, HA port p+1)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p < 1100 or p > 65000:
            continue
        ok = True
        for q in range(p - 2, p + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
                    break
        if ok:
            return p


def wait_port(port: int, timeout_s: float = 30.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return time.monotonic() - t0
        except OSError:
            time.sleep(0.005)
    raise TimeoutError(f"port {port} not up")


class Cluster:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ns_port = 0

    def spawn(self, name: str, argv: list[str], cpu: str | None = None) -> subprocess.Popen[bytes]:
        log = open(self.base / f"{name}.log", "ab")
        cmd = [sys.executable, "-m", "ferrymq.cli", *argv]
        if cpu is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", cpu, *cmd]
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = p
        return p

    def namesrv(self) -> None:
        self.ns_port = free_port()
        self.spawn("namesrv", ["namesrv", "--listen", f"127.0.0.1:{self.ns_port}"])
        wait_port(self.ns_port)

    def broker_conf(self, name: str, port: int, role: str, broker_id: int = 0, **extra: Any) -> Path:
        conf = self.base / f"{name}.conf"
        lines = {
            "brokerClusterName": "HotCluster", "brokerName": "hot", "brokerId": broker_id,
            "namesrvAddr": f"127.0.0.1:{self.ns_port}", "listenPort": port, "brokerIP1": "127.0.0.1",
            "listenHost": "127.0.0.1", "storePathRootDir": str(self.base / name), "brokerRole": role,
            "flushDiskType": "ASYNC_FLUSH", "defaultTopicQueueNums": QUEUES,
        }
        lines.update(extra)
        conf.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        return conf

    def broker(self, name: str, port: int, role: str, broker_id: int = 0, cpu: str | None = None,
               **extra: Any) -> subprocess.Popen[bytes]:
        conf = self.broker_conf(name, port, role, broker_id, **extra)
        p = self.spawn(name, ["broker", "-c", str(conf), "--log-level", "WARNING"], cpu)
        wait_port(port, 120)
        return p

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        p = self.procs.pop(name, None)
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self) -> None:
        for name in list(self.procs)[::-1]:
            self.stop(name)


def request(port: int, code: int, fields: dict[str, Any], body: bytes = b"", timeout_s: float = 10) -> RemotingCommand:
    cmd = RemotingCommand.request(code, fields, body)
    cmd.opaque = 1
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(encode(cmd))
        buf = b""
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
            if len(buf) >= 4 and len(buf) >= 4 + _LEN.unpack_from(buf)[0]:
                return decode_frame(buf[4:4 + _LEN.unpack_from(buf)[0]])


def create_topic(port: int, queues: int = QUEUES) -> None:
    resp = request(port, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": TOPIC, "defaultTopic": "TBW102", "readQueueNums": queues, "writeQueueNums": queues, "perm": 6,
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False})
    assert resp.code == 0, resp


def runtime_info(port: int) -> dict[str, str]:
    import orjson
    resp = request(port, RequestCode.GET_BROKER_RUNTIME_INFO, {})
    return {str(k): str(v) for k, v in orjson.loads(resp.body)["table"].items()}


def max_offset(port: int, queue_id: int) -> int:
    resp = request(port, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": queue_id})
    return int(resp.ext_fields.get("offset", "0"))


# ---------------------------------------------------------------------------------------------------------
# requests
def uniq(i: int) -> str:
    return f"7F000001{os.getpid() & 0xFFFF:04X}{i:020X}"


def send_frames(n: int, size: int, queue_id: int, salt: int) -> list[bytes]:
    body = os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")
    out = []
    for i in range(n):
        props = properties_to_string({"WAIT": "true", "TAGS": "TagA",
                                      PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq(salt * 1_000_000 + i)})
        cmd = api.build_send(producer_group="hotpath", topic=TOPIC, queue_id=queue_id, sys_flag=0,
                             born_timestamp_ms=int(time.time() * 1000), flag=0, properties=props, body=body,
                             broker_name="hot", default_topic_queue_nums=QUEUES)
        cmd.opaque = i + 1
        out.append(encode(cmd))
    return out


def batch_frames(n: int, size: int, batch: int, queue_id: int, salt: int) -> list[bytes]:
    body = os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")
    out = []
    for i in range(n):
        entries = [(0, body, properties_to_string({
            "WAIT": "true", PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq(salt * 1_000_000 + i * batch + j)}))
            for j in range(batch)]
        cmd = api.build_send(producer_group="hotpath", topic=TOPIC, queue_id=queue_id, sys_flag=0,
                             born_timestamp_ms=int(time.time() * 1000), flag=0, properties="",
                             body=encode_batch_body(entries), batch=True, broker_name="hot",
                             default_topic_queue_nums=QUEUES)
        cmd.opaque = i + 1
        out.append(encode(cmd))
    return out


def pull_cmd(queue_id: int, offset: int, max_nums: int) -> bytes:
    cmd = api.build_pull(group="hotpath-c", mq=MessageQueue(TOPIC, "hot", queue_id), queue_offset=offset,
                         max_nums=max_nums, sys_flag=4, commit_offset=0, suspend_timeout_ms=0,
                         subscription="*", sub_version=0)
    cmd.opaque = offset + 1
    return encode(cmd)


# ---------------------------------------------------------------------------------------------------------
# load generator (runs in its own process)
class Pipe(asyncio.Protocol):
    """Keeps ``depth`` requests in flight, cycling through pre-encoded frames; counts answers."""

    def __init__(self, frames: list[bytes], depth: int, per_frame: int, check: bool) -> None:
        self.frames = frames
        self.depth = depth
        self.per_frame = per_frame
        self.check = check
        self.i = 0
        self.buf = bytearray()
        self.count = 0
        self.bad = 0
        self.running = True
        self.t: Any = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.t = transport
        self._send(self.depth)

    def _send(self, n: int) -> None:
        frames = self.frames
        k = len(frames)
        out = []
        for _ in range(n):
            out.append(frames[self.i % k])
            self.i += 1
        self.t.writelines(out)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, n, size = 0, 0, len(buf)
        while size - pos >= 4:
            (length,) = _LEN.unpack_from(buf, pos)
            if size - pos - 4 < length:
                break
            if self.check:
                cmd = decode_frame(bytes(buf[pos + 4:pos + 4 + length]))
                if cmd.code != 0:
                    self.bad += 1
                    if self.bad < 3:
                        print("bad answer", cmd.code, cmd.remark, file=sys.stderr)
            pos += 4 + length
            n += 1
        if pos:
            del buf[:pos]
        self.count += n
        if self.running:
            self._send(n)
        elif self.count >= self.i and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


class PullPipe(asyncio.Protocol):
    """One queue per connection, one pull in flight; counts messages via nextBeginOffset."""

    def __init__(self, queue_id: int, end: int, max_nums: int) -> None:
        self.queue_id = queue_id
        self.end = end
        self.max_nums = max_nums
        self.offset = 0
        self.buf = bytearray()
        self.msgs = 0
        self.bytes = 0
        self.reqs = 0
        self.running = True
        self.t: Any = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.t = transport
        self.t.write(pull_cmd(self.queue_id, self.offset, self.max_nums))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if len(buf) < 4:
            return
        (length,) = _LEN.unpack_from(buf, 0)
        if len(buf) < 4 + length:
            return
        (word,) = struct.unpack_from(">I", buf, 4)
        hlen = word & 0xFFFFFF
        import orjson
        header = orjson.loads(bytes(buf[8:8 + hlen]))
        if header.get("code") != 0:
            print("pull answer", header.get("code"), header.get("remark"), file=sys.stderr)
        nxt = int(header["extFields"].get("nextBeginOffset", self.offset))
        self.bytes += length - 4 - hlen
        del buf[:4 + length]
        self.reqs += 1
        self.msgs += nxt - self.offset
        self.offset = nxt
        if self.running and nxt < self.end:
            self.t.write(pull_cmd(self.queue_id, self.offset, self.max_nums))
        elif not self.done.done():
            self.done.set_result(None)


def _load_main(kind: str, port: int, opts: dict[str, Any], out: Any) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    out.put(asyncio.run(_load(kind, port, opts)))


async def _load(kind: str, port: int, opts: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    conns = opts["conns"]
    secs = opts["secs"]
    if kind == "pull":
        pulls: list[PullPipe] = []
        for q in range(conns):
            _, pp = await loop.create_connection(
                functools.partial(PullPipe, q % QUEUES, opts["ends"][q % QUEUES], opts.get("max_nums", 32)),
                "127.0.0.1", port)
            pulls.append(pp)
        t0 = time.perf_counter()
        await asyncio.wait([pp.done for pp in pulls], timeout=secs)
        dt = time.perf_counter() - t0
        return {"secs": dt, "count": sum(pp.msgs for pp in pulls), "reqs": sum(pp.reqs for pp in pulls),
                "bytes": sum(pp.bytes for pp in pulls)}
    frames_by_conn = opts["frames"]
    pipes: list[Pipe] = []
    for c in range(conns):
        _, p = await loop.create_connection(
            functools.partial(Pipe, frames_by_conn[c % len(frames_by_conn)], opts["depth"], 1,
                              opts.get("check", False)),
            "127.0.0.1", port)
        pipes.append(p)
    await asyncio.sleep(opts.get("warmup", 0.5))
    c0 = sum(p.count for p in pipes)
    t0 = time.perf_counter()
    await asyncio.sleep(secs)
    c1 = sum(p.count for p in pipes)
    dt = time.perf_counter() - t0
    for p in pipes:
        p.running = False
    await asyncio.wait([p.done for p in pipes], timeout=10)
    for p in pipes:
        p.t.close()
    return {"secs": dt, "count": c1 - c0, "bad": sum(p.bad for p in pipes), "total": sum(p.count for p in pipes)}


def cpu_secs(pid: int) -> float:
    """utime + stime of a process (all threads), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(kind: str, port: int, opts: dict[str, Any], cpu: int | None = None,
             server_pid: int | None = None) -> dict[str, Any]:
    """Run the load process; with ``server_pid``, also the server's CPU seconds over the whole run."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_load_main, args=(kind, port, opts, q))
    c0 = cpu_secs(server_pid) if server_pid else 0.0
    w0 = time.perf_counter()
    p.start()
    if cpu is not None and p.pid is not None:
        os.sched_setaffinity(p.pid, {cpu})
    res = q.get()
    p.join()
    if server_pid:
        res["server_cpu"] = cpu_secs(server_pid) - c0
        res["wall"] = time.perf_counter() - w0
    return res


# ---------------------------------------------------------------------------------------------------------
# echo server reference (same framing: answers every frame with the same frame)
class EchoServer(asyncio.Protocol):
    def __init__(self, reply: bytes | None) -> None:
        self.buf = bytearray()
        self.reply = reply

    def connection_made(self, transport: Any) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, size = 0, len(buf)
        out = []
        while size - pos >= 4:
            (length,) = _LEN.unpack_from(buf, pos)
            if size - pos - 4 < length:
                break
            out.append(self.reply if self.reply is not None else bytes(buf[pos:pos + 4 + length]))
            pos += 4 + length
        if pos:
            del buf[:pos]
        if out:
            self.t.writelines(out)


def _echo_main(port: int, small: bool) -> None:
    import uvloop
    reply = None
    if small:
        req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {})
        reply = encode(req.response(0, {"msgId": "7F00000100002A9F0000000000000000", "queueId": 1,
                                         "queueOffset": 123456, "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(lambda: EchoServer(reply), "127.0.0.1", port)
        await srv.serve_forever()

    uvloop.run(main())


# ---------------------------------------------------------------------------------------------------------
# profiling
def start_profile(pid: int, path: str | None, secs: float) -> subprocess.Popen[bytes] | None:
    if not path:
        return None
    return subprocess.Popen(["py-spy", "record", "-o", path, "--pid", str(pid), "-d", str(int(secs) + 1),
                             "-r", "200", "--nonblocking", *(["-f", "raw"] if path.endswith(".txt") else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rate_line(name: str, res: dict[str, Any], size: int, per: int = 1) -> str:
    r = res["count"] / res["secs"]
    line = f"{name}: {r:,.0f} msg/s  {r * size / 1e6:,.1f} MB/s  ({res['count']} in {res['secs']:.2f}s, bad={res.get('bad', 0)})"
    if "server_cpu" in res and res.get("total"):
        # server CPU per request over the whole run (warm-up + drain included): robust on a busy machine
        us = res["server_cpu"] / (res["total"]) * 1e6
        line += f"  server {us:.1f} us CPU/req -> {1e6 / us * per:,.0f} msg/s per core"
    return line


# ---------------------------------------------------------------------------------------------------------
# workloads
def wl_echo(a: argparse.Namespace) -> None:
    for small in (False, True):
        port = free_port()
        ctx = mp.get_context("fork")
        srv = ctx.Process(target=_echo_main, args=(port, small), daemon=True)
        srv.start()
        try:
            wait_port(port)
            frames = [send_frames(64, a.size, c % QUEUES, c) for c in range(a.conns)]
            res = run_load("send", port, {"conns": a.conns, "secs": a.secs, "depth": a.depth, "frames": frames},
                           server_pid=srv.pid)
            label = "echo(small reply)" if small else "echo(frame echoed)"
            print(rate_line(f"{label} conns={a.conns} depth={a.depth}", res, a.size), flush=True)
        finally:
            srv.terminate()
            srv.join()


def _master(a: argparse.Namespace, cl: Cluster, role: str, **extra: Any) -> int:
    cl.namesrv()
    port = free_port(2)
    cl.broker("master", port, role, cpu=a.pin, **extra)
    create_topic(port)
    return port


def wl_produce(a: argparse.Namespace, role: str | None = None, batch: int = 0) -> None:
    role = role or a.role
    with tempfile.TemporaryDirectory(prefix="hotpath-", dir=a.dir) as tmp:
        cl = Cluster(Path(tmp))
        try:
            port = _master(a, cl, role)
            if role == "SYNC_MASTER":
                sport = free_port(2)
                cl.broker("slave", sport, "SLAVE", broker_id=1, haMasterAddress=f"127.0.0.1:{port + 1}",
                          cpu=a.pin)
                time.sleep(1.0)
                # wait until the slave is connected: a send must come back SEND_OK
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    f = send_frames(1, 16, 0, 999)[0]
                    with socket.create_connection(("127.0.0.1", port)) as s:
                        s.sendall(f)
                        data = s.recv(65536)
                    cmd = decode_frame(data[4:])
                    if cmd.code == 0:
                        break
                    time.sleep(0.2)
            if batch:
                frames = [batch_frames(32, a.size, batch, c % QUEUES, c) for c in range(a.conns)]
            else:
                frames = [send_frames(512, a.size, c % QUEUES, c) for c in range(a.conns)]
            prof = start_profile(cl.procs["master"].pid, a.profile, a.secs + 0.5)
            res = run_load("send", port, {"conns": a.conns, "secs": a.secs, "depth": a.depth, "frames": frames,
                                          "check": True}, server_pid=cl.procs["master"].pid,
                           cpu=int(a.pin_client) if a.pin_client is not None else None)
            if batch:
                res["count"] *= batch
            print(rate_line(f"{'batch' + str(batch) if batch else 'produce'} {role} conns={a.conns} "
                            f"depth={a.depth} size={a.size}", res, a.size, batch or 1), flush=True)
            if prof:
                prof.wait()
        finally:
            cl.stop_all()


def wl_batch(a: argparse.Namespace) -> None:
    wl_produce(a, batch=a.batch)


def wl_sync(a: argparse.Namespace) -> None:
    wl_produce(a, role="SYNC_MASTER")


def _fill(port: int, a: argparse.Namespace, total_bytes: int) -> None:
    """Fill the topic with batches (fast) until ~total_bytes of messages are stored."""
    frames = [batch_frames(8, a.size, 64, c % QUEUES, c) for c in range(QUEUES)]
    per_sec = 150e6
    secs = max(1.0, total_bytes / per_sec)
    t0 = time.monotonic()
    stored = 0
    while stored < total_bytes:
        res = run_load("send", port, {"conns": QUEUES, "secs": min(secs, 10), "depth": 1, "frames": frames,
                                      "warmup": 0.0})
        stored = int(runtime_info(port)["commitLogMaxOffset"])
        print(f"  filled {stored / 1e6:,.0f} MB ({time.monotonic() - t0:.1f}s)", flush=True)
        del res


def wl_consume(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="hotpath-", dir=a.dir) as tmp:
        cl = Cluster(Path(tmp))
        try:
            port = _master(a, cl, "ASYNC_MASTER")
            _fill(port, a, int(a.backlog * (a.size + 150)))
            ends = [max_offset(port, q) for q in range(QUEUES)]
            print(f"  backlog {sum(ends):,} msgs", flush=True)
            prof = start_profile(cl.procs["master"].pid, a.profile, a.secs)
            res = run_load("pull", port, {"conns": a.conns, "secs": a.secs, "ends": ends, "max_nums": a.max_nums},
                           server_pid=cl.procs["master"].pid)
            r = res["count"] / res["secs"]
            print(f"consume conns={a.conns} max_nums={a.max_nums}: {r:,.0f} msg/s  "
                  f"{res['bytes'] / res['secs'] / 1e6:,.1f} MB/s  ({res['count']} msgs, {res['reqs']} pulls in "
                  f"{res['secs']:.2f}s)  server {res['server_cpu'] / res['count'] * 1e6:.2f} us CPU/msg -> "
                  f"{res['count'] / res['server_cpu']:,.0f} msg/s per core", flush=True)
            if prof:
                prof.wait()
        finally:
            cl.stop_all()


def wl_catchup(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="hotpath-", dir=a.dir) as tmp:
        cl = Cluster(Path(tmp))
        try:
            # --segment: a segment larger than the backlog keeps the whole fill in one segment, all copied
            ha_extra = {"haTransferBatchSize": a.ha_batch} if a.ha_batch else {}
            port = _master(a, cl, "ASYNC_MASTER", mappedFileSizeCommitLog=a.segment, **ha_extra)
            _fill(port, a, int(a.gib * (1 << 30)))
            info = runtime_info(port)
            target = int(info["commitLogMaxOffset"])
            ends = [max_offset(port, q) for q in range(QUEUES)]
            sport = free_port(2)
            master_cpu0 = cpu_secs(cl.procs["master"].pid)
            t0 = time.monotonic()
            cl.broker("slave", sport, "SLAVE", broker_id=1, haMasterAddress=f"127.0.0.1:{port + 1}",
                      mappedFileSizeCommitLog=a.segment)
            prof = start_profile(cl.procs["slave"].pid, a.profile, 10)
            t_up = time.monotonic() - t0
            while True:
                si = runtime_info(sport)
                if int(si["commitLogMaxOffset"]) >= target and int(si["reputPhyOffset"]) >= target:
                    break
                time.sleep(0.02)
            dt = time.monotonic() - t0
            slave_cpu = cpu_secs(cl.procs["slave"].pid)  # start-up included
            master_cpu = cpu_secs(cl.procs["master"].pid) - master_cpu0
            sends = [max_offset(sport, q) for q in range(QUEUES)]
            assert sends == ends, (sends, ends)
            # a fresh slave is served from the start of the master's LAST segment: count only what it holds
            copied = target - int(runtime_info(sport)["commitLogMinOffset"])
            print(f"catchup {copied / 1e6:,.0f} MB copied (master log {target / 1e6:,.0f} MB): {dt:.2f}s incl. "
                  f"start {t_up:.2f}s -> {copied / dt / 1e6:,.0f} MB/s "
                  f"({copied / (dt - t_up) / 1e6:,.0f} MB/s after port up); consume queues match; CPU slave "
                  f"{slave_cpu:.2f}s = {slave_cpu / (copied * sum(ends) / target) * 1e6:.2f} us/record copied, "
                  f"master {master_cpu:.2f}s",
                  flush=True)
            if prof:
                prof.wait()
        finally:
            cl.stop_all()


def wl_restart(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="hotpath-", dir=a.dir) as tmp:
        if a.keep:
            tmp = tempfile.mkdtemp(prefix="hotpath-keep-", dir=a.dir)
            print("  keeping", tmp, flush=True)
        cl = Cluster(Path(tmp))
        try:
            port = _master(a, cl, "ASYNC_MASTER", mappedFileSizeCommitLog=a.segment)
            _fill(port, a, int(a.gib * (1 << 30)))
            ends = [max_offset(port, q) for q in range(QUEUES)]
            time.sleep(a.settle)
            cl.stop("master", signal.SIGKILL)
            t0 = time.monotonic()
            p = cl.broker("master", port, "ASYNC_MASTER", mappedFileSizeCommitLog=a.segment)
            t_port = time.monotonic() - t0
            # serving: a pull of the last message and a send both answer
            while True:
                try:
                    r = request(port, RequestCode.PULL_MESSAGE, {
                        "consumerGroup": "g", "topic": TOPIC, "queueId": 0, "queueOffset": max(0, ends[0] - 1),
                        "maxMsgNums": 1, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
                        "subscription": "*", "subVersion": 0, "expressionType": "TAG"}, timeout_s=30)
                    if r.code == 0:
                        break
                except OSError:
                    pass
                time.sleep(0.01)
            t_serve = time.monotonic() - t0
            after = [max_offset(port, q) for q in range(QUEUES)]
            print(f"restart after SIGKILL, {a.gib} GiB log: port up {t_port:.2f}s, serving {t_serve:.2f}s; "
                  f"queues {'match' if after == ends else f'DIFFER {after} vs {ends}'} (pid {p.pid})", flush=True)
        finally:
            cl.stop_all()


def _client_main(ns: str, conns: int, secs: float, size: int, out: Any) -> None:
    import uvloop

    from ferrymq.client import Producer, new_message

    async def main() -> dict[str, Any]:
        prod = Producer(f"127.0.0.1:{ns}", "hotpath-client")
        await prod.start()
        body = b"x" * size
        count = 0
        running = True

        async def worker() -> None:
            nonlocal count
            while running:
                await prod.send(new_message(TOPIC, body))
                count += 1

        tasks = [asyncio.ensure_future(worker()) for _ in range(conns)]
        await asyncio.sleep(0.5)
        c0, t0 = count, time.perf_counter()
        await asyncio.sleep(secs)
        c1, dt = count, time.perf_counter() - t0
        running = False
        await asyncio.gather(*tasks)
        await prod.close()
        return {"count": c1 - c0, "secs": dt}

    out.put(uvloop.run(main()))


def wl_client(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="hotpath-", dir=a.dir) as tmp:
        cl = Cluster(Path(tmp))
        try:
            _master(a, cl, a.role)
            ctx = mp.get_context("fork")
            q = ctx.Queue()
            p = ctx.Process(target=_client_main, args=(cl.ns_port, a.conns, a.secs, a.size, q))
            p.start()
            res = q.get()
            p.join()
            print(rate_line(f"client Producer.send x{a.conns} {a.role}", res, a.size), flush=True)
        finally:
            cl.stop_all()


# ---------------------------------------------------------------------------------------------------------
# in-process SEND path (no sockets): CPU per request of the broker's own Python
class _FakeTransport:
    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def writelines(self, chunks: list[bytes]) -> None:
        self.writes += len(chunks)

    def get_extra_info(self, key: str) -> Any:
        return ("127.0.0.1", 40000)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


async def _inproc(a: argparse.Namespace, tmp: str) -> None:
    from ferrymq.broker.app import BrokerController
    from ferrymq.broker.config import BrokerConfig
    from ferrymq.namesrv.app import NameServer
    from ferrymq.remoting.connection import Connection

    ns = NameServer("127.0.0.1", 0)
    await ns.start()
    cfg = BrokerConfig(listen_port=0, listen_host="127.0.0.1", broker_ip1="127.0.0.1", store_path_root_dir=tmp,
                       namesrv_addr=[ns.addr], fast_listen_enable=False, metrics_port=a.metrics_port)
    cfg.default_topic_queue_nums = QUEUES
    ctl = BrokerController(cfg)
    await ctl.start()
    try:
        conn = Connection(ctl.dispatcher)
        transport = _FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        create_topic_inproc = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": TOPIC, "defaultTopic": "TBW102", "readQueueNums": QUEUES, "writeQueueNums": QUEUES,
            "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False})
        conn.data_received(encode(create_topic_inproc))
        await asyncio.sleep(0.05)
        per = a.batch if a.kind == "batch" else 1
        distinct = 64 if a.kind == "batch" else 2048
        # like --conns 16: consecutive requests go to the 16 queues in turn
        per_queue = [batch_frames(distinct // QUEUES, a.size, a.batch, q, q) if a.kind == "batch"
                     else send_frames(distinct // QUEUES, a.size, q, q) for q in range(QUEUES)]
        frames = [f for group in zip(*per_queue, strict=True) for f in group]
        # --per-read frames per data_received (16: like 16 producers), then one loop iteration (the reput runs once
        # per read, as on a broker answering that many requests per loop iteration; 1: one producer's shape)
        per_read = a.per_read
        chunks = [b"".join(frames[i:i + per_read]) for i in range(0, len(frames), per_read)]
        rounds = max(1, a.requests // len(frames))
        before = transport.writes
        t0 = time.process_time()
        for _ in range(rounds):
            for chunk in chunks:
                conn.data_received(chunk)
                await asyncio.sleep(0)
        dt = time.process_time() - t0
        n = rounds * len(frames)
        assert transport.writes - before == n, (transport.writes - before, n)
        print(f"inproc {a.kind} size={a.size}{f' batch={a.batch}' if a.kind == 'batch' else ''} per-read={per_read}: "
              f"{dt / n * 1e6:.1f} us CPU/request = {dt / (n * per) * 1e6:.2f} us/msg "
              f"({n} requests, {n * per * a.size / dt / 1e6:,.0f} MB/s per core)", flush=True)
    finally:
        await ctl.stop()
        await ns.stop()


def wl_inproc(a: argparse.Namespace) -> None:
    run: Any = asyncio.run
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="hotpath-", dir=a.dir) as tmp:
        run(_inproc(a, tmp))


def _sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _sigterm)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=["echo", "produce", "batch", "sync", "consume", "catchup", "restart",
                                         "client", "inproc"])
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--secs", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--role", default="ASYNC_MASTER")
    ap.add_argument("--backlog", type=int, default=400_000)
    ap.add_argument("--max-nums", dest="max_nums", type=int, default=32)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--segment", type=int, default=1 << 30)
    ap.add_argument("--ha-batch", dest="ha_batch", type=int, default=0,
                    help="catchup: the master's haTransferBatchSize in bytes (default: the broker's, 32 KiB)")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds between fill and SIGKILL")
    ap.add_argument("--dir", default=None, help="parent of the temporary store dirs")
    ap.add_argument("--profile", default=None, help="py-spy output (.svg, or .txt for raw folded stacks)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--kind", choices=["send", "batch"], default="send", help="inproc: request kind")
    ap.add_argument("--requests", type=int, default=20_000, help="inproc: requests fed")
    ap.add_argument("--per-read", dest="per_read", type=int, default=16,
                    help="inproc: frames per data_received (1: one request per loop iteration, as one producer)")
    ap.add_argument("--metrics-port", type=int, default=-1, help="inproc: the broker's metricsPort (-1 = off)")
    ap.add_argument("--keep", action="store_true", help="restart: keep the store dir (for profiling)")
    ap.add_argument("--pin", default=None, help="taskset CPU list for the broker(s), e.g. 0")
    ap.add_argument("--pin-client", dest="pin_client", default=None, help="CPU for the load process, e.g. 0")
    a = ap.parse_args()
    fn = globals()["wl_" + a.workload]
    for _ in range(a.repeat):
        fn(a)


if __name__ == "__main__":
    main()
