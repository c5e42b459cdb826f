"""The result table of ``ferry bench`` (rich)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from ferrymq.cli.bench_impl.units import fmt_size

_STATUS_STYLE = {"PASS": "bold green", "MISS": "bold red", "FAIL": "bold magenta", "SKIP": "yellow"}


def fmt_num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit in ("s",):
        return f"{v:.2f}"
    if abs(v) >= 100_000:
        return f"{v / 1000:,.0f}k"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _detail(r: Any) -> str:
    parts = []
    for key, label, unit in (("msgs_s", "msgs/s", ""), ("MB_s", "MB/s", ""), ("seconds", "took", "s"),
                             ("port_s", "port after", "s"), ("log_MiB", "log MiB", ""), ("copied_MiB", "slave copied MiB", "")):
        v = r.x(key)
        if v is not None:
            parts.append(f"{label} {fmt_num(v, unit)}{'s' if unit == 's' else ''}")
    cpu = r.x("cpu_us_msg")
    if cpu is not None:
        parts.append(f"broker CPU {fmt_num(cpu)} us/msg")
    server_cpu = r.x("server_cpu_us_msg")
    if server_cpu is not None:
        parts.append(f"server CPU {fmt_num(server_cpu)} us/msg")
    if len(r.values) > 1:
        parts.append("runs " + "/".join(fmt_num(v, r.unit) for v in r.values))
    if r.note:
        parts.append(r.note)
    if r.error:
        parts.append(r.error)
    return "; ".join(parts)


def load_cell(r: Any, cores: int | None) -> str:
    """The highest 1-minute load average while the row's repeats ran, flagged ``!`` when it was above 1.0 per
    core (the row was measured on a busy machine)."""
    loads = r.extra.get("load1") or []
    if not loads:
        return ""
    high = max(loads)
    return f"{high:.1f}!" if cores and high / cores > 1.0 else f"{high:.1f}"


def render_table(bench: Any) -> Table:
    h = bench.header()
    t = Table(title=f"ferry bench: {h['cores']} cores, Python {h['python']}, medians of {h['repeats']} "
                    f"x {h['duration_s']}s (+{h['warmup_s']}s warm-up), {h['client_procs']} client processes",
              caption="latencies in microseconds; client load runs in separate processes from the broker; "
                      "load: the highest 1-minute load average during the row's repeats, ! = above 1.0 per core",
              show_lines=False)
    right = {"#", "size", "median", "p50", "p99", "p999", "load"}
    for col in ("#", "workload", "size", "metric", "median", "p50", "p99", "p999", "ratio", "target", "result",
                "load", "detail"):
        t.add_column(col, justify="right" if col in right else "left", overflow="fold")
    for r in bench.rows:
        status = r.status or ""
        style = _STATUS_STYLE.get(status, "")
        t.add_row(r.wid, r.name, fmt_size(r.size) if r.size else "", r.metric, fmt_num(r.value, r.unit),
                  fmt_num(r.x("p50_us")), fmt_num(r.x("p99_us")), fmt_num(r.x("p999_us")), r.ratio, r.target,
                  f"[{style}]{status}[/]" if style else status, load_cell(r, h["cores"]), Text(_detail(r)))
    return t
