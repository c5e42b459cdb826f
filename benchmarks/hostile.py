"""Hostile peers against real processes: ``python benchmarks/hostile.py [--frames N] [--seconds S]``.

Starts a name server, a SYNC_MASTER and its SLAVE (real ``ferry`` processes on 127.0.0.1, tmp dir), then
for each of the three ports (name server, broker, master HA) in turn runs, side by side:

* hostile frames: ``--frames`` frames per port (default 100,000) over many connections: random bytes,
  huge and negative length prefixes, truncated frames, JSON headers that are not JSON or have bad ints,
  giant opaques and header integers past 32 bits;
* a client that pipelines requests and never reads the answers;
* slowloris connections that send one byte of a frame every 0.5 s;

while a well-behaved client measures its round trip (GET_BROKER_RUNTIME_INFO on the broker, the route
request on the name server, a send on the broker while the HA port is attacked) and the RSS of every
server process is sampled. Prints one table: per port, frames thrown, connections closed by the server,
the well-behaved round trip (median / max ms), and the peak RSS growth of each process. Exit code 1 when a
process died or the well-behaved client failed.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "acceptance"), str(ROOT / "tests")]

from ha_support import start_ha_pair  # noqa: E402
from procs import LOOPBACK, ProcessGroup, request  # noqa: E402

from ferrymq.remoting.codec import RemotingCommand, encode  # noqa: E402
from ferrymq.remoting.codes import RequestCode  # noqa: E402
from support.wire import send_v1  # noqa: E402

#: slowloris connections per port
SLOWLORIS = 100
#: hostile connections, each carrying frames until the server closes it or its share is sent
HOSTILE_CONNECTIONS = 200


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def hostile_frame(rng: random.Random) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 64))
    if kind == 1:
        return struct.pack(">i", rng.choice([-1, 0, 3, 2**31 - 1, 64 * 1024 * 1024])) + rng.randbytes(8)
    if kind == 2:
        good = encode(RemotingCommand.request(int(RequestCode.GET_BROKER_RUNTIME_INFO), {}))
        return good[: rng.randrange(4, len(good))]
    header = {
        3: b"{not json",
        4: b'{"code":10,"language":"JAVA","version":400,"opaque":99999999999999999999999,"flag":0}',
        5: b'{"code":"x","opaque":[],"flag":{},"version":null}',
        6: json.dumps({"code": 10, "language": "JAVA", "version": 400, "opaque": 1, "flag": 0,
                       "extFields": {"topic": "T", "producerGroup": "p", "flag": "99999999999",
                                     "sysFlag": str(2**40), "queueId": "0"}}).encode(),
        7: b'{"code":310,"language":"JAVA","version":400,"opaque":7,"flag":0,"extFields":{"b":"T","j":"1e99"}}',
    }[kind]
    return struct.pack(">ii", 4 + len(header) + 1, len(header)) + header + b"x"


def throw_frames(port: int, frames: int, seed: int, counts: dict[str, int]) -> None:
    rng = random.Random(seed)
    per_conn = max(1, frames // HOSTILE_CONNECTIONS)
    thrown = 0
    while thrown < frames:
        try:
            sock = socket.create_connection((LOOPBACK, port), timeout=2)
        except OSError:
            counts["refused"] += 1
            time.sleep(0.01)
            continue
        sock.settimeout(2)
        try:
            for _ in range(per_conn):
                sock.sendall(hostile_frame(rng))
                thrown += 1
        except OSError:
            counts["closed_by_server"] += 1
        finally:
            sock.close()
    counts["frames"] += thrown


def no_read_client(port: int, request_bytes: bytes, stop: threading.Event) -> None:
    try:
        sock = socket.create_connection((LOOPBACK, port), timeout=2)
    except OSError:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.settimeout(0.2)
    try:
        while not stop.is_set():
            try:
                sock.sendall(request_bytes * 50)
            except TimeoutError:
                pass
            except OSError:
                return
    finally:
        sock.close()


def slowloris(port: int, stop: threading.Event, counts: dict[str, int]) -> None:
    frame = encode(RemotingCommand.request(int(RequestCode.GET_BROKER_RUNTIME_INFO), {}, b"x" * 200))
    socks: list[socket.socket] = []
    for _ in range(SLOWLORIS):
        try:
            socks.append(socket.create_connection((LOOPBACK, port), timeout=2))
        except OSError:
            counts["refused"] += 1
    i = 0
    while not stop.is_set() and socks:
        for s in list(socks):
            try:
                s.sendall(frame[i % len(frame): i % len(frame) + 1])
            except OSError:
                counts["slowloris_closed"] += 1
                socks.remove(s)
        i += 1
        stop.wait(0.5)
    for s in socks:
        s.close()


def attack(port: int, frames: int, seconds: float, seed: int, probe: Callable[[], None],
           pids: dict[str, int]) -> dict[str, object]:
    counts = {"frames": 0, "closed_by_server": 0, "refused": 0, "slowloris_closed": 0}
    stop = threading.Event()
    req = encode(RemotingCommand.request(int(RequestCode.GET_BROKER_RUNTIME_INFO), {}))
    threads = [
        threading.Thread(target=throw_frames, args=(port, frames, seed, counts)),
        threading.Thread(target=no_read_client, args=(port, req, stop)),
        threading.Thread(target=slowloris, args=(port, stop, counts)),
    ]
    base = {name: rss_mib(pid) for name, pid in pids.items()}
    peak = dict(base)
    rtts: list[float] = []
    failures = 0
    start = time.monotonic()
    for t in threads:
        t.start()
    while time.monotonic() - start < seconds or threads[0].is_alive():
        t0 = time.monotonic()
        try:
            probe()
            rtts.append((time.monotonic() - t0) * 1000)
        except Exception:
            failures += 1
        for name, pid in pids.items():
            peak[name] = max(peak[name], rss_mib(pid))
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    return {
        **counts,
        "rtt_median_ms": statistics.median(rtts) if rtts else float("nan"),
        "rtt_max_ms": max(rtts) if rtts else float("nan"),
        "probe_failures": failures,
        "rss_growth_mib": {name: round(peak[name] - base[name], 1) for name in pids},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=100_000, help="hostile frames per port")
    ap.add_argument("--seconds", type=float, default=20.0, help="least time per port")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferry-hostile-") as tmp:
        group = ProcessGroup(Path(tmp))
        try:
            pair = start_ha_pair(group)
            pids = {"namesrv": pair.namesrv.proc.pid, "master": pair.master.proc.pid,  # type: ignore[union-attr]
                    "slave": pair.slave.proc.pid}  # type: ignore[union-attr]

            def broker_probe() -> None:
                resp = request(pair.master.addr, int(RequestCode.GET_BROKER_RUNTIME_INFO), timeout_ms=5000)
                assert resp.code == 0

            def ns_probe() -> None:
                resp = request(pair.ns_addr, int(RequestCode.GET_BROKER_CLUSTER_INFO), timeout_ms=5000)
                assert resp.code == 0

            def send_probe() -> None:
                resp = request(pair.master.addr, int(RequestCode.SEND_MESSAGE), send_v1("HostileProbe"), b"ok",
                               timeout_ms=5000)
                assert resp.code == 0, resp.remark

            ports = [("namesrv", int(pair.ns_addr.rsplit(":", 1)[1]), ns_probe),
                     ("broker", pair.master.port, broker_probe),
                     ("master HA", pair.master.port + 1, send_probe)]
            rows = []
            for name, port, probe in ports:
                print(f"attacking the {name} port {port} ...", flush=True)
                rows.append((name, attack(port, args.frames, args.seconds, args.seed, probe, pids)))
            dead = [n for n, b in (("namesrv", pair.namesrv), ("master", pair.master), ("slave", pair.slave))
                    if b.proc is None or b.proc.exited]
        finally:
            group.stop_all()
    print()
    print("| port | frames | closed by server | slowloris closed | round trip median / max ms | probe failures "
          "| RSS growth MiB (namesrv / master / slave) |")
    print("|---|---|---|---|---|---|---|")
    ok = not dead
    for name, r in rows:
        g = r["rss_growth_mib"]
        assert isinstance(g, dict)
        print(f"| {name} | {r['frames']} | {r['closed_by_server']} | {r['slowloris_closed']} | "
              f"{r['rtt_median_ms']:.1f} / {r['rtt_max_ms']:.1f} | {r['probe_failures']} | "
              f"{g['namesrv']} / {g['master']} / {g['slave']} |")
        ok = ok and r["probe_failures"] == 0
    print(f"processes dead at the end: {dead or 'none'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
