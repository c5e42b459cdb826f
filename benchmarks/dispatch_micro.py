"""In-process micro-benchmark of reput (dispatch): µs of CPU per dispatched record, per path.

    PYTHONPATH=src python benchmarks/dispatch_micro.py [--records 65536] [--batch 64] [--reps 5]

Fills a MessageStore (default index geometry, 1 KiB bodies, 16 queues, ``TAGS`` + a distinct ``UNIQ_KEY`` per
message like ``hotpath.py``'s load) with ``put_messages`` batches, then times ``reput()`` of the whole backlog
(process CPU time) for each path:

* ``native``   the C extension's scan of the commit log bytes (the default when it is built);
* ``pending``  pure Python, master: the ``RecordMeta``s queued at put time (``dispatch_run``);
* ``parse``    pure Python, slave / fallback: records parsed from the commit log (``check_record_meta``).

Also the put side (``put_messages``) with and without queuing the metas. Best of ``--reps`` per path, each rep on
a fresh store; the consume queue and index files of the paths are compared byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from ferrymq.common.message import MessageExtBrokerInner, properties_to_string
from ferrymq.store import MessageStore, StoreConfig, speedups

QUEUES = 16
TOPIC = "HotPath"
BORN_HOST = b"\x7f\x00\x00\x01\x00\x00\x30\x39"
STORE_HOST = b"\x7f\x00\x00\x01\x00\x00\x27\x11"
PATHS = ("native", "pending", "parse")


def batches(records: int, batch: int, size: int) -> list[list[MessageExtBrokerInner]]:
    body = os.urandom(size // 2).hex().encode()[:size]
    out: list[list[MessageExtBrokerInner]] = []
    n = 0
    while n < records:
        queue_id = len(out) % QUEUES
        group = []
        for _ in range(min(batch, records - n)):
            props = properties_to_string({"TAGS": "TagA", "UNIQ_KEY": f"7F000001ABCD{n:020X}"})
            group.append(MessageExtBrokerInner(topic=TOPIC, queue_id=queue_id, body=body, properties_string=props,
                                               born_timestamp=1_700_000_000_000, born_host=BORN_HOST,
                                               store_host=STORE_HOST))
            n += 1
        out.append(group)
    return out


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        self.now_ms += 1
        return self.now_ms


def run_once(root: Path, path: str, work: list[list[MessageExtBrokerInner]]) -> tuple[float, float, str]:
    """(put seconds, reput seconds, digest of the consume queue + index files)."""
    native = speedups.EXTENSION if path == "native" else None
    saved = speedups.NATIVE
    speedups.NATIVE = native
    try:
        store = MessageStore(StoreConfig(store_path_root_dir=str(root), total_memory_bytes=1 << 32), Clock())
        store.load()
    finally:
        speedups.NATIVE = saved
    try:
        t0 = time.process_time()
        for group in work:
            store.put_messages(group)
        t_put = time.process_time() - t0
        if path == "parse":
            store.commit_log.pending.clear()
        t0 = time.process_time()
        store.reput()
        t_reput = time.process_time() - t0
        assert store.reput_phy_offset == store.max_phy_offset
        store.shutdown()
        return t_put, t_reput, digest(root)
    finally:
        if store.running:
            store.shutdown()


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for sub in ("consumequeue", "index"):
        for p in sorted((root / sub).rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(root / sub)).encode() if sub == "consumequeue" else b"index")
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=65536)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    paths = PATHS if speedups.EXTENSION is not None else PATHS[1:]
    work = batches(a.records, a.batch, a.size)
    best: dict[str, tuple[float, float]] = {}
    digests: dict[str, set[str]] = {p: set() for p in paths}
    for _ in range(a.reps):
        for path in paths:  # interleaved
            tmp = tempfile.mkdtemp(prefix="dispatch-micro-", dir=a.dir)
            try:
                t_put, t_reput, d = run_once(Path(tmp), path, work)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            digests[path].add(d)
            old = best.get(path, (t_put, t_reput))
            best[path] = (min(old[0], t_put), min(old[1], t_reput))
    for path in paths:
        t_put, t_reput = best[path]
        print(f"{path:8s} reput {t_reput / a.records * 1e6:6.2f} us/record  "
              f"({a.records / t_reput / 1e3:,.0f}k records/s, {a.records * (a.size + 150) / t_reput / 1e6:,.0f} MB/s)"
              f"   put {t_put / a.records * 1e6:6.2f} us/record   files {','.join(sorted(digests[path]))}")
    same = len({d for ds in digests.values() for d in ds}) == 1
    print("consume queue + index files identical across paths:", same)


if __name__ == "__main__":
    main()
