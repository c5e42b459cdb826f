"""``ferry namesrv-config get|set``: the name servers' runtime config (mqadmin getNamesrvConfig /
updateNamesrvConfig; namesrv/config_processor.py says which keys change at runtime)."""

from __future__ import annotations

import click

from ferrymq.client import Admin, ops_more
from ferrymq.client._cli import emit, json_option, namesrv_option, run


@click.group("namesrv-config")
def command() -> None:
    """Read and change the name servers' configuration."""


@command.command("get")
@namesrv_option
@json_option
def get(namesrv: str, as_json: bool) -> None:
    """Every key of every name server (mqadmin getNamesrvConfig)."""
    async def go() -> list[dict[str, str]]:
        async with Admin(namesrv) as admin:
            return await ops_more.namesrv_config(admin)
    emit(run(go()), ["nameServer", "key", "value"], as_json=as_json)


@command.command("set")
@namesrv_option
@click.argument("assignments", nargs=-1, required=True, metavar="KEY=VALUE...")
@json_option
def set_(namesrv: str, assignments: tuple[str, ...], as_json: bool) -> None:
    """Change runtime-safe keys on every name server, written back to namesrv.conf (mqadmin updateNamesrvConfig)."""
    updates = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="KEY=VALUE")
        updates[key.strip()] = value.strip()

    async def go() -> list[dict[str, str]]:
        async with Admin(namesrv) as admin:
            return await ops_more.update_namesrv_config(admin, updates)
    emit(run(go()), ["nameServer", "persisted"], as_json=as_json, title="updated")
