"""``ferry stats all`` (mqadmin statsAll): messages in and out per topic and consuming group."""

from __future__ import annotations

from typing import Any

import click

from ferrymq.client._cli import emit, json_option, namesrv_option, run


@click.group("stats")
def command() -> None:
    """Traffic figures of topics and groups."""


@command.command("all")
@namesrv_option
@click.option("-t", "--topic", default=None, help="Only this topic (system topics too when named)")
@click.option("-a", "--active", is_flag=True, help="Only rows with traffic in the last minute")
@json_option
def all_(namesrv: str, topic: str | None, active: bool, as_json: bool) -> None:
    """Per topic and consuming group: messages put and got over the last minute (per second) and since each
    broker started (mqadmin statsAll; its 24-hour counts are totals since start here)."""
    from ferrymq.client import Admin, ops_admin

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await ops_admin.stats_all(admin, topic=topic, active_only=active)
    emit(run(go()), ["topic", "group", "inTps", "outTps", "inTotal", "outTotal"], as_json=as_json)
