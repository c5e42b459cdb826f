"""``ferry quickstart [--data-dir DIR]``: an embedded name server + broker on free 127.0.0.1 ports, a small
send/consume demo over raw remoting, then serve until Ctrl-C."""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile

import click

from ferrymq.cli.broker import event_loop_factory, wait_for_signal

DEMO_TOPIC = "QuickstartTopic"
DEMO_GROUP = "quickstart_consumer"
DEMO_MESSAGES = 5


async def demo(broker_addr: str) -> None:
    from ferrymq.common.message_codec import iter_records
    from ferrymq.remoting.codec import RemotingCommand
    from ferrymq.remoting.codes import RequestCode, ResponseCode
    from ferrymq.remoting.connection import connect

    conn = await connect(broker_addr)
    try:
        for i in range(DEMO_MESSAGES):
            cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, {
                "producerGroup": "quickstart_producer", "topic": DEMO_TOPIC, "defaultTopic": "TBW102",
                "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0, "bornTimestamp": 0, "flag": 0,
                "properties": f"TAGS\x01demo\x02KEYS\x01key{i}"}, f"hello ferrymq {i}".encode())
            resp = await conn.invoke(cmd)
            click.echo(f"sent   #{i} -> code {resp.code} msgId {resp.ext_fields.get('msgId')} "
                       f"queueOffset {resp.ext_fields.get('queueOffset')}")
        pull = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": DEMO_GROUP, "topic": DEMO_TOPIC, "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
            "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0})
        resp = await conn.invoke(pull)
        if resp.code == ResponseCode.SUCCESS:
            for msg in iter_records(resp.body):
                click.echo(f"pulled queueOffset {msg.queue_offset}: {msg.body.decode(errors='replace')}")
        click.echo(f"pull -> code {resp.code} ({resp.remark}), nextBeginOffset "
                   f"{resp.ext_fields.get('nextBeginOffset')}")
        commit = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": DEMO_GROUP, "topic": DEMO_TOPIC, "queueId": 0,
            "commitOffset": resp.ext_fields.get("nextBeginOffset", "0")})
        await conn.invoke(commit)
        click.echo(f"committed offset {resp.ext_fields.get('nextBeginOffset')} for group {DEMO_GROUP}")
    finally:
        conn.close()


async def run(data_dir: str) -> None:
    from ferrymq.broker.app import BrokerController
    from ferrymq.broker.config import BrokerConfig
    from ferrymq.namesrv.app import NameServer

    ns = NameServer("127.0.0.1", 0)
    await ns.start()
    try:
        cfg = BrokerConfig(broker_name="broker-a", listen_port=0, listen_host="127.0.0.1", broker_ip1="127.0.0.1",
                           store_path_root_dir=data_dir, namesrv_addr=[ns.addr], fast_listen_enable=False,
                           mapped_file_size_commit_log=64 * 1024 * 1024)
        ctl = BrokerController(cfg)
        await ctl.start()
        try:
            click.echo(f"name server on {ns.addr}")
            click.echo(f"ferrymq broker {cfg.broker_name} (id 0, {cfg.broker_role.value}) serving on "
                       f"{ctl.broker_addr}; data in {data_dir}")
            await demo(ctl.broker_addr)
            click.echo(f"serving; point clients at name server {ns.addr}. Ctrl-C to stop.")
            sys.stdout.flush()
            await wait_for_signal()
        finally:
            await ctl.stop()
    finally:
        await ns.stop()


@click.command("quickstart")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False), help="data directory (default: temp)")
def command(data_dir: str | None) -> None:
    """Run a name server + broker locally, send and consume a few messages, keep serving."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ferrymq-quickstart-")
        data_dir = tmp.name
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(run(data_dir))
    finally:
        if tmp is not None:
            tmp.cleanup()
