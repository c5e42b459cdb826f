"""A full disk under a real SYNC_FLUSH broker: it never crashes (every file it writes through a memory map has
its blocks reserved first), refuses sends with SERVICE_NOT_AVAILABLE and a clear remark, keeps serving
reads, and accepts sends again by itself when space returns. Three fill/free cycles on an 80 MB tmpfs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import ProcessGroup, request, start_broker, start_namesrv
from tmpfs_support import small_tmpfs

from ferrymq.common.message_codec import encode_batch_body, iter_records
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from support.wire import pull, send_v1

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]

TMPFS_MB = 80
FILLER_MB = 12
FILLERS = 3
CYCLES = 3
#: sends per cycle before the disk must have filled (bounds the loop)
MAX_BATCHES_PER_CYCLE = 2000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, TMPFS_MB) as mount_point:
        yield mount_point


def test_full_disk_refuses_sends_serves_reads_and_recovers(procs: ProcessGroup, small_disk: Path) -> None:
    fillers = []
    for i in range(FILLERS):
        path = small_disk / f"filler-{i}"
        with open(path, "wb") as fh:
            fh.write(b"\xff" * (FILLER_MB * 1024 * 1024))
        fillers.append(path)
    ns = start_namesrv(procs)
    broker = start_broker(procs, [ns.addr], storePathRootDir=str(small_disk / "store"),
                          mappedFileSizeCommitLog=4 * 1024 * 1024, mappedFileSizeConsumeQueue=20 * 20_000,
                          flushDiskType="SYNC_FLUSH", cleanFileForciblyEnable="false")
    assert broker.proc is not None
    topic = f"Full{uuid.uuid4().hex[:6]}"
    batch = encode_batch_body([(0, bytes([i]) * 1024, "") for i in range(64)])
    acked = 0
    for cycle in range(CYCLES):
        refused = None
        for _ in range(MAX_BATCHES_PER_CYCLE):
            resp = request(broker.addr, int(RequestCode.SEND_BATCH_MESSAGE), send_v1(topic, 0, ""), batch)
            if resp.code == R.SUCCESS:
                acked += 64
                continue
            refused = resp
            break
        assert refused is not None, f"cycle {cycle}: the disk never filled"
        assert refused.code == R.SERVICE_NOT_AVAILABLE, (refused.code, refused.remark)
        assert "disk" in (refused.remark or ""), refused.remark
        assert broker.proc.returncode is None, "the broker died on a full disk"
        # reads go on: the newest acknowledged message is served
        last = request(broker.addr, int(RequestCode.PULL_MESSAGE),
                       pull(topic, offset=acked - 1, sys_flag=4, max_msgs=1))
        assert last.code == R.SUCCESS, (last.code, last.remark)
        (msg,) = list(iter_records(last.body))
        assert msg.queue_offset == acked - 1 and len(msg.body) == 1024
        # space returns: sends are accepted again without a restart
        fillers.pop().unlink()
        deadline = time.monotonic() + 20
        while True:
            resp = request(broker.addr, int(RequestCode.SEND_BATCH_MESSAGE), send_v1(topic, 0, ""), batch)
            if resp.code == R.SUCCESS:
                acked += 64
                break
            assert time.monotonic() < deadline, f"cycle {cycle}: sends still refused: {resp.remark}"
            time.sleep(0.2)
    assert broker.proc.returncode is None
    assert "Traceback" not in broker.proc.log_text()
