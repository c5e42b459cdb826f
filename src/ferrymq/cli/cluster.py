"""``ferry cluster list``."""

from __future__ import annotations

from typing import Any

import click

from ferrymq.client import Admin
from ferrymq.client._cli import emit, json_option, namesrv_option, run

#: runtime-info keys shown in the table (all are in --json)
SHOWN_KEYS = ("brokerRole", "putTps", "commitLogMaxOffset", "haSlaveCount")


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
                     "addr": r["addr"], **{k: rt.get(k, r.get("error", "")) for k in SHOWN_KEYS}})
    emit(flat, ["cluster", "brokerName", "brokerId", "addr", *SHOWN_KEYS], as_json=False)
