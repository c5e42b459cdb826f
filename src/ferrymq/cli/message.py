"""``ferry message show --id ID [-t TOPIC] | --key KEY -t TOPIC | -t TOPIC --queue Q --offset N [--broker B]``.

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
@click.option("--queue", "queue_id", default=None, type=click.IntRange(0), help="Queue id (with --offset)")
@click.option("--offset", "queue_offset", default=None, type=click.IntRange(0),
              help="Queue offset of the message (with --queue; mqadmin queryMsgByOffset)")
@click.option("--broker", "broker_name", default=None, help="Broker name of the queue (default: the topic's only one)")
@json_option
def show(namesrv: str, msg_id: str | None, key: str | None, topic: str | None, max_num: int, queue_id: int | None,
         queue_offset: int | None, broker_name: str | None, as_json: bool) -> None:
    """Show a message by id (offset msgId or client msgId), the messages of a key, or the message at a queue
    offset."""
    if (queue_id is None) != (queue_offset is None):
        raise click.UsageError("--queue and --offset go together")
    if queue_id is not None:
        if msg_id or key or not topic:
            raise click.UsageError("--queue/--offset need --topic and neither --id nor --key")
        assert queue_offset is not None
        _show_at(namesrv, topic, broker_name, queue_id, queue_offset, as_json)
        return
    if bool(msg_id) == bool(key):
        raise click.UsageError("give exactly one of --id or --key, or --queue and --offset")
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


def _show_at(namesrv: str, topic: str, broker_name: str | None, queue_id: int, queue_offset: int,
             as_json: bool) -> None:
    from ferrymq.client import ops_more

    async def go() -> Any:
        async with Admin(namesrv) as admin:
            name = broker_name
            if name is None:
                names = sorted({bd.broker_name for bd in (await admin.topic_route(topic)).broker_datas})
                if len(names) != 1:
                    raise ClientError(f"topic {topic} is on brokers {', '.join(names)}: give --broker")
                name = names[0]
            return await ops_more.message_at(admin, topic, name, queue_id, queue_offset)
    msg = run(go())
    emit([message_row(msg)], ["topic", "queueId", "queueOffset", "msgId", "offsetMsgId", "tags", "keys", "body"],
         as_json=as_json)


def _add_ops_verbs() -> None:
    from ferrymq.cli import admin_verbs

    for verb in admin_verbs.MESSAGE_VERBS:
        command.add_command(verb)


_add_ops_verbs()
