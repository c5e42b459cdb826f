"""A scrape of the broker's /metrics at estate size: how long it takes, how big it is, and the longest time it
holds the broker's event loop (the rocketmq-exporter families and the per-topic / per-group series are built in
slices, broker/exporter_metrics.py).

An in-process broker (metricsPort=0, no name server) is filled through its managers with ``--topics`` topics of
8 queues, ``--groups`` subscription groups each with committed offsets on 2 topics, and per-topic / per-group
traffic counters (so every rate family has a series); then ``--scrapes`` scrapes run one after the other over
HTTP by a client process (started per scrape, so the scrape time includes its start) while the broker's
loop-lag probe watches. Printed: series, bytes, scrape time (median, max), the
longest run of the builder between two yields of the loop (its own measure, in wall time, which on a busy
machine includes time the process waited for a CPU, and in the thread's CPU time, the work itself), the longest event-loop stall (the probe's 10 ms timer overshoot, ``ferrymq_event_loop_lag_seconds``) and the
longest garbage-collector pause by generation (a stall the builder's slicing cannot split).

    python benchmarks/exporter_scrape.py --topics 10000 --groups 5000 --scrapes 5
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time

from ferrymq.broker.app import BrokerController
from ferrymq.broker.config import BrokerConfig
from ferrymq.broker.subscription_manager import SubscriptionGroupConfig
from ferrymq.common.topic import TopicConfig

LOOPBACK = "127.0.0.1"
QUEUES = 8


class GcPauses:
    """The longest garbage-collector pause (s) since the last ``take``, by generation."""

    def __init__(self) -> None:
        self.longest: dict[int, float] = {}
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            gen = info["generation"]
            self.longest[gen] = max(self.longest.get(gen, 0.0), time.perf_counter() - self._started)

    def take(self) -> dict[int, float]:
        out, self.longest = self.longest, {}
        return out


#: the scraping client, in its own process (its reading of 20+ MB would otherwise stall the broker's loop)
SCRAPER = """
import sys, urllib.request
body = urllib.request.urlopen(sys.argv[1], timeout=120).read()
series = sum(1 for line in body.split(b"\\n") if line and not line.startswith(b"#"))
print(len(body), series)
"""


async def scrape(port: int) -> tuple[int, int]:
    """(bytes, series) of one scrape."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", SCRAPER, f"http://{LOOPBACK}:{port}/metrics",
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    size, series = out.split()
    return int(size), int(series)


async def run(topics: int, groups: int, scrapes: int) -> None:
    with tempfile.TemporaryDirectory() as data:
        cfg = BrokerConfig(listen_port=0, listen_host=LOOPBACK, broker_ip1=LOOPBACK, store_path_root_dir=data,
                           namesrv_addr=[], fast_listen_enable=False, metrics_port=0)
        ctl = BrokerController(cfg)
        await ctl.start()
        try:
            for i in range(topics):
                ctl.topics.table[f"T{i}"] = TopicConfig(f"T{i}", QUEUES, QUEUES)
                ctl.stats.on_put(f"T{i}", 10, 1000)
            for g in range(groups):
                ctl.groups.table[f"G{g}"] = SubscriptionGroupConfig(f"G{g}")
                for t in (g % topics, (g + 1) % topics):
                    ctl.offsets.table[f"T{t}@G{g}"] = dict.fromkeys(range(QUEUES), 0)
                    ctl.stats.on_get(f"T{t}", 5, 500, f"G{g}")
            assert ctl.metrics_server is not None
            port = ctl.metrics_server.port
            await scrape(port)  # warm-up
            pauses = GcPauses()
            times, stalls, slices, cpu_slices = [], [], [], []
            size = series = 0
            for _ in range(scrapes):
                ctl.loop_lag.reset_max()
                t0 = time.perf_counter()
                size, series = await scrape(port)
                times.append(time.perf_counter() - t0)
                await asyncio.sleep(0.05)  # let the probe report the last slice
                stalls.append(ctl.loop_lag.reset_max())
                exposition = ctl.metrics_server.exposition  # type: ignore[attr-defined]
                slices.append(exposition.last_longest_slice_s)
                cpu_slices.append(exposition.last_longest_slice_cpu_s)
            print(f"topics={topics} groups={groups} series={series} bytes={size}")
            print(f"scrape s: median={statistics.median(times):.3f} max={max(times):.3f}")
            print(f"longest event-loop stall ms: {max(stalls) * 1000:.1f} (per scrape: "
                  f"{', '.join(f'{s * 1000:.1f}' for s in stalls)})")
            print(f"longest run of the builder between two yields ms: {max(slices) * 1000:.1f} (per scrape: "
                  f"{', '.join(f'{s * 1000:.1f}' for s in slices)})")
            print(f"  the same in CPU time of the loop's thread ms: {max(cpu_slices) * 1000:.1f} (per scrape: "
                  f"{', '.join(f'{s * 1000:.1f}' for s in cpu_slices)})")
            print("longest garbage-collector pause ms by generation: "
                  + ", ".join(f"gen{g}={p * 1000:.1f}" for g, p in sorted(pauses.take().items())))
        finally:
            await ctl.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--groups", type=int, default=5_000)
    ap.add_argument("--scrapes", type=int, default=5)
    a = ap.parse_args()
    asyncio.run(run(a.topics, a.groups, a.scrapes))


if __name__ == "__main__":
    main()
