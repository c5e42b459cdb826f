"""``ferry kv set|get|delete``: the name servers' KV config table (mqadmin updateKvConfig / deleteKvConfig)."""

from __future__ import annotations

import click

from ferrymq.client import Admin, ops_more
from ferrymq.client._cli import emit, json_option, namesrv_option, run


@click.group("kv")
def command() -> None:
    """The name servers' KV config (e.g. ORDER_TOPIC_CONFIG)."""


@command.command("set")
@namesrv_option
@click.argument("namespace")
@click.argument("key")
@click.argument("value")
@json_option
def set_(namesrv: str, namespace: str, key: str, value: str, as_json: bool) -> None:
    """Set NAMESPACE/KEY to VALUE on every name server (mqadmin updateKvConfig)."""
    async def go() -> int:
        async with Admin(namesrv) as admin:
            return await ops_more.kv_set(admin, namespace, key, value)
    n = run(go())
    emit([{"namespace": namespace, "key": key, "value": value, "nameServers": n}],
         ["namespace", "key", "value", "nameServers"], as_json=as_json, title="set")


@command.command("get")
@namesrv_option
@click.argument("namespace")
@click.argument("key")
@json_option
def get(namesrv: str, namespace: str, key: str, as_json: bool) -> None:
    """The value of NAMESPACE/KEY (exit 1 when unset)."""
    async def go() -> str | None:
        async with Admin(namesrv) as admin:
            return await ops_more.kv_get(admin, namespace, key)
    value = run(go())
    if value is None:
        raise click.ClickException(f"{namespace}/{key} is not set")
    emit([{"namespace": namespace, "key": key, "value": value}], ["namespace", "key", "value"], as_json=as_json)


@command.command("delete")
@namesrv_option
@click.argument("namespace")
@click.argument("key")
@json_option
def delete(namesrv: str, namespace: str, key: str, as_json: bool) -> None:
    """Delete NAMESPACE/KEY on every name server (mqadmin deleteKvConfig)."""
    async def go() -> int:
        async with Admin(namesrv) as admin:
            return await ops_more.kv_delete(admin, namespace, key)
    n = run(go())
    emit([{"namespace": namespace, "key": key, "nameServers": n}], ["namespace", "key", "nameServers"],
         as_json=as_json, title="deleted")
