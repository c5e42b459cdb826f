"""``ferry consumer progress``."""

from __future__ import annotations

from typing import Any

import click

from ferrymq.client import Admin
from ferrymq.client._cli import emit, json_option, namesrv_option, run


@click.group("consumer")
def command() -> None:
    """Consumer groups."""


@command.command("progress")
@namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", default=None)
@json_option
def progress(namesrv: str, group: str, topic: str | None, as_json: bool) -> None:
    """Broker offset, committed offset and lag per queue."""
    async def go() -> Any:
        async with Admin(namesrv) as admin:
            return await admin.consumer_progress(group, topic)
    rows = [{"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "brokerOffset": b,
             "consumerOffset": c, "lag": lag} for mq, b, c, lag in run(go())]
    emit(rows, ["topic", "brokerName", "queueId", "brokerOffset", "consumerOffset", "lag"], as_json=as_json,
         title=f"group {group}, total lag {sum(r['lag'] for r in rows)}")


def _add_ops_verbs() -> None:
    from ferrymq.cli import admin_verbs, consumer_ops

    for verb in (*consumer_ops.CONSUMER_VERBS, *admin_verbs.CONSUMER_VERBS):
        command.add_command(verb)


_add_ops_verbs()
