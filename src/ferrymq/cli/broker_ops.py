"""``ferry broker config get|set``, ``ferry broker wipe-write-perm|add-write-perm``, ``ferry broker
delete-expired-commitlog``: operations on running brokers (subcommands of ``ferry broker``)."""

from __future__ import annotations

import json
from typing import Any

import click

from ferrymq.client._cli import addr_param, emit, json_option, namesrv_option, run

BROKER_ADDR_HELP = "Broker address host:port"


@click.group("config")
def config() -> None:
    """Read or change a running broker's configuration (mqadmin getBrokerConfig / updateBrokerConfig)."""


@config.command("get")
@namesrv_option
@click.option("-b", "--broker", "broker_addr", callback=addr_param, required=True, help=BROKER_ADDR_HELP)
@json_option
def config_get(namesrv: str, broker_addr: str, as_json: bool) -> None:
    """Every key with its current value (GET_BROKER_CONFIG; mqadmin getBrokerConfig)."""
    from ferrymq.client import Admin
    from ferrymq.client.ops import broker_config

    async def go() -> dict[str, str]:
        async with Admin(namesrv) as admin:
            return await broker_config(admin, broker_addr)
    values = run(go())
    if as_json:
        click.echo(json.dumps(values))
        return
    emit([{"key": k, "value": v} for k, v in values.items()], ["key", "value"], as_json=False,
         title=f"broker {broker_addr}")


@config.command("set")
@namesrv_option
@click.option("-b", "--broker", "broker_addr", callback=addr_param, required=True, help=BROKER_ADDR_HELP)
@click.argument("assignments", nargs=-1, required=True)
@json_option
def config_set(namesrv: str, broker_addr: str, assignments: tuple[str, ...], as_json: bool) -> None:
    """Change runtime-safe keys: KEY=VALUE ... (UPDATE_BROKER_CONFIG; mqadmin updateBrokerConfig). All or
    nothing: the broker refuses the whole update, naming the key, if one key cannot change at runtime; an
    accepted update is written to the broker's config file. docs/operations.md lists the runtime-safe keys."""
    from ferrymq.client import Admin
    from ferrymq.client.ops import update_broker_config

    updates: dict[str, str] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="ASSIGNMENTS")
        updates[key.strip()] = value.strip()

    async def go() -> str:
        async with Admin(namesrv) as admin:
            return await update_broker_config(admin, broker_addr, updates)
    persisted = run(go())
    if as_json:
        click.echo(json.dumps({"broker": broker_addr, "applied": updates, "persisted": persisted}))
        return
    emit([{"key": k, "value": v} for k, v in updates.items()], ["key", "value"], as_json=False,
         title=f"updated on {broker_addr}; " + (f"written to {persisted}" if persisted else
                                                "the broker has no config file: not persisted"))


def _perm_verb(name: str, doc: str, fn_name: str) -> click.Command:
    @click.command(name, help=doc)
    @namesrv_option
    @click.option("-b", "--broker-name", required=True, help="Broker group name (brokerName)")
    @json_option
    def verb(namesrv: str, broker_name: str, as_json: bool) -> None:
        from ferrymq.client import Admin, ops

        async def go() -> tuple[list[dict[str, Any]], bool]:
            async with Admin(namesrv) as admin:
                result: list[dict[str, Any]] = await getattr(ops, fn_name)(admin, broker_name)
                known = True
                if not any(r["topics"] or r["error"] for r in result):
                    # nothing changed anywhere: a mistyped name, or a group with no topics?
                    known = broker_name in (await admin.cluster_info())["brokerAddrTable"]
                return result, known
        rows, known = run(go())
        if not known:
            raise click.ClickException(f"no name server knows the broker group {broker_name!r} "
                                       "(see `ferry cluster list`)")
        emit(rows, ["namesrv", "topics", "error"], as_json=as_json, title=f"{name} {broker_name}")
        if any(r["error"] for r in rows):
            raise click.ClickException("some name servers did not take the change")
    return verb


wipe_write_perm = _perm_verb(
    "wipe-write-perm", "Take the broker group's write permission away on every name server, so producers stop "
    "sending to it (before maintenance; mqadmin wipeWritePerm). Pulls go on.", "wipe_write_perm")
add_write_perm = _perm_verb(
    "add-write-perm", "Give the broker group its write permission back on every name server (mqadmin "
    "addWritePerm).", "add_write_perm")


@click.command("delete-expired-commitlog")
@namesrv_option
@click.option("-c", "--cluster", default=None, help="Every broker of this cluster (default: all)")
@click.option("-b", "--broker", "broker_addr", callback=addr_param, default=None, help=BROKER_ADDR_HELP + " (only this broker)")
@json_option
def delete_expired_commitlog(namesrv: str, cluster: str | None, broker_addr: str | None, as_json: bool) -> None:
    """Delete commit log segments older than fileReservedTime now (DELETE_EXPIRED_COMMITLOG; mqadmin
    deleteExpiredCommitLog)."""
    from ferrymq.client import Admin
    from ferrymq.client.ops import delete_expired_commitlog as call

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await call(admin, cluster, broker_addr)
    emit(run(go()), ["brokerName", "addr", "deletedFiles"], as_json=as_json)


VERBS: tuple[click.Command, ...] = (config, wipe_write_perm, add_write_perm, delete_expired_commitlog)
