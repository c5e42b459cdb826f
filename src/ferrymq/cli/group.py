"""``ferry group create|delete``: subscription groups on the masters (mqadmin updateSubGroup / deleteSubGroup)."""

from __future__ import annotations

import click

from ferrymq.client import Admin
from ferrymq.client._cli import addr_param, emit, json_option, namesrv_option, run


@click.group("group")
def command() -> None:
    """Create and delete consumer (subscription) groups."""


@command.command("create")
@namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-c", "--cluster", default=None, help="Every master of this cluster [default: every cluster]")
@click.option("-b", "--broker-addr", callback=addr_param, default=None, help="This broker only")
@click.option("--retry-max-times", default=16, show_default=True, type=click.IntRange(0))
@click.option("--retry-queues", default=1, show_default=True, type=click.IntRange(1))
@click.option("--no-broadcast", is_flag=True, help="Refuse broadcasting consumers")
@click.option("--disable", is_flag=True, help="consumeEnable=false: pulls of the group are refused")
@json_option
def create(namesrv: str, group: str, cluster: str | None, broker_addr: str | None, retry_max_times: int,
           retry_queues: int, no_broadcast: bool, disable: bool, as_json: bool) -> None:
    """Create or update a subscription group (mqadmin updateSubGroup)."""
    async def go() -> list[str]:
        async with Admin(namesrv) as admin:
            return await admin.create_subscription_group(
                group, cluster=cluster, broker_addr=broker_addr, retry_max_times=retry_max_times,
                retry_queue_nums=retry_queues, consume_broadcast_enable=not no_broadcast, consume_enable=not disable)
    emit([{"group": group, "broker": a} for a in run(go())], ["group", "broker"], as_json=as_json, title="created")


@command.command("delete")
@namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-c", "--cluster", default=None, help="Every master of this cluster [default: every cluster]")
@click.option("-b", "--broker-addr", callback=addr_param, default=None, help="This broker only")
@json_option
def delete(namesrv: str, group: str, cluster: str | None, broker_addr: str | None, as_json: bool) -> None:
    """Delete a subscription group (mqadmin deleteSubGroup); its committed offsets stay."""
    from ferrymq.client import ops_more

    async def go() -> list[str]:
        async with Admin(namesrv) as admin:
            return await ops_more.delete_group(admin, group, cluster, broker_addr)
    emit([{"group": group, "broker": a} for a in run(go())], ["group", "broker"], as_json=as_json, title="deleted")
