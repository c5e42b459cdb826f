"""``ferry message show --id ID | --key KEY -t TOPIC``."""

from __future__ import annotations

from typing import Any

import click

from ferrymq.client import Admin
from ferrymq.client._cli import emit, json_option, message_row, namesrv_option, run


@click.group("message")
def command() -> None:
    """Look messages up."""


@command.command("show")
@namesrv_option
@click.option("--id", "msg_id", default=None, help="Offset message id (as returned by a send)")
@click.option("--key", default=None, help="Message key (KEYS or UNIQ_KEY); needs --topic")
@click.option("-t", "--topic", default=None)
@click.option("--max", "max_num", default=32, show_default=True, type=int)
@json_option
def show(namesrv: str, msg_id: str | None, key: str | None, topic: str | None, max_num: int, as_json: bool) -> None:
    """Show a message by offset id, or the messages of a key."""
    if bool(msg_id) == bool(key):
        raise click.UsageError("give exactly one of --id or --key")
    if key and not topic:
        raise click.UsageError("--key needs --topic")

    async def go() -> list[Any]:
        async with Admin(namesrv) as admin:
            if msg_id:
                return [await admin.view_message(msg_id)]
            assert topic is not None and key is not None
            return await admin.query_messages_by_key(topic, key, max_num)
    msgs = run(go())
    if not msgs:
        raise click.ClickException("no message found")
    emit([message_row(m) for m in msgs], ["topic", "queueId", "queueOffset", "msgId", "tags", "keys", "body"],
         as_json=as_json)
