"""``ferry controller``: run a controller, or look at the controllers' state.

* ``ferry controller -c controller.conf`` (also ``ferry controller start -c controller.conf``): run one
  controller in the foreground until SIGINT/SIGTERM; prints one line with its listen address.
* ``ferry controller status --controller host:port[;host:port] [--json]``: every broker group as the Raft
  leader sees it (master, epochs, SyncStateSet, each replica's offset and liveness).

Exit codes: 0 ok (and after a signal), 1 the controller cannot start / no controller leader answers,
2 bad configuration or option.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from ferrymq.client.controller_admin import DEFAULT_CONTROLLER_ADDR
from ferrymq.common import logthrottle
from ferrymq.errors import ConfigError, FerryError

if TYPE_CHECKING:
    from ferrymq.controller.config import ControllerConfig

EXIT_START_FAILED = 1
EXIT_CONFIG_ERROR = 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
CONTROLLER_ENV = "CONTROLLER_ADDR"


def controller_option(f: Any) -> Any:
    return click.option("--controller", "controller", envvar=CONTROLLER_ENV, default=DEFAULT_CONTROLLER_ADDR,
                        show_default=True,
                        help="Controller address(es), ';'-separated (env CONTROLLER_ADDR); the leader is found")(f)


async def _serve(cfg: ControllerConfig) -> None:
    from ferrymq.cli.broker import wait_for_signal
    from ferrymq.controller.server import ControllerServer

    server = ControllerServer(cfg)
    await server.start()
    try:
        click.echo(f"ferrymq controller {cfg.self_id} serving on {server.addr} (raft {server.raft.self_addr}, "
                   f"{len(cfg.peers) or 1} node{'s' if len(cfg.peers) > 1 else ''})")
        sys.stdout.flush()
        await wait_for_signal()
        logging.getLogger("ferrymq.controller").info("signal received, shutting down")
    finally:
        await server.stop()


def run_controller(config_path: str, log_level: str) -> None:
    from ferrymq.cli.broker import event_loop_factory

    if log_level.upper() not in LOG_LEVELS:
        click.echo(f"config error: --log-level: expected one of {', '.join(LOG_LEVELS)}, got {log_level!r}",
                   err=True)
        sys.exit(EXIT_CONFIG_ERROR)
    from ferrymq.controller.config import load_config

    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        click.echo(f"config error: {exc}", err=True)
        sys.exit(EXIT_CONFIG_ERROR)
    logthrottle.configure_server_logging(log_level.upper())
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(_serve(cfg))
    except ConfigError as exc:
        click.echo(f"config error: {exc}", err=True)
        sys.exit(EXIT_CONFIG_ERROR)
    except (FerryError, OSError) as exc:
        click.echo(f"controller failed: {exc}", err=True)
        sys.exit(EXIT_START_FAILED)


_config_option = click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
                              help="controller .properties file (controllerPeers, controllerSelfId, ...)")
_log_option = click.option("--log-level", default="INFO", show_default=True)


@click.group("controller", invoke_without_command=True)
@_config_option
@_log_option
@click.pass_context
def command(ctx: click.Context, config_path: str | None, log_level: str) -> None:
    """Run a controller (-c controller.conf), or query the controllers (status)."""
    if ctx.invoked_subcommand is not None:
        if config_path is not None:
            raise click.UsageError(f"-c belongs to running a controller, not to '{ctx.invoked_subcommand}'")
        return
    if config_path is None:
        raise click.UsageError("give -c controller.conf to run a controller, or a subcommand")
    run_controller(config_path, log_level)


@command.command("start")
@click.option("-c", "--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="controller .properties file")
@_log_option
def start(config_path: str, log_level: str) -> None:
    """Run a controller until SIGINT/SIGTERM (same as ``ferry controller -c FILE``)."""
    run_controller(config_path, log_level)


# ---- status ------------------------------------------------------------------------------------------


async def collect_status(controllers: str, timeout_ms: int) -> dict[str, Any]:
    from ferrymq.client.controller_admin import ControllerAdmin

    async with ControllerAdmin(controllers, timeout_ms=timeout_ms) as admin:
        groups = await admin.sync_state_data()
        try:
            meta: dict[str, Any] = await admin.metadata()
        except FerryError as exc:
            meta = {"error": str(exc)}
    return {"controller": meta, "groups": groups}


def replica_rows(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per replica (pure; the table of ``status``)."""
    rows = []
    for g in groups:
        in_set = set(g.get("syncStateSet", []))
        replicas = g.get("replicas", {})
        if not replicas:
            rows.append({"group": g.get("brokerName", ""), "cluster": g.get("clusterName", "")})
        for rid, r in sorted(replicas.items(), key=lambda kv: int(kv[0])):
            role = "master" if int(rid) == g.get("masterId") else ("in-sync" if int(rid) in in_set else "replica")
            rows.append({
                "group": g.get("brokerName", ""), "cluster": g.get("clusterName", ""),
                "masterEpoch": g.get("masterEpoch", 0),
                "syncStateSet": ",".join(str(i) for i in g.get("syncStateSet", [])),
                "ssEpoch": g.get("syncStateSetEpoch", 0),
                "id": int(rid), "role": role, "brokerAddr": r.get("brokerAddr", ""),
                "alive": "yes" if r.get("alive") else "no", "maxPhyOffset": r.get("maxPhyOffset", -1),
                "heartbeatAgoMs": r.get("lastHeartbeatAgoMs", -1),
            })
    return rows


STATUS_COLUMNS = ["group", "cluster", "masterEpoch", "syncStateSet", "ssEpoch", "id", "role", "brokerAddr",
                  "alive", "maxPhyOffset", "heartbeatAgoMs"]


@command.command("status")
@controller_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.option("--timeout-ms", default=3000, show_default=True, type=click.IntRange(1, 600_000))
def status(controller: str, as_json: bool, timeout_ms: int) -> None:
    """Every broker group: master, epochs, SyncStateSet, each replica's offset and liveness."""
    try:
        report = asyncio.run(collect_status(controller, timeout_ms))
    except FerryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_START_FAILED)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    meta = report["controller"]
    title = (f"controller leader {meta.get('leaderId', '?')} at {meta.get('leaderAddr', '?')} "
             f"(term {meta.get('term', '?')})" if "error" not in meta else "controller")
    table = Table(title=title)
    for col in STATUS_COLUMNS:
        table.add_column(col)
    for row in replica_rows(report["groups"]):
        table.add_row(*(str(row.get(c, "")) for c in STATUS_COLUMNS))
    console = Console(width=int(os.environ.get("COLUMNS", "160")))
    if not report["groups"]:
        console.print(f"{title}: no broker groups")
        return
    console.print(table)


@command.command("sync-state-set")
@controller_option
@click.option("-b", "--broker-name", required=True, help="broker group (brokerName)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.option("--timeout-ms", default=3000, show_default=True, type=click.IntRange(1, 600_000))
def sync_state_set(controller: str, broker_name: str, as_json: bool, timeout_ms: int) -> None:
    """One broker group's master, epochs and SyncStateSet (mqadmin getSyncStateSet)."""
    from ferrymq.client.controller_admin import ControllerAdmin

    async def go() -> list[dict[str, Any]]:
        async with ControllerAdmin(controller, timeout_ms=timeout_ms) as admin:
            return await admin.sync_state_data(broker_name)
    try:
        groups = [g for g in asyncio.run(go()) if g.get("brokerName") == broker_name]
    except FerryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_START_FAILED)
    if not groups:
        click.echo(f"error: the controllers know no broker group {broker_name!r}", err=True)
        sys.exit(EXIT_START_FAILED)
    if as_json:
        click.echo(json.dumps(groups[0], indent=2, sort_keys=True))
        return
    for row in replica_rows(groups):
        click.echo("  ".join(f"{c}={row.get(c, '')}" for c in STATUS_COLUMNS))


@command.command("metadata")
@controller_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.option("--timeout-ms", default=3000, show_default=True, type=click.IntRange(1, 600_000))
def metadata(controller: str, as_json: bool, timeout_ms: int) -> None:
    """The controllers' Raft metadata: leader, term, peers (mqadmin getControllerMetaData)."""
    from ferrymq.client.controller_admin import ControllerAdmin

    async def go() -> dict[str, Any]:
        async with ControllerAdmin(controller, timeout_ms=timeout_ms) as admin:
            return await admin.metadata()
    try:
        meta = asyncio.run(go())
    except FerryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_START_FAILED)
    if as_json:
        click.echo(json.dumps(meta, indent=2, sort_keys=True))
        return
    for key, value in sorted(meta.items()):
        click.echo(f"{key:<16} {value}")
