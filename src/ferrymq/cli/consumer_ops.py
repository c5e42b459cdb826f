"""``ferry consumer reset-offset|skip-backlog|clone-offset|connection|topics`` and ``ferry topic
who-consumes`` and ``ferry producer connection``: the incident verbs (client/ops.py does the calls)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from ferrymq.client._cli import addr_param, emit, json_option, namesrv_option, run

#: mqadmin's timestamp form (resetOffsetByTime -s): 2024-01-31#13:45:00:000, local time
MQADMIN_TIME_FORMAT = "%Y-%m-%d#%H:%M:%S:%f"
#: digits of a millisecond epoch timestamp from 2001 on (shorter numbers are refused as likely seconds)
EPOCH_MS_MIN_DIGITS = 13


def parse_timestamp_ms(text: str) -> int:
    """Milliseconds since the epoch from ``1706708700000`` (ms), ``0`` (the earliest offsets), an ISO 8601
    date-time (local time unless it carries an offset) or mqadmin's ``2024-01-31#13:45:00:000``; ValueError
    otherwise."""
    s = text.strip()
    if s == "0":  # the earliest offsets
        return 0
    if s.isdigit():
        if len(s) < EPOCH_MS_MIN_DIGITS:
            raise ValueError(f"{s} looks like seconds: give milliseconds since the epoch or a date-time")
        return int(s)
    for parse in (datetime.fromisoformat, lambda v: datetime.strptime(v, MQADMIN_TIME_FORMAT)):
        try:
            return int(parse(s).timestamp() * 1000)
        except ValueError:
            continue
    raise ValueError(f"cannot read {text!r} as a time: give ms since the epoch, an ISO date-time "
                     "(2024-01-31T13:45:00) or 2024-01-31#13:45:00:000")


OFFSET_COLUMNS = ["topic", "brokerName", "queueId", "offset", "clientsNotified"]


def _reset(namesrv: str, group: str, topic: str, timestamp_ms: int, force: bool, as_json: bool, title: str) -> None:
    from ferrymq.client import Admin
    from ferrymq.client.ops import reset_offset

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await reset_offset(admin, group, topic, timestamp_ms, force=force)
    emit(run(go()), OFFSET_COLUMNS, as_json=as_json, title=title)


@click.command("reset-offset")
@namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", required=True)
@click.option("-s", "--timestamp", "when", required=True,
              help="ms since the epoch, ISO date-time (local) or yyyy-MM-dd#HH:mm:ss:SSS")
@click.option("--force/--no-force", default=True, show_default=True,
              help="--no-force: only move offsets back (never skip messages)")
@json_option
def reset_offset(namesrv: str, group: str, topic: str, when: str, force: bool, as_json: bool) -> None:
    """Move the group's offsets to the first message stored at or after a time (INVOKE_BROKER_TO_RESET_OFFSET;
    mqadmin resetOffsetByTime). Stored offsets change at once; online consumers are told
    (RESET_CONSUMER_CLIENT_OFFSET) and resume there."""
    try:
        ts = parse_timestamp_ms(when)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--timestamp") from None
    _reset(namesrv, group, topic, ts, force, as_json, f"{group} on {topic} reset to {ts}")


@click.command("skip-backlog")
@namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", required=True)
@json_option
def skip_backlog(namesrv: str, group: str, topic: str, as_json: bool) -> None:
    """Skip every message not consumed yet: offsets to each queue's max offset (mqadmin skipAccumulatedMessage)."""
    from ferrymq.client.ops import RESET_TO_MAX_TIMESTAMP

    _reset(namesrv, group, topic, RESET_TO_MAX_TIMESTAMP, True, as_json, f"{group} on {topic}: backlog skipped")


@click.command("clone-offset")
@namesrv_option
@click.option("-s", "--src-group", required=True)
@click.option("-d", "--dest-group", required=True)
@click.option("-t", "--topic", default=None, help="Only this topic (default: every topic of the source group)")
@json_option
def clone_offset(namesrv: str, src_group: str, dest_group: str, topic: str | None, as_json: bool) -> None:
    """Give a group the committed offsets of another (CLONE_GROUP_OFFSET; mqadmin cloneGroupOffset)."""
    from ferrymq.client import Admin
    from ferrymq.client.ops import clone_offset as call

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await call(admin, src_group, dest_group, topic)
    emit(run(go()), ["brokerName", "clonedQueues"], as_json=as_json, title=f"{src_group} -> {dest_group}")


@click.command("connection")
@namesrv_option
@click.option("-g", "--group", required=True)
@json_option
def consumer_connection(namesrv: str, group: str, as_json: bool) -> None:
    """Online consumers of a group and their subscriptions (GET_CONSUMER_CONNECTION_LIST; mqadmin
    consumerConnection)."""
    from ferrymq.client import Admin
    from ferrymq.client.ops import consumer_connections

    async def go() -> dict[str, Any]:
        async with Admin(namesrv) as admin:
            return await consumer_connections(admin, group)
    info = run(go())
    if as_json:
        click.echo(json.dumps(info))
        return
    emit(info["connections"], ["broker", "clientId", "clientAddr", "language", "version"], as_json=False,
         title=f"group {group}: {info.get('consumeType')} {info.get('messageModel')}, subscriptions "
               + ", ".join(f"{t}={s}" for t, s in sorted(info["subscriptions"].items())))


@click.command("topics")
@namesrv_option
@click.option("-g", "--group", required=True)
@json_option
def group_topics(namesrv: str, group: str, as_json: bool) -> None:
    """Topics the group has offsets for or subscribes to (QUERY_TOPICS_BY_CONSUMER)."""
    from ferrymq.client import Admin
    from ferrymq.client.ops import topics_of_group

    async def go() -> list[str]:
        async with Admin(namesrv) as admin:
            return await topics_of_group(admin, group)
    emit([{"topic": t} for t in run(go())], ["topic"], as_json=as_json)


@click.command("who-consumes")
@namesrv_option
@click.option("-t", "--topic", required=True)
@json_option
def who_consumes(namesrv: str, topic: str, as_json: bool) -> None:
    """Consumer groups of a topic: with offsets for it or subscribing (QUERY_TOPIC_CONSUME_BY_WHO, what
    RocketMQ's dashboard asks)."""
    from ferrymq.client import Admin
    from ferrymq.client.ops import groups_consuming

    async def go() -> list[str]:
        async with Admin(namesrv) as admin:
            return await groups_consuming(admin, topic)
    emit([{"group": g} for g in run(go())], ["group"], as_json=as_json)


@click.command("connection")
@namesrv_option
@click.option("-g", "--group", required=True, help="Producer group")
@json_option
def producer_connection(namesrv: str, group: str, as_json: bool) -> None:
    """Connected producers of a group, per broker (GET_PRODUCER_CONNECTION_LIST; mqadmin producerConnection)."""
    from ferrymq.client import Admin
    from ferrymq.client.ops import producer_connections

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await producer_connections(admin, group)
    emit(run(go()), ["broker", "brokerAddr", "clientId", "clientAddr", "language", "version"], as_json=as_json,
         title=f"producer group {group}")


@click.command("status")
@namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", default=None, help="Each live consumer's own offsets of this topic (223)")
@click.option("-i", "--client-id", default=None, help="This consumer's running info instead (307)")
@json_option
def consumer_status(namesrv: str, group: str, topic: str | None, client_id: str | None, as_json: bool) -> None:
    """Ask the consumers themselves: their offsets of a topic (mqadmin getConsumerStatus), or one client's
    running info (mqadmin consumerStatus -i)."""
    from ferrymq.client import Admin, ops_more

    if (topic is None) == (client_id is None):
        raise click.UsageError("give exactly one of --topic or --client-id")
    if client_id is not None:
        async def info() -> dict[str, Any]:
            async with Admin(namesrv) as admin:
                return await ops_more.consumer_running_info(admin, group, client_id)
        got = run(info())
        if as_json:
            click.echo(json.dumps(got, default=str))
            return
        props = got.get("properties") or {}
        emit([{"key": k, "value": v} for k, v in sorted(props.items())], ["key", "value"], as_json=False,
             title=f"{client_id} ({got.get('broker')})")
        emit([{"queue": q, **{k: v for k, v in (st or {}).items() if not isinstance(v, (dict, list))}}
              for q, st in sorted((got.get("mqTable") or {}).items())],
             ["queue", "commitOffset", "cachedMsgCount", "cachedMsgMinOffset", "cachedMsgMaxOffset"], as_json=False,
             title="queues")
        return
    assert topic is not None

    async def offsets() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await ops_more.consumer_status(admin, group, topic)
    emit(run(offsets()), ["clientId", "brokerName", "queueId", "offset"], as_json=as_json,
         title=f"group {group} on {topic}")


@click.command("all")
@namesrv_option
@click.option("-b", "--broker-addr", callback=addr_param, required=True)
@json_option
def all_producers(namesrv: str, broker_addr: str, as_json: bool) -> None:
    """Every producer connected to a broker, by group (GET_ALL_PRODUCER_INFO)."""
    from ferrymq.client import Admin, ops_more

    async def go() -> list[dict[str, Any]]:
        async with Admin(namesrv) as admin:
            return await ops_more.all_producers(admin, broker_addr)
    emit(run(go()), ["group", "clientId", "remoteIP", "language", "version", "lastUpdateTimestamp"],
         as_json=as_json)


CONSUMER_VERBS: tuple[click.Command, ...] = (reset_offset, skip_backlog, clone_offset, consumer_connection,
                                             group_topics, consumer_status)
TOPIC_VERBS: tuple[click.Command, ...] = (who_consumes,)
