"""``ferry ha status [-n NAMESRV] [--json]`` (the name server defaults to ``NAMESRV_ADDR``): every broker group's master and slaves with their lag.
``ferry ha elect --controller ADDR --broker-name B [--broker-id N] [--json]``: a manual switchover in
controller mode (CONTROLLER_ELECT_MASTER; without --broker-id the controller's normal election, which
keeps a live master).

Sources: GET_BROKER_CLUSTER_INFO from the name server; GET_BROKER_RUNTIME_INFO from every broker.
A master's runtime info carries ``haSlaveCount`` and ``haSlaves`` (a JSON list of
``HAService.slave_status()``: addr, ackOffset, lagBytes, connectedSinceMs); every broker carries
``commitLogMaxOffset``. A slave's lag is ``master commitLogMaxOffset - slave commitLogMaxOffset``.

Exit codes: 0 ok, 1 name server unreachable, 2 bad option.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import click

from ferrymq.client._cli import namesrv_option

EXIT_UNREACHABLE = 1


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def build_report(
    cluster_info: dict[str, Any], runtime: dict[str, dict[str, str] | str]
) -> list[dict[str, Any]]:
    """Pure: name-server cluster info (normalised, int broker ids) + runtime info per address (or an
    error string) -> one row per broker group."""
    groups: list[dict[str, Any]] = []
    for name, bd in sorted(cluster_info.get("brokerAddrTable", {}).items()):
        addrs: dict[int, str] = bd.get("brokerAddrs", {})
        master_addr = addrs.get(0)
        master_rt = runtime.get(master_addr) if master_addr else None
        master: dict[str, Any] | None = None
        master_max = -1
        ha_links: list[dict[str, Any]] = []
        if master_addr is not None:
            master = {"addr": master_addr}
            if isinstance(master_rt, dict):
                master_max = _int(master_rt.get("commitLogMaxOffset"))
                master["role"] = master_rt.get("brokerRole", "")
                master["maxOffset"] = master_max
                master["haServerAddr"] = master_rt.get("haServerAddr", "")
                master["haSlaveCount"] = _int(master_rt.get("haSlaveCount"), 0)
                raw = master_rt.get("haSlaves")
                if raw:
                    try:
                        parsed = json.loads(raw)
                        if isinstance(parsed, list):
                            ha_links = [x for x in parsed if isinstance(x, dict)]
                    except ValueError:
                        pass
            elif isinstance(master_rt, str):
                master["error"] = master_rt
        slaves: list[dict[str, Any]] = []
        for bid, addr in sorted(addrs.items()):
            if bid == 0:
                continue
            row: dict[str, Any] = {"brokerId": bid, "addr": addr}
            rt = runtime.get(addr)
            if isinstance(rt, dict):
                smax = _int(rt.get("commitLogMaxOffset"))
                row["maxOffset"] = smax
                row["masterAddr"] = rt.get("masterAddr", "")
                row["masterHaAddr"] = rt.get("masterHaAddr", "")
                row["lagBytes"] = master_max - smax if master_max >= 0 and smax >= 0 else None
            elif isinstance(rt, str):
                row["error"] = rt
            slaves.append(row)
        groups.append(
            {
                "cluster": bd.get("cluster", ""),
                "brokerName": name,
                "master": master,
                "slaves": slaves,
                "haLinks": ha_links,
            }
        )
    return groups


async def collect(namesrv: str, timeout_ms: int) -> list[dict[str, Any]]:
    from ferrymq.client.admin import Admin

    async with Admin(namesrv, request_timeout_ms=timeout_ms) as admin:
        info = await admin.cluster_info()
        addrs = sorted({a for bd in info["brokerAddrTable"].values() for a in bd["brokerAddrs"].values()})

        async def one(addr: str) -> tuple[str, dict[str, str] | str]:
            try:
                return addr, await admin.broker_runtime_info(addr)
            except Exception as exc:
                return addr, f"{type(exc).__name__}: {exc}"

        runtime = dict(await asyncio.gather(*(one(a) for a in addrs)))
        return build_report(info, runtime)


def _age(connected_since_ms: Any) -> str:
    ms = _int(connected_since_ms, 0)
    if ms <= 0:
        return "-"
    secs = max(0, int(time.time() - ms / 1000))
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m{secs % 60:02d}s"


def render_text(groups: list[dict[str, Any]]) -> str:
    if not groups:
        return "no brokers registered"
    lines: list[str] = []
    for g in groups:
        lines.append(f"{g['cluster']}/{g['brokerName']}")
        m = g["master"]
        if m is None:
            lines.append("  master   (none registered)")
        elif "error" in m:
            lines.append(f"  master   {m['addr']}  unreachable: {m['error']}")
        else:
            lines.append(
                f"  master   {m['addr']}  {m.get('role', '')}  maxOffset={m.get('maxOffset', -1)}"
                f"  haSlaves={m.get('haSlaveCount', 0)}"
            )
        for s in g["slaves"]:
            if "error" in s:
                lines.append(f"  slave {s['brokerId']}  {s['addr']}  unreachable: {s['error']}")
            else:
                lag = s.get("lagBytes")
                lines.append(
                    f"  slave {s['brokerId']}  {s['addr']}  maxOffset={s.get('maxOffset', -1)}"
                    f"  lag={'?' if lag is None else lag} bytes"
                )
        for link in g["haLinks"]:
            lines.append(
                f"  ha-link  {link.get('addr', '?')}  ack={link.get('ackOffset', -1)}"
                f"  lag={link.get('lagBytes', '?')} bytes  up {_age(link.get('connectedSinceMs'))}"
            )
    return "\n".join(lines)


@click.group(name="ha")
def command() -> None:
    """Master/slave replication."""


@command.command("status")
@namesrv_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.option("--timeout-ms", default=5000, show_default=True, type=int)
def status(namesrv: str, as_json: bool, timeout_ms: int) -> None:
    """Every broker group's master and slaves with their replication lag."""
    try:
        groups = asyncio.run(collect(namesrv, timeout_ms))
    except Exception as exc:
        click.echo(f"error: cannot read cluster info from {namesrv}: {exc}", err=True)
        sys.exit(EXIT_UNREACHABLE)
    if as_json:
        click.echo(json.dumps(groups, indent=2, sort_keys=True))
    else:
        click.echo(render_text(groups))


@command.command("elect")
@click.option("--controller", "controller", envvar="CONTROLLER_ADDR", default="127.0.0.1:9880", show_default=True,
              help="Controller address(es), ';'-separated (env CONTROLLER_ADDR); the leader is found")
@click.option("--broker-name", "-b", "broker_name", required=True, help="broker group (brokerName)")
@click.option("--broker-id", "-i", "broker_id", type=click.IntRange(1, None), default=None,
              help="replica to make master (must be alive); default: the controller chooses")
@click.option("--json", "as_json", is_flag=True, help="print the group's new state as JSON")
@click.option("--timeout-ms", default=3000, show_default=True, type=click.IntRange(1, 600_000))
def elect(controller: str, broker_name: str, broker_id: int | None, as_json: bool, timeout_ms: int) -> None:
    """Elect a master of one broker group (controller mode), like mqadmin electMaster."""
    from ferrymq.client.controller_admin import ControllerAdmin
    from ferrymq.errors import FerryError

    async def run() -> dict[str, Any]:
        async with ControllerAdmin(controller, timeout_ms=timeout_ms) as admin:
            return await admin.elect(broker_name, broker_id)

    try:
        group = asyncio.run(run())
    except FerryError as exc:
        click.echo(f"error: election of {broker_name} failed: {exc}", err=True)
        sys.exit(EXIT_UNREACHABLE)
    if as_json:
        click.echo(json.dumps(group, indent=2, sort_keys=True))
        return
    master = group.get("masterId", -1)
    click.echo(f"{broker_name}: master {master} ({group.get('masterAddr') or 'none'}), "
               f"masterEpoch {group.get('masterEpoch')}, SyncStateSet {group.get('syncStateSet')}")
