"""``ferry topic create|list|route|status|delete``."""

from __future__ import annotations

import json
from typing import Any

import click

from ferrymq.client import Admin
from ferrymq.client._cli import addr_param, emit, json_option, namesrv_option, run


@click.group("topic")
def command() -> None:
    """Create, list, inspect and delete topics."""


@command.command("create")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-c", "--cluster", default=None, help="Create on every master of this cluster")
@click.option("-b", "--broker-addr", callback=addr_param, default=None, help="Create on this broker only")
@click.option("-r", "--read-queues", default=8, show_default=True, type=int)
@click.option("-w", "--write-queues", default=8, show_default=True, type=int)
@click.option("-p", "--perm", default=6, show_default=True, type=int)
@click.option("-o", "--order", is_flag=True, help="Mark the topic as ordered")
@json_option
def create(namesrv: str, topic: str, cluster: str | None, broker_addr: str | None, read_queues: int,
           write_queues: int, perm: int, order: bool, as_json: bool) -> None:
    """Create or update a topic."""
    async def go() -> list[str]:
        async with Admin(namesrv) as admin:
            return await admin.create_topic(topic, cluster=cluster, broker_addr=broker_addr,
                                            read_queue_nums=read_queues, write_queue_nums=write_queues,
                                            perm=perm, order=order)
    addrs = run(go())
    emit([{"topic": topic, "broker": a, "readQueues": read_queues, "writeQueues": write_queues} for a in addrs],
         ["topic", "broker", "readQueues", "writeQueues"], as_json=as_json, title="created")


@command.command("list")
@namesrv_option
@json_option
def list_(namesrv: str, as_json: bool) -> None:
    """All topics known to the name server."""
    async def go() -> list[str]:
        async with Admin(namesrv) as admin:
            return await admin.topic_list()
    emit([{"topic": t} for t in run(go())], ["topic"], as_json=as_json)


@command.command("route")
@namesrv_option
@click.option("-t", "--topic", required=True)
@json_option
def route(namesrv: str, topic: str, as_json: bool) -> None:
    """The topic's route: queues per broker and broker addresses."""
    async def go() -> Any:
        async with Admin(namesrv) as admin:
            return await admin.topic_route(topic)
    rt = run(go())
    rows = []
    for qd in sorted(rt.queue_datas, key=lambda q: q.broker_name):
        bd = rt.broker(qd.broker_name)
        rows.append({"brokerName": qd.broker_name, "cluster": bd.cluster if bd else "",
                     "readQueues": qd.read_queue_nums, "writeQueues": qd.write_queue_nums, "perm": qd.perm,
                     "brokerAddrs": {str(k): v for k, v in sorted((bd.broker_addrs if bd else {}).items())}})
    emit(rows, ["brokerName", "cluster", "readQueues", "writeQueues", "perm", "brokerAddrs"], as_json=as_json)


@command.command("status")
@namesrv_option
@click.option("-t", "--topic", required=True)
@json_option
def status(namesrv: str, topic: str, as_json: bool) -> None:
    """Min/max offset of every queue."""
    async def go() -> Any:
        async with Admin(namesrv) as admin:
            return await admin.topic_status(topic)
    rows = [{"brokerName": mq.broker_name, "queueId": mq.queue_id, "minOffset": lo, "maxOffset": hi,
             "lastUpdateMs": ts} for mq, lo, hi, ts in run(go())]
    emit(rows, ["brokerName", "queueId", "minOffset", "maxOffset", "lastUpdateMs"], as_json=as_json)


@command.command("delete")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-c", "--cluster", default=None)
@json_option
def delete(namesrv: str, topic: str, cluster: str | None, as_json: bool) -> None:
    """Delete a topic from the brokers and the name servers (mqadmin deleteTopic). Refused, with nothing
    changed, while a broker group serving the topic has no master."""
    async def go() -> None:
        async with Admin(namesrv) as admin:
            await admin.delete_topic(topic, cluster)
    run(go())
    if as_json:
        click.echo(json.dumps({"topic": topic, "cluster": cluster, "deleted": True}))
    else:
        click.echo(f"deleted {topic}")


def _add_ops_verbs() -> None:
    from ferrymq.cli import admin_verbs, consumer_ops

    for verb in (*consumer_ops.TOPIC_VERBS, *admin_verbs.TOPIC_VERBS):
        command.add_command(verb)


_add_ops_verbs()
