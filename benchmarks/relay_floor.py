"""The floor of workload (3a)'s shape on this machine: a SYNC_MASTER round trip without a broker.

    python benchmarks/relay_floor.py [--busy-us 0,20,40] [--secs 4] [--size 1024]

Three uvloop processes on 127.0.0.1, as in (3a): a closed-loop client sends a ``--size`` frame to the
"master", which forwards the same bytes to the "slave"; the slave answers 8 bytes (the HA offset report);
then the master answers the client 16 bytes. One request in flight. No parsing, no store: the figure is
what the three process hops and four loopback writes cost. ``--busy-us N`` adds N µs of busy CPU to each of
the three processing stages (master on request, slave on data, master on report) to show how per-stage
work adds to the round trip. Prints round trips per second and the p50 / p99 round trip in µs.

It bounds (3a): Redis XADD + WAIT 1 (10b) has the same four hops; whatever our client, master and slave
spend per request on top of this floor is what separates (3a) from (10b). Results: PROFILE-NOTES.md.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from typing import Any

REPORT_BYTES = 8
ANSWER_BYTES = 16
WARMUP_S = 1.0


def _spin(busy_s: float) -> None:
    if busy_s > 0:
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass


class _Units(asyncio.Protocol):
    """Counts received bytes in units of ``unit`` bytes and calls ``on_unit(self)`` once per whole unit."""

    def __init__(self, unit: int, on_unit: Callable[[_Units], None]) -> None:
        self.unit = unit
        self.on_unit = on_unit
        self.pending_bytes = 0
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.pending_bytes += len(data)
        while self.pending_bytes >= self.unit:
            self.pending_bytes -= self.unit
            self.on_unit(self)


async def _slave(size: int, busy_s: float, port_out: Any) -> None:
    def on_transfer(link: _Units) -> None:
        _spin(busy_s)
        link.transport.write(b"\0" * REPORT_BYTES)

    server = await asyncio.get_running_loop().create_server(lambda: _Units(size, on_transfer), "127.0.0.1", 0)
    port_out.send(server.sockets[0].getsockname()[1])
    await server.serve_forever()


async def _master(size: int, busy_s: float, slave_port: int, port_out: Any) -> None:
    loop = asyncio.get_running_loop()
    waiting: list[Any] = []

    def on_report(link: _Units) -> None:
        _spin(busy_s)
        client = waiting.pop(0)
        if not client.is_closing():
            client.write(b"\1" * ANSWER_BYTES)

    def on_request(conn: _Units) -> None:
        _spin(busy_s)
        waiting.append(conn.transport)
        slave.transport.write(b"x" * size)

    _, slave = await loop.create_connection(lambda: _Units(REPORT_BYTES, on_report), "127.0.0.1", slave_port)
    server = await loop.create_server(lambda: _Units(size, on_request), "127.0.0.1", 0)
    port_out.send(server.sockets[0].getsockname()[1])
    await server.serve_forever()


def _serve(role: str, size: int, busy_s: float, slave_port: int, port_out: Any) -> None:
    import uvloop

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if role == "slave":
        uvloop.run(_slave(size, busy_s, port_out))
    else:
        uvloop.run(_master(size, busy_s, slave_port, port_out))


async def _client(port: int, size: int, secs: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    rtts: list[int] = []
    frame = b"x" * size

    sent_ns = [0]

    def on_answer(conn: _Units) -> None:
        now = time.perf_counter_ns()
        rtts.append(now - sent_ns[0])
        sent_ns[0] = now
        conn.transport.write(frame)

    transport, _ = await loop.create_connection(lambda: _Units(ANSWER_BYTES, on_answer), "127.0.0.1", port)
    sent_ns[0] = time.perf_counter_ns()
    transport.write(frame)
    try:
        await asyncio.sleep(WARMUP_S)
        first, t0 = len(rtts), time.perf_counter()
        await asyncio.sleep(secs)
        counted, elapsed = rtts[first:], time.perf_counter() - t0
    finally:
        transport.close()
    counted.sort()
    if not counted:
        raise RuntimeError("no round trip completed")
    return {"rt_s": len(counted) / elapsed, "p50_us": counted[len(counted) // 2] / 1000,
            "p99_us": counted[int(len(counted) * 0.99)] / 1000}


def run_once(size: int, busy_us: float, secs: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    try:
        recv, send = ctx.Pipe(duplex=False)
        slave = ctx.Process(target=_serve, args=("slave", size, busy_us / 1e6, 0, send), daemon=True)
        slave.start()
        procs.append(slave)
        if not recv.poll(30):
            raise RuntimeError("slave did not start")
        slave_port = recv.recv()
        master = ctx.Process(target=_serve, args=("master", size, busy_us / 1e6, slave_port, send), daemon=True)
        master.start()
        procs.append(master)
        if not recv.poll(30):
            raise RuntimeError("master did not start")
        master_port = recv.recv()
        import uvloop

        return uvloop.run(_client(master_port, size, secs))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy-us", default="0,20,40", help="comma-separated µs of busy CPU per processing stage")
    ap.add_argument("--secs", type=float, default=4.0, help="counted seconds per run")
    ap.add_argument("--size", type=int, default=1024, help="request bytes")
    a = ap.parse_args()
    for busy in [float(x) for x in a.busy_us.split(",") if x.strip()]:
        r = run_once(a.size, busy, a.secs)
        print(f"relay floor size={a.size} busy={busy:g} us/stage (x3 stages): {r['rt_s']:,.0f} round trips/s  "
              f"p50 {r['p50_us']:.0f} us  p99 {r['p99_us']:.0f} us", flush=True)


if __name__ == "__main__":
    main()
