"""``ferry consume -n NS -t TOPIC -g GROUP [--count N] [--from-beginning]``."""

from __future__ import annotations

import asyncio
import json

import click

from ferrymq.client import Admin, ConsumeStatus, MessageExt, PushConsumer
from ferrymq.client._cli import message_row, namesrv_option, run
from ferrymq.common.aio import wait_event
from ferrymq.errors import TopicNotExistError


@click.command("consume")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-g", "--group", required=True)
@click.option("-e", "--expression", default="*", show_default=True, help="Tag expression, e.g. 'TagA || TagB'")
@click.option("--count", default=0, type=int, help="Stop after N messages (0 = run until Ctrl-C)")
@click.option("--from-beginning", is_flag=True, help="A new group starts at the first offset")
@click.option("--timeout-s", default=0.0, type=float, help="Stop after this many seconds (0 = no limit)")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message")
def command(namesrv: str, topic: str, group: str, expression: str, count: int, from_beginning: bool,
            timeout_s: float, as_json: bool) -> None:
    """Consume with a push consumer and print each message."""
    async def go() -> int:
        done = asyncio.Event()
        seen = 0

        def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            nonlocal seen
            for m in msgs:
                if count and seen >= count:
                    return ConsumeStatus.CONSUME_SUCCESS
                seen += 1
                if as_json:
                    click.echo(json.dumps(message_row(m), ensure_ascii=False))
                else:
                    click.echo(f"{m.topic} q{m.queue_id}@{m.queue_offset} tags={m.tags or ''} "
                               f"keys={' '.join(m.keys)} id={m.msg_id}: {m.body.decode('utf-8', 'replace')}")
            if count and seen >= count:
                loop.call_soon_threadsafe(done.set)
            return ConsumeStatus.CONSUME_SUCCESS

        loop = asyncio.get_running_loop()
        async with Admin(namesrv) as admin:
            try:
                await admin.topic_route(topic)
            except TopicNotExistError:
                raise click.ClickException(f"topic {topic} does not exist (no name server has a route for it)"
                                           ) from None
        consumer = PushConsumer(namesrv, group, consume_from_where="CONSUME_FROM_FIRST_OFFSET" if from_beginning
                                else "CONSUME_FROM_LAST_OFFSET", consume_concurrency=1)
        consumer.subscribe(topic, expression)
        consumer.register_message_listener(listener)
        await consumer.start()
        try:
            if timeout_s:
                await wait_event(done, timeout_s)
            else:
                await done.wait()
        finally:
            await consumer.close()
        return seen

    try:
        n = run(go())
    except KeyboardInterrupt:
        return
    if count and n < count:
        raise click.ClickException(f"received {n} of {count} messages before the timeout")
