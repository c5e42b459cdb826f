"""``ferry acl list|versions|update|delete|white-addrs``: brokers' plain_acl.yml managed remotely (ACL admin
codes 50..54). The verbs sign with ``ferry --access-key/--secret-key``, which must be an admin account."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import click

from ferrymq.client import Admin, acl_admin
from ferrymq.client._cli import addr_param, emit, json_option, namesrv_option, run

PERMS = click.Choice(["DENY", "PUB", "SUB", "PUB|SUB"], case_sensitive=False)


def _target_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("-b", "--broker-addr", callback=addr_param, default=None, help="This broker only")(f)
    return click.option("-c", "--cluster", default=None,
                        help="Every broker (masters and slaves) of this cluster [default: every cluster]")(f)


def _admin_run(namesrv: str, fn: Callable[[Admin], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        async with Admin(namesrv) as admin:
            return await fn(admin)
    return run(go())


@click.group("acl")
def command() -> None:
    """Manage the brokers' ACL (plain_acl.yml) remotely; needs an admin account (ferry --access-key)."""


@command.command("update")
@namesrv_option
@click.argument("access_key")
@click.option("--secret", "secret_key", default=None, help="The account's secretKey (6 characters or more)")
@click.option("--white-address", default=None, help="whiteRemoteAddress pattern (e.g. 192.168.0.*)")
@click.option("--admin/--no-admin", "admin_account", default=None, help="admin account or not")
@click.option("--default-topic-perm", type=PERMS, default=None)
@click.option("--default-group-perm", type=PERMS, default=None)
@click.option("--topic-perm", "topic_perms", multiple=True, metavar="TOPIC=PERM",
              help="Per-topic perm (repeatable; replaces the account's list)")
@click.option("--group-perm", "group_perms", multiple=True, metavar="GROUP=PERM",
              help="Per-group perm (repeatable; replaces the account's list)")
@_target_options
@json_option
def update(namesrv: str, access_key: str, secret_key: str | None, white_address: str | None,
           admin_account: bool | None, default_topic_perm: str | None, default_group_perm: str | None,
           topic_perms: tuple[str, ...], group_perms: tuple[str, ...], cluster: str | None, broker_addr: str | None,
           as_json: bool) -> None:
    """Create the account ACCESS_KEY or change the fields given (mqadmin updateAclConfig)."""
    addrs = _admin_run(namesrv, lambda admin: acl_admin.update_account(
        admin, access_key, secret_key=secret_key, white_remote_address=white_address, admin_account=admin_account,
        default_topic_perm=default_topic_perm.upper() if default_topic_perm else None,
        default_group_perm=default_group_perm.upper() if default_group_perm else None,
        topic_perms=list(topic_perms) or None, group_perms=list(group_perms) or None,
        cluster=cluster, broker_addr=broker_addr))
    emit([{"accessKey": access_key, "broker": a} for a in addrs], ["accessKey", "broker"], as_json=as_json,
         title="updated")


@command.command("delete")
@namesrv_option
@click.argument("access_key")
@_target_options
@json_option
def delete(namesrv: str, access_key: str, cluster: str | None, broker_addr: str | None, as_json: bool) -> None:
    """Remove the account ACCESS_KEY (mqadmin deleteAclConfig)."""
    addrs = _admin_run(namesrv, lambda admin: acl_admin.delete_account(admin, access_key, cluster=cluster,
                                                                        broker_addr=broker_addr))
    emit([{"accessKey": access_key, "broker": a} for a in addrs], ["accessKey", "broker"], as_json=as_json,
         title="deleted")


@command.command("white-addrs")
@namesrv_option
@click.argument("addresses", nargs=-1)
@_target_options
@json_option
def white_addrs(namesrv: str, addresses: tuple[str, ...], cluster: str | None, broker_addr: str | None,
                as_json: bool) -> None:
    """Replace globalWhiteRemoteAddresses with ADDRESSES; none clears it (mqadmin updateGlobalWhiteAddr)."""
    addrs = _admin_run(namesrv, lambda admin: acl_admin.update_global_white_addrs(
        admin, list(addresses), cluster=cluster, broker_addr=broker_addr))
    emit([{"broker": a, "globalWhiteAddrs": ",".join(addresses)} for a in addrs], ["broker", "globalWhiteAddrs"],
         as_json=as_json, title="updated")


@command.command("list")
@namesrv_option
@_target_options
@click.option("--show-secrets", is_flag=True, help="Print secret keys too (hidden by default)")
@json_option
def list_(namesrv: str, cluster: str | None, broker_addr: str | None, show_secrets: bool, as_json: bool) -> None:
    """Every account of each broker's ACL (mqadmin getAclConfig)."""
    async def go(admin: Admin) -> list[dict[str, Any]]:
        rows = []
        for addr in await acl_admin.targets(admin, cluster, broker_addr):
            cfg = await acl_admin.acl_config(admin, addr)
            for account in cfg.get("plainAccessConfigs") or []:
                if not show_secrets:
                    account["secretKey"] = "******"
                rows.append({"broker": addr, **account,
                             "topicPerms": ",".join(account.get("topicPerms") or []),
                             "groupPerms": ",".join(account.get("groupPerms") or []),
                             "globalWhiteAddrs": ",".join(cfg.get("globalWhiteAddrs") or [])})
        return rows
    emit(_admin_run(namesrv, go), ["broker", "accessKey", "secretKey", "admin", "whiteRemoteAddress",
                                   "defaultTopicPerm", "defaultGroupPerm", "topicPerms", "groupPerms",
                                   "globalWhiteAddrs"], as_json=as_json)


@command.command("versions")
@namesrv_option
@_target_options
@json_option
def versions(namesrv: str, cluster: str | None, broker_addr: str | None, as_json: bool) -> None:
    """Each broker's ACL file version (mqadmin clusterAclConfigVersion)."""
    rows = _admin_run(namesrv, lambda admin: acl_admin.acl_versions(admin, cluster, broker_addr))
    emit(rows, ["broker", "brokerName", "cluster", "counter", "timestamp"], as_json=as_json)
