"""Start ferrymq name servers and brokers as subprocesses (``ferry namesrv`` / ``ferry broker -c``) on free
127.0.0.1 ports, plus small async helpers (raw remoting calls, topic creation, offsets)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from ferrymq.cli.bench_impl.procs import HOST, Child, Supervisor, ferry_argv, free_port

#: Wait for a topic route / a replicated send to become available.
READY_TIMEOUT_S = 60.0
POLL_S = 0.05
QUEUES = 8


@dataclass
class BrokerProc:
    name: str  # supervisor child name
    broker_name: str
    broker_id: int
    port: int
    ha_port: int
    store_dir: str
    conf_path: str
    child: Child | None = None

    @property
    def addr(self) -> str:
        return f"{HOST}:{self.port}"


@dataclass
class Stack:
    """One name server plus brokers, all under ``sup``'s temp dir in ``<label>/``."""

    sup: Supervisor
    label: str
    namesrv_port: int = 0
    brokers: list[BrokerProc] = field(default_factory=list)
    namesrv: Child | None = None
    controller: Child | None = None
    #: broker.conf keys for every broker of this stack (before ``broker(extra=...)``)
    common_conf: dict[str, Any] = field(default_factory=dict)

    @property
    def name_server(self) -> str:
        return f"{HOST}:{self.namesrv_port}"

    def start_namesrv(self) -> None:
        self.namesrv_port = free_port()
        self.namesrv = self.sup.spawn(f"{self.label}-namesrv",
                                      ferry_argv("namesrv", "--listen", f"{HOST}:{self.namesrv_port}"),
                                      port=self.namesrv_port)
        self.sup.wait_port(self.namesrv)

    def broker(self, broker_name: str, *, role: str = "ASYNC_MASTER", flush: str = "ASYNC_FLUSH",
               broker_id: int = 0, master: BrokerProc | None = None, tag: str = "",
               extra: dict[str, Any] | None = None) -> BrokerProc:
        """Write a broker.conf (not started yet). Ports: base = fast port, base+2 = listenPort, base+3 = HA."""
        base = free_port(4)
        port, ha_port = base + 2, base + 3
        name = f"{self.label}-{broker_name}-{broker_id}{tag}"
        store_dir = self.sup.path(self.label, name, "store")
        os.makedirs(store_dir, exist_ok=True)
        conf = {
            "brokerClusterName": f"bench-{self.label}",
            "brokerName": broker_name,
            "brokerId": broker_id,
            "namesrvAddr": self.name_server,
            "listenPort": port,
            "brokerIP1": HOST,
            "listenHost": HOST,
            "storePathRootDir": store_dir,
            "flushDiskType": flush,
            "brokerRole": "SLAVE" if master is not None else role,
            "haListenPort": ha_port,
            "registerNameServerPeriod": 10000,
            "autoCreateTopicEnable": "true",
        }
        if master is not None:
            conf["haMasterAddress"] = f"{HOST}:{master.ha_port}"
        conf.update(self.common_conf)
        conf.update(extra or {})
        conf_path = self.sup.path(self.label, name, "broker.conf")
        with open(conf_path, "w") as fh:
            for k, v in conf.items():
                fh.write(f"{k}={v}\n")
        bp = BrokerProc(name, broker_name, broker_id, port, ha_port, store_dir, conf_path)
        self.brokers.append(bp)
        return bp

    def start_controller(self) -> str:
        """One controller (``ferry controller -c``) for controller-mode brokers; returns its address."""
        port, raft_port = free_port(), free_port()
        store = self.sup.path(self.label, "controller", "store")
        os.makedirs(store, exist_ok=True)
        conf_path = self.sup.path(self.label, "controller", "controller.conf")
        with open(conf_path, "w") as fh:
            for k, v in {"controllerPeers": f"n0-{HOST}:{raft_port}", "controllerSelfId": "n0",
                         "controllerStorePath": store, "controllerListenPort": port, "listenHost": HOST}.items():
                fh.write(f"{k}={v}\n")
        self.controller = self.sup.spawn(f"{self.label}-controller", ferry_argv("controller", "-c", conf_path),
                                         port=port)
        self.sup.wait_port(self.controller)
        return f"{HOST}:{port}"

    def start(self, bp: BrokerProc, *, wait: bool = True) -> float:
        """Spawn the broker; returns seconds until its port answered (0 if not waited)."""
        bp.child = self.sup.spawn(bp.name, ferry_argv("broker", "-c", bp.conf_path), port=bp.port)
        return self.sup.wait_port(bp.child) if wait else 0.0

    def kill(self, bp: BrokerProc) -> None:
        if bp.child is not None:
            self.sup.kill(bp.child)
            bp.child = None

    def stop_broker(self, bp: BrokerProc) -> None:
        if bp.child is not None:
            self.sup.stop(bp.child)
            bp.child = None

    def wipe(self, bp: BrokerProc) -> None:
        shutil.rmtree(bp.store_dir, ignore_errors=True)
        os.makedirs(bp.store_dir, exist_ok=True)

    def close(self) -> None:
        for bp in reversed(self.brokers):
            self.stop_broker(bp)
        for child in (self.controller, self.namesrv):
            if child is not None:
                self.sup.stop(child)
        self.namesrv = self.controller = None
        if not self.sup.keep_dir:  # free the disk for the next stack
            shutil.rmtree(self.sup.path(self.label), ignore_errors=True)


# ---- async helpers (run in the bench process with asyncio.run) ---------------------------------------
async def create_topic(name_server: str, broker: BrokerProc, topic: str, queues: int = QUEUES) -> None:
    """Create ``topic`` on ``broker`` and wait until the name server routes it."""
    from ferrymq.client.admin import Admin

    admin = Admin(name_server)
    await admin.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                await admin.create_topic(topic, broker_addr=broker.addr, read_queue_nums=queues,
                                         write_queue_nums=queues)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        while True:
            try:
                route = await admin.topic_route(topic)
                if any(bd.broker_name == broker.broker_name for bd in route.broker_datas) and route.queue_datas:
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} not routed by the name server after {READY_TIMEOUT_S}s")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def wait_send_ok(name_server: str, topic: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Probe sends until one is SEND_OK (e.g. SYNC_MASTER: until the slave is attached)."""
    from ferrymq.client.producer import Producer
    from ferrymq.client.values import SendStatus, new_message

    p = Producer(name_server, "bench_probe", send_timeout_ms=5000)
    await p.start()
    try:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                r = await p.send(new_message(topic, b"probe"))
                if r.status is SendStatus.SEND_OK:
                    return
                last = r.status
            except Exception as exc:  # noqa: BLE001
                last = exc
            await asyncio.sleep(0.2)
        raise TimeoutError(f"no SEND_OK on {topic} within {timeout_s}s (last: {last})")
    finally:
        await p.close()


async def max_offsets(addr: str, topic: str, queues: int = QUEUES, pool: Any = None) -> list[int]:
    """GET_MAX_OFFSET of every queue of ``topic`` on one broker (raw remoting call, no route needed)."""
    from ferrymq.remoting.codec import RemotingCommand
    from ferrymq.remoting.codes import RequestCode, ResponseCode
    from ferrymq.remoting.pool import ConnectionPool

    own = pool is None
    pool = pool or ConnectionPool()
    try:
        out = []
        for q in range(queues):
            resp = await pool.invoke(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                                                   {"topic": topic, "queueId": q}), 3000)
            out.append(resp.get_int("offset", -1) if resp.code == ResponseCode.SUCCESS else -1)
        return out
    finally:
        if own:
            await pool.close()


async def runtime_info(addr: str) -> dict[str, str]:
    from ferrymq.remoting import jsonx
    from ferrymq.remoting.codec import RemotingCommand
    from ferrymq.remoting.codes import RequestCode
    from ferrymq.remoting.pool import ConnectionPool

    pool = ConnectionPool()
    try:
        resp = await pool.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 3000)
        if resp.code != 0 or not resp.body:
            return {}
        obj = jsonx.loads(resp.body)
        table = obj.get("table", obj) if isinstance(obj, dict) else {}
        return {str(k): str(v) for k, v in table.items()}
    finally:
        await pool.close()


async def pull_once(addr: str, topic: str, queue_id: int = 0, pool: Any = None) -> int:
    """One raw PULL of ``topic``/``queue_id`` at offset 0; returns the response code (0 = FOUND)."""
    from ferrymq.client import api
    from ferrymq.common.route import MessageQueue
    from ferrymq.remoting.pool import ConnectionPool

    own = pool is None
    pool = pool or ConnectionPool()
    try:
        cmd = api.build_pull(group="bench_restart", mq=MessageQueue(topic, "", queue_id), queue_offset=0, max_nums=1,
                             sys_flag=api.PULL_FLAG_SUBSCRIPTION, commit_offset=0, suspend_timeout_ms=0,
                             subscription="*", sub_version=0)
        resp = await pool.invoke(addr, cmd, 3000)
        return resp.code
    finally:
        if own:
            await pool.close()


async def controller_master(name_server: str, controller: str, brokers: list[BrokerProc],
                            timeout_s: float = READY_TIMEOUT_S) -> BrokerProc:
    """The master of a controller-mode group once every replica is in its SyncStateSet and the name server
    routes it as brokerId 0 (until then SYNC sends are acknowledged by fewer replicas)."""
    from ferrymq.remoting import jsonx
    from ferrymq.remoting.codec import RemotingCommand
    from ferrymq.remoting.codes import RequestCode, ResponseCode
    from ferrymq.remoting.connection import connect

    async def call(addr: str, code: int, fields: dict[str, Any]) -> Any:
        conn = await connect(addr, timeout_ms=2000)
        try:
            resp = await conn.invoke(RemotingCommand.request(code, fields), 2000)
        finally:
            conn.close()
        return jsonx.loads(resp.body) if resp.code == ResponseCode.SUCCESS and resp.body else None

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = await call(controller, RequestCode.CONTROLLER_GET_REPLICA_INFO,
                               {"brokerName": brokers[0].broker_name})
            info = await call(name_server, RequestCode.GET_BROKER_CLUSTER_INFO, {})
            entry = ((info or {}).get("brokerAddrTable") or {}).get(brokers[0].broker_name) or {}
            routed = {str(k): v for k, v in (entry.get("brokerAddrs") or {}).items()}.get("0")
            if state and len(state.get("syncStateSet") or ()) == len(brokers):
                for bp in brokers:
                    if bp.broker_id == int(state["masterId"]) and routed == bp.addr:
                        return bp
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no controller-mode master with a full SyncStateSet after {timeout_s} s")
        await asyncio.sleep(0.2)
