"""Per-operation latency of the broker's metadata paths at two estate sizes (issue 24).

Starts a name server (``ferry namesrv``, its own process) and an in-process broker, fills the broker with
``N`` topics and ``N`` subscription groups, then times, one request at a time over one connection:

| row              | request                                                              |
|------------------|----------------------------------------------------------------------|
| topic create     | UPDATE_AND_CREATE_TOPIC of a new topic                               |
| group by hb      | HEART_BEAT declaring one new consumer group (config + retry topic)   |
| offset commit    | UPDATE_CONSUMER_OFFSET                                               |
| consumer list    | GET_CONSUMER_LIST_BY_GROUP                                           |

and prints p50 / p99 in ms per row, and the longest event-loop stall the broker's loop-lag probe saw.
The estate is filled through the managers (not the wire) so that the fill is quick; the timed requests go
through the wire like any client's.

    python benchmarks/metadata_ops.py --sizes 100,10000 --ops 200

``--stalls``: the whole-table operations of one estate (``--topics`` × 8 queues, ``--groups``, ``--offsets``
committed offsets), each run alone on an in-process broker restarted on the filled tables (no name server),
printing how long it took and the longest stall of the broker's event loop meanwhile (its loop-lag probe,
``ferrymq_event_loop_lag_seconds``): the slave-sync answers (GET_ALL_TOPIC_CONFIG, GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
GET_ALL_CONSUMER_OFFSET, GET_ALL_DELAY_OFFSET, GET_BROKER_CONSUME_STATS), the registration body, the timed
snapshots, the slave's take-over of each table, and request-reply's look-up of the requester.

    python benchmarks/metadata_ops.py --stalls --topics 10000 --groups 5000 --offsets 100000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from ferrymq.broker.app import BrokerController
from ferrymq.broker.config import BrokerConfig
from ferrymq.broker.subscription_manager import SubscriptionGroupConfig
from ferrymq.common.topic import TopicConfig
from ferrymq.errors import ConnectError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.connection import connect

LOOPBACK = "127.0.0.1"
#: time the name server gets to answer after its start
NAMESRV_START_TIMEOUT_S = 20.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


async def _wait_namesrv(addr: str) -> None:
    deadline = time.monotonic() + NAMESRV_START_TIMEOUT_S
    while True:
        try:
            conn = await connect(addr, timeout_ms=500)
            conn.close()
            return
        except (OSError, ConnectError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _timed(conn: Any, cmd: RemotingCommand) -> float:
    t0 = time.perf_counter()
    resp = await conn.invoke(cmd, 30_000)
    dt = (time.perf_counter() - t0) * 1000
    if resp.code != 0:
        raise RuntimeError(f"code {cmd.code} answered {resp.code} {resp.remark}")
    return dt


def _heartbeat(client_id: str, group: str) -> RemotingCommand:
    body = {"clientID": client_id, "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": "T0", "subString": "*", "subVersion": 1}]}]}
    return RemotingCommand.request(RequestCode.HEART_BEAT, {}, jsonx.dumps(body))


async def run_size(ns_addr: str, size: int, ops: int) -> dict[str, tuple[float, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = BrokerConfig(listen_port=0, listen_host=LOOPBACK, broker_ip1=LOOPBACK, store_path_root_dir=tmp,
                           namesrv_addr=[ns_addr], fast_listen_enable=False)
        ctl = BrokerController(cfg)
        await ctl.start()
        try:
            for i in range(size):
                ctl.topics.table[f"T{i}"] = TopicConfig(f"T{i}", 8, 8)
                ctl.groups.table[f"G{i}"] = SubscriptionGroupConfig(f"G{i}")
            ctl.topics.persist()
            ctl.groups.persist()
            await ctl.registrar.register_all()  # type: ignore[union-attr]
            conn = await connect(ctl.broker_addr, timeout_ms=3000)
            rows: dict[str, list[float]] = {"topic create": [], "group by hb": [], "offset commit": [],
                                            "consumer list": []}
            probe = getattr(ctl, "loop_lag", None)
            if probe is not None:
                probe.reset_max()
            for i in range(ops):
                rows["topic create"].append(await _timed(conn, RemotingCommand.request(
                    RequestCode.UPDATE_AND_CREATE_TOPIC,
                    {"topic": f"NEW{i}", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6})))
                rows["group by hb"].append(await _timed(conn, _heartbeat("bench@1", f"NEWG{i}")))
                rows["offset commit"].append(await _timed(conn, RemotingCommand.request(
                    RequestCode.UPDATE_CONSUMER_OFFSET,
                    {"consumerGroup": f"G{i % max(1, size)}", "topic": f"T{i % max(1, size)}", "queueId": 0,
                     "commitOffset": i})))
                rows["consumer list"].append(await _timed(conn, RemotingCommand.request(
                    RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": f"NEWG{i}"})))
            conn.close()
            out = {name: (statistics.median(v), _pct(v, 0.99)) for name, v in rows.items()}
            if probe is not None:
                out["longest loop stall"] = (probe.max_lag_s * 1000, probe.max_lag_s * 1000)
            return out
        finally:
            await ctl.stop()


class _OpenConn:
    closed = False


async def run_stalls(topics: int, groups: int, offsets: int) -> list[tuple[str, float, float]]:
    """(row, ms taken, longest loop stall in ms) per whole-table operation."""
    import inspect

    from ferrymq.broker.consumer_manager import ConsumerData

    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = BrokerConfig(listen_port=0, listen_host=LOOPBACK, broker_ip1=LOOPBACK, store_path_root_dir=tmp,
                           namesrv_addr=[], fast_listen_enable=False)
        ctl = BrokerController(cfg)
        await ctl.start()
        for i in range(topics):
            ctl.topics.table[f"T{i}"] = TopicConfig(f"T{i}", 8, 8)
        for i in range(groups):
            ctl.groups.table[f"G{i}"] = SubscriptionGroupConfig(f"G{i}")
        for i in range(offsets):  # topics x groups pairs, 8 queues each
            pair = i // 8
            ctl.offsets.commit(f"G{pair % max(1, groups)}", f"T{pair % max(1, topics)}", i % 8, i)
        ctl.topics._dirty = ctl.groups._dirty = True
        await ctl.stop()  # persists the tables: the measured broker loads them as after a restart
        ctl = BrokerController(cfg)
        await ctl.start()
        probe = ctl.loop_lag
        try:
            async def measure(name: str, fn: Any) -> Any:
                await asyncio.sleep(0.05)
                probe.reset_max()
                t0 = time.perf_counter()
                result = fn()
                if inspect.isawaitable(result):
                    result = await result
                took_ms = (time.perf_counter() - t0) * 1000
                await asyncio.sleep(3 * probe.interval_s)  # the probe's next wake-up sees the last stall
                rows.append((name, took_ms, probe.max_lag_s * 1000))
                return result

            def request(code: int) -> Any:
                handler = ctl.dispatcher.get(code)
                assert handler is not None
                return lambda: handler(None, RemotingCommand.request(code, {}))

            assert ctl.registrar is not None
            await measure("registration body (first)", ctl.registrar.build_body)
            t = await measure("GET_ALL_TOPIC_CONFIG", request(RequestCode.GET_ALL_TOPIC_CONFIG))
            g = await measure("GET_ALL_SUBSCRIPTIONGROUP_CONFIG", request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
            o = await measure("GET_ALL_CONSUMER_OFFSET", request(RequestCode.GET_ALL_CONSUMER_OFFSET))
            await measure("GET_ALL_DELAY_OFFSET", request(RequestCode.GET_ALL_DELAY_OFFSET))
            await measure("GET_BROKER_CONSUME_STATS", request(RequestCode.GET_BROKER_CONSUME_STATS))
            for table in (ctl.offsets, ctl.topics, ctl.groups):
                table._dirty = True
            await measure("consumer offsets snapshot", ctl.offsets.snapshot_if_dirty)
            await measure("topics snapshot", ctl.topics.snapshot_if_dirty)
            await measure("groups snapshot", ctl.groups.snapshot_if_dirty)
            topic_obj, group_obj, offset_obj = (jsonx.loads(r.body) for r in (t, g, o))
            topic_obj["dataVersion"]["counter"] += 1
            group_obj["dataVersion"]["counter"] += 1
            await measure("slave: topics replace_all", lambda: ctl.topics.replace_all(topic_obj))
            await measure("slave: groups replace_all", lambda: ctl.groups.replace_all(group_obj))
            await measure("slave: offsets merge", lambda: ctl.offsets.merge_from_master(offset_obj))
            for i in range(groups):
                ctl.consumers.register(_OpenConn(), f"client-{i}", "JAVA", 1, ConsumerData(
                    f"G{i}", "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", []))

            def find_requesters() -> None:
                for _ in range(100):
                    ctl.producers.find_channel("absent") or ctl.consumers.find_channel("absent")

            await measure("100 reply look-ups (absent)", find_requesters)
        finally:
            await ctl.stop()
    return rows


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,10000", help="estate sizes (topics and groups), comma-separated")
    ap.add_argument("--ops", type=int, default=200, help="timed requests per row and size")
    ap.add_argument("--stalls", action="store_true", help="measure the whole-table operations' loop stalls")
    ap.add_argument("--topics", type=int, default=10_000, help="--stalls: topics (8 queues each)")
    ap.add_argument("--groups", type=int, default=5_000, help="--stalls: subscription groups")
    ap.add_argument("--offsets", type=int, default=100_000, help="--stalls: committed offsets")
    args = ap.parse_args()
    if args.stalls:
        print(f"estate {args.topics} topics x 8 queues / {args.groups} groups / {args.offsets} committed offsets")
        for name, took_ms, stall_ms in await run_stalls(args.topics, args.groups, args.offsets):
            print(f"  {name:<34} took {took_ms:8.1f} ms   longest loop stall {stall_ms:7.1f} ms")
        return
    port = _free_port()
    ns = subprocess.Popen([sys.executable, "-m", "ferrymq.cli", "namesrv", "--listen", f"{LOOPBACK}:{port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await _wait_namesrv(f"{LOOPBACK}:{port}")
        for size in (int(s) for s in args.sizes.split(",")):
            res = await run_size(f"{LOOPBACK}:{port}", size, args.ops)
            print(f"estate {size} topics / {size} groups, {args.ops} ops per row")
            for name, (p50, p99) in res.items():
                print(f"  {name:<20} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms")
    finally:
        ns.terminate()
        ns.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
