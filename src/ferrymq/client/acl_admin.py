"""Managing brokers' ACL files remotely (ACL admin codes 50..54, layouts in acl/edit.py) through an ``Admin``:
a change goes to every broker of a cluster (masters and slaves, so slaves enforce the same ACL) or to one
address. The caller's own credentials must be an admin account of each broker's ACL."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ferrymq.client import api
from ferrymq.client.admin import Admin
from ferrymq.errors import ClientError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode


async def targets(admin: Admin, cluster: str | None, broker_addr: str | None) -> list[str]:
    """``broker_addr`` alone, or every broker (all ids) of ``cluster`` (of every cluster when None)."""
    if broker_addr:
        return [broker_addr]
    addrs = [b.addr for b in await admin.brokers(cluster)]
    if not addrs:
        raise ClientError("no broker found to manage the ACL of")
    return addrs


async def _each(admin: Admin, addrs: Iterable[str], code: int, fields: dict[str, Any]) -> list[str]:
    done = []
    for addr in addrs:
        api.check(await admin.instance.invoke(addr, RemotingCommand.request(code, fields)))
        done.append(addr)
    return done


async def update_account(admin: Admin, access_key: str, *, secret_key: str | None = None,
                         white_remote_address: str | None = None, admin_account: bool | None = None,
                         default_topic_perm: str | None = None, default_group_perm: str | None = None,
                         topic_perms: list[str] | None = None, group_perms: list[str] | None = None,
                         cluster: str | None = None, broker_addr: str | None = None) -> list[str]:
    """Create the account or change the fields given (mqadmin updateAclConfig); the brokers changed."""
    fields: dict[str, Any] = {"accessKey": access_key}
    for key, value in (("secretKey", secret_key), ("whiteRemoteAddress", white_remote_address),
                       ("defaultTopicPerm", default_topic_perm), ("defaultGroupPerm", default_group_perm)):
        if value is not None:
            fields[key] = value
    if admin_account is not None:
        fields["admin"] = "true" if admin_account else "false"
    for key, items in (("topicPerms", topic_perms), ("groupPerms", group_perms)):
        if items is not None:
            fields[key] = ",".join(items)
    return await _each(admin, await targets(admin, cluster, broker_addr), RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
                       fields)


async def delete_account(admin: Admin, access_key: str, *, cluster: str | None = None,
                         broker_addr: str | None = None) -> list[str]:
    """Remove the account (mqadmin deleteAclConfig)."""
    return await _each(admin, await targets(admin, cluster, broker_addr), RequestCode.DELETE_ACL_CONFIG,
                       {"accessKey": access_key})


async def update_global_white_addrs(admin: Admin, addresses: list[str], *, cluster: str | None = None,
                                    broker_addr: str | None = None) -> list[str]:
    """Replace the global whitelist (mqadmin updateGlobalWhiteAddr); an empty list clears it."""
    return await _each(admin, await targets(admin, cluster, broker_addr),
                       RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, {"globalWhiteAddrs": ",".join(addresses)})


async def acl_config(admin: Admin, broker_addr: str) -> dict[str, Any]:
    """One broker's ACL: ``globalWhiteAddrs`` and ``plainAccessConfigs`` (secret keys included)."""
    resp = api.check(await admin.instance.invoke(
        broker_addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG)))
    out: dict[str, Any] = jsonx.loads(resp.body) if resp.body else {}
    return out


async def acl_versions(admin: Admin, cluster: str | None = None,
                       broker_addr: str | None = None) -> list[dict[str, Any]]:
    """Each broker's ACL file version (mqadmin clusterAclConfigVersion)."""
    rows = []
    for addr in await targets(admin, cluster, broker_addr):
        resp = api.check(await admin.instance.invoke(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_ACL_INFO)))
        version = jsonx.loads(resp.ext_fields.get("version") or "{}")
        rows.append({"broker": addr, "brokerName": resp.ext_fields.get("brokerName", ""),
                     "cluster": resp.ext_fields.get("clusterName", ""), "counter": version.get("counter", 0),
                     "timestamp": version.get("timestamp", 0)})
    return rows
