"""``ferry quickstart --failover``: controller mode on this machine, and a master SIGKILLed under load.

Starts a name server, a controller (``ferry controller -c``) and three brokers of one group in controller
mode (SYNC replication, ``allAckInSyncStateSet``), sends a stream of messages through ferrymq's Producer,
SIGKILLs the master once the SyncStateSet holds all three, and prints every send around the kill (which
broker stored it) until sends go on at the newly elected master. Then it prints the controller's view (master,
epoch, SyncStateSet), how long writes were unavailable, and stops everything. Exit code 0 when sends
continued on a new master.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from ferrymq.cli.quickstart_stack import (
    BROKER_START_TIMEOUT_S,
    CLUSTER_NAME,
    LOOPBACK,
    NAMESRV_START_TIMEOUT_S,
    POLL_INTERVAL_S,
    QuickstartError,
    Stack,
    free_port,
    json_body,
    request,
    wait_until,
    write_conf,
)

BROKER_NAME = "broker-f"
TOPIC = "FailoverTopic"
REPLICA_IDS = (1, 2, 3)
#: the group is whole (a master, all three replicas in the SyncStateSet) within this
WHOLE_TIMEOUT_S = 60.0
#: a new master takes sends within this after the kill
FAILOVER_TIMEOUT_S = 60.0
#: sends shown after the new master took the first one
SENDS_AFTER_FAILOVER = 5


async def _replica_info(controller_addr: str) -> dict[str, Any] | None:
    from ferrymq.remoting.codes import RequestCode, ResponseCode

    resp = await request(controller_addr, RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": BROKER_NAME})
    if resp.code != ResponseCode.SUCCESS:
        return None
    body = json_body(resp)
    return body if isinstance(body, dict) else None


def _describe(state: dict[str, Any]) -> str:
    return (f"master replica {state.get('masterId')} ({state.get('masterAddr')}), epoch {state.get('masterEpoch')}, "
            f"SyncStateSet {state.get('syncStateSet')}")


async def run_failover(stack: Stack) -> None:
    from ferrymq.client import Producer, SendStatus, new_message
    from ferrymq.common.message import decode_offset_msg_id
    from ferrymq.remoting.codes import RequestCode, ResponseCode

    taken: set[int] = set()
    stack.namesrv_port = free_port(taken)
    controller_port, raft_port = free_port(taken), free_port(taken)
    controller_addr = f"{LOOPBACK}:{controller_port}"
    stack.spawn("namesrv", "namesrv", "--listen", stack.namesrv_addr, "--log-level", "WARNING")

    async def namesrv_up() -> bool:
        resp = await request(stack.namesrv_addr, RequestCode.GET_BROKER_CLUSTER_INFO)
        return resp.code == ResponseCode.SUCCESS

    await wait_until(stack, namesrv_up, timeout_s=NAMESRV_START_TIMEOUT_S, what="the name server")
    ctl_conf = write_conf(stack.data_dir / "controller.conf", {
        "controllerPeers": f"n0-{LOOPBACK}:{raft_port}", "controllerSelfId": "n0",
        "controllerStorePath": str(stack.data_dir / "controller"), "controllerListenPort": str(controller_port),
        "listenHost": LOOPBACK})
    stack.spawn("controller", "controller", "-c", str(ctl_conf))

    async def controller_up() -> bool:
        resp = await request(controller_addr, RequestCode.CONTROLLER_GET_METADATA_INFO)
        return resp.code == ResponseCode.SUCCESS

    await wait_until(stack, controller_up, timeout_s=NAMESRV_START_TIMEOUT_S, what="the controller")
    children = {}
    addrs = {}
    for rid in REPLICA_IDS:
        port = free_port(taken, with_next=True)
        addrs[rid] = f"{LOOPBACK}:{port}"
        conf = write_conf(stack.data_dir / f"replica{rid}.conf", {
            "brokerClusterName": CLUSTER_NAME, "brokerName": BROKER_NAME, "brokerId": str(rid),
            "enableControllerMode": "true", "controllerAddr": controller_addr, "brokerRole": "SYNC_MASTER",
            "allAckInSyncStateSet": "true", "haMaxTimeSlaveNotCatchup": "3000",
            "controllerHeartbeatPeriodMs": "500", "namesrvAddr": stack.namesrv_addr, "listenHost": LOOPBACK,
            "brokerIP1": LOOPBACK, "listenPort": str(port), "haListenPort": str(port + 1),
            "fastListenEnable": "false", "storePathRootDir": str(stack.data_dir / f"replica{rid}"),
            "mappedFileSizeCommitLog": str(16 * 1024 * 1024), "autoCreateTopicEnable": "true"})
        children[rid] = stack.spawn(f"replica{rid}", "broker", "-c", str(conf))

    async def whole() -> dict[str, Any] | None:
        state = await _replica_info(controller_addr)
        if not state or int(state.get("masterId", -1)) < 0 or sorted(state.get("syncStateSet") or ()) != [1, 2, 3]:
            return None
        return state

    state: dict[str, Any] | None = await wait_until(stack, whole, timeout_s=WHOLE_TIMEOUT_S + BROKER_START_TIMEOUT_S,
                             what="a master and all three replicas in the SyncStateSet")
    assert state is not None
    click.echo(f"controller    {_describe(state)}")
    old_master = int(state["masterId"])
    async with Producer(stack.namesrv_addr, "quickstart_failover_producer", send_timeout_ms=2000) as producer:
        seq = 0

        async def send_one() -> tuple[bool, str]:
            nonlocal seq
            seq += 1
            try:
                r = await producer.send(new_message(TOPIC, f"failover demo #{seq}"))
            except Exception as exc:
                return False, f"#{seq} failed: {type(exc).__name__}: {exc}"
            if r.status is not SendStatus.SEND_OK:
                return False, f"#{seq} {r.status.value}"
            ip, port, _ = decode_offset_msg_id(r.offset_msg_id)
            return True, f"#{seq} SEND_OK stored by {ip}:{port}"

        for _ in range(5):
            ok, line = await send_one()
            click.echo(f"send          {line}")
        killed = children[old_master]
        click.echo(f"SIGKILL       master replica {old_master} (pid {killed.pid}, {addrs[old_master]})")
        stack.children.remove(killed)
        with contextlib.suppress(ProcessLookupError):
            assert killed.popen is not None
            killed.popen.send_signal(signal.SIGKILL)
            killed.popen.wait()
        t_kill = time.monotonic()
        after = 0
        while after < SENDS_AFTER_FAILOVER:
            stack.check_alive()
            if time.monotonic() - t_kill > FAILOVER_TIMEOUT_S:
                raise QuickstartError(f"no send succeeded on a new master within {FAILOVER_TIMEOUT_S:.0f} s")
            ok, line = await send_one()
            elapsed = time.monotonic() - t_kill
            click.echo(f"send  +{elapsed:5.1f}s {line}")
            if ok and addrs[old_master] not in line:
                if after == 0:
                    click.echo(f"failover      writes resumed {elapsed:.1f} s after the kill")
                after += 1
            elif not ok:
                await asyncio.sleep(POLL_INTERVAL_S * 3)
    state = await _replica_info(controller_addr) or {}
    click.echo(f"controller    {_describe(state)}")
    click.echo(f"$ ferry controller status --controller {controller_addr}")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "ferrymq.cli", "controller", "status",
                                                "--controller", controller_addr, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    click.echo(out.decode(errors="replace").rstrip())


async def run(data_dir: Path) -> int:
    stack = Stack(data_dir)
    try:
        click.echo(f"ferrymq quickstart --failover: data in {data_dir}")
        await run_failover(stack)
        return 0
    except QuickstartError as exc:
        click.echo(f"quickstart failed: {exc}", err=True)
        return 1
    finally:
        await stack.stop_all()
