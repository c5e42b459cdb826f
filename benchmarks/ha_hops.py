"""Python cost of each hop of a classic SYNC_MASTER send, in one process, without sockets.

A real master store and a real slave store (temporary directories), the master's ``_SlaveLink`` and the
slave's ``_MasterLink`` wired through fake transports: each round puts one message into the master store
(not timed), then times

* push: ``notify_data_appended()`` until the transfer is written (inline from the put, or at the loop's
  next iteration, whichever the tree does: the time until the bytes reach the transport);
* slave: the transfer handed to the slave link (``get_buffer`` / ``buffer_updated``) until its 8-byte
  report is written (append included);
* ack: the report handed to the master link (``data_received``) until the waiting send's
  ``on_slave_ack`` callback ran.

No syscalls are counted: these are the Python parts of the round trip, the part a change in ``ferrymq.ha``
moves. Usage::

    python benchmarks/ha_hops.py [--rounds 20000] [--size 1024] [--repeats 5]

Run two trees interleaved with ``PYTHONPATH=<tree>/src`` to compare them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ferrymq.common.message import MessageExtBrokerInner, properties_to_string
from ferrymq.ha.client import HAClient, _MasterLink
from ferrymq.ha.service import HAService, _SlaveLink
from ferrymq.ha.slave_conn import SlaveConnection
from ferrymq.store.config import BrokerRole, StoreConfig
from ferrymq.store.message_store import MessageStore

SEGMENT = 64 * 1024 * 1024


class Wire:
    """A transport that keeps what was written for the test to hand to the peer."""

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def writelines(self, datas: list[bytes]) -> None:
        self.out.extend(datas)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def take(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data


def open_store(root: Path, role: BrokerRole) -> MessageStore:
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
                      mapped_file_size_consume_queue=20 * 100_000, broker_role=role,
                      index_hash_slot_num=1024, index_max_num=8192, total_memory_bytes=1 << 30)
    store = MessageStore(cfg)
    store.load()
    return store


async def run(rounds: int, size: int) -> dict[str, float]:
    ns = time.perf_counter_ns
    with tempfile.TemporaryDirectory(prefix="ha-hops-") as tmp:
        mstore = open_store(Path(tmp) / "m", BrokerRole.SYNC_MASTER)
        sstore = open_store(Path(tmp) / "s", BrokerRole.SLAVE)
        service = HAService(mstore, listen_host="127.0.0.1", listen_port=0)
        service._loop = asyncio.get_running_loop()
        service._loop_thread_id = threading.get_ident()
        service.started = True
        mwire, swire = Wire(), Wire()
        mlink = _SlaveLink(service)
        mlink.connection_made(mwire)  # type: ignore[arg-type]
        client = HAClient(sstore)
        client._transport = swire  # type: ignore[assignment]
        slink = _MasterLink(client)
        proto = SlaveConnection(client._view, now_ms=client._clock_ms(), config=client._config)
        client._proto = proto
        slink.attach(proto)  # the first report
        mlink.data_received(swire.take())
        for _ in range(100):
            if mlink._wake is not None:
                break
            await asyncio.sleep(0)

        def feed_slave(data: bytes) -> None:
            pos = 0
            while pos < len(data):
                region = slink.get_buffer(-1)
                n = min(len(region), len(data) - pos)
                region[:n] = data[pos:pos + n]
                pos += n
                slink.buffer_updated(n)

        body = b"x" * size
        props = properties_to_string({"UNIQ_KEY": "U0", "WAIT": "true"})
        push: list[int] = []
        slave: list[int] = []
        ack: list[int] = []
        answered: list[bool] = []
        for i in range(rounds):
            res = mstore.put_message(MessageExtBrokerInner(topic="HaHops", queue_id=i % 4, body=body,
                                                           properties_string=props, born_timestamp=i))
            ar = res.append_result
            end = ar.wrote_offset + ar.wrote_bytes
            t0 = ns()
            service.notify_data_appended()
            if not mwire.out:
                await asyncio.sleep(0)  # a tree that pushes at the loop's next iteration
            t1 = ns()
            feed_slave(mwire.take())
            t2 = ns()
            service.on_slave_ack(end, 5000, answered.append)
            t3 = ns()
            mlink.data_received(swire.take())
            t4 = ns()
            assert answered and answered[-1] is True, "the ack did not release the send"
            answered.clear()
            push.append(t1 - t0)
            slave.append(t2 - t1)
            ack.append(t4 - t3)
            if i % 512 == 0:
                mstore.reput()
                sstore.reput()
        mlink.close()
        await asyncio.gather(*mlink.tasks, return_exceptions=True)
        mstore.shutdown()
        sstore.shutdown()
    med = statistics.median
    return {"push": med(push) / 1e3, "slave": med(slave) / 1e3, "ack": med(ack) / 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    rows = [runner(run(a.rounds, a.size)) for _ in range(a.repeats)]
    for key in ("push", "slave", "ack"):
        vals = [r[key] for r in rows]
        print(f"{key:6s} median {statistics.median(vals):6.2f} us  (runs: {' / '.join(f'{v:.2f}' for v in vals)})")
    total = [r["push"] + r["slave"] + r["ack"] for r in rows]
    print(f"total  median {statistics.median(total):6.2f} us", file=sys.stdout)


if __name__ == "__main__":
    main()
