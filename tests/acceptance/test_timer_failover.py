"""Timer messages on real processes: a 3 s timer message survives a SIGKILL of its broker and is delivered at its
time (the restart takes less than the delay) or right after the restart (a restart after its time); a recall and
the delivery progress survive the SIGKILL too; a slave copies the timer checkpoint, and the slave made master
delivers the pending messages, not the delivered ones again."""

from __future__ import annotations

import time
from typing import Any

import pytest
from ha_support import wait_caught_up
from procs import (
    Broker,
    ProcessGroup,
    request,
    start_broker,
    start_namesrv,
    wait_for,
    write_properties,
)

from ferrymq.common.message_codec import iter_records
from ferrymq.remoting import jsonx
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from support.ports import port_free
from support.wire import pull, send_v1

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]

DELAY_MS = 3_000
#: how far from its time a message may be delivered (the wake-up timer's precision on a loaded machine)
ON_TIME_MS = 500
#: the checkpoint is persisted (and copied by a slave) this often in these tests
PERSIST_MS = 300


def _send_timer(addr: str, topic: str, uniq: str, deliver_ms: int) -> dict[str, str]:
    props = f"UNIQ_KEY\x01{uniq}\x02TIMER_DELIVER_MS\x01{deliver_ms}\x02"
    resp = request(addr, int(RequestCode.SEND_MESSAGE), send_v1(topic, 0, props), uniq.encode())
    assert resp.code == R.SUCCESS, (resp.code, resp.remark)
    assert resp.ext_fields.get("recallHandle"), "a timer message answers its recall handle"
    return resp.ext_fields


def _delivered(addr: str, topic: str) -> list[Any]:
    resp = request(addr, int(RequestCode.PULL_MESSAGE), pull(topic, offset=0, sys_flag=4, suspend_ms=0))
    return list(iter_records(resp.body)) if resp.code == R.SUCCESS else []


def _checkpoint(addr: str) -> dict[str, Any]:
    resp = request(addr, int(RequestCode.GET_TIMER_CHECK_POINT))
    assert resp.code == R.SUCCESS, resp.remark
    return dict(jsonx.loads(resp.body))


def _saved_offset(broker: Broker) -> int:
    path = broker.store_dir / "config" / "timerCheckpoint.json"
    return int(jsonx.loads(path.read_bytes())["queueOffset"]) if path.exists() else -1


def _barrier(broker: Broker, topic: str, count: int) -> None:
    """A timer message due in 200 ms, delivered: the pending set was rebuilt and every message due before it
    (a wrong redelivery of an older one included) was delivered first."""
    _send_timer(broker.addr, topic, "barrier", int(time.time() * 1000) + 200)
    msgs = _wait_delivered(broker, topic, count, timeout_s=30)
    assert msgs[-1].properties["UNIQ_KEY"] == "barrier", [m.properties["UNIQ_KEY"] for m in msgs]


def _wait_delivered(broker: Broker, topic: str, count: int, timeout_s: float) -> list[Any]:
    assert broker.proc is not None
    return wait_for(lambda: (lambda got: got if len(got) >= count else None)(_delivered(broker.addr, topic)),
                    timeout_s=timeout_s, interval_s=0.02, what=f"{count} message(s) in {topic}", alive=[broker.proc])


def test_timer_message_survives_sigkill_and_is_delivered_on_time(procs: ProcessGroup) -> None:
    """Each round: a 3 s timer message and a recalled one, SIGKILL, restart. "quick" rounds restart at once (the
    message is due after the restart: delivered at its time ± ON_TIME_MS; a round whose restart took longer than
    the delay, on a loaded machine, is only held to the bound below and does not count as measured); the "down"
    round stays down past the delivery time (delivered within ON_TIME_MS of the restart)."""
    ns = start_namesrv(procs)
    broker = start_broker(procs, [ns.addr], flushDelayOffsetInterval=PERSIST_MS)
    topic = "TimerAcc"
    measured_ms: list[int] = []
    rounds = ["quick", "quick", "down"]
    for rnd, mode in enumerate(rounds):
        deliver_ms = int(time.time() * 1000) + DELAY_MS
        _send_timer(broker.addr, topic, f"keep-{rnd}", deliver_ms)
        recalled = _send_timer(broker.addr, topic, f"recall-{rnd}", deliver_ms)
        got = request(broker.addr, int(RequestCode.RECALL_MESSAGE),
                      {"producerGroup": "pg", "topic": topic, "recallHandle": recalled["recallHandle"]})
        assert got.code == R.SUCCESS, got.remark
        broker.kill()
        if mode == "down":
            wait_for(lambda due=deliver_ms: time.time() * 1000 > due + 500, timeout_s=10, what="the delivery time")
        wait_for(lambda: port_free(broker.port), timeout_s=30, what="the killed broker's port")
        broker.start()
        ready_ms = time.time() * 1000
        msgs = _wait_delivered(broker, topic, rnd + 1, timeout_s=DELAY_MS / 1000 + 30)
        msg = msgs[rnd]
        assert msg.properties["UNIQ_KEY"] == f"keep-{rnd}"
        late_ms = msg.store_timestamp - deliver_ms
        print(f"round {rnd} ({mode}): delivered {late_ms} ms after its time, the restarted broker ready "
              f"{ready_ms - deliver_ms:.0f} ms after it")
        assert late_ms >= 0, f"round {rnd}: delivered {-late_ms} ms early"
        assert msg.store_timestamp - max(deliver_ms, ready_ms) < ON_TIME_MS, f"round {rnd}: {late_ms} ms late"
        if mode == "quick" and ready_ms < deliver_ms:
            measured_ms.append(late_ms)
        # the progress is persisted (past the message, the recalled one and its marker): a SIGKILL now delivers
        # neither message again
        wait_for(lambda done=3 * (rnd + 1): _saved_offset(broker) == done, timeout_s=10,
                 what="the persisted timer checkpoint", alive=[broker.proc])
    assert measured_ms, "every restart took longer than the delay: nothing was measured"
    broker.kill()
    wait_for(lambda: port_free(broker.port), timeout_s=30, what="the killed broker's port")
    broker.start()
    _barrier(broker, topic, len(rounds) + 1)
    assert [m.properties["UNIQ_KEY"] for m in _delivered(broker.addr, topic)] == \
        [f"keep-{i}" for i in range(len(rounds))] + ["barrier"]


def test_a_slave_made_master_delivers_the_pending_timer_messages_once(procs: ProcessGroup) -> None:
    ns = start_namesrv(procs)
    props: dict[str, Any] = {"flushDelayOffsetInterval": PERSIST_MS, "slaveSyncInterval": 1_000}
    master = start_broker(procs, [ns.addr], name="master", **props)
    slave = start_broker(procs, [ns.addr], name="slave", brokerId=1, brokerRole="SLAVE",
                         haMasterAddress=f"127.0.0.1:{master.port + 1}", **props)
    topic = "TimerHa"
    now_ms = int(time.time() * 1000)
    _send_timer(master.addr, topic, "early", now_ms + 1_000)
    late_ms = now_ms + 12_000
    _send_timer(master.addr, topic, "late", late_ms)
    _wait_delivered(master, topic, 1, timeout_s=30)

    class _Pair:
        pass

    pair: Any = _Pair()
    pair.master, pair.slave = master, slave
    pair.alive = [p for p in (ns.proc, master.proc, slave.proc) if p is not None]
    wait_caught_up(pair)
    # the slave copied the checkpoint past the delivered message
    wait_for(lambda: _checkpoint(slave.addr)["queueOffset"] >= 1, timeout_s=15, what="the slave's timer checkpoint",
             alive=pair.alive)
    assert time.time() * 1000 < late_ms - 4_000, "too slow to promote before the late message is due"
    master.kill()
    slave.stop()
    wait_for(lambda: port_free(slave.port), timeout_s=30, what="the slave's port")
    slave.props.update(brokerId=0, brokerRole="ASYNC_MASTER")
    slave.props.pop("haMasterAddress")
    write_properties(slave.conf_path, slave.props)
    slave.start()
    msgs = _wait_delivered(slave, topic, 2, timeout_s=30)
    assert [m.properties["UNIQ_KEY"] for m in msgs] == ["early", "late"]
    assert msgs[1].store_timestamp >= late_ms
    assert msgs[1].store_timestamp - late_ms < ON_TIME_MS
    _barrier(slave, topic, 3)  # and the early one was not delivered again
