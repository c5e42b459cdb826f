"""Restart after SIGKILL, then pull at once: the first pull finds the messages (never PULL_OFFSET_MOVED), and
keeps finding them once the broker's disk check has run (the forced cleanup above diskSpaceCleanForciblyRatio
deleted the oldest segment of a young, unconsumed log: queue min offset > 0, every pull at 0 answered 21).
Ten rounds of write, SIGKILL, restart, pull, on a disk that reads as past the forced-cleanup ratio."""

from __future__ import annotations

import pytest
from procs import ProcessGroup, request, start_broker, start_namesrv

from ferrymq.common.message_codec import encode_batch_body
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from support.wire import pull, send_v1

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(280)]

TOPIC = "RestartPull"
ROUNDS = 10
PER_ROUND = 200
BATCH = 50
BODY = b"r" * 1000
SEGMENT_BYTES = 128 * 1024
#: the broker logs this when its forced cleanup declines to delete (proof that the disk check ran)
DECLINED = "no commit log segment is both older"


def _pull_at_zero(addr: str) -> tuple[int, int]:
    resp = request(addr, int(RequestCode.PULL_MESSAGE), pull(TOPIC, offset=0, sys_flag=4, suspend_ms=0, max_msgs=4))
    return resp.code, int(resp.ext_fields.get("minOffset", -1))


def test_pull_right_after_sigkill_restart_never_answers_offset_moved(procs: ProcessGroup) -> None:
    ns = start_namesrv(procs)
    # every disk reads as past the forced-cleanup ratio; sends are refused only on a 99% full disk
    broker = start_broker(procs, [ns.addr], mappedFileSizeCommitLog=SEGMENT_BYTES, diskMaxUsedSpaceRatio=99,
                          diskSpaceCleanForciblyRatio=1, diskSpaceWarningLevelRatio=99)
    sent = 0
    for rnd in range(ROUNDS):
        for _ in range(PER_ROUND // BATCH):
            body = encode_batch_body([(0, BODY, "") for _ in range(BATCH)])
            resp = request(broker.addr, int(RequestCode.SEND_BATCH_MESSAGE), send_v1(TOPIC, 0, ""), body)
            assert resp.code == R.SUCCESS, (rnd, resp.code, resp.remark)
        sent += PER_ROUND
        broker.kill()
        broker.start()
        code, min_offset = _pull_at_zero(broker.addr)
        assert (code, min_offset) == (R.SUCCESS, 0), f"round {rnd}: first pull after the restart"
        assert broker.proc is not None
        broker.proc.wait_log(DECLINED, timeout_s=30)  # the disk check ran on this process
        code, min_offset = _pull_at_zero(broker.addr)
        assert (code, min_offset) == (R.SUCCESS, 0), f"round {rnd}: pull after the disk check"
        resp = request(broker.addr, int(RequestCode.GET_MAX_OFFSET), {"topic": TOPIC, "queueId": 0})
        assert int(resp.ext_fields["offset"]) == sent
    assert sent * len(BODY) > 4 * SEGMENT_BYTES, "the log spans several segments"
