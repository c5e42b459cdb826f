"""``ferry cluster list|clean-expired|clean-unused-topic``."""

from __future__ import annotations

from typing import Any

import click

from ferrymq.client import Admin
from ferrymq.client._cli import addr_param, emit, json_option, namesrv_option, run

#: runtime-info keys shown in the table (all are in --json)
SHOWN_KEYS = ("brokerRole", "putTps", "commitLogMaxOffset", "haSlaveCount")
#: columns showing a figure against its limit as "used/limit": column -> (used key, limit key) of the runtime info
SHOWN_RATIOS = {
    "storeFiles": ("storeOpenFiles", "storeOpenFilesLimit"),  # consume queue files mapped / maxOpenSegmentFiles
    "fds": ("processOpenFds", "processMaxFds"),  # the broker's file descriptors / its RLIMIT_NOFILE
}


def _ratio(runtime: dict[str, Any], used_key: str, limit_key: str) -> str:
    used, limit = runtime.get(used_key), runtime.get(limit_key)
    return f"{used}/{limit}" if used is not None and limit is not None else ""


@click.group("cluster")
def command() -> None:
    """Inspect the cluster."""


@command.command("list")
@namesrv_option
@click.option("-c", "--cluster", default=None)
@json_option
def list_(namesrv: str, cluster: str | None, as_json: bool) -> None:
    """Every broker address of the cluster(s), with runtime (and HA) info."""
    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await admin.ha_status(cluster)
    rows = run(go())
    if as_json:
        emit(rows, [], as_json=True)
        return
    flat = []
    for r in rows:
        rt = r.get("runtime", {})
        flat.append({"cluster": r["cluster"], "brokerName": r["brokerName"], "brokerId": r["brokerId"],
                     "addr": r["addr"], **{k: rt.get(k, r.get("error", "")) for k in SHOWN_KEYS},
                     **{col: _ratio(rt, *keys) for col, keys in SHOWN_RATIOS.items()}})
    emit(flat, ["cluster", "brokerName", "brokerId", "addr", *SHOWN_KEYS, *SHOWN_RATIOS], as_json=False)


def _cleanup_verb(name: str, fn_name: str, count_field: str, doc: str) -> click.Command:
    @click.command(name, help=doc)
    @namesrv_option
    @click.option("-c", "--cluster", default=None, help="Every broker of this cluster [default: every cluster]")
    @click.option("-b", "--broker-addr", callback=addr_param, default=None, help="This broker only")
    @json_option
    def verb(namesrv: str, cluster: str | None, broker_addr: str | None, as_json: bool) -> None:
        from ferrymq.client import ops_more

        async def go() -> list[dict[str, Any]]:
            async with Admin(namesrv) as admin:
                rows: list[dict[str, Any]] = await getattr(ops_more, fn_name)(admin, cluster, broker_addr)
                return rows
        emit(run(go()), ["brokerName", "addr", count_field], as_json=as_json)
    return verb


command.add_command(_cleanup_verb(
    "clean-expired", "clean_expired_consume_queues", "deletedFiles",
    "Delete consume-queue and index files that only point below each broker's commit log (mqadmin "
    "cleanExpiredCQ)."))
command.add_command(_cleanup_verb(
    "clean-unused-topic", "clean_unused_topics", "deletedTopics",
    "Delete the consume queues of topics a broker no longer has a config for (mqadmin cleanUnusedTopic)."))
