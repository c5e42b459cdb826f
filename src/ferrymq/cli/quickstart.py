"""``ferry quickstart [--data-dir DIR]``: a name server, a SYNC_MASTER and its SLAVE as separate processes on
free 127.0.0.1 ports, a send/consume round trip, the replication status, then serve until Ctrl-C/SIGTERM.

| step | what                                                                      | done when                                    |
|------|---------------------------------------------------------------------------|----------------------------------------------|
| 1    | ``python -m ferrymq.cli namesrv --listen 127.0.0.1:P``                    | GET_BROKER_CLUSTER_INFO answers              |
| 2    | ``python -m ferrymq.cli broker -c master.conf`` (SYNC_MASTER, id 0)       | the name server lists broker-a/0             |
| 3    | ``python -m ferrymq.cli broker -c slave.conf`` (SLAVE, id 1, haMasterAddress) | listed as broker-a/1, master haSlaveCount ≥ 1 and the slave's max offset = the master's |
| 4    | create ``QuickstartTopic`` on the master                                  | the name server routes it to broker-a        |
| 5    | send ``DEMO_MESSAGES`` (ferrymq.client Producer, else raw SEND_MESSAGE)   | every send answered SEND_OK                  |
| 6    | consume them (ferrymq.client PushConsumer, else raw PULL_MESSAGE)         | every body of this run received              |
| 7    | replication status from the master's GET_BROKER_RUNTIME_INFO              | the slave's commit log reached the master's  |
| 8    | ``python -m ferrymq.cli console`` (the web console)                       | its port answers                             |
| 9    | print the Prometheus and console URLs, the ``quickstart ready: ...`` line and the ``export NAMESRV_ADDR=...`` line, wait for SIGINT/SIGTERM | |

The name server and both brokers serve Prometheus metrics (``metricsPort``, docs/metrics.md) on free ports.

Layout of the data directory::

    <data-dir>/master/{broker.conf,store/}   <data-dir>/slave/{broker.conf,store/}   <data-dir>/logs/*.log

Every child runs in its own session (a terminal Ctrl-C reaches only this process, which then stops the
children slave → master → name server: SIGTERM, then SIGKILL after ``CHILD_STOP_GRACE_S``); on Linux the
children also get SIGTERM when this process dies (PR_SET_PDEATHSIG). Children are stopped on every exit
path, failures included. Exit codes: 0 after a signal, 1 when start-up or the demo failed or a child died (with ``--keep-going`` a dead child is reported and the
others keep serving).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click

from ferrymq.cli.broker import event_loop_factory
from ferrymq.cli.quickstart_stack import (
    BROKER_START_TIMEOUT_S,
    CLUSTER_NAME,
    LOOPBACK,
    NAMESRV_START_TIMEOUT_S,
    POLL_INTERVAL_S,
    QuickstartError,
    Stack,
    free_port,
    json_body,
    port_free,
    request,
    wait_until,
    write_conf,
)

BROKER_NAME = "broker-a"
DEMO_TOPIC = "QuickstartTopic"
DEMO_QUEUES = 4
DEMO_PRODUCER_GROUP = "quickstart_producer"
DEMO_GROUP = "quickstart_consumer"
DEMO_MESSAGES = 5
#: commit log segment size of the quickstart brokers (64 MiB keeps the demo's disk footprint small)
COMMIT_LOG_FILE_BYTES = 64 * 1024 * 1024
#: HA report/heartbeat period: a slave sends its first report one period after connecting (protocol §6.4)
HA_HEARTBEAT_INTERVAL_MS = 1000
#: limits of each start-up step
REPLICATION_TIMEOUT_S = 60.0
ROUTE_TIMEOUT_S = 45.0
DEMO_TIMEOUT_S = 60.0
EXIT_FAILED = 1


def broker_conf(stack: Stack, *, role: str, broker_id: int, port: int, store_dir: Path) -> dict[str, str]:
    props = {
        "brokerClusterName": CLUSTER_NAME,
        "brokerName": BROKER_NAME,
        "brokerId": str(broker_id),
        "brokerRole": role,
        "namesrvAddr": stack.namesrv_addr,
        "listenHost": LOOPBACK,
        "brokerIP1": LOOPBACK,
        "listenPort": str(port),
        "haListenPort": str(port + 1),
        "fastListenEnable": "false",
        "storePathRootDir": str(store_dir),
        "mappedFileSizeCommitLog": str(COMMIT_LOG_FILE_BYTES),
        "flushDiskType": "ASYNC_FLUSH",
        "haSendHeartbeatInterval": str(HA_HEARTBEAT_INTERVAL_MS),
        "autoCreateTopicEnable": "true",
        "metricsPort": str(stack.slave_metrics_port if role == "SLAVE" else stack.master_metrics_port),
    }
    if role == "SLAVE":
        props["haMasterAddress"] = stack.master_ha_addr
    return props


async def cluster_addrs(ns_addr: str) -> dict[int, str]:
    """broker-a's ``{brokerId: addr}`` as the name server lists it."""
    from ferrymq.remoting.codes import RequestCode, ResponseCode

    resp = await request(ns_addr, RequestCode.GET_BROKER_CLUSTER_INFO)
    if resp.code != ResponseCode.SUCCESS:
        return {}
    entry = ((json_body(resp) or {}).get("brokerAddrTable") or {}).get(BROKER_NAME) or {}
    return {int(k): str(v) for k, v in (entry.get("brokerAddrs") or {}).items()}


async def runtime_info(addr: str) -> dict[str, str]:
    from ferrymq.remoting.codes import RequestCode, ResponseCode

    resp = await request(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
    if resp.code != ResponseCode.SUCCESS:
        raise QuickstartError(f"GET_BROKER_RUNTIME_INFO on {addr} -> {resp.code} {resp.remark}")
    return {str(k): str(v) for k, v in ((json_body(resp) or {}).get("table") or {}).items()}


# ---------------------------------------------------------------------------------------------------
# start-up


async def start_stack(stack: Stack) -> None:
    from ferrymq.remoting.codes import RequestCode, ResponseCode

    taken: set[int] = set()
    stack.namesrv_port = free_port(taken)
    stack.master_port = free_port(taken, with_next=True)
    stack.slave_port = free_port(taken, with_next=True)
    stack.namesrv_metrics_port = free_port(taken)
    stack.master_metrics_port = free_port(taken)
    stack.slave_metrics_port = free_port(taken)
    stack.console_port = free_port(taken)

    stack.spawn("namesrv", "namesrv", "--listen", stack.namesrv_addr, "--log-level", "WARNING",
                "--metrics-port", str(stack.namesrv_metrics_port))

    async def namesrv_up() -> bool:
        resp = await request(stack.namesrv_addr, RequestCode.GET_BROKER_CLUSTER_INFO)
        return resp.code == ResponseCode.SUCCESS

    await wait_until(
        stack, namesrv_up, timeout_s=NAMESRV_START_TIMEOUT_S, what=f"name server on {stack.namesrv_addr}"
    )
    click.echo(f"name server   {stack.namesrv_addr} is up")

    master_dir = stack.data_dir / "master"
    slave_dir = stack.data_dir / "slave"
    master_conf = write_conf(
        master_dir / "broker.conf",
        broker_conf(
            stack, role="SYNC_MASTER", broker_id=0, port=stack.master_port, store_dir=master_dir / "store"
        ),
    )
    slave_conf = write_conf(
        slave_dir / "broker.conf",
        broker_conf(stack, role="SLAVE", broker_id=1, port=stack.slave_port, store_dir=slave_dir / "store"),
    )
    stack.spawn("master", "broker", "-c", str(master_conf), "--log-level", "WARNING")
    stack.spawn("slave", "broker", "-c", str(slave_conf), "--log-level", "WARNING")

    async def wait_listed(role: str, broker_id: int, addr: str) -> None:
        async def listed() -> bool:
            return (await cluster_addrs(stack.namesrv_addr)).get(broker_id) == addr

        await wait_until(
            stack, listed, timeout_s=BROKER_START_TIMEOUT_S, what=f"the name server to list {role} {addr}"
        )

    await wait_listed("master", 0, stack.master_addr)
    click.echo(
        f"master        {stack.master_addr} (SYNC_MASTER, id 0, HA port {stack.master_port + 1}) registered"
    )
    await wait_listed("slave", 1, stack.slave_addr)
    click.echo(
        f"slave         {stack.slave_addr} (SLAVE, id 1, replicating from {stack.master_ha_addr}) registered"
    )

    async def replicating() -> bool:
        m = await runtime_info(stack.master_addr)
        s = await runtime_info(stack.slave_addr)
        return (
            int(m.get("haSlaveCount", "0") or 0) >= 1
            and _slave_acked(m)
            and m.get("commitLogMaxOffset") == s.get("commitLogMaxOffset")
        )

    await wait_until(
        stack,
        replicating,
        timeout_s=REPLICATION_TIMEOUT_S,
        what="the slave to connect to the master's HA port and catch up",
    )
    click.echo("replication   slave connected to the master's HA port and caught up")

    resp = await request(
        stack.master_addr,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {
            "topic": DEMO_TOPIC,
            "defaultTopic": "TBW102",
            "readQueueNums": DEMO_QUEUES,
            "writeQueueNums": DEMO_QUEUES,
            "perm": 6,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": "false",
        },
    )
    if resp.code != ResponseCode.SUCCESS:
        raise QuickstartError(f"creating topic {DEMO_TOPIC} -> {resp.code} {resp.remark}")

    async def routed() -> bool:
        r = await request(stack.namesrv_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": DEMO_TOPIC})
        if r.code != ResponseCode.SUCCESS:
            return False
        route = json_body(r) or {}
        return any(q.get("brokerName") == BROKER_NAME for q in route.get("queueDatas") or [])

    await wait_until(stack, routed, timeout_s=ROUTE_TIMEOUT_S, what=f"the route of {DEMO_TOPIC}")
    click.echo(f"topic         {DEMO_TOPIC} ({DEMO_QUEUES} queues) created and routed to {BROKER_NAME}")


def _slave_acked(master_rt: dict[str, str]) -> bool:
    """True when the master's HA link table (``haSlaves``, if reported) has an acking slave."""
    links = _ha_links(master_rt)
    if not links:
        return True  # brokers without the link table report only haSlaveCount
    return any(int(link.get("ackOffset", -1)) >= 0 for link in links)


# ---------------------------------------------------------------------------------------------------
# demo: send and consume


def _client_available() -> bool:
    try:
        from ferrymq.client import Producer, PushConsumer, new_message  # noqa: F401
    except Exception:
        return False
    return True


async def demo_with_client(stack: Stack, run_id: str) -> None:
    from ferrymq.client import ConsumeStatus, Producer, PushConsumer, SendStatus, new_message

    bodies = [f"hello ferrymq {run_id} #{i}" for i in range(DEMO_MESSAGES)]
    async with Producer(stack.namesrv_addr, DEMO_PRODUCER_GROUP) as producer:
        for i, body in enumerate(bodies):
            r = await producer.send(new_message(DEMO_TOPIC, body, tags="demo", keys=f"{run_id}-{i}"))
            click.echo(
                f"sent          #{i} -> {r.status.value} msgId {r.msg_id} queue {r.message_queue.queue_id} "
                f"queueOffset {r.queue_offset}"
            )
            if r.status is not SendStatus.SEND_OK:
                raise QuickstartError(f"send #{i} answered {r.status.value}")

    wanted = set(bodies)
    got: set[str] = set()
    all_in = asyncio.Event()

    def on_messages(msgs: list[Any]) -> ConsumeStatus:
        for m in msgs:
            text = m.body.decode(errors="replace")
            if text in wanted and text not in got:
                got.add(text)
                click.echo(f"consumed      queue {m.queue_id} queueOffset {m.queue_offset}: {text}")
        if got >= wanted:
            all_in.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        stack.namesrv_addr, DEMO_GROUP, consume_from_where="CONSUME_FROM_FIRST_OFFSET", listener=on_messages
    )
    consumer.subscribe(DEMO_TOPIC, "*")
    await consumer.start()
    try:

        async def done() -> bool:
            return all_in.is_set()

        await wait_until(stack, done, timeout_s=DEMO_TIMEOUT_S, what=f"the {DEMO_MESSAGES} demo messages")
    finally:
        await consumer.close()  # commits the consumed offsets
    click.echo(
        f"round trip    {len(got)}/{DEMO_MESSAGES} messages sent and consumed "
        f"(ferrymq.client Producer + PushConsumer, group {DEMO_GROUP})"
    )


async def demo_raw(stack: Stack, run_id: str) -> None:
    """The same round trip over raw remoting (used when ferrymq.client cannot be imported)."""
    from ferrymq.common.message_codec import iter_records
    from ferrymq.remoting.codes import RequestCode, ResponseCode

    bodies = [f"hello ferrymq {run_id} #{i}" for i in range(DEMO_MESSAGES)]
    start = {}
    for q in range(DEMO_QUEUES):
        resp = await request(
            stack.master_addr, RequestCode.GET_MAX_OFFSET, {"topic": DEMO_TOPIC, "queueId": q}
        )
        start[q] = int(resp.ext_fields.get("offset", "0")) if resp.code == ResponseCode.SUCCESS else 0
    for i, body in enumerate(bodies):
        q = i % DEMO_QUEUES
        resp = await request(
            stack.master_addr,
            RequestCode.SEND_MESSAGE,
            {
                "producerGroup": DEMO_PRODUCER_GROUP,
                "topic": DEMO_TOPIC,
                "defaultTopic": "TBW102",
                "defaultTopicQueueNums": DEMO_QUEUES,
                "queueId": q,
                "sysFlag": 0,
                "bornTimestamp": int(time.time() * 1000),
                "flag": 0,
                "properties": f"TAGS\x01demo\x02KEYS\x01{run_id}-{i}\x02",
            },
            body.encode(),
        )
        click.echo(
            f"sent          #{i} -> code {resp.code} msgId {resp.ext_fields.get('msgId')} queue {q} "
            f"queueOffset {resp.ext_fields.get('queueOffset')}"
        )
        if resp.code != ResponseCode.SUCCESS:
            raise QuickstartError(f"send #{i} answered {resp.code} {resp.remark}")
    got = 0
    for q in range(DEMO_QUEUES):
        resp = await request(
            stack.master_addr,
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": DEMO_GROUP,
                "topic": DEMO_TOPIC,
                "queueId": q,
                "queueOffset": start[q],
                "maxMsgNums": 32,
                "sysFlag": 4,
                "commitOffset": 0,
                "suspendTimeoutMillis": 0,
                "subscription": "*",
                "subVersion": 0,
            },
        )
        if resp.code != ResponseCode.SUCCESS:
            continue
        for m in iter_records(resp.body):
            text = m.body.decode(errors="replace")
            if text in bodies:
                got += 1
                click.echo(f"consumed      queue {q} queueOffset {m.queue_offset}: {text}")
        await request(
            stack.master_addr,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {
                "consumerGroup": DEMO_GROUP,
                "topic": DEMO_TOPIC,
                "queueId": q,
                "commitOffset": resp.ext_fields.get("nextBeginOffset", "0"),
            },
        )
    if got != DEMO_MESSAGES:
        raise QuickstartError(f"consumed {got} of {DEMO_MESSAGES} demo messages")
    click.echo(
        f"round trip    {got}/{DEMO_MESSAGES} messages sent and consumed (raw remoting, group {DEMO_GROUP})"
    )


# ---------------------------------------------------------------------------------------------------
# replication status


def _ha_links(master_rt: dict[str, str]) -> list[dict[str, Any]]:
    """The master's per-slave HA link table (``haSlaves`` JSON), empty when it does not report one."""
    with contextlib.suppress(ValueError, TypeError):
        parsed = json.loads(master_rt.get("haSlaves") or "[]")
        if isinstance(parsed, list):
            return [x for x in parsed if isinstance(x, dict)]
    return []


async def replication_status(stack: Stack) -> None:
    """Wait until the slave holds everything the master has, then print the master's view per slave."""

    async def caught_up() -> tuple[dict[str, str], dict[str, str]] | None:
        m = await runtime_info(stack.master_addr)
        s = await runtime_info(stack.slave_addr)
        if m.get("commitLogMaxOffset") != s.get("commitLogMaxOffset"):
            return None
        acks = [int(link.get("ackOffset", -1)) for link in _ha_links(m)]
        if acks and max(acks) != int(m.get("commitLogMaxOffset", "0") or 0):
            return None  # the slave has it all; its ack report is on the way
        return m, s

    pair = await wait_until(
        stack, caught_up, timeout_s=REPLICATION_TIMEOUT_S, what="the slave to replicate the demo messages"
    )
    assert pair is not None
    master_rt, slave_rt = pair
    master_max = int(master_rt.get("commitLogMaxOffset", "0") or 0)
    links = _ha_links(master_rt)
    count = master_rt.get("haSlaveCount", str(len(links)))
    click.echo(
        f"replication   master {stack.master_addr} (SYNC_MASTER) commit log max offset {master_max}, "
        f"haSlaveCount {count}"
    )
    if links:
        for link in links:
            ack = int(link.get("ackOffset", -1))
            lag = int(link.get("lagBytes", master_max - max(ack, 0)))
            name = stack.slave_addr if len(links) == 1 else "?"
            click.echo(
                f"  slave {name} (HA link {link.get('addr', '?')}): acked offset {ack}, lag {lag} bytes"
            )
    else:  # the master does not report haSlaves: the slave's own max offset is what it acknowledged
        slave_max = int(slave_rt.get("commitLogMaxOffset", "0") or 0)
        click.echo(
            f"  slave {stack.slave_addr}: acked offset {slave_max}, lag {master_max - slave_max} bytes"
        )


# ---------------------------------------------------------------------------------------------------
# main


async def _setup(stack: Stack) -> None:
    await start_stack(stack)
    run_id = uuid.uuid4().hex[:8]
    if _client_available():
        await demo_with_client(stack, run_id)
    else:
        click.echo("ferrymq.client is not importable; using raw remoting for the demo")
        await demo_raw(stack, run_id)
    await replication_status(stack)
    await start_console(stack)


async def start_console(stack: Stack) -> None:
    stack.spawn("console", "console", "-n", stack.namesrv_addr, "--listen", f"{LOOPBACK}:{stack.console_port}")

    async def listening() -> bool:
        return not port_free(stack.console_port)

    await wait_until(stack, listening, timeout_s=NAMESRV_START_TIMEOUT_S, what="the console")
    for name, port in (("namesrv", stack.namesrv_metrics_port), ("master", stack.master_metrics_port),
                       ("slave", stack.slave_metrics_port)):
        click.echo(f"metrics       {name:<8} http://{LOOPBACK}:{port}/metrics")
    click.echo(f"console       http://{LOOPBACK}:{stack.console_port}/")


async def _watch_children(stack: Stack, keep_going: bool) -> None:
    """Returns never; raises QuickstartError when a child dies, unless ``keep_going``: then the death is
    reported and the others keep serving (to rehearse "master down" with real clients)."""
    reported: set[str] = set()
    while True:
        if not keep_going:
            stack.check_alive()
        for child in stack.newly_dead(reported):
            click.echo(f"{child.name} (pid {child.pid}) exited with code {child.exit_code}; --keep-going: the "
                       f"others keep serving (log {child.log_path})")
        if keep_going and len(reported) == len(stack.children):
            raise QuickstartError("every process of the quickstart has exited")
        await asyncio.sleep(POLL_INTERVAL_S)


async def run(data_dir: Path, *, keep_going: bool = False) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    stack = Stack(data_dir)
    stopper = asyncio.ensure_future(stop.wait())
    exit_code = 0
    try:
        click.echo(f"ferrymq quickstart: data in {data_dir}")
        setup = asyncio.ensure_future(_setup(stack))
        await asyncio.wait({setup, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not setup.done():
            setup.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await setup
            click.echo("signal received during start-up; stopping")
            return 0
        setup.result()  # raises on failure
        click.echo(
            f"quickstart ready: namesrv {stack.namesrv_addr}, master {stack.master_addr}, "
            f"slave {stack.slave_addr} (Ctrl-C to stop)"
        )
        click.echo(f"to use it from another shell: export NAMESRV_ADDR={stack.namesrv_addr}   "
                   "(then e.g. `ferry cluster list`)")
        sys.stdout.flush()
        watch = asyncio.ensure_future(_watch_children(stack, keep_going))
        await asyncio.wait({watch, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if watch.done():
            watch.result()  # a child died: raises QuickstartError
        watch.cancel()
        click.echo("signal received; stopping")
    except QuickstartError as exc:
        click.echo(f"quickstart failed: {exc}", err=True)
        exit_code = EXIT_FAILED
    except Exception as exc:
        click.echo(f"quickstart failed: {type(exc).__name__}: {exc}", err=True)
        exit_code = EXIT_FAILED
    finally:
        stopper.cancel()
        await stack.stop_all()
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        sys.stdout.flush()
    return exit_code


@click.command("quickstart")
@click.option(
    "--data-dir", default=None, type=click.Path(file_okay=False), help="data directory (default: temp)"
)
@click.option("--failover", is_flag=True, help="controller mode instead: a controller and three replicas; the "
              "master is SIGKILLed under load and sends go on at the new master, then everything stops")
@click.option("--keep-going", is_flag=True, help="when a child process dies (say you kill the master to "
              "rehearse an outage), report it and keep the others serving instead of stopping everything")
def command(data_dir: str | None, failover: bool, keep_going: bool) -> None:
    """Run a name server, a SYNC_MASTER and its SLAVE locally, send and consume a few messages, keep serving."""
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ferrymq-quickstart-")
        data_dir = tmp.name
    path = Path(data_dir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            if failover:
                from ferrymq.cli import quickstart_failover

                code = runner.run(quickstart_failover.run(path))
            else:
                code = runner.run(run(path, keep_going=keep_going))
    finally:
        if tmp is not None:
            tmp.cleanup()
    sys.exit(code)
