"""``ferry produce -n NS -t TOPIC [--tags] [--keys] [--count N] [BODY]`` (stdin lines without BODY)."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import click

from ferrymq.client import Producer, new_message
from ferrymq.client._cli import emit, json_option, namesrv_option, run

#: up to this many messages the table lists every send; above it a progress bar and a summary (--verbose: rows)
ROWS_BY_DEFAULT_MAX = 20


@click.command("produce")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-g", "--group", default="ferry-cli-producer", show_default=True)
@click.option("--tags", default=None)
@click.option("--keys", default=None, help="Space-separated keys")
@click.option("-p", "--property", "props", multiple=True, help="name=value (repeatable)")
@click.option("--count", default=1, show_default=True, type=click.IntRange(min=1), help="Send BODY this many times")
@click.option("--delay-level", default=0, type=int)
@click.option("-v", "--verbose", is_flag=True,
              help=f"A row per message even above {ROWS_BY_DEFAULT_MAX} messages (default there: a summary)")
@json_option
@click.argument("body", required=False)
def command(namesrv: str, topic: str, group: str, tags: str | None, keys: str | None, props: tuple[str, ...],
            count: int, delay_level: int, verbose: bool, as_json: bool, body: str | None) -> None:
    """Send messages: BODY ``--count`` times, or one message per stdin line. Up to 20 messages print a row
    each; more print a progress bar and a summary per status and queue (``--verbose``: every row; ``--json``:
    every row as JSON)."""
    properties: dict[str, str] = {}
    for p in props:
        name, sep, value = p.partition("=")
        if not sep:
            raise click.UsageError(f"property must be name=value: {p!r}")
        properties[name] = value
    bodies = [body] * count if body is not None else [line.rstrip("\n") for line in sys.stdin if line.strip()]
    rows_wanted = as_json or verbose or len(bodies) <= ROWS_BY_DEFAULT_MAX

    async def go() -> list[Any]:
        from rich.console import Console
        from rich.progress import Progress

        results = []
        async with Producer(namesrv, group) as producer:
            with Progress(console=Console(stderr=True), transient=True, disable=rows_wanted) as progress:
                task = progress.add_task(f"sending to {topic}", total=len(bodies))
                for b in bodies:
                    results.append(await producer.send(new_message(
                        topic, b, tags=tags, keys=keys.split() if keys else None, properties=properties,
                        delay_level=delay_level)))
                    progress.advance(task)
        return results
    results = run(go())
    if rows_wanted:
        emit([{"status": r.status.name, "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id,
               "brokerName": r.message_queue.broker_name, "queueId": r.message_queue.queue_id,
               "queueOffset": r.queue_offset} for r in results],
             ["status", "msgId", "offsetMsgId", "brokerName", "queueId", "queueOffset"], as_json=as_json)
        return
    summary: Counter[tuple[str, str, int]] = Counter(
        (r.status.name, r.message_queue.broker_name, r.message_queue.queue_id) for r in results)
    emit([{"status": st, "brokerName": bn, "queueId": q, "messages": n} for (st, bn, q), n in sorted(summary.items())],
         ["status", "brokerName", "queueId", "messages"], as_json=False,
         title=f"{len(results)} messages sent to {topic} (--verbose: a row each)")
