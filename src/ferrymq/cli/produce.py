"""``ferry produce -n NS -t TOPIC [--tags] [--keys] [--count N] [BODY]`` (stdin lines without BODY)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ferrymq.client import Producer, new_message
from ferrymq.client._cli import emit, json_option, namesrv_option, run


@click.command("produce")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-g", "--group", default="ferry-cli-producer", show_default=True)
@click.option("--tags", default=None)
@click.option("--keys", default=None, help="Space-separated keys")
@click.option("-p", "--property", "props", multiple=True, help="name=value (repeatable)")
@click.option("--count", default=1, show_default=True, type=int, help="Send BODY this many times")
@click.option("--delay-level", default=0, type=int)
@json_option
@click.argument("body", required=False)
def command(namesrv: str, topic: str, group: str, tags: str | None, keys: str | None, props: tuple[str, ...],
            count: int, delay_level: int, as_json: bool, body: str | None) -> None:
    """Send messages: BODY ``--count`` times, or one message per stdin line."""
    properties: dict[str, str] = {}
    for p in props:
        name, sep, value = p.partition("=")
        if not sep:
            raise click.UsageError(f"property must be name=value: {p!r}")
        properties[name] = value
    bodies = [body] * count if body is not None else [line.rstrip("\n") for line in sys.stdin if line.strip()]

    async def go() -> list[Any]:
        async with Producer(namesrv, group) as producer:
            return [await producer.send(new_message(topic, b, tags=tags, keys=keys.split() if keys else None,
                                                    properties=properties, delay_level=delay_level))
                    for b in bodies]
    results = run(go())
    emit([{"status": r.status.name, "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id,
           "brokerName": r.message_queue.broker_name, "queueId": r.message_queue.queue_id,
           "queueOffset": r.queue_offset} for r in results],
         ["status", "msgId", "offsetMsgId", "brokerName", "queueId", "queueOffset"], as_json=as_json)
