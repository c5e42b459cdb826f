"""Timer messages against retention on a real broker process: 4 KiB commit log segments, a forced cleanup every
second that deletes the oldest segment whatever its age (cleanFileForciblyEnable above a 1% disk ratio), plain
traffic all along, a roll window of 1 s. Pending timer messages outlive the deletion of every segment their
records were first written to (they were rolled to the log's end), a SIGKILL between a roll and the next
checkpoint save, and are each delivered once. Before rolling and the retention pin, the forced cleanup deleted the
pending records and the messages were lost."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from procs import ProcessGroup, json_body, request, start_broker, start_namesrv, wait_for

from ferrymq.common.message import decode_offset_msg_id
from ferrymq.common.message_codec import iter_records
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from support.ports import port_free
from support.wire import pull, send_v1

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]

TOPIC = "TimerKept"
FILLER = "TimerFiller"
MESSAGES = 16
#: the messages are due this long after the send (the kill and restart come before)
DUE_MS = 9_000


def _min_phy(addr: str) -> int:
    resp = request(addr, RequestCode.GET_BROKER_RUNTIME_INFO, timeout_ms=2000)
    return int(((json_body(resp) or {}).get("table") or {}).get("commitLogMinOffset", -1))


class Filler:
    """Plain sends of 600 B in a thread (new segments for the cleanup to delete); errors while the broker is down
    are ignored."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.stopped = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(0.02):
            try:
                if request(self.addr, int(RequestCode.SEND_MESSAGE), send_v1(FILLER), b"f" * 600,
                           timeout_ms=2000).code == R.SUCCESS:
                    self.sent += 1
            except Exception:
                time.sleep(0.1)

    def __enter__(self) -> Filler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)


class Deliveries:
    """What reached TOPIC, by UNIQ_KEY, pulled as it arrives (the cleanup deletes old copies too)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.next_offset = 0

    def poll(self, addr: str) -> Counter[str]:
        for _ in range(10):
            resp = request(addr, int(RequestCode.PULL_MESSAGE),
                           pull(TOPIC, offset=self.next_offset, sys_flag=4, suspend_ms=0, max_msgs=64))
            if resp.code != R.SUCCESS:
                break
            msgs = list(iter_records(resp.body))
            for msg in msgs:
                self.counts[msg.properties["UNIQ_KEY"]] += 1
            self.next_offset = int(resp.ext_fields.get("nextBeginOffset", self.next_offset))
            if not msgs:
                break
        return self.counts


def test_pending_timer_messages_outlive_forced_cleanups_and_a_sigkill(procs: ProcessGroup) -> None:
    ns = start_namesrv(procs)
    broker = start_broker(procs, [ns.addr], mappedFileSizeCommitLog=4096, cleanFileForciblyEnable="true",
                          diskSpaceCleanForciblyRatio=1, diskMaxUsedSpaceRatio=1, timerRollWindowSec=1,
                          flushDelayOffsetInterval=300)
    assert request(broker.addr, int(RequestCode.SEND_MESSAGE), send_v1(FILLER), b"first").code == R.SUCCESS
    due_ms = int(time.time() * 1000) + DUE_MS
    original_phys = []
    for i in range(MESSAGES):
        props = f"UNIQ_KEY\x01K{i}\x02TIMER_DELIVER_MS\x01{due_ms + 50 * i}\x02"
        resp = request(broker.addr, int(RequestCode.SEND_MESSAGE), send_v1(TOPIC, 0, props), b"t" * 300)
        assert resp.code == R.SUCCESS, (resp.code, resp.remark)
        original_phys.append(decode_offset_msg_id(resp.ext_fields["msgId"])[2])
    deliveries = Deliveries()
    alive: list[Any] = [ns.proc]
    with Filler(broker.addr) as filler:
        # every segment a pending record was first written to is deleted, the messages still pending
        wait_for(lambda: _min_phy(broker.addr) > max(original_phys), timeout_s=DUE_MS / 1000 - 3,
                 what="the forced cleanup past the original records", alive=[*alive, broker.proc])
        assert time.time() * 1000 < due_ms - 1_000, "too slow: the messages are due before the kill"
        assert not deliveries.poll(broker.addr)
        broker.kill()  # rolls since the last checkpoint save (300 ms) are read back twice by the rebuild
        wait_for(lambda: port_free(broker.port), timeout_s=30, what="the killed broker's port")
        broker.start()
        got = wait_for(lambda: (lambda c: c if len(c) == MESSAGES else None)(deliveries.poll(broker.addr)),
                       timeout_s=DUE_MS / 1000 + 30, interval_s=0.05, what="every timer message delivered",
                       alive=[*alive, broker.proc])
        min_phy_at_end = _min_phy(broker.addr)
    duplicates = sum(n - 1 for n in got.values())
    print(f"filler sends {filler.sent}, commit log min offset {min_phy_at_end} (originals up to "
          f"{max(original_phys)}), duplicates {duplicates}")
    assert set(got) == {f"K{i}" for i in range(MESSAGES)}
    assert duplicates == 0, got
