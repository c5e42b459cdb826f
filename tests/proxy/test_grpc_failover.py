"""Pop consumption across broker faults, real processes: a 5.x producer and a 5.x PushConsumer (the real
Python SDK) go through ``ferry proxy`` while the master of the broker group is SIGKILLed: in controller mode
(another replica is elected) and as a classic master restarted on its own data.

Checked: every message whose send the SDK saw acknowledged is consumed at least once (duplicates are counted
and reported, not refused), and consumption ends: the group's consumer offset on the (new) master reaches the
end of every queue, so nothing acknowledged is delivered again later, nor after a proxy restart."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from sdk5_support import DRIVER

from support.ports import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
from controller_support import NemesisGroup  # noqa: E402
from procs import (  # noqa: E402
    ManagedProcess,
    ProcessGroup,
    create_topic,
    ferry_argv,
    request,
    start_broker,
    start_namesrv,
    wait_for,
    wait_route,
)

from ferrymq.remoting.codes import RequestCode, ResponseCode  # noqa: E402

pytestmark = pytest.mark.acceptance

START_TIMEOUT_S = 60
#: the producer sends one message every SEND_INTERVAL_S until ACKED_AFTER_FAULT sends after the fault were
#: acknowledged; the fault comes once ACKED_BEFORE_FAULT were
SEND_INTERVAL_S = 0.05
ACKED_BEFORE_FAULT = 30
ACKED_AFTER_FAULT = 30
QUEUES = 2
#: every acknowledged message consumed, offsets at the end, within this after the producer ended
SETTLE_TIMEOUT_S = 120
#: flushConsumerOffsetInterval of a broker whose consumer offsets a SIGKILL loses
OFFSETS_NEVER_FLUSHED_MS = 3_600_000



def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return out


class Sdk:
    """One sdk5_driver verb running in the background (a process of ``procs``)."""

    def __init__(self, procs: ProcessGroup, sdk_path: Path, home: Path, endpoints: str, verb: str,
                 **args: Any) -> None:
        self.out = home / f"{verb}-{uuid.uuid4().hex[:8]}.jsonl"
        full = {"verb": verb, "endpoints": endpoints, "out": str(self.out), **args}
        self.proc: ManagedProcess = procs.spawn(f"sdk-{verb}", [sys.executable, str(DRIVER), json.dumps(full)],
                                                env={"PYTHONPATH": str(sdk_path), "HOME": str(home)})

    def records(self) -> list[dict[str, Any]]:
        return records(self.out)


def start_proxy(procs: ProcessGroup, ns_addr: str) -> tuple[str, ManagedProcess]:
    port = free_port()
    proxy = procs.spawn("proxy", ferry_argv("proxy", "-n", ns_addr, "--listen", f"127.0.0.1:{port}"))
    proxy.wait_log(r"gRPC proxy serving", timeout_s=START_TIMEOUT_S)
    return f"127.0.0.1:{port}", proxy


def offsets_at_end(broker_addr: str, topic: str, group: str) -> bool:
    """The group's committed offset is the queue's end on every queue of ``topic`` on ``broker_addr``."""
    for queue_id in range(QUEUES):
        end = request(broker_addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
        committed = request(broker_addr, RequestCode.QUERY_CONSUMER_OFFSET,
                            {"consumerGroup": group, "topic": topic, "queueId": queue_id})
        if end.code != ResponseCode.SUCCESS or committed.code != ResponseCode.SUCCESS:
            return False
        if int(committed.ext_fields["offset"]) != int(end.ext_fields["offset"]):
            return False
    return True


def run_traffic_across(procs: ProcessGroup, sdk5_path: Path, home: Path, endpoints: str, topic: str,
                       fault: Any, master_addr: Any, alive: list[ManagedProcess], group: str) -> Sdk:
    """Producer and PushConsumer of ``group`` through ``endpoints``; ``fault()`` once ACKED_BEFORE_FAULT sends
    were acknowledged; then the checks of the module docstring against ``master_addr()``. Returns the
    consumer, still running."""
    consumer = Sdk(procs, sdk5_path, home, endpoints, "push", topic=topic, group=group, expect=10**9,
                   timeout_s=3600)
    producer = Sdk(procs, sdk5_path, home, endpoints, "produce", topic=topic, count=10**9, prefix="F",
                   interval_s=SEND_INTERVAL_S, timeout_s=3600)
    everyone = [*alive, consumer.proc]

    def acked_seqs() -> list[int]:
        return [r["seq"] for r in producer.records() if r.get("ok")]

    wait_for(lambda: len(acked_seqs()) >= ACKED_BEFORE_FAULT, timeout_s=START_TIMEOUT_S,
             what="sends before the fault", alive=[*everyone, producer.proc])
    fault()
    last_before = max(acked_seqs())
    wait_for(lambda: sum(1 for seq in acked_seqs() if seq > last_before) >= ACKED_AFTER_FAULT,
             timeout_s=SETTLE_TIMEOUT_S, what="sends acknowledged after the fault", alive=[*everyone, producer.proc])
    producer.proc.stop()  # a send cut short may be stored unacknowledged: consumed, not required
    sent = producer.records()
    acked = {f"F-{r['seq']}" for r in sent if r.get("ok")}

    def consumed() -> list[str]:
        return [r["body"] for r in consumer.records() if "body" in r]

    try:
        wait_for(lambda: acked <= set(consumed()), timeout_s=SETTLE_TIMEOUT_S,
                 what="every acknowledged message consumed", alive=everyone)
    except TimeoutError:
        missing = sorted(acked - set(consumed()))
        pytest.fail(f"{len(missing)} of {len(acked)} acknowledged messages never consumed, e.g. {missing[:5]}")
    # consumption ends: everything stored was acknowledged by the consumer and the offsets say so
    wait_for(lambda: offsets_at_end(master_addr(), topic, group), timeout_s=SETTLE_TIMEOUT_S,
             what="the group's offsets at the end of every queue", alive=everyone)
    bodies = consumed()
    counts = {"acked_sends": len(acked), "failed_sends": sum(1 for r in sent if r.get("ok") is False),
              "consumed": len(bodies), "distinct": len(set(bodies)),
              "duplicates": len(bodies) - len(set(bodies))}
    print(f"pop across the fault: {counts}")
    return consumer


def test_push_consumer_across_a_master_sigkill_in_controller_mode(procs: ProcessGroup, sdk5_path: Path,
                                                                   tmp_path: Path) -> None:
    nemesis = NemesisGroup.start(procs)
    topic = f"TF_{uuid.uuid4().hex[:6]}"
    create_topic(nemesis.master().addr, topic, queues=QUEUES)
    wait_route(nemesis.ns.addr, topic, timeout_s=START_TIMEOUT_S)
    endpoints, proxy = start_proxy(procs, nemesis.ns.addr)
    old_master = nemesis.master_id()

    def fault() -> None:
        nemesis.round("kill-master", None, None)  # type: ignore[arg-type]  # no rng needed for kill-master

    run_traffic_across(procs, sdk5_path, tmp_path, endpoints, topic, fault, lambda: nemesis.master().addr,
                       [*nemesis.alive, proxy], f"gf_{uuid.uuid4().hex[:6]}")
    assert nemesis.master_id() != old_master


def test_push_consumer_across_a_classic_master_restart(procs: ProcessGroup, sdk5_path: Path,
                                                       tmp_path: Path) -> None:
    """Then once more with no traffic: the broker writes consumer offsets to disk only now and then
    (``flushConsumerOffsetInterval``), so a SIGKILL loses the last ones the proxy wrote; the proxy writes them
    again once the broker is back, or the group would show a lag that is not there and get acknowledged
    messages again after a proxy restart."""
    ns = start_namesrv(procs)
    broker = start_broker(procs, [ns.addr], flushConsumerOffsetInterval=OFFSETS_NEVER_FLUSHED_MS)
    topic, group = f"TR_{uuid.uuid4().hex[:6]}", f"gr_{uuid.uuid4().hex[:6]}"
    create_topic(broker.addr, topic, queues=QUEUES)
    wait_route(ns.addr, topic, timeout_s=START_TIMEOUT_S)
    endpoints, proxy = start_proxy(procs, ns.addr)

    def fault() -> None:
        broker.restart(kill=True)

    alive = [p for p in (ns.proc, proxy) if p is not None]
    consumer = run_traffic_across(procs, sdk5_path, tmp_path, endpoints, topic, fault, lambda: broker.addr,
                                  alive, group)
    consumed = len(consumer.records())
    broker.restart(kill=True)
    wait_for(lambda: offsets_at_end(broker.addr, topic, group), timeout_s=SETTLE_TIMEOUT_S,
             what="the proxy to write the group's offsets again", alive=[*alive, consumer.proc])
    assert len(consumer.records()) == consumed, "nothing is delivered again"
