"""Limit workload: a request/response ceiling for Python with the RocketMQ remoting framing.

Server (run as ``python -m ferrymq.cli.bench_impl.echo --port P``): an asyncio Protocol on uvloop that
decodes every frame with ``ferrymq.remoting.codec.FrameDecoder`` (JSON header parse included) and answers
each request with a send-like response (``msgId``/``queueId``/``queueOffset``) encoded with
``codec.encode``: the cheapest possible "broker" that still speaks the wire format. ``--mode raw`` only
splits frames by the length prefix and echoes a fixed small frame (the framing-free ceiling).

Load generator (worker ``load``): N connections, one request in flight per connection (closed loop,
like a producer doing sync sends), a pre-encoded SEND_MESSAGE_V2-shaped request with an X-byte body.
It splits replies by the length prefix only, so it stays cheaper than the server.

Worker ``lockstep`` (row 13j of ``ferry bench``): the same load with ONE connection, each request written
when the previous reply arrived, timing every round trip of the counted window: the request/reply floor of
one client over loopback TCP, which the one-client rows of workload 13 are put beside. Its result has the
shape of a producer worker's (``count``, ``lat_ns``, ...) plus ``acked``: every reply of the run, warm-up
included (the divisor of the server's CPU over the whole run).
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import time
from typing import Any

from ferrymq.cli.bench_impl.stats import thin
from ferrymq.common import aio
from ferrymq.remoting.codec import FrameDecoder, RemotingCommand, encode

_LEN = struct.Struct(">i")
#: round-trip samples a ``lockstep`` worker ships back (thinned, sorted)
LATENCY_SAMPLE_CAP = 50_000


def take_frames(buf: bytearray) -> int:
    """Drop the complete length-prefixed frames at the front of ``buf``; returns how many."""
    pos, n, count = 0, len(buf), 0
    while n - pos >= 4:
        (length,) = _LEN.unpack_from(buf, pos)
        if n - pos - 4 < length:
            break
        pos += 4 + length
        count += 1
    if pos:
        del buf[:pos]
    return count


class CodecEcho(asyncio.Protocol):
    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.offset = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        out = []
        for cmd in self.decoder.feed(data):
            self.offset += 1
            resp = cmd.response(0, {"msgId": "7F00000100002A9F0000000000000000", "queueId": cmd.get_str("e", "0"),
                                    "queueOffset": self.offset})
            out.append(encode(resp))
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


class RawEcho(asyncio.Protocol):
    def __init__(self, reply: bytes) -> None:
        self.buf = bytearray()
        self.reply = reply
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        count = take_frames(self.buf)
        if count and self.transport is not None:
            self.transport.write(self.reply * count)


def request_frame(body_bytes: int) -> bytes:
    cmd = RemotingCommand.request(310, {
        "a": "bench_pg", "b": "BenchTopic", "c": "TBW102", "d": 4, "e": 0, "f": 0,
        "g": int(time.time() * 1000), "h": 0,
        "i": "UNIQ_KEY\x01AC110002000078308DB13E1E6B2F0000\x02WAIT\x01true\x02TAGS\x01bench\x02",
        "j": 0, "k": False,
    }, body=b"x" * body_bytes)
    return encode(cmd)


async def serve(port: int, mode: str) -> None:
    loop = asyncio.get_running_loop()
    if mode == "raw":
        reply = encode(RemotingCommand(code=0, opaque=1, flag=1))
        server = await loop.create_server(lambda: RawEcho(reply), "127.0.0.1", port, backlog=1024)
    else:
        server = await loop.create_server(CodecEcho, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


class _Client(asyncio.Protocol):
    def __init__(self, frame: bytes, stop_at: list[float], lat_ns: list[int] | None = None,
                 measure_at: list[float] | None = None) -> None:
        self.frame = frame
        self.stop_at = stop_at
        self.buf = bytearray()
        self.count = 0
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.running = False
        #: round trips (ns) of replies arriving after ``measure_at[0]`` (only with one request in flight)
        self.lat_ns = lat_ns
        self.measure_at = measure_at or [0.0]
        self.sent_ns = 0
        #: when the last timed reply arrived (monotonic seconds)
        self.last_timed_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def start(self) -> None:
        self.running = True
        assert self.transport is not None
        self.sent_ns = time.perf_counter_ns()
        self.transport.write(self.frame)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        got = take_frames(self.buf)
        if not got:
            return
        self.count += got
        now = time.monotonic()
        if self.lat_ns is not None:
            t = time.perf_counter_ns()
            if now >= self.measure_at[0]:
                self.lat_ns.append(t - self.sent_ns)
                self.last_timed_at = now
            self.sent_ns = t
        if now < self.stop_at[0]:
            assert self.transport is not None
            self.transport.write(self.frame * got)
        elif not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def load(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """Worker: ``spec`` = {port, connections, body_bytes, duration_s, warmup_s}."""
    loop = asyncio.get_running_loop()
    frame = request_frame(spec["body_bytes"])
    stop_at = [float("inf")]
    clients = []
    for _ in range(spec["connections"]):
        _, proto = await loop.create_connection(lambda: _Client(frame, stop_at), "127.0.0.1", spec["port"])
        clients.append(proto)
    await ctl.ready()
    t0 = time.monotonic()
    stop_at[0] = t0 + spec["warmup_s"] + spec["duration_s"]
    for c in clients:
        c.start()
    await asyncio.sleep(spec["warmup_s"])
    c0 = sum(c.count for c in clients)
    t1 = time.monotonic()
    await aio.wait_for(asyncio.gather(*(c.done for c in clients)), spec["duration_s"] + 30)
    t2 = time.monotonic()
    c2 = sum(c.count for c in clients)
    for c in clients:
        if c.transport is not None:
            c.transport.close()
    return {"count": c2 - c0, "elapsed_s": t2 - t1}


async def lockstep(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """Worker: ``spec`` = {port, body_bytes, duration_s, warmup_s}; one connection, one request in flight,
    every round trip of the counted window timed."""
    loop = asyncio.get_running_loop()
    frame = request_frame(spec["body_bytes"])
    stop_at, measure_at = [float("inf")], [float("inf")]
    lat_ns: list[int] = []
    _, client = await loop.create_connection(lambda: _Client(frame, stop_at, lat_ns, measure_at), "127.0.0.1",
                                             spec["port"])
    await ctl.ready()
    t0 = time.monotonic()
    measure_at[0] = t0 + spec["warmup_s"]
    stop_at[0] = measure_at[0] + spec["duration_s"]
    client.start()
    await aio.wait_for(client.done, spec["warmup_s"] + spec["duration_s"] + 30)
    if client.transport is not None:
        client.transport.close()
    # the counted window: the replies that arrived from measure_at on, each with its round trip
    count = len(lat_ns)
    elapsed_s = max(client.last_timed_at - measure_at[0], 1e-9)
    return {"count": count, "bytes": count * spec["body_bytes"], "elapsed_s": elapsed_s, "errors": 0, "not_ok": 0,
            "first_error": None, "lat_ns": thin(sorted(lat_ns), LATENCY_SAMPLE_CAP), "acked": client.count}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", choices=("codec", "raw"), default="codec")
    args = ap.parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover
        runner = asyncio.Runner()
    with runner:
        runner.run(serve(args.port, args.mode))


if __name__ == "__main__":
    main()
