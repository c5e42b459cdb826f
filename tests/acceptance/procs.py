"""Process helpers for acceptance tests: ferrymq subprocesses, raw remoting requests (free ports come from
``support.ports`` and are re-exported here).

Rules kept here (CONTRIBUTING.md, "Tests"):

* every port is on 127.0.0.1, found by binding port 0 (brokers also need listenPort-2 and listenPort+1);
* every process started is registered and stopped (SIGTERM, then SIGKILL) by its owner, also on failure;
* every wait is a polling loop with a deadline on a condition, never a bare sleep;
* process output goes to log files in a tmp dir, dumped when a test fails.

| helper                  | what it waits for                                                         |
|-------------------------|---------------------------------------------------------------------------|
| ``start_namesrv``       | the port answers GET_BROKER_CLUSTER_INFO                                  |
| ``start_broker``        | the port accepts connections and every namesrv lists the broker           |
| ``wait_route``          | GET_ROUTEINFO_BY_TOPIC on the namesrv answers SUCCESS (optionally: broker)|
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import connect
from support.ports import LOOPBACK as LOOPBACK
from support.ports import free_port as free_port
from support.ports import port_answers as port_answers
from support.ports import port_free

ACCEPTANCE_DIR = Path(__file__).resolve().parent
CPP_SCRIPTS_DIR = ACCEPTANCE_DIR / "cpp_scripts"
NODE_DIR = ACCEPTANCE_DIR / "node"

#: Polling period of every wait loop.
POLL_INTERVAL_S = 0.05
#: Grace period between SIGTERM and SIGKILL when stopping a process.
STOP_GRACE_S = 10.0
#: A namesrv is expected to answer within this after its start.
NAMESRV_START_TIMEOUT_S = 30.0
#: A broker is expected to serve and be registered within this after its start.
BROKER_START_TIMEOUT_S = 60.0
#: Timeout of one raw request from the helpers.
REQUEST_TIMEOUT_MS = 3000
#: Bytes of each log shown when a test fails.
LOG_TAIL_BYTES = 20_000

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# ports and waiting


def wait_for(
    condition: Callable[[], T],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = POLL_INTERVAL_S,
    alive: Iterable[ManagedProcess] = (),
) -> T:
    """Poll ``condition`` until it returns a truthy value; raise TimeoutError naming ``what``.

    Exceptions raised by ``condition`` count as "not yet" (the last one is chained). If any process in
    ``alive`` exits meanwhile, fail at once with its exit code."""
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    procs = list(alive)
    while True:
        try:
            value = condition()
        except Exception as exc:  # a condition that cannot be evaluated yet
            last_exc = exc
            value = None
        if value:
            return value
        for p in procs:
            if p.exited:
                raise RuntimeError(f"{p.name} exited with code {p.returncode} while waiting for {what}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f} s waiting for {what}") from last_exc
        time.sleep(interval_s)


# ---------------------------------------------------------------------------------------------
# processes


@dataclass
class ManagedProcess:
    """A subprocess whose stdout+stderr go to ``log_path``."""

    name: str
    argv: list[str]
    log_path: Path
    cwd: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None
    _log_file: Any = None

    def start(self) -> ManagedProcess:
        assert self.popen is None or self.popen.poll() is not None, f"{self.name} is already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file.write(f"\n=== start {' '.join(self.argv)}\n".encode())
        self._log_file.flush()
        self.popen = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a SIGINT to pytest does not hit the children first
        )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def exited(self) -> bool:
        return self.popen is not None and self.popen.poll() is not None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_log(self, pattern: str, *, timeout_s: float) -> re.Match[str]:
        rx = re.compile(pattern)
        return wait_for(lambda: rx.search(self.log_text()), timeout_s=timeout_s,
                        what=f"{self.name} to log /{pattern}/", alive=[self])

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def wait_exit(self, timeout_s: float) -> int:
        assert self.popen is not None
        return self.popen.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        self._close_log()

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL. Returns the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()
        return self.popen.returncode

    def _close_log(self) -> None:
        if self._log_file is not None:
            with contextlib.suppress(Exception):
                self._log_file.write(f"=== exited with {self.returncode}\n".encode())
                self._log_file.close()
            self._log_file = None

    def tail(self, n_bytes: int = LOG_TAIL_BYTES) -> str:
        text = self.log_text()
        return text if len(text) <= n_bytes else "...\n" + text[-n_bytes:]


class ProcessGroup:
    """Owns every process a test starts; ``stop_all`` ends them in reverse order."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.procs: list[ManagedProcess] = []
        #: more log files shown by dump(): explicit paths, and glob patterns (resolved at dump time)
        self.extra_logs: list[Path] = []
        self.extra_log_globs: list[str] = []

    def spawn(self, name: str, argv: list[str], *, cwd: Path | None = None,
              env: Mapping[str, str] | None = None) -> ManagedProcess:
        log_dir = self.base_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ)
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env.update(env or {})
        proc = ManagedProcess(name=name, argv=argv, log_path=log_dir / f"{name}.log",
                              cwd=cwd or self.base_dir, env=full_env)
        self.procs.append(proc)
        return proc.start()

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            try:
                p.stop()
            except Exception:
                p.kill()

    def dump(self) -> str:
        parts = []
        for p in self.procs:
            parts.append(f"----- {p.name} (pid {p.popen.pid if p.popen else '-'}, rc {p.returncode}) "
                         f"{p.log_path} -----\n{p.tail()}")
        globbed = sorted(p for pattern in self.extra_log_globs for p in Path("/").glob(pattern.lstrip("/")))
        for path in [*self.extra_logs, *globbed]:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                parts.append(f"----- {path} -----\n{text[-LOG_TAIL_BYTES:]}")
        return "\n".join(parts)


def cpp_script_argv(name: str, args: Mapping[str, Any]) -> list[str]:
    """argv running ``cpp_scripts/<name>.py`` with ``args`` as its one JSON argument (cwd: CPP_SCRIPTS_DIR,
    environment: ``cpp_env``)."""
    return [sys.executable, str(CPP_SCRIPTS_DIR / f"{name}.py"), json.dumps(dict(args))]


def spawn_cpp_script(group: ProcessGroup, tmp_path: Path, proc_name: str, script: str,
                     args: Mapping[str, Any]) -> ManagedProcess:
    """``cpp_scripts/<script>.py`` in the background, a member of ``group`` (stopped at teardown)."""
    return group.spawn(proc_name, cpp_script_argv(script, args), cwd=CPP_SCRIPTS_DIR, env=cpp_env(tmp_path))


def cpp_env(tmp_path: Path) -> dict[str, str]:
    """Environment for C++-client scripts: HOME in the tmp dir, so librocketmq's logs
    (``$HOME/logs/rocketmq-cpp``) stay with the test."""
    home = tmp_path / "cpp-home"
    home.mkdir(exist_ok=True)
    env = dict(os.environ)
    env["HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def ferry_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "ferrymq.cli", *args]


# ---------------------------------------------------------------------------------------------
# raw remoting requests (one connection per call; fine for tests)


async def _invoke(addr: str, cmd: RemotingCommand, timeout_ms: int) -> RemotingCommand:
    conn = await connect(addr, timeout_ms=timeout_ms)
    try:
        return await conn.invoke(cmd, timeout_ms)
    finally:
        conn.close()


def request(addr: str, code: int, ext_fields: Mapping[str, Any] | None = None, body: bytes = b"",
            *, timeout_ms: int = REQUEST_TIMEOUT_MS) -> RemotingCommand:
    """Send one request to ``addr`` ("host:port") on a fresh connection and return the response."""
    cmd = RemotingCommand.request(code, dict(ext_fields or {}), body)
    return asyncio.run(_invoke(addr, cmd, timeout_ms))


def json_body(resp: RemotingCommand) -> Any:
    from ferrymq.remoting import jsonx

    return jsonx.loads(resp.body) if resp.body else None


def cluster_info(ns_addr: str) -> dict[str, Any]:
    resp = request(ns_addr, RequestCode.GET_BROKER_CLUSTER_INFO)
    if resp.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"GET_BROKER_CLUSTER_INFO -> {resp.code} {resp.remark}")
    return json_body(resp) or {}


def broker_listed(ns_addr: str, broker_name: str, broker_addr: str | None = None, broker_id: int = 0) -> bool:
    info = cluster_info(ns_addr)
    entry = (info.get("brokerAddrTable") or {}).get(broker_name)
    if not entry:
        return False
    addrs = {str(k): v for k, v in (entry.get("brokerAddrs") or {}).items()}
    got = addrs.get(str(broker_id))
    return got is not None and (broker_addr is None or got == broker_addr)


def master_addr(ns_addr: str, broker_name: str) -> str:
    """The master (brokerId 0) address of ``broker_name`` as the namesrv lists it (how mqadmin finds it)."""
    entry = (cluster_info(ns_addr).get("brokerAddrTable") or {}).get(broker_name) or {}
    addrs = {str(k): v for k, v in (entry.get("brokerAddrs") or {}).items()}
    if "0" not in addrs:
        raise RuntimeError(f"namesrv {ns_addr} lists no master for {broker_name}: {entry}")
    return str(addrs["0"])


def route(ns_addr: str, topic: str) -> dict[str, Any] | None:
    """The TopicRouteData JSON for ``topic``, or None when the namesrv answers TOPIC_NOT_EXIST."""
    resp = request(ns_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    if resp.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"GET_ROUTEINFO_BY_TOPIC({topic}) -> {resp.code} {resp.remark}")
    return json_body(resp)


def wait_route(ns_addr: str, topic: str, *, timeout_s: float, broker_name: str | None = None,
               alive: Iterable[ManagedProcess] = ()) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        r = route(ns_addr, topic)
        if r is None:
            return None
        if broker_name is not None and not any(
                q.get("brokerName") == broker_name for q in r.get("queueDatas") or []):
            return None
        return r

    return wait_for(ok, timeout_s=timeout_s, what=f"namesrv {ns_addr} to route topic {topic}", alive=alive)


def create_topic(broker_addr: str, topic: str, *, queues: int = 4, perm: int = 6) -> RemotingCommand:
    """UPDATE_AND_CREATE_TOPIC on one broker, the way mqadmin sends it."""
    resp = request(broker_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": queues,
        "writeQueueNums": queues,
        "perm": perm,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "order": "false",
    })
    if resp.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"UPDATE_AND_CREATE_TOPIC({topic}) on {broker_addr} -> {resp.code} {resp.remark}")
    return resp


def query_consumer_offset(broker_addr: str, group: str, topic: str, queue_id: int) -> int | None:
    resp = request(broker_addr, RequestCode.QUERY_CONSUMER_OFFSET,
                   {"consumerGroup": group, "topic": topic, "queueId": queue_id})
    if resp.code != ResponseCode.SUCCESS:
        return None
    return resp.get_int("offset")


def max_offset(broker_addr: str, topic: str, queue_id: int) -> int:
    resp = request(broker_addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
    if resp.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"GET_MAX_OFFSET({topic}, {queue_id}) -> {resp.code} {resp.remark}")
    offset = resp.get_int("offset")
    assert offset is not None
    return offset


# ---------------------------------------------------------------------------------------------
# namesrv and broker


@dataclass
class Namesrv:
    proc: ManagedProcess
    port: int

    @property
    def addr(self) -> str:
        return f"{LOOPBACK}:{self.port}"


def start_namesrv(group: ProcessGroup, *, name: str = "namesrv", port: int | None = None,
                  timeout_s: float = NAMESRV_START_TIMEOUT_S) -> Namesrv:
    port = port or free_port()
    proc = group.spawn(name, ferry_argv("namesrv", "--listen", f"{LOOPBACK}:{port}"))
    ns = Namesrv(proc, port)
    wait_for(lambda: port_answers(port) and cluster_info(ns.addr) is not None,
             timeout_s=timeout_s, what=f"{name} to answer on {ns.addr}", alive=[proc])
    return ns


def write_properties(path: Path, props: Mapping[str, Any]) -> Path:
    lines = [f"{k}={_prop_str(v)}" for k, v in props.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _prop_str(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


@dataclass
class Broker:
    group: ProcessGroup
    name: str
    conf_path: Path
    props: dict[str, Any]
    namesrv_addrs: list[str]
    proc: ManagedProcess | None = None
    starts: int = 0

    @property
    def port(self) -> int:
        return int(self.props["listenPort"])

    @property
    def addr(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def broker_name(self) -> str:
        return str(self.props["brokerName"])

    @property
    def broker_id(self) -> int:
        return int(self.props.get("brokerId", 0))

    @property
    def store_dir(self) -> Path:
        return Path(self.props["storePathRootDir"])

    def start(self, *, timeout_s: float = BROKER_START_TIMEOUT_S) -> Broker:
        self.starts += 1
        proc_name = self.name if self.starts == 1 else f"{self.name}-run{self.starts}"
        self.proc = self.group.spawn(proc_name, ferry_argv("broker", "-c", str(self.conf_path)))
        self.wait_ready(timeout_s=timeout_s)
        return self

    def wait_ready(self, *, timeout_s: float = BROKER_START_TIMEOUT_S) -> None:
        assert self.proc is not None
        wait_for(lambda: port_answers(self.port), timeout_s=timeout_s,
                 what=f"{self.name} to accept connections on {self.addr}", alive=[self.proc])
        for ns in self.namesrv_addrs:
            wait_for(lambda ns=ns: broker_listed(ns, self.broker_name, self.addr, self.broker_id),
                     timeout_s=timeout_s, what=f"namesrv {ns} to list {self.broker_name}/{self.broker_id}",
                     alive=[self.proc])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()

    def stop(self) -> int | None:
        assert self.proc is not None
        return self.proc.stop()

    def restart(self, *, kill: bool = False, timeout_s: float = BROKER_START_TIMEOUT_S) -> Broker:
        """Stop (SIGTERM, or SIGKILL with ``kill``) and start again on the same config and data dir."""
        if kill:
            self.kill()
        else:
            self.stop()
        wait_for(lambda: port_free(self.port), timeout_s=timeout_s,
                 what=f"port {self.port} to be released by {self.name}")
        return self.start(timeout_s=timeout_s)


def broker_props(*, namesrv_addrs: list[str], store_dir: Path, port: int, broker_name: str = "broker-a",
                 cluster_name: str = "DefaultCluster", **overrides: Any) -> dict[str, Any]:
    props: dict[str, Any] = {
        "brokerClusterName": cluster_name,
        "brokerName": broker_name,
        "brokerId": 0,
        "namesrvAddr": ";".join(namesrv_addrs),
        "listenPort": port,
        "brokerIP1": LOOPBACK,
        "listenHost": LOOPBACK,  # ferrymq extension: keep test servers on loopback
        "storePathRootDir": str(store_dir),
        # small commit log segments keep tests light and exercise segment roll-over
        "mappedFileSizeCommitLog": 16 * 1024 * 1024,
        "flushDiskType": "ASYNC_FLUSH",
        "brokerRole": "ASYNC_MASTER",
        "autoCreateTopicEnable": True,
    }
    props.update(overrides)
    return props


def start_broker(group: ProcessGroup, namesrv_addrs: list[str], *, name: str = "broker",
                 timeout_s: float = BROKER_START_TIMEOUT_S, **overrides: Any) -> Broker:
    port = int(overrides.pop("listenPort", 0)) or free_port(broker=True)
    store_dir = Path(overrides.pop("storePathRootDir", group.base_dir / f"{name}-store"))
    store_dir.mkdir(parents=True, exist_ok=True)
    props = broker_props(namesrv_addrs=namesrv_addrs, store_dir=store_dir, port=port, **overrides)
    conf = write_properties(group.base_dir / f"{name}.conf", props)
    broker = Broker(group=group, name=name, conf_path=conf, props=props, namesrv_addrs=namesrv_addrs)
    return broker.start(timeout_s=timeout_s)


@dataclass
class Cluster:
    group: ProcessGroup
    namesrv: Namesrv
    broker: Broker
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ns_addr(self) -> str:
        return self.namesrv.addr

    @property
    def broker_addr(self) -> str:
        return self.broker.addr

    @property
    def alive(self) -> list[ManagedProcess]:
        return [p for p in (self.namesrv.proc, self.broker.proc) if p is not None]

    def create_topic(self, topic: str, *, queues: int = 4, timeout_s: float = 45.0) -> dict[str, Any]:
        """Create ``topic`` on the master the namesrv lists (UPDATE_AND_CREATE_TOPIC) and wait until the
        namesrv routes it (ali-ons needs the route)."""
        addr = master_addr(self.ns_addr, self.broker.broker_name)
        assert addr == self.broker_addr, (addr, self.broker_addr)
        create_topic(addr, topic, queues=queues)
        return wait_route(self.ns_addr, topic, timeout_s=timeout_s, broker_name=self.broker.broker_name,
                          alive=self.alive)
