"""``ferry message show --id ID [-t TOPIC] | --key KEY -t TOPIC``.

``--id`` takes either id RocketMQ gives a message: the offset msgId (store host + commit log offset,
``offsetMsgId`` in ``ferry produce``) or the client's msgId (its UNIQ_KEY, ``msgId`` in ``ferry produce`` and
``ferry consume``). See ``Admin.find_message``.
"""

from __future__ import annotations

from typing import Any

import click

from ferrymq.client import Admin
from ferrymq.client._cli import emit, json_option, message_row, namesrv_option, run
from ferrymq.client.admin import check_message_id
from ferrymq.errors import ClientError


@click.group("message")
def command() -> None:
    """Look messages up."""


@command.command("show")
@namesrv_option
@click.option("--id", "msg_id", default=None,
              help="Message id: the offsetMsgId or the msgId (UNIQ_KEY) that produce/consume print")
@click.option("--key", default=None, help="Message key (KEYS or UNIQ_KEY); needs --topic")
@click.option("-t", "--topic", default=None,
              help="Topic of the message (needed with --key; with --id it narrows a msgId lookup, which "
                   "otherwise looks in every topic)")
@click.option("--max", "max_num", default=32, show_default=True, type=int)
@json_option
def show(namesrv: str, msg_id: str | None, key: str | None, topic: str | None, max_num: int, as_json: bool) -> None:
    """Show a message by id (offset msgId or client msgId), or the messages of a key."""
    if bool(msg_id) == bool(key):
        raise click.UsageError("give exactly one of --id or --key")
    if key and not topic:
        raise click.UsageError("--key needs --topic")
    if msg_id is not None:
        try:
            msg_id = check_message_id(msg_id)
        except ClientError as exc:
            raise click.BadParameter(str(exc), param_hint="--id") from None

    async def go() -> list[Any]:
        async with Admin(namesrv) as admin:
            if msg_id:
                return [await admin.find_message(msg_id, topic)]
            assert topic is not None and key is not None
            return await admin.query_messages_by_key(topic, key, max_num)
    msgs = run(go())
    if not msgs:
        raise click.ClickException("no message found")
    emit([message_row(m) for m in msgs],
         ["topic", "queueId", "queueOffset", "msgId", "offsetMsgId", "tags", "keys", "body"], as_json=as_json)
