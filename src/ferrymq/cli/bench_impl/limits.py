"""Machine limits: loopback TCP throughput (sink subprocess + sender worker), sequential write MB/s and
4 KiB write+fdatasync per second on the store's disk.

``python -m ferrymq.cli.bench_impl.limits sink --port P`` runs the TCP sink.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from typing import Any

from ferrymq.cli.bench_impl.stats import latency_summary_us, thin

#: recv buffer of the sink
SINK_RECV_BYTES = 4 * 1024 * 1024
FSYNC_FILE_BYTES = 64 * 1024 * 1024
FSYNC_WRITE_BYTES = 4096
SEQ_WRITE_CHUNK_BYTES = 1024 * 1024
LATENCY_SAMPLE_CAP = 200_000


def sink(port: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(64)

    def drain(conn: socket.socket) -> None:
        buf = bytearray(SINK_RECV_BYTES)
        with conn:
            while conn.recv_into(buf):
                pass

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


async def tcp_sender(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """Worker: blocking sends of ``chunk_bytes`` for ``duration_s`` to the sink (one stream)."""
    s = socket.create_connection(("127.0.0.1", spec["port"]))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    chunk = b"\0" * spec["chunk_bytes"]
    await ctl.ready()
    end = time.monotonic() + spec["duration_s"]
    sent = 0
    t0 = time.monotonic()
    n = len(chunk)
    while True:
        s.sendall(chunk)
        sent += n
        if (sent // n) % 64 == 0 and time.monotonic() >= end:
            break
    elapsed = time.monotonic() - t0
    s.close()
    return {"bytes": sent, "elapsed_s": elapsed}


def seq_write(dir_path: str, total_bytes: int) -> dict[str, Any]:
    """Write ``total_bytes`` sequentially in 1 MiB chunks to a new file, fsync once; MB/s incl. the fsync."""
    path = os.path.join(dir_path, "seqwrite.bin")
    chunk = os.urandom(SEQ_WRITE_CHUNK_BYTES)
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        while written < total_bytes:
            written += os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.monotonic() - t0
    os.unlink(path)
    return {"bytes": written, "elapsed_s": elapsed, "mb_s": written / elapsed / 1e6}


def fsync_rate(dir_path: str, duration_s: float) -> dict[str, Any]:
    """4 KiB pwrite + fdatasync at increasing offsets of a preallocated 64 MiB file (like a commit log)."""
    path = os.path.join(dir_path, "fsync.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"\0" * FSYNC_FILE_BYTES)
        os.fsync(fd)
        block = os.urandom(FSYNC_WRITE_BYTES)
        lat: list[int] = []
        off = 0
        t0 = time.monotonic()
        end = t0 + duration_s
        while True:
            a = time.perf_counter_ns()
            os.pwrite(fd, block, off)
            os.fdatasync(fd)
            lat.append(time.perf_counter_ns() - a)
            off = (off + FSYNC_WRITE_BYTES) % FSYNC_FILE_BYTES
            if time.monotonic() >= end:
                break
        elapsed = time.monotonic() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    out: dict[str, Any] = {"count": len(lat), "elapsed_s": elapsed, "per_s": len(lat) / elapsed}
    out.update(latency_summary_us(thin(sorted(lat), LATENCY_SAMPLE_CAP)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sink")
    s.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    if args.cmd == "sink":
        sink(args.port)


if __name__ == "__main__":
    main()
