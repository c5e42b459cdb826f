"""The bench table prints what a row says verbatim, and row 9 is skipped with its reason where the C++ client
cannot be imported (instead of failing as a worker error with no reason)."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from ferrymq.cli.bench_impl.report import render_table
from ferrymq.cli.bench_impl.runner import Bench, Options, Row, cpp_client_missing


def rendered(bench: Bench) -> str:
    buf = io.StringIO()
    Console(file=buf, width=400, color_system=None).print(render_table(bench))
    return buf.getvalue()


def test_a_skip_reason_with_brackets_is_printed_verbatim() -> None:
    bench = Bench(Options())
    bench.rows = [Row("10a", "peer Redis", 1024, "ops/s", "ops/s",
                      error="SKIPPED: PyPI package 'redis' not installed (pip install 'ferrymq[bench]')")]
    assert "pip install 'ferrymq[bench]'" in rendered(bench)


def test_row_9_names_why_the_cpp_client_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rocketmq", None)
    monkeypatch.setitem(sys.modules, "rocketmq.client", None)
    reason = cpp_client_missing()
    assert reason is not None and "rocketmq==0.4.4" in reason


def test_controller_rows_print_the_ratio_to_classic_sync_master_repeat_by_repeat() -> None:
    """Workload 12 runs interleaved with 3 (each repeat right after the same repeat of 3): judged on the median
    of the per-repeat ratios (the machine's speed drifts between repeats), which the table prints with each
    pair's ratio and the ratio of the medians."""
    bench = Bench(Options())
    bench.rows = [Row("3a", "SYNC_MASTER, 1 client", 1024, "msgs/s", "msgs/s", values=[1000.0, 2000.0, 1500.0]),
                  Row("12a", "controller, 1 client", 1024, "msgs/s", "msgs/s", values=[950.0, 1900.0, 1200.0],
                      paired_with="3a")]
    bench.evaluate()
    row = bench.rows[1]
    assert row.ratio == "0.95x of (3a)" and row.status == "PASS"
    assert "repeat/paired 0.95/0.95/0.80 (median of the pairs; ratio of the medians 0.80)" in row.note
    assert "repeat/paired" in rendered(bench)
