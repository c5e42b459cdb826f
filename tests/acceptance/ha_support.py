"""HA acceptance helpers: a namesrv + master + slave of real ``ferry`` processes, commit log and
queue comparisons, raw pulls from the slave. Waits are condition polls with deadlines (procs.wait_for)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procs import (
    LOOPBACK,
    Broker,
    Namesrv,
    ProcessGroup,
    json_body,
    request,
    start_broker,
    start_namesrv,
    wait_for,
)

from ferrymq.common.message_codec import iter_records
from ferrymq.remoting.codes import RequestCode, ResponseCode

#: small segments: 10,000 messages cross several of them
HA_SEGMENT_BYTES = 1024 * 1024
PULL_BATCH = 32


@dataclass
class HAPair:
    group: ProcessGroup
    namesrv: Namesrv
    master: Broker
    slave: Broker

    @property
    def ns_addr(self) -> str:
        return self.namesrv.addr

    @property
    def alive(self) -> list[Any]:
        return [p.proc for p in (self.master, self.slave) if p.proc is not None and not p.proc.exited] + [
            self.namesrv.proc
        ]


def start_ha_pair(procs: ProcessGroup, *, role: str = "SYNC_MASTER", **props: Any) -> HAPair:
    """A namesrv, a master (``role``) and its slave (brokerId 1, haMasterAddress set)."""
    props.setdefault("mappedFileSizeCommitLog", HA_SEGMENT_BYTES)
    ns = start_namesrv(procs)
    master = start_broker(procs, [ns.addr], name="master", brokerRole=role, **props)
    slave = start_broker(
        procs,
        [ns.addr],
        name="slave",
        brokerId=1,
        brokerRole="SLAVE",
        haMasterAddress=f"{LOOPBACK}:{master.port + 1}",
        **props,
    )
    return HAPair(procs, ns, master, slave)


def runtime_info(addr: str) -> dict[str, str]:
    resp = request(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
    if resp.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"GET_BROKER_RUNTIME_INFO -> {resp.code}")
    return dict((json_body(resp) or {}).get("table") or {})


def max_phy_offset(addr: str) -> int:
    return int(runtime_info(addr)["commitLogMaxOffset"])


def wait_slave_caught_up(pair: HAPair, *, timeout_s: float = 60.0) -> int:
    """Wait until the slave's commit log max equals the master's; return that offset."""

    def same() -> int | None:
        m = max_phy_offset(pair.master.addr)
        s = max_phy_offset(pair.slave.addr)
        return m if m == s else None

    return int(
        wait_for(same, timeout_s=timeout_s, what="slave to catch up with the master", alive=pair.alive)
    )


def commit_log_bytes(store_dir: Path, end: int) -> bytes:
    """Concatenated commit log segment files of ``store_dir`` from their first offset up to ``end``."""
    files = sorted((store_dir / "commitlog").iterdir(), key=lambda p: int(p.name))
    out = bytearray()
    for f in files:
        start = int(f.name)
        if start >= end:
            break
        data = f.read_bytes()
        out += data[: min(len(data), end - start)]
    return bytes(out)


def first_segment_offset(store_dir: Path) -> int:
    return min(int(p.name) for p in (store_dir / "commitlog").iterdir())


async def _pull_all(addr: str, topic: str, queue_id: int, start: int, end: int) -> list[Any]:
    from ferrymq.remoting.codec import RemotingCommand
    from ferrymq.remoting.connection import connect

    conn = await connect(addr, timeout_ms=3000)
    msgs: list[Any] = []
    try:
        offset = start
        while offset < end:
            cmd = RemotingCommand.request(
                RequestCode.PULL_MESSAGE,
                {
                    "consumerGroup": "ha-acceptance",
                    "topic": topic,
                    "queueId": str(queue_id),
                    "queueOffset": str(offset),
                    "maxMsgNums": str(PULL_BATCH),
                    "sysFlag": "4",  # FLAG_SUBSCRIPTION only: no suspend, no commit
                    "commitOffset": "0",
                    "suspendTimeoutMillis": "0",
                    "subscription": "*",
                    "subVersion": "0",
                },
            )
            resp = await conn.invoke(cmd, 5000)
            if resp.code != ResponseCode.SUCCESS:
                raise AssertionError(
                    f"pull {topic}/{queue_id}@{offset} from {addr} -> {resp.code} {resp.remark}"
                )
            got = list(iter_records(resp.body or b""))
            assert got, f"empty FOUND pull at {offset}"
            msgs.extend(got)
            offset = msgs[-1].queue_offset + 1
    finally:
        conn.close()
    return msgs


def pull_queue(addr: str, topic: str, queue_id: int, start: int, end: int) -> list[Any]:
    """Every message of queue ``queue_id`` in [start, end) pulled from ``addr``, in order."""
    return asyncio.run(_pull_all(addr, topic, queue_id, start, end))


def queue_max_offsets(addr: str, topic: str, queues: int) -> list[int]:
    from procs import max_offset

    return [max_offset(addr, topic, q) for q in range(queues)]
