"""What a SYNC_FLUSH commit log's ``fdatasync`` costs by how its blocks were prepared (private perf driver).

    python benchmarks/fsync_extents.py [--dir DIR] [--appends 2000] [--rounds 2] [--size 1024]

Appends ``--size`` bytes at a time to a 64 MiB file in ``--dir`` (default: a temporary directory under the
current one, i.e. on the disk the stores would use) and ``fdatasync``-s after each, like a SYNC_FLUSH broker
with one producer. Variants, interleaved per round:

| variant | the file's blocks before the appends | the append |
|---|---|---|
| mmap, fallocate | reserved unwritten (``posix_fallocate``: what a SYNC_FLUSH segment is) | slice into a shared map |
| mmap, fallocate, zero_ahead | the same, pages ahead written with zeros (``MappedFile.zero_ahead``) | slice into the map |
| mmap, written | written with zeros one 4 KiB page at a time, synced | slice into the map |
| mmap, written in one write | written with one 64 MiB write (large page cache folios), synced | slice into the map |
| pwrite, written | written with one 64 MiB write, synced (``ferry bench`` row 11e with 1 KiB) | ``pwrite`` |

Per variant: voluntary context switches per append (the thread blocked: once for the data write, once more
when the ``fdatasync`` commits the journal, e.g. to mark an unwritten block written), system CPU per append,
the disk's write requests and 512-byte sectors per append (``/sys/block/<dev>/stat``: the whole disk, so other
processes' writes are counted too) and the median latency. Counts are steadier than times on a shared machine.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import statistics
import sys
import tempfile
import time

FILE_BYTES = 64 << 20
PAGE = mmap.PAGESIZE
ZERO_AHEAD_BYTES = 128 * 1024


def _disk_stat_path(directory: str) -> str | None:
    """/sys/block/<dev>/stat of the disk holding ``directory`` (a partition's own stat file, if it has one)."""
    dev = os.stat(directory).st_dev
    link = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat"
    return link if os.path.exists(link) else None


def _disk_writes(stat_path: str | None) -> tuple[int, int]:
    if stat_path is None:
        return 0, 0
    with open(stat_path) as fh:
        f = fh.read().split()
    return int(f[4]), int(f[6])


def _prepare(fd: int, how: str) -> None:
    if how == "fallocate":
        os.posix_fallocate(fd, 0, FILE_BYTES)
        return
    if how == "pages":
        zeros = bytes(PAGE)
        for pos in range(0, FILE_BYTES, PAGE):
            os.pwrite(fd, zeros, pos)
    else:
        os.pwrite(fd, bytes(FILE_BYTES), 0)
    os.fsync(fd)


def run(directory: str, stat_path: str | None, variant: tuple[str, str, str, bool], appends: int,
        size: int) -> dict[str, float]:
    name, how, write, zero_ahead = variant
    path = os.path.join(directory, "fsync-extents.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.unlink(path)
    try:
        _prepare(fd, how)
        mm = mmap.mmap(fd, FILE_BYTES)
        data = os.urandom(size)
        zeros = bytes(PAGE)
        pos = zeroed_to = 0
        lat = []
        w0 = _disk_writes(stat_path)
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        for _ in range(appends):
            t = time.perf_counter_ns()
            if zero_ahead and zeroed_to - pos < ZERO_AHEAD_BYTES // 2:
                start = max(zeroed_to, -(-pos // PAGE) * PAGE)
                end = min(-(-pos // PAGE) * PAGE + ZERO_AHEAD_BYTES, FILE_BYTES)
                for p in range(start, end, PAGE):
                    os.pwrite(fd, zeros, p)
                zeroed_to = max(zeroed_to, end)
            if write == "mmap":
                mm[pos:pos + size] = data
            else:
                os.pwrite(fd, data, pos)
            os.fdatasync(fd)
            lat.append(time.perf_counter_ns() - t)
            pos += size
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        w1 = _disk_writes(stat_path)
        mm.close()
    finally:
        os.close(fd)
    return {"switches": (r1.ru_nvcsw - r0.ru_nvcsw) / appends, "sys_us": (r1.ru_stime - r0.ru_stime) / appends * 1e6,
            "writes": (w1[0] - w0[0]) / appends, "sectors": (w1[1] - w0[1]) / appends,
            "p50_us": statistics.median(lat) / 1000}


VARIANTS = [
    ("mmap, fallocate", "fallocate", "mmap", False),
    ("mmap, fallocate, zero_ahead", "fallocate", "mmap", True),
    ("mmap, written", "pages", "mmap", False),
    ("mmap, written in one write", "one", "mmap", False),
    ("pwrite, written", "one", "pwrite", False),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    ap.add_argument("--appends", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--size", type=int, default=1024)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir or os.getcwd(), prefix="fsync-extents-") as directory:
        stat_path = _disk_stat_path(directory)
        print(f"load {os.getloadavg()[0]:.2f}; disk stat {stat_path or 'unknown'}", flush=True)
        results: dict[str, list[dict[str, float]]] = {v[0]: [] for v in VARIANTS}
        for _ in range(a.rounds):
            for v in VARIANTS:
                results[v[0]].append(run(directory, stat_path, v, a.appends, a.size))
        print(f"{'variant':30} {'switches':>9} {'sys us':>7} {'writes':>7} {'sectors':>8} {'p50 us':>7}  (per append, "
              f"median of {a.rounds} rounds; load {os.getloadavg()[0]:.2f})")
        for name, runs in results.items():
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"{name:30} {med['switches']:9.2f} {med['sys_us']:7.1f} {med['writes']:7.2f} {med['sectors']:8.1f} "
                  f"{med['p50_us']:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
