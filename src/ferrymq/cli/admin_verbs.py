"""mqadmin verbs beyond the daily ones, attached to their nouns: ``ferry topic update-perm`` (updateTopicPerm),
``ferry broker status`` (brokerStatus), ``consume-stats`` (brokerConsumeStats) and ``epoch`` (getBrokerEpoch), ``ferry consumer config``
(getConsumerConfig), ``ferry message print`` (printMsg / printMsgByQueue)."""

from __future__ import annotations

import json
from typing import Any

import click

from ferrymq.client._cli import addr_param, emit, json_option, message_row, namesrv_option, run

#: the columns ``message print`` shows in a table (``--json``: every field)
PRINT_COLUMNS = ["topic", "queueId", "queueOffset", "storeTimestamp", "msgId", "tags", "keys", "body"]


@click.command("update-perm")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-p", "--perm", required=True, type=click.Choice(["2", "4", "6"]),
              help="2 write only, 4 read only, 6 read and write")
@click.option("-c", "--cluster", default=None, help="Only the masters of this cluster")
@click.option("-b", "--broker-addr", callback=addr_param, default=None, help="Only this broker")
@json_option
def update_perm(namesrv: str, topic: str, perm: str, cluster: str | None, broker_addr: str | None,
                as_json: bool) -> None:
    """Change a topic's permission only, keeping its queue counts and flags (mqadmin updateTopicPerm)."""
    from ferrymq.client import Admin, ops_admin

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await ops_admin.update_topic_perm(admin, topic, int(perm), cluster=cluster,
                                                     broker_addr=broker_addr)
    emit(run(go()), ["topic", "brokerName", "broker", "oldPerm", "perm"], as_json=as_json, title="updated")


@click.command("status")
@namesrv_option
@click.option("-b", "--broker", "broker_addr", required=True, callback=addr_param, help="Broker address host:port")
@json_option
def broker_status(namesrv: str, broker_addr: str, as_json: bool) -> None:
    """Every runtime figure of one broker (mqadmin brokerStatus)."""
    from ferrymq.client import Admin, ops_admin

    async def go() -> dict[str, str]:
        async with Admin(namesrv) as admin:
            return await ops_admin.broker_status(admin, broker_addr)
    values = run(go())
    if as_json:
        click.echo(json.dumps(values))
        return
    emit([{"key": k, "value": v} for k, v in sorted(values.items())], ["key", "value"], as_json=False,
         title=f"broker {broker_addr}")


@click.command("consume-stats")
@namesrv_option
@click.option("-b", "--broker", "broker_addr", required=True, callback=addr_param, help="Broker address host:port")
@click.option("--order", is_flag=True, help="Only ordered topics")
@json_option
def broker_consume_stats(namesrv: str, broker_addr: str, order: bool, as_json: bool) -> None:
    """Lag of every group on every queue of one broker (mqadmin brokerConsumeStats)."""
    from ferrymq.client import Admin, ops_admin

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await ops_admin.broker_consume_stats(admin, broker_addr, order=order)
    rows = run(go())
    emit(rows, ["group", "topic", "brokerName", "queueId", "brokerOffset", "consumerOffset", "lag"], as_json=as_json,
         title=f"broker {broker_addr}, total lag {sum(r['lag'] for r in rows)}")


@click.command("epoch")
@namesrv_option
@click.option("-b", "--broker-name", required=True, help="Broker group (brokerName), controller mode")
@json_option
def broker_epoch(namesrv: str, broker_name: str, as_json: bool) -> None:
    """Each replica's master epochs and the commit-log range each wrote (mqadmin getBrokerEpoch)."""
    from ferrymq.client import Admin, ops_admin

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await ops_admin.broker_epochs(admin, broker_name)
    emit(run(go()), ["replicaId", "addr", "epoch", "startOffset", "endOffset", "maxOffset"], as_json=as_json,
         title=f"epochs of {broker_name}")


@click.command("config")
@namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-c", "--cluster", default=None)
@json_option
def consumer_config(namesrv: str, group: str, cluster: str | None, as_json: bool) -> None:
    """The subscription group's settings on each master (mqadmin getConsumerConfig)."""
    from ferrymq.client import Admin, ops_admin

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await ops_admin.group_config(admin, group, cluster=cluster)
    emit(run(go()), ["brokerName", "broker", "groupName", "consumeEnable", "consumeBroadcastEnable",
                     "retryQueueNums", "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly"],
         as_json=as_json)


@click.command("print")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("--broker", "broker_name", default=None, help="Only this broker group (brokerName)")
@click.option("--queue", "queue_id", default=None, type=click.IntRange(min=0), help="Only this queue id")
@click.option("--begin", "begin", default=None, help="Stored at or after (ms, ISO date-time, yyyy-MM-dd#HH:mm:ss:SSS)")
@click.option("--end", "end", default=None, help="Stored at or before (same forms)")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(min=1), help="At most this many")
@json_option
def print_messages(namesrv: str, topic: str, broker_name: str | None, queue_id: int | None, begin: str | None,
                   end: str | None, limit: int, as_json: bool) -> None:
    """The messages of a topic or one queue in a time range, queue by queue (mqadmin printMsg /
    printMsgByQueue)."""
    from ferrymq.cli.consumer_ops import parse_timestamp_ms
    from ferrymq.client import Admin, ops_admin

    try:
        begin_ms = parse_timestamp_ms(begin) if begin else 0
        end_ms = parse_timestamp_ms(end) if end else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--begin/--end") from None

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return [message_row(m) async for m in ops_admin.messages_in_range(
                admin, topic, broker_name=broker_name, queue_id=queue_id, begin_ms=begin_ms, end_ms=end_ms,
                limit=limit)]
    rows = run(go())
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, ensure_ascii=False))
        return
    emit(rows, PRINT_COLUMNS, as_json=False, title=f"{len(rows)} messages of {topic}")


TOPIC_VERBS: tuple[click.Command, ...] = (update_perm,)
BROKER_VERBS: tuple[click.Command, ...] = (broker_status, broker_consume_stats, broker_epoch)
CONSUMER_VERBS: tuple[click.Command, ...] = (consumer_config,)
MESSAGE_VERBS: tuple[click.Command, ...] = (print_messages,)
