"""``ferry bench``: benchmarks of ferrymq side by side with a peer (Redis streams) and the machine's limits.

Starts everything it needs on 127.0.0.1 as subprocesses (name server, brokers, slaves, Redis, an echo
server) on free ports in a temp dir, drives bounded workloads from worker processes, stops everything
(also on Ctrl-C or failure) and prints one table of medians over ``--repeats`` with ratios and PASS/MISS
against the targets. The implementation lives in ``ferrymq.cli.bench_impl`` (see its ``runner`` module
for the workload list).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

#: Width used for the table when stdout is not a terminal (or a narrow one), so rows stay on one line.
TABLE_MIN_WIDTH = 200

QUICK = {
    "repeats": 1, "duration_s": 0.5, "warmup_s": 0.2, "backlog_bytes": 2 * 1024**2,
    "catchup_bytes": 8 * 1024**2, "restart_bytes": 8 * 1024**2, "disk_bytes": 16 * 1024**2, "e2e_rate": 200,
}


def _size_option(value: str | None) -> int | None:
    from ferrymq.cli.bench_impl.units import parse_size

    return None if value is None else parse_size(value)


@click.command(name="bench", context_settings={"show_default": True})
@click.option("--repeats", type=int, default=None, help="Runs per measurement; the table shows medians [3].")
@click.option("--duration", "duration_s", type=float, default=None, help="Counted seconds per run [5].")
@click.option("--warmup", "warmup_s", type=float, default=None, help="Uncounted seconds before each run [1].")
@click.option("--sizes", default="1KiB", help="Message body sizes, comma separated (e.g. 1KiB,128B).")
@click.option("--producers", type=int, default=16, help="Concurrent producers / connections / redis clients.")
@click.option("--client-procs", type=int, default=1,
              help="Worker processes generating ferrymq client load (the echo limit tries 1 and 2).")
@click.option("--batch-bytes", default="256KiB", help="Body bytes per batched send (workload 2).")
@click.option("--e2e-rate", type=int, default=None, help="Fixed send rate of the end-to-end latency run [2000].")
@click.option("--backlog-bytes", default=None, help="Backlog consumed in workload 6 [256MiB].")
@click.option("--catchup-bytes", default=None, help="Master backlog a new slave catches up on [2GiB].")
@click.option("--restart-bytes", default=None, help="Commit-log size for the SIGKILL restart [1GiB].")
@click.option("--disk-bytes", default=None, help="Bytes for the sequential-write limit [1GiB].")
@click.option("--only", default=None, help="Workload numbers to run, e.g. 1,2,11 (default all: 1-13).")
@click.option("--skip", default=None, help="Workload numbers to skip, e.g. 7,8.")
@click.option("--quick", is_flag=True, help="Tiny counts and one short repeat (smoke run; figures meaningless).")
@click.option("--json", "json_path", default=None, help="Also write results as JSON to this file ('-' = stdout).")
@click.option("--dir", "base_dir", default=None, help="Work directory (default: a new temp dir).")
@click.option("--keep-dir", is_flag=True, help="Keep the work directory (stores, logs) afterwards.")
@click.option("--broker-conf", "broker_conf", multiple=True, metavar="KEY=VALUE",
              help="A broker.conf key for every broker started (repeatable), e.g. metricsPort=0.")
@click.option("-v", "--verbose", is_flag=True, help="Log every step to stderr.")
@click.option("--estate", is_flag=True,
              help="Run the estate benchmark instead: many topics, groups and queues on one broker, in steps.")
@click.option("--estate-scale", type=click.Choice(["full", "small"]), default="full",
              help="Estate step sizes preset (small: a quick smoke run).")
@click.option("--estate-topics", default=None, help="Topic counts of the estate steps, e.g. 100,1000,10000.")
@click.option("--estate-groups", default=None, help="Consumer group counts of the estate steps, e.g. 100,1000,5000.")
@click.option("--estate-queues", type=int, default=None,
              help="Queues given one message each in the last estate step (0 = no such step).")
@click.option("--estate-samples", type=int, default=None, help="Single requests per operation and estate step.")
@click.option("--estate-heartbeat-groups", type=int, default=None,
              help="New groups per heartbeat while building the estate's groups.")
@click.option("--estate-server-pythonpath", default=None, envvar="FERRY_BENCH_SERVER_PYTHONPATH",
              help="PYTHONPATH of the started name server and broker (e.g. another checkout's src).")
def command(repeats: int | None, duration_s: float | None, warmup_s: float | None, sizes: str, producers: int,
            client_procs: int, batch_bytes: str, e2e_rate: int | None, backlog_bytes: str | None,
            catchup_bytes: str | None, restart_bytes: str | None, disk_bytes: str | None, only: str | None,
            skip: str | None, quick: bool, json_path: str | None, base_dir: str | None, keep_dir: bool,
            verbose: bool, broker_conf: tuple[str, ...], estate: bool, estate_scale: str, estate_topics: str | None,
            estate_groups: str | None, estate_queues: int | None, estate_samples: int | None,
            estate_heartbeat_groups: int | None, estate_server_pythonpath: str | None) -> None:
    """Benchmark ferrymq against Redis and the machine's limits; prints one table (medians, ratios, targets)."""
    if estate:
        from ferrymq.cli.bench_impl.estate import run_estate

        run_estate(scale=estate_scale, topics=estate_topics, groups=estate_groups, queues=estate_queues,
                   samples=estate_samples, heartbeat_groups=estate_heartbeat_groups,
                   server_pythonpath=estate_server_pythonpath, json_path=json_path, base_dir=base_dir,
                   keep_dir=keep_dir, broker_conf=broker_conf, verbose=verbose)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from ferrymq.cli.bench_impl.report import render_table
    from ferrymq.cli.bench_impl.runner import ALL_WORKLOADS, Bench, Options
    from ferrymq.cli.bench_impl.units import parse_size, parse_sizes

    opts = Options()
    if quick:
        for k, v in QUICK.items():
            setattr(opts, k, v)
    given: dict[str, Any] = {
        "repeats": repeats, "duration_s": duration_s, "warmup_s": warmup_s, "e2e_rate": e2e_rate,
        "backlog_bytes": _size_option(backlog_bytes), "catchup_bytes": _size_option(catchup_bytes),
        "restart_bytes": _size_option(restart_bytes), "disk_bytes": _size_option(disk_bytes),
    }
    for k, v in given.items():
        if v is not None:
            setattr(opts, k, v)
    opts.sizes = parse_sizes(sizes)
    opts.producers = producers
    opts.client_procs = max(1, client_procs)
    opts.batch_bytes = parse_size(batch_bytes)
    opts.keep_dir = keep_dir
    for item in broker_conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--broker-conf")
        opts.broker_conf[key.strip()] = value.strip()
    opts.base_dir = base_dir
    chosen = [w.strip() for w in only.split(",")] if only else list(ALL_WORKLOADS)
    unknown = [w for w in chosen if w not in ALL_WORKLOADS]
    if unknown:
        raise click.BadParameter(f"unknown workload(s) {unknown}; known: {', '.join(ALL_WORKLOADS)}")
    skipped = {w.strip() for w in skip.split(",")} if skip else set()
    opts.only = [w for w in chosen if w not in skipped]

    err = Console(stderr=True)
    out = Console(stderr=json_path == "-")
    if not out.is_terminal or out.width < TABLE_MIN_WIDTH:
        out = Console(stderr=json_path == "-", width=TABLE_MIN_WIDTH)

    def log(text: str) -> None:
        if verbose:
            err.log(text, markup=False, highlight=False)

    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as progress:
        bench = Bench(opts, progress=progress, log=log)
        try:
            bench.run()
        except KeyboardInterrupt:
            err.print("[yellow]interrupted: all started processes were stopped; partial results below[/]")
            for r in bench.rows:
                if not r.values and r.error is None:
                    r.error = "not run (interrupted)"
            bench.evaluate()
    out.print(render_table(bench))
    if json_path:
        data = json.dumps(bench.to_json(), indent=2, default=str)
        if json_path == "-":
            sys.stdout.write(data + "\n")
        else:
            with open(json_path, "w") as fh:
                fh.write(data + "\n")
