"""The store's files at the edges, with real processes.

* File descriptors: a broker started under ``ulimit -n 256`` (soft and hard, so its raise to the hard limit
  changes nothing) while 1,000 idle client connections take every descriptor it has. A send to a new topic is
  either refused with SERVICE_NOT_AVAILABLE and a remark naming the cause, or acknowledged and readable at once;
  once the connections are gone every acknowledged message stays readable and new topics are accepted again,
  with no send needed to resume anything. Three hold/release cycles.
* Disk: on a small tmpfs filled by a filler file, every send is refused or acknowledged and readable (ASYNC_FLUSH:
  reads never wait for a flush), and after the filler is freed every acknowledged message is readable within a
  bounded wait with no further send; a queue's first message reserves one chunk of disk, not a whole file.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import (
    Broker,
    ProcessGroup,
    broker_props,
    ferry_argv,
    free_port,
    start_broker,
    start_namesrv,
    write_properties,
)
from tmpfs_support import small_tmpfs

from ferrymq.common.message_codec import iter_records
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from ferrymq.store.consume_queue import CQ_RESERVE_CHUNK_BYTES
from support.wire import Client, pull, send_v1

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(300)]

FD_LIMIT = 256
IDLE_CONNECTIONS = 1000
CYCLES = 3
SENDS_PER_PHASE = 20
#: bound on a message becoming readable (it is dispatched in the loop iteration of its send)
READABLE_WAIT_S = 10.0
#: bound on the broker taking every descriptor it can for the idle connections (it retries accept each second)
SATURATE_WAIT_S = 30.0

_LIMITED = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (%d, %d)); "
            "os.execvp(sys.argv[1], sys.argv[1:])")


class LimitedBroker(Broker):
    """A broker process started with RLIMIT_NOFILE = ``FD_LIMIT`` (soft and hard)."""

    def start(self, *, timeout_s: float = 60.0) -> Broker:
        self.starts += 1
        argv = [sys.executable, "-c", _LIMITED % (FD_LIMIT, FD_LIMIT), *ferry_argv("broker", "-c", str(self.conf_path))]
        self.proc = self.group.spawn(f"{self.name}-run{self.starts}", argv)
        self.wait_ready(timeout_s=timeout_s)
        return self


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _wait_readable(client: Client, topic: str, queue_offset: int = 0,
                         timeout_s: float = READABLE_WAIT_S) -> str:
    """The message of ``topic`` queue 0 at ``queue_offset`` as PULL serves it: its body; fails after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        resp = await client.call(int(RequestCode.PULL_MESSAGE),
                                 pull(topic, group="cg", offset=queue_offset, sys_flag=4, suspend_ms=0, max_msgs=1))
        if resp.code == R.SUCCESS:
            (msg,) = list(iter_records(resp.body))
            return msg.body.decode()
        last = (resp.code, resp.remark)
        assert time.monotonic() < deadline, f"{topic}: acknowledged but not readable: {last}"
        await asyncio.sleep(0.05)


async def _create_topics(client: Client, prefix: str, count: int) -> list[str]:
    """UPDATE_AND_CREATE_TOPIC for ``count`` topics (while descriptors are free: the topic table's journal needs
    one); none has a consume queue file yet."""
    topics = [f"{prefix}{i}" for i in range(count)]
    for topic in topics:
        resp = await client.call(int(RequestCode.UPDATE_AND_CREATE_TOPIC), {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"})
        assert resp.code == R.SUCCESS, (topic, resp.code, resp.remark)
    return topics


async def _send_new_topics(client: Client, topics: list[str]) -> tuple[list[str], list[str]]:
    """A first message to each of ``topics``: (acknowledged topics, remarks of refusals). Every acknowledged
    message is readable at once; every refusal is SERVICE_NOT_AVAILABLE naming its cause."""
    acked: list[str] = []
    refused: list[str] = []
    for topic in topics:
        resp = await client.call(int(RequestCode.SEND_MESSAGE), send_v1(topic, 0, ""), topic.encode())
        if resp.code == R.SUCCESS:
            assert await _wait_readable(client, topic) == topic
            acked.append(topic)
        else:
            remark = resp.remark or ""
            assert resp.code == R.SERVICE_NOT_AVAILABLE and "too many open files" in remark, (topic, resp.code, remark)
            refused.append(remark)
    return acked, refused


def _idle_connections(port: int, count: int) -> list[socket.socket]:
    """``count`` connections to 127.0.0.1:port that send nothing (non-blocking connects: those the broker cannot
    accept wait in its backlog)."""
    socks = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    return socks


@pytest.fixture
def many_fds() -> Iterator[None]:
    """This test process holds the 1,000 client ends: its own soft limit must allow them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = IDLE_CONNECTIONS + 256
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the test needs {need} file descriptors (hard limit {hard})")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_descriptor_exhaustion_refuses_or_serves_and_resumes_by_itself(procs: ProcessGroup, many_fds: None) -> None:
    ns = start_namesrv(procs)
    port = free_port(broker=True)
    store_dir = procs.base_dir / "broker-store"
    store_dir.mkdir()
    props = broker_props(namesrv_addrs=[ns.addr], store_dir=store_dir, port=port)
    broker = LimitedBroker(group=procs, name="broker", conf_path=write_properties(procs.base_dir / "broker.conf",
                                                                                   props),
                           props=props, namesrv_addrs=[ns.addr])
    broker.start()
    assert broker.proc is not None
    pid = broker.proc.pid

    async def scenario() -> tuple[int, int]:
        client = await Client().open(broker.addr)  # opened before the descriptors run out
        acked_total = refused_total = 0
        all_acked: list[str] = []
        try:
            for cycle in range(CYCLES):
                held_topics = await _create_topics(client, f"Fd{cycle}x{uuid.uuid4().hex[:4]}t", SENDS_PER_PHASE)
                free_topics = await _create_topics(client, f"Free{cycle}x{uuid.uuid4().hex[:4]}t", 5)
                idle = _idle_connections(broker.port, IDLE_CONNECTIONS)
                try:
                    deadline = time.monotonic() + SATURATE_WAIT_S
                    while _open_fds(pid) < FD_LIMIT - 2:
                        assert time.monotonic() < deadline, f"broker holds only {_open_fds(pid)} descriptors"
                        await asyncio.sleep(0.1)
                    acked, refused = await _send_new_topics(client, held_topics)
                    all_acked += acked
                    acked_total += len(acked)
                    refused_total += len(refused)
                    for topic in all_acked:  # still served while the connections are held
                        assert await _wait_readable(client, topic) == topic
                finally:
                    for s in idle:
                        s.close()
                deadline = time.monotonic() + SATURATE_WAIT_S
                while _open_fds(pid) > FD_LIMIT // 2:
                    assert time.monotonic() < deadline, "the broker kept the closed connections"
                    await asyncio.sleep(0.1)
                for topic in all_acked:  # everything acknowledged is served, no send needed
                    assert await _wait_readable(client, topic) == topic
                acked, refused = await _send_new_topics(client, free_topics)
                assert len(acked) == 5, refused
                all_acked += acked
        finally:
            client.close()
        return acked_total, refused_total

    acked_total, refused_total = asyncio.run(scenario())
    sys.stdout.write(f"\nwhile the descriptors were spent: {acked_total} sends acknowledged and readable, "
                     f"{refused_total} refused\n")
    assert acked_total + refused_total == CYCLES * SENDS_PER_PHASE
    assert broker.proc.returncode is None
    assert "Traceback" not in broker.proc.log_text()


# --- disk ----------------------------------------------------------------------------------------------------

TMPFS_MB = 48
FULL_ROUNDS = 3


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, TMPFS_MB) as mount_point:
        yield mount_point


def _fill(path: Path) -> None:
    """Write ``path`` until the file system is full (1 MiB writes, then 4 KiB ones for the rest)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (1 << 20, 4096):
            chunk = b"\xff" * size
            try:
                while os.write(fd, chunk) > 0:
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


def test_full_disk_acknowledged_sends_become_readable_without_another_send(procs: ProcessGroup,
                                                                            small_disk: Path) -> None:
    ns = start_namesrv(procs)
    store = small_disk / "store"
    broker = start_broker(procs, [ns.addr], storePathRootDir=str(store), mappedFileSizeCommitLog=4 * 1024 * 1024,
                          flushDiskType="ASYNC_FLUSH", diskSpaceWarningLevelRatio=99,
                          diskMaxUsedSpaceRatio=99, diskSpaceCleanForciblyRatio=99)
    assert broker.proc is not None

    async def scenario() -> None:
        client = await Client().open(broker.addr)
        acked: list[tuple[str, int, str]] = []  # (topic, queue offset, body)
        next_offset: dict[str, int] = {}

        async def send(topic: str) -> RemotingCommand:
            body = f"{topic}-{next_offset.get(topic, 0)}"
            resp = await client.call(int(RequestCode.SEND_MESSAGE), send_v1(topic, 0, ""), body.encode())
            if resp.code == R.SUCCESS:
                offset = next_offset.get(topic, 0)
                assert int(resp.ext_fields["queueOffset"]) == offset
                next_offset[topic] = offset + 1
                acked.append((topic, offset, body))
                # served at once, also while the disk is full (ASYNC_FLUSH: reads never wait for a flush)
                assert await _wait_readable(client, topic, offset) == body
            else:
                assert resp.code == R.SERVICE_NOT_AVAILABLE and "disk" in (resp.remark or ""), (resp.code, resp.remark)
            return resp

        try:
            # a queue's first message reserves one chunk of its file's blocks, not the whole file
            (first,) = await _create_topics(client, f"One{uuid.uuid4().hex[:6]}t", 1)
            assert (await send(first)).code == R.SUCCESS
            (cq_file,) = (store / "consumequeue" / first / "0").iterdir()
            assert os.path.getsize(cq_file) == 6_000_000
            assert os.stat(cq_file).st_blocks * 512 <= CQ_RESERVE_CHUNK_BYTES
            for round_ in range(FULL_ROUNDS):
                # topics created while there is room (the topic table needs some); no consume queue file yet
                fresh = await _create_topics(client, f"Full{round_}x{uuid.uuid4().hex[:4]}t", 30)
                filler = small_disk / f"filler-{round_}"
                _fill(filler)
                refused = 0
                for topic in fresh:  # a new consume queue file each, on the full disk
                    if (await send(topic)).code != R.SUCCESS:
                        refused += 1
                for _ in range(20):  # a queue whose reserved chunk still has room
                    assert (await send(first)).code in (R.SUCCESS, R.SERVICE_NOT_AVAILABLE)
                assert refused > 0, "the disk never filled"
                filler.unlink()
                for topic, offset, body in acked:  # every acknowledged message readable, no further send
                    assert await _wait_readable(client, topic, offset) == body
                deadline = time.monotonic() + 20
                while (await send(fresh[-1])).code != R.SUCCESS:  # and sends are accepted again by themselves
                    assert time.monotonic() < deadline, "sends still refused after the disk was freed"
                    await asyncio.sleep(0.2)
            for topic, offset, body in acked:
                assert await _wait_readable(client, topic, offset) == body
        finally:
            client.close()

    asyncio.run(scenario())
    assert broker.proc.returncode is None
    assert "Traceback" not in broker.proc.log_text()
