"""``ferry bench --estate``: the cost of a large estate (many topics, queues and groups) on one broker.

Starts a name server and a broker as subprocesses (127.0.0.1, free ports, a fresh temp dir), builds an estate
in steps and measures, at each step, on a quiet broker: the latency of single requests, the longest event-loop
stall seen by a probe client, memory, disk and fds, and the time to restart the broker with the whole estate.

A step is (topics, groups, queues holding one message). Steps come from ``--estate-topics`` and
``--estate-groups`` (paired by position, the shorter list repeats its last value), then a last step that
raises the topic count to ``queues / 8`` and sends one 1 KiB message to each of ``--estate-queues`` queues.

Per step, in order:

1. build (bulk paths, not measured per request): UPDATE_AND_CREATE_TOPIC pipelined over ``BULK_CONNECTIONS``
   connections with ``BULK_DEPTH`` requests in flight each; sends to fill queues the same way; then consumer
   groups registered by HEART_BEATs of ``--estate-heartbeat-groups`` new groups each, one at a time;
2. wait until the name server routes the newest topic;
3. measure ``samples`` single requests of each kind, one at a time on one connection:

   | op             | request                                                                        |
   |----------------|--------------------------------------------------------------------------------|
   | topic_create   | UPDATE_AND_CREATE_TOPIC of a new topic, 8 queues                                |
   | group_create   | HEART_BEAT of a new client declaring one new consumer group                     |
   | send           | SEND_MESSAGE_V2, 1 KiB, to a random queue of a random estate topic               |
   | pull           | PULL_MESSAGE at offset 0 of a queue the sends above filled                      |
   | offset_commit  | UPDATE_CONSUMER_OFFSET of a random estate group on a random queue                |
   | route_query    | GET_ROUTEINFO_BY_TOPIC of a random estate topic, at the name server              |

   (the sampled creates add ``samples`` topics and groups on top of the step's counts);
4. read the broker's and the name server's RSS (``/proc/<pid>/status`` VmRSS), the broker's open fds and the
   disk blocks (``st_blocks * 512``) of ``consumequeue/`` + ``index/`` (and of ``commitlog/``, for reference);
5. restart: SIGTERM to the broker, wait for its exit, start it again, until a route query of an estate topic
   names the broker and a PULL of a filled queue answers FOUND (``restart_s``, from SIGTERM; ``stop_s`` of it
   until the old process exited).

Throughout the step a probe process sends GET_MAX_OFFSET to the broker every ``PROBE_INTERVAL_S`` on its own
connection and keeps the worst response time: ``stall_build_ms`` (during the pipelined bulk topic/send build:
includes queueing behind the bulk requests, reported only), ``stall_groups_ms`` (during the heartbeat group
build) and ``stall_ms`` (during the sampled requests). When the broker exports ``ferrymq_event_loop_lag_seconds``
on its metrics endpoint, ``loop_lag_max_s`` is the upper bound of the highest histogram bucket that gained an
observation during the step (or the ``_max`` gauge if there is one).

Targets (printed beside the figures with met / not met; a missed target never fails the command): p99 of each
operation at the last step within ``TARGET_P99_RATIO`` of the first; the longest stall (sampled requests and
group build) at most ``TARGET_STALL_MS``; consume-queue + index disk for ``TARGET_DISK_QUEUES`` queues with one
message each at most ``TARGET_DISK_BYTES`` (scaled linearly from the queues filled when fewer); restart with
the whole estate at most ``TARGET_RESTART_S``.

JSON (``--json``) layout: ``machine`` (cores, python, platform, load average at start and end, time),
``options`` (step sizes, samples, bulk settings, server PYTHONPATH), ``error`` (null, or why the run stopped),
``targets[]`` (name, figure, target, met: true / false / null when not measurable) and ``steps[]``:

| key                          | value                                                                     |
|------------------------------|---------------------------------------------------------------------------|
| name, topics, groups         | the step; estate counts after it (sampled creates included)               |
| queues_filled                | queues holding at least one message                                       |
| build_s                      | seconds of the step's bulk build (topics, fill, groups)                   |
| ops.<op>                     | p50_ms, p99_ms, samples, errors (answers other than SUCCESS) per operation |
| route_p99_ms                 | ops.route_query.p99_ms (the name server's figure)                         |
| stall_ms, stall_groups_ms, stall_build_ms | the probe's worst response time, ms (see above)              |
| loop_lag_max_s               | from the broker's lag histogram; null when it exports none                |
| broker_rss_bytes, broker_rss_anon_bytes, namesrv_rss_bytes | VmRSS / RssAnon of the processes            |
| broker_fds                   | open file descriptors of the broker                                       |
| cq_index_disk_bytes, commitlog_disk_bytes | disk blocks of consumequeue/ + index/, of commitlog/         |
| restart_s, stop_s            | restart with the estate, from SIGTERM; of it until the old process exited |
| restart_error                | null, or why the broker did not answer again within RESTART_TIMEOUT_S      |
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing as mp
import os
import platform
import random
import re
import signal
import socket
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ferrymq.cli.bench_impl.procs import (
    HOST,
    Child,
    ChildFailed,
    Supervisor,
    ferry_argv,
    free_port,
    port_open,
)
from ferrymq.cli.bench_impl.stack import Stack
from ferrymq.cli.bench_impl.stats import percentile

QUEUES_PER_TOPIC = 8
BODY_BYTES = 1024
#: connections and requests in flight per connection of the bulk (build) paths
BULK_CONNECTIONS = 4
BULK_DEPTH = 8
#: rounds of new connections for bulk requests whose connection the broker closed
BULK_RETRY_ROUNDS = 3
#: per-request timeout of the bulk paths and of the sampled requests (a large estate on old code is slow)
BULK_TIMEOUT_MS = 600_000
SAMPLE_TIMEOUT_MS = 120_000
#: the probe's request period
PROBE_INTERVAL_S = 0.010
PROBE_REPLY_TIMEOUT_S = 600.0
#: waits for routes, restarts and the broker's exit
ROUTE_TIMEOUT_S = 600.0
RESTART_TIMEOUT_S = 600.0
STOP_GRACE_S = 300.0
POLL_S = 0.05
#: targets (benchmark figures, never a failing exit)
TARGET_P99_RATIO = 1.5
TARGET_STALL_MS = 50.0
TARGET_DISK_QUEUES = 100_000
TARGET_DISK_BYTES = 10 * 10**9
TARGET_RESTART_S = 10.0
#: environment variable naming the PYTHONPATH of the started servers (``--estate-server-pythonpath``)
SERVER_PYTHONPATH_ENV = "FERRY_BENCH_SERVER_PYTHONPATH"
#: created and filled before the first step (not counted in the estate)
WARM_TOPIC = "estate-warm"
OPS = ("topic_create", "group_create", "send", "pull", "offset_commit", "route_query")
LAG_METRIC = "ferrymq_event_loop_lag_seconds"


@dataclass(frozen=True)
class EstateScale:
    topics: tuple[int, ...]
    groups: tuple[int, ...]
    queues: int
    samples: int
    heartbeat_groups: int


SCALES = {
    "full": EstateScale(topics=(100, 1000, 10_000), groups=(100, 1000, 5000), queues=100_000, samples=200,
                        heartbeat_groups=500),
    "small": EstateScale(topics=(10, 100), groups=(10, 100), queues=200, samples=20, heartbeat_groups=50),
}


@dataclass
class EstateOptions:
    topics: tuple[int, ...] = SCALES["full"].topics
    groups: tuple[int, ...] = SCALES["full"].groups
    queues: int = SCALES["full"].queues
    samples: int = SCALES["full"].samples
    heartbeat_groups: int = SCALES["full"].heartbeat_groups
    restart_every_step: bool = True
    server_pythonpath: str | None = None
    base_dir: str | None = None
    keep_dir: bool = False
    broker_conf: dict[str, str] = field(default_factory=dict)
    seed: int = 1


@dataclass(frozen=True)
class Step:
    name: str
    topics: int
    groups: int
    queues_filled: int


def plan_steps(o: EstateOptions) -> list[Step]:
    """The steps of a run: topics/groups paired by position, then the queue-fill step (if ``queues`` > 0)."""
    steps: list[Step] = []
    n = max(len(o.topics), len(o.groups))
    for i in range(n):
        t = o.topics[min(i, len(o.topics) - 1)] if o.topics else 0
        g = o.groups[min(i, len(o.groups) - 1)] if o.groups else 0
        steps.append(Step(f"{t} topics / {g} groups", t, g, 0))
    if o.queues > 0:
        last_t = steps[-1].topics if steps else 0
        last_g = steps[-1].groups if steps else 0
        t = max(last_t, math.ceil(o.queues / QUEUES_PER_TOPIC))
        steps.append(Step(f"{o.queues} queues x 1 msg", t, last_g, o.queues))
    return steps


class EstateError(RuntimeError):
    pass


# ---- probe process ---------------------------------------------------------------------------------------
def probe_main(ctl: Any) -> None:
    """A separate process (no GIL shared with the driver): on ("start", addr, topic) it connects and sends
    GET_MAX_OFFSET every PROBE_INTERVAL_S, one at a time, keeping the worst response time; on ("stop",) it
    answers (worst_s, count, failures) and disconnects; on ("exit",) it returns."""
    from ferrymq.remoting.codec import FrameDecoder, RemotingCommand, encode
    from ferrymq.remoting.codes import RequestCode

    sock: socket.socket | None = None
    worst_s, count, failures = 0.0, 0, 0
    frame = b""
    decoder = FrameDecoder()
    while True:
        if sock is None:
            msg = ctl.recv()
        else:  # at least one request per window, so a short window reports a figure too
            msg = ctl.recv() if count and ctl.poll() else None
        if msg is not None:
            if msg[0] == "exit":
                return
            if msg[0] == "stop":
                if sock is not None:
                    sock.close()
                    sock = None
                ctl.send((worst_s, count, failures))
                continue
            if msg[0] == "start":
                _, addr, topic = msg
                host, _, port = addr.rpartition(":")
                worst_s, count, failures = 0.0, 0, 0
                decoder = FrameDecoder()
                cmd = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
                cmd.opaque = 1
                frame = encode(cmd)
                sock = socket.create_connection((host, int(port)), timeout=PROBE_REPLY_TIMEOUT_S)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                continue
        assert sock is not None
        t0 = time.perf_counter()
        try:
            sock.sendall(frame)
            got: list[Any] = []
            while not got:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("closed")
                got = decoder.feed(data)
        except OSError:
            failures += 1
            sock.close()
            sock = None
            ctl.send(("lost",))
            continue
        rtt = time.perf_counter() - t0
        count += 1
        worst_s = max(worst_s, rtt)
        pause = PROBE_INTERVAL_S - (time.perf_counter() - t0)
        if pause > 0:
            time.sleep(pause)


class Probe:
    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=probe_main, args=(child_conn,), daemon=True, name="ferry-bench-probe")
        self._proc.start()
        self.lost = False

    def start(self, addr: str, topic: str) -> None:
        self.lost = False
        self._conn.send(("start", addr, topic))

    def stop(self) -> float | None:
        """Worst response time in ms since start (None when no answer was seen)."""
        self._conn.send(("stop",))
        deadline = time.monotonic() + PROBE_REPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._conn.poll(0.5):
                reply = self._conn.recv()
                if reply[0] == "lost":
                    self.lost = True
                    continue
                worst_s, count, _failures = reply
                return worst_s * 1000.0 if count else None
        raise EstateError("the probe process did not answer")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.send(("exit",))
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)


# ---- measurements of processes and files ------------------------------------------------------------------
def rss_bytes(pid: int, key: str = "VmRSS") -> int | None:
    """A memory figure of ``/proc/<pid>/status`` in bytes: VmRSS (all resident pages, mapped store files
    included) or RssAnon (resident anonymous memory: the process's own tables and objects)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def disk_bytes(path: str) -> int:
    """Bytes of disk blocks allocated under ``path`` (st_blocks * 512, so sparse and preallocated files count
    what they hold on disk, not their length)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


_BUCKET_RE = re.compile(r'^' + LAG_METRIC + r'_bucket\{[^}]*le="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)')
_MAX_RE = re.compile(r'^' + LAG_METRIC + r'_max(?:\{[^}]*\})?\s+([0-9.eE+-]+)')


def scrape_lag(metrics_port: int) -> dict[str, float] | None:
    """Cumulative bucket counts of the loop-lag histogram by upper bound (``"max"``: a max gauge, if any);
    None when the endpoint or the metric is absent."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{metrics_port}/metrics", timeout=10) as resp:
            text = resp.read().decode(errors="replace")
    except OSError:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _BUCKET_RE.match(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
            continue
        m = _MAX_RE.match(line)
        if m:
            out["max"] = max(out.get("max", 0.0), float(m.group(1)))
    return out or None


def lag_bound_s(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Upper bound of the highest bucket that gained observations between two scrapes (a max gauge wins)."""
    if after is None:
        return None
    if "max" in after:
        return after["max"]
    before = before or {}
    bounds = sorted(((float(le), n - before.get(le, 0.0)) for le, n in after.items()), key=lambda x: x[0])
    total = bounds[-1][1] if bounds else 0.0
    if total <= 0:
        return 0.0
    for le, gained in bounds:
        if gained >= total:
            return le
    return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---- the run -----------------------------------------------------------------------------------------------
def _summary_ms(samples_s: list[float], errors: int) -> dict[str, Any]:
    s = sorted(samples_s)
    p50, p99 = percentile(s, 50), percentile(s, 99)
    return {"p50_ms": None if p50 is None else p50 * 1000, "p99_ms": None if p99 is None else p99 * 1000,
            "samples": len(s), "errors": errors}


class EstateBench:
    def __init__(self, opts: EstateOptions, log: Callable[[str], None] | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.o = opts
        self.log = log or (lambda _t: None)
        self.progress = progress or (lambda _t: None)
        self.rng = random.Random(opts.seed)
        self.steps = plan_steps(opts)
        self.results: list[dict[str, Any]] = []
        self.topics: list[str] = []
        self.groups: list[str] = []
        #: (topic, queue id) holding at least one message, in the order filled
        self.filled: list[tuple[str, int]] = []
        self._filled_set: set[tuple[str, int]] = set()
        self._next_fill = 0  # index of the next queue to fill (topic index * 8 + queue id)
        self.started_load: list[float] | None = None
        self.error: str | None = None
        self._clients = 0

    # -- environment --
    def _env(self) -> dict[str, str] | None:
        path = self.o.server_pythonpath
        return {"PYTHONPATH": path} if path else None

    def run(self) -> None:
        self.started_load = load_average()
        with Supervisor(keep_dir=self.o.keep_dir, base_dir=self.o.base_dir) as sup:
            self.sup = sup
            probe = Probe()
            try:
                asyncio.run(self._run(sup, probe))
            finally:
                probe.close()

    async def _run(self, sup: Supervisor, probe: Probe) -> None:
        stack = Stack(sup, "estate")
        self.stack = stack
        stack.namesrv_port = free_port()
        stack.namesrv = sup.spawn("estate-namesrv",
                                  ferry_argv("namesrv", "--listen", f"{HOST}:{stack.namesrv_port}"),
                                  port=stack.namesrv_port, env=self._env())
        await _wait_port(stack.namesrv, stack.namesrv_port)
        self.metrics_port = free_port()
        conf: dict[str, Any] = {"autoCreateTopicEnable": "false", "registerNameServerPeriod": 30000,
                                "metricsPort": self.metrics_port}
        conf.update(self.o.broker_conf)
        self.bp = stack.broker("estate", extra=conf)
        await self._start_broker()
        self.probe = probe
        from ferrymq.remoting.connection import connect

        self.ns_conn = await connect(stack.name_server)
        try:
            await self._connect_broker()
            await self._warm_up()
            for i, step in enumerate(self.steps):
                self.progress(f"step {i + 1}/{len(self.steps)}: {step.name}")
                try:
                    await self._step(step, last=i == len(self.steps) - 1)
                except Exception as exc:
                    self.error = f"step {step.name!r}: {type(exc).__name__}: {exc}"
                    raise
        finally:
            self._close_broker_conns()
            self.ns_conn.close()

    async def _warm_up(self) -> None:
        """One topic with one message, pulled, before the first step: the commit log's first segment and the
        first consume queue are created here, not in the first step's figures."""
        from ferrymq.client import api
        from ferrymq.common.route import MessageQueue
        from ferrymq.remoting.codes import ResponseCode

        for cmd in (self._create_cmd(WARM_TOPIC), self._send_cmd(WARM_TOPIC, 0)):
            resp = await self.quiet.invoke(cmd, BULK_TIMEOUT_MS)
            if resp.code != ResponseCode.SUCCESS:
                raise EstateError(f"warm-up request {cmd.code} answered {resp.code}: {resp.remark}")
        pull = api.build_pull(group="estate_pull", mq=MessageQueue(WARM_TOPIC, "", 0), queue_offset=0, max_nums=1,
                              sys_flag=api.PULL_FLAG_SUBSCRIPTION, commit_offset=0, suspend_timeout_ms=0,
                              subscription="*", sub_version=0)
        deadline = time.monotonic() + ROUTE_TIMEOUT_S
        while (await self.quiet.invoke(pull, SAMPLE_TIMEOUT_MS)).code != ResponseCode.SUCCESS:
            if time.monotonic() > deadline:
                raise EstateError("the warm-up message is not readable")
            await asyncio.sleep(POLL_S)

    async def _start_broker(self) -> None:
        self.bp.child = self.sup.spawn(self.bp.name, ferry_argv("broker", "-c", self.bp.conf_path),
                                       port=self.bp.port, env=self._env())
        await _wait_port(self.bp.child, self.bp.port)

    async def _connect_broker(self) -> None:
        from ferrymq.remoting.connection import connect

        self.quiet = await connect(self.bp.addr)
        self.bulk = [await connect(self.bp.addr) for _ in range(BULK_CONNECTIONS)]

    def _close_broker_conns(self) -> None:
        for c in [getattr(self, "quiet", None), *getattr(self, "bulk", [])]:
            if c is not None:
                c.close()

    # -- one step --
    async def _step(self, step: Step, *, last: bool) -> None:
        o = self.o
        res: dict[str, Any] = {"name": step.name}
        probe_topic = WARM_TOPIC
        lag0 = await asyncio.to_thread(scrape_lag, self.metrics_port)
        t_build = time.monotonic()
        # 1. pipelined build: topics, then queue fill
        await self._reconnect_idle()
        self.probe.start(self.bp.addr, probe_topic)
        new_topics = [f"estate-t{n}" for n in range(len(self.topics), max(len(self.topics), step.topics))]
        self.log(f"creating {len(new_topics)} topics")
        await self._pipeline(self.bulk, (self._create_cmd(t) for t in new_topics), "topic create")
        self.topics.extend(new_topics)
        fill = max(0, step.queues_filled - self._next_fill)
        self.log(f"sending one message to each of {fill} queues")
        await self._pipeline(self.bulk, self._fill_cmds(fill), "send")
        res["stall_build_ms"] = self.probe.stop()
        # 2. groups by heartbeats of many new groups, one heartbeat at a time
        self.probe.start(self.bp.addr, probe_topic)
        await self._build_groups(step.groups)
        res["stall_groups_ms"] = self.probe.stop()
        res["build_s"] = time.monotonic() - t_build
        await self._reconnect_idle()
        await self._wait_route(self.topics[-1])
        # 3. sampled single requests on a quiet broker
        self.probe.start(self.bp.addr, probe_topic)
        ops = await self._samples(step)
        res["stall_ms"] = self.probe.stop()
        lag1 = await asyncio.to_thread(scrape_lag, self.metrics_port)
        res["loop_lag_max_s"] = lag_bound_s(lag0, lag1)
        res["ops"] = ops
        res["route_p99_ms"] = ops["route_query"]["p99_ms"]
        # 4. sizes
        res.update(topics=len(self.topics), groups=len(self.groups), queues_filled=len(self.filled))
        assert self.bp.child is not None and self.stack.namesrv is not None
        res["broker_rss_bytes"] = rss_bytes(self.bp.child.pid)
        res["broker_rss_anon_bytes"] = rss_bytes(self.bp.child.pid, "RssAnon")
        res["broker_fds"] = open_fds(self.bp.child.pid)
        res["namesrv_rss_bytes"] = rss_bytes(self.stack.namesrv.pid)
        store = self.bp.store_dir
        res["cq_index_disk_bytes"] = await asyncio.to_thread(
            lambda: disk_bytes(os.path.join(store, "consumequeue")) + disk_bytes(os.path.join(store, "index")))
        res["commitlog_disk_bytes"] = await asyncio.to_thread(disk_bytes, os.path.join(store, "commitlog"))
        # 5. restart with the whole estate
        res["restart_s"] = res["stop_s"] = None
        res["restart_error"] = None
        self.results.append(res)  # the step's figures stand even if the restart below fails
        await self._reconnect_idle()
        if o.restart_every_step or last:
            try:
                res["restart_s"], res["stop_s"] = await self._restart()
            except (EstateError, ChildFailed) as exc:
                res["restart_error"] = str(exc).splitlines()[0]
                raise
        self.log(f"step done: {res}")

    def _create_cmd(self, topic: str) -> Any:
        from ferrymq.client import api

        return api.build_create_topic(topic, read_queue_nums=QUEUES_PER_TOPIC, write_queue_nums=QUEUES_PER_TOPIC,
                                      perm=6, order=False)

    def _send_cmd(self, topic: str, queue_id: int) -> Any:
        from ferrymq.client import api

        return api.build_send(producer_group="estate_producer", topic=topic, queue_id=queue_id, sys_flag=0,
                              born_timestamp_ms=int(time.time() * 1000), flag=0, properties="",
                              body=b"x" * BODY_BYTES)

    def _fill_cmds(self, count: int) -> Iterator[Any]:
        for _ in range(count):
            n = self._next_fill
            self._next_fill += 1
            mq = (self.topics[n // QUEUES_PER_TOPIC], n % QUEUES_PER_TOPIC)
            self._mark_filled(mq)
            yield self._send_cmd(*mq)

    def _mark_filled(self, mq: tuple[str, int]) -> None:
        if mq not in self._filled_set:
            self._filled_set.add(mq)
            self.filled.append(mq)

    def _heartbeat_cmd(self, groups: list[str]) -> Any:
        from ferrymq.client import api

        self._clients += 1
        consumers = [{
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_ACTIVELY", "groupName": g,
            "messageModel": "CLUSTERING", "unitMode": False,
            "subscriptionDataSet": [api.subscription_data(self.topics[zlib.crc32(g.encode()) % len(self.topics)],
                                                   "*", 0)],
        } for g in groups]
        return api.build_heartbeat(f"{HOST}@estate-{self._clients}", [], consumers)

    async def _build_groups(self, target: int) -> None:
        from ferrymq.errors import RemotingError
        from ferrymq.remoting.codes import ResponseCode
        from ferrymq.remoting.connection import connect

        missing = max(0, target - len(self.groups))
        if not missing:
            return
        self.log(f"registering {missing} groups by heartbeats of {self.o.heartbeat_groups}")
        conn = await connect(self.bp.addr)
        try:
            while len(self.groups) < target:
                chunk = [f"estate-g{n}" for n in range(len(self.groups),
                                                       min(target, len(self.groups) + self.o.heartbeat_groups))]
                for attempt in range(BULK_RETRY_ROUNDS + 1):
                    try:
                        resp = await conn.invoke(self._heartbeat_cmd(chunk), BULK_TIMEOUT_MS)
                        break
                    except RemotingError:  # the broker dropped the channel (e.g. an earlier client id expired)
                        if attempt == BULK_RETRY_ROUNDS:
                            raise
                        self.log(f"heartbeat connection lost; resending {len(chunk)} groups on a new one")
                        conn.close()
                        conn = await connect(self.bp.addr)
                if resp.code != ResponseCode.SUCCESS:
                    raise EstateError(f"heartbeat of {len(chunk)} groups answered {resp.code}: {resp.remark}")
                self.groups.extend(chunk)
        finally:
            conn.close()  # the groups stay (subscription groups); their consumers go

    async def _pipeline(self, conns: list[Any], cmds: Iterable[Any], what: str) -> None:
        """Send ``cmds`` over ``conns`` with BULK_DEPTH requests in flight per connection. Requests whose
        connection closed are sent again on new connections (up to BULK_RETRY_ROUNDS rounds: creates are
        idempotent and a fill needs at least one message per queue); raises on an answer other than SUCCESS."""
        from ferrymq.errors import RemotingError
        from ferrymq.remoting.codes import ResponseCode

        failures: list[str] = []
        todo: Iterable[Any] = cmds
        for round_no in range(BULK_RETRY_ROUNDS + 1):
            it = iter(todo)
            lost: list[Any] = []

            async def worker(conn: Any, it: Iterator[Any] = it, lost: list[Any] = lost) -> None:
                sem = asyncio.Semaphore(BULK_DEPTH)
                pending: set[asyncio.Future[Any]] = set()

                def done(fut: asyncio.Future[Any], cmd: Any) -> None:
                    sem.release()
                    pending.discard(fut)
                    exc = None if fut.cancelled() else fut.exception()
                    if fut.cancelled() or isinstance(exc, RemotingError):
                        lost.append(cmd)
                    elif exc is not None:
                        failures.append(repr(exc))
                    elif fut.result().code != ResponseCode.SUCCESS:
                        failures.append(f"code {fut.result().code}: {fut.result().remark}")

                for cmd in it:
                    await sem.acquire()
                    if conn.closed:
                        sem.release()
                        lost.append(cmd)
                        continue
                    fut = conn.request(cmd, BULK_TIMEOUT_MS)
                    pending.add(fut)
                    fut.add_done_callback(lambda f, cmd=cmd: done(f, cmd))
                if pending:
                    await asyncio.wait(set(pending))

            await asyncio.gather(*(worker(c) for c in conns))
            if failures:
                raise EstateError(f"{what}: {len(failures)} requests failed, first: {failures[0]}")
            if not lost:
                return
            self.log(f"{what}: {len(lost)} requests lost with their connection (round {round_no + 1}); resending")
            await self._reconnect_bulk(conns)
            todo = lost
        raise EstateError(f"{what}: requests still lost after {BULK_RETRY_ROUNDS} rounds of new connections")

    async def _reconnect_idle(self) -> None:
        """Reopen connections the servers closed as idle (a long build leaves the others quiet for minutes)."""
        from ferrymq.remoting.connection import connect

        await self._reconnect_bulk(self.bulk)
        if self.quiet.closed:
            self.quiet = await connect(self.bp.addr)
        if self.ns_conn.closed:
            self.ns_conn = await connect(self.stack.name_server)

    async def _reconnect_bulk(self, conns: list[Any]) -> None:
        from ferrymq.remoting.connection import connect

        for i, c in enumerate(conns):
            if c.closed:
                conns[i] = await connect(self.bp.addr)

    async def _wait_route(self, topic: str) -> None:
        from ferrymq.client import api
        from ferrymq.remoting.codes import ResponseCode

        deadline = time.monotonic() + ROUTE_TIMEOUT_S
        while True:
            await self._reconnect_idle()
            resp = await self.ns_conn.invoke(api.build_get_route(topic), SAMPLE_TIMEOUT_MS)
            if resp.code == ResponseCode.SUCCESS and self.bp.addr.encode() in (resp.body or b""):
                return
            if time.monotonic() > deadline:
                raise EstateError(f"the name server does not route {topic} after {ROUTE_TIMEOUT_S} s")
            await asyncio.sleep(POLL_S)

    async def _timed(self, server: str, cmd: Any, ok: tuple[int, ...], lat: list[float]) -> bool:
        """One request on the quiet connection to ``server`` ("broker" or "namesrv"), timed. A connection the
        server closed (idle for minutes during a long build) is reopened and the request sent again, timed
        afresh."""
        from ferrymq.errors import ConnectionClosedError
        from ferrymq.remoting.connection import connect

        for attempt in range(2):
            conn = self.quiet if server == "broker" else self.ns_conn
            try:
                t0 = time.perf_counter()
                resp = await conn.invoke(cmd, SAMPLE_TIMEOUT_MS)
                lat.append(time.perf_counter() - t0)
                return resp.code in ok
            except ConnectionClosedError:
                if attempt:
                    raise
                if server == "broker":
                    self.quiet = await connect(self.bp.addr)
                else:
                    self.ns_conn = await connect(self.stack.name_server)
        raise AssertionError("unreachable")

    async def _samples(self, step: Step) -> dict[str, Any]:
        from ferrymq.client import api
        from ferrymq.common.route import MessageQueue
        from ferrymq.remoting.codes import ResponseCode

        n, rng, conn = self.o.samples, self.rng, "broker"
        ok = (int(ResponseCode.SUCCESS),)
        out: dict[str, Any] = {}
        tag = len(self.results)
        lat: list[float] = []
        errors = 0
        for i in range(n):
            topic = f"estate-x{tag}-{i}"
            errors += not await self._timed(conn, self._create_cmd(topic), ok, lat)
            self.topics.append(topic)
        out["topic_create"] = _summary_ms(lat, errors)
        lat, errors = [], 0
        for i in range(n):
            group = f"estate-gx{tag}-{i}"
            errors += not await self._timed(conn, self._heartbeat_cmd([group]), ok, lat)
            self.groups.append(group)
        out["group_create"] = _summary_ms(lat, errors)
        lat, errors = [], 0
        sent: list[tuple[str, int]] = []
        estate_topics = [t for t in self.topics if t.startswith("estate-t")] or self.topics
        for _ in range(n):
            mq = (rng.choice(estate_topics), rng.randrange(QUEUES_PER_TOPIC))
            errors += not await self._timed(conn, self._send_cmd(*mq), ok, lat)
            sent.append(mq)
            self._mark_filled(mq)
        out["send"] = _summary_ms(lat, errors)
        lat, errors = [], 0
        for topic, qid in sent:
            cmd = api.build_pull(group="estate_pull", mq=MessageQueue(topic, "", qid), queue_offset=0, max_nums=1,
                                 sys_flag=api.PULL_FLAG_SUBSCRIPTION, commit_offset=0, suspend_timeout_ms=0,
                                 subscription="*", sub_version=0)
            errors += not await self._timed(conn, cmd, ok, lat)
        out["pull"] = _summary_ms(lat, errors)
        lat, errors = [], 0
        for _ in range(n):
            commit_mq = MessageQueue(rng.choice(estate_topics), "", rng.randrange(QUEUES_PER_TOPIC))
            errors += not await self._timed(
                conn, api.build_update_consumer_offset(rng.choice(self.groups), commit_mq, 1), ok, lat)
        out["offset_commit"] = _summary_ms(lat, errors)
        lat, errors = [], 0
        for _ in range(n):
            errors += not await self._timed("namesrv", api.build_get_route(rng.choice(estate_topics)), ok, lat)
        out["route_query"] = _summary_ms(lat, errors)
        return out

    async def _restart(self) -> tuple[float, float]:
        """SIGTERM, wait for the exit, start; seconds from SIGTERM until a route query names the broker and a
        PULL of a filled queue answers FOUND, and seconds until the old process exited."""
        from ferrymq.client import api
        from ferrymq.common.route import MessageQueue
        from ferrymq.remoting.codes import ResponseCode
        from ferrymq.remoting.connection import connect

        child = self.bp.child
        assert child is not None
        self._close_broker_conns()
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, signal.SIGTERM)
        await asyncio.to_thread(_wait_exit, child, STOP_GRACE_S)
        stop_s = time.monotonic() - t0
        if child in self.sup.children:
            self.sup.children.remove(child)
        await self._start_broker()
        topic, qid = self.filled[0] if self.filled else (self.topics[0], 0)
        pull = api.build_pull(group="estate_pull", mq=MessageQueue(topic, "", qid), queue_offset=0, max_nums=1,
                              sys_flag=api.PULL_FLAG_SUBSCRIPTION, commit_offset=0, suspend_timeout_ms=0,
                              subscription="*", sub_version=0)
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        conn = await connect(self.bp.addr)
        routed = found = False
        try:
            while not (routed and found):
                if not routed:
                    resp = await self.ns_conn.invoke(api.build_get_route(topic), SAMPLE_TIMEOUT_MS)
                    routed = resp.code == ResponseCode.SUCCESS and self.bp.addr.encode() in (resp.body or b"")
                if not found:
                    resp = await conn.invoke(pull, SAMPLE_TIMEOUT_MS)
                    found = resp.code == ResponseCode.SUCCESS
                if time.monotonic() > deadline:
                    raise EstateError(f"broker not answering a route query and a pull {RESTART_TIMEOUT_S} s "
                                      "after restart")
                if not (routed and found):
                    await asyncio.sleep(POLL_S)
        finally:
            conn.close()
        restart_s = time.monotonic() - t0
        await self._connect_broker()
        return restart_s, stop_s

    # -- results --
    def targets(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not self.results:
            return out
        first, last = self.results[0], self.results[-1]
        for op in OPS:
            a, b = first["ops"][op]["p99_ms"], last["ops"][op]["p99_ms"]
            ratio = b / a if a and b is not None else None
            out.append({"name": f"{op} p99, last step / first step", "figure": ratio,
                        "target": f"<= {TARGET_P99_RATIO}x", "met": None if ratio is None
                        else ratio <= TARGET_P99_RATIO})
        stalls = [v for r in self.results for v in (r["stall_ms"], r["stall_groups_ms"]) if v is not None]
        worst = max(stalls) if stalls else None
        out.append({"name": "longest stall (sampled requests, group build), ms", "figure": worst,
                    "target": f"<= {TARGET_STALL_MS:g} ms", "met": None if worst is None else worst <= TARGET_STALL_MS})
        filled = last["queues_filled"]
        disk = last["cq_index_disk_bytes"]
        scaled = disk * TARGET_DISK_QUEUES / filled if filled else None
        note = "" if filled >= TARGET_DISK_QUEUES else f" (scaled from {filled} queues)"
        out.append({"name": f"CQ+index disk for {TARGET_DISK_QUEUES} queues x 1 msg, bytes{note}", "figure": scaled,
                    "target": f"<= {TARGET_DISK_BYTES / 1e9:g} GB",
                    "met": None if scaled is None else scaled <= TARGET_DISK_BYTES})
        rs = last["restart_s"]
        out.append({"name": "restart with the whole estate, s", "figure": rs, "target": f"<= {TARGET_RESTART_S:g} s",
                    "met": None if rs is None else rs <= TARGET_RESTART_S})
        return out

    def to_json(self) -> dict[str, Any]:
        o = self.o
        return {
            "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                        "load_average_start": self.started_load, "load_average_end": load_average(),
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
            "options": {"topics": list(o.topics), "groups": list(o.groups), "queues": o.queues,
                        "samples": o.samples, "heartbeat_groups": o.heartbeat_groups,
                        "bulk_connections": BULK_CONNECTIONS, "bulk_depth": BULK_DEPTH,
                        "server_pythonpath": o.server_pythonpath},
            "steps": self.results,
            "targets": self.targets(),
            "error": self.error,
        }


def _wait_exit(child: Child, grace_s: float) -> None:
    try:
        child.proc.wait(timeout=grace_s)
    except Exception:  # noqa: BLE001 - still running after the grace: kill it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=30)


async def _wait_port(child: Child, port: int, timeout_s: float = RESTART_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(port_open, port):
        if not child.alive():
            raise ChildFailed(f"{child.name} exited with {child.proc.returncode}:\n{child.log_tail()}")
        if time.monotonic() > deadline:
            raise ChildFailed(f"{child.name} did not open port {port} in {timeout_s}s:\n{child.log_tail()}")
        await asyncio.sleep(POLL_S)


# ---- table ---------------------------------------------------------------------------------------------------
def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:,.0f}")


def _mb(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e6:,.1f}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def render_estate_table(bench: EstateBench) -> Any:
    from rich.table import Table

    res = bench.results
    load = bench.started_load
    t = Table(title=f"ferry bench --estate: {os.cpu_count()} cores, Python {platform.python_version()}, "
                    f"{bench.o.samples} single requests per operation and step"
                    + (f", load average at start {load[0]}" if load else ""),
              caption="latencies in ms (one request at a time on a quiet broker); sizes in MB (1e6 bytes)")
    t.add_column("figure")
    for r in res:
        t.add_column(r["name"], justify="right")
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("topics / groups / queues with messages",
         lambda r: f"{r['topics']:,} / {r['groups']:,} / {r['queues_filled']:,}"),
        ("build time of the step, s", lambda r: _s(r["build_s"])),
    ]
    for op in OPS:
        rows.append((f"{op} p50 / p99", lambda r, op=op: f"{_ms(r['ops'][op]['p50_ms'])} / "  # type: ignore[misc]
                                                           f"{_ms(r['ops'][op]['p99_ms'])}"
                     + (f" ({r['ops'][op]['errors']} err)" if r["ops"][op]["errors"] else "")))
    rows += [
        ("longest stall: sampled requests, ms", lambda r: _ms(r["stall_ms"])),
        ("longest stall: heartbeat group build, ms", lambda r: _ms(r["stall_groups_ms"])),
        ("longest stall: pipelined build (queueing), ms", lambda r: _ms(r["stall_build_ms"])),
        (f"{LAG_METRIC} max, ms", lambda r: _ms(None if r["loop_lag_max_s"] is None else r["loop_lag_max_s"] * 1000)),
        ("broker RSS (anonymous), MB", lambda r: f"{_mb(r['broker_rss_bytes'])} ({_mb(r['broker_rss_anon_bytes'])})"),
        ("broker open fds", lambda r: "-" if r["broker_fds"] is None else str(r["broker_fds"])),
        ("consume queues + index on disk, MB", lambda r: _mb(r["cq_index_disk_bytes"])),
        ("commit log on disk, MB", lambda r: _mb(r["commitlog_disk_bytes"])),
        ("name server RSS, MB", lambda r: _mb(r["namesrv_rss_bytes"])),
        ("restart with the estate (stop part), s",
         lambda r: f"{_s(r['restart_s'])} ({_s(r['stop_s'])})" if not r["restart_error"] else "failed"),
    ]
    for label, fn in rows:
        t.add_row(label, *(fn(r) for r in res))
    return t


def render_targets(bench: EstateBench) -> Any:
    from rich.table import Table

    t = Table(title="targets (a missed target is reported, never a failing exit)")
    for col in ("target", "figure", "bound", "result"):
        t.add_column(col, justify="right" if col == "figure" else "left")
    for tg in bench.targets():
        fig = tg["figure"]
        shown = "-" if fig is None else (f"{fig:.2f}" if fig < 1000 else f"{fig:,.0f}")
        met = tg["met"]
        t.add_row(tg["name"], shown, tg["target"],
                  "-" if met is None else ("[bold green]met[/]" if met else "[bold red]not met[/]"))
    return t


# ---- command line ------------------------------------------------------------------------------------------
def _counts(text: str, what: str) -> tuple[int, ...]:
    import click

    try:
        values = tuple(int(v.replace("_", "").strip()) for v in text.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated counts, got {text!r}", param_hint=what) from None
    if not values or any(v < 0 for v in values):
        raise click.BadParameter(f"expected counts >= 0, got {text!r}", param_hint=what)
    return values


def run_estate(*, scale: str, topics: str | None, groups: str | None, queues: int | None, samples: int | None,
               heartbeat_groups: int | None, server_pythonpath: str | None, json_path: str | None,
               base_dir: str | None, keep_dir: bool, broker_conf: tuple[str, ...], verbose: bool) -> None:
    """``ferry bench --estate``: run, print the table and the targets (stdout; stderr with ``--json -``)."""
    import json
    import sys

    import click
    from rich.console import Console

    preset = SCALES[scale]
    o = EstateOptions(topics=preset.topics, groups=preset.groups, queues=preset.queues, samples=preset.samples,
                      heartbeat_groups=preset.heartbeat_groups)
    if topics is not None:
        o.topics = _counts(topics, "--estate-topics")
    if groups is not None:
        o.groups = _counts(groups, "--estate-groups")
    if queues is not None:
        if queues < 0:
            raise click.BadParameter("must be >= 0", param_hint="--estate-queues")
        o.queues = queues
    if samples is not None:
        if samples < 1:
            raise click.BadParameter("must be >= 1", param_hint="--estate-samples")
        o.samples = samples
    if heartbeat_groups is not None:
        if heartbeat_groups < 1:
            raise click.BadParameter("must be >= 1", param_hint="--estate-heartbeat-groups")
        o.heartbeat_groups = heartbeat_groups
    if max(o.topics, default=0) == 0 and o.queues == 0:
        raise click.BadParameter("the estate needs topics (--estate-topics) or queues (--estate-queues)")
    o.server_pythonpath = server_pythonpath or None
    o.base_dir, o.keep_dir = base_dir, keep_dir
    for item in broker_conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--broker-conf")
        o.broker_conf[key.strip()] = value.strip()

    err = Console(stderr=True)
    out = Console(stderr=json_path == "-", width=max(160, Console().width))

    def log(text: str) -> None:
        if verbose:
            err.log(text, markup=False, highlight=False)

    def progress(text: str) -> None:
        err.print(f"[bold]estate[/]: {text}", highlight=False)

    bench = EstateBench(o, log=log, progress=progress)
    failed = False
    try:
        bench.run()
    except KeyboardInterrupt:
        err.print("[yellow]interrupted: all started processes were stopped; the steps done so far below[/]")
        bench.error = bench.error or "interrupted"
    except Exception as exc:  # noqa: BLE001 - reported in one line with the steps done so far
        bench.error = bench.error or f"{type(exc).__name__}: {exc}"
        failed = True
    if bench.results:
        out.print(render_estate_table(bench))
        out.print(render_targets(bench))
    if json_path:
        data = json.dumps(bench.to_json(), indent=2, default=str)
        if json_path == "-":
            sys.stdout.write(data + "\n")
        else:
            with open(json_path, "w") as fh:
                fh.write(data + "\n")
    if failed:
        err.print(f"[red]error:[/] {bench.error}", highlight=False)
        raise SystemExit(1)
