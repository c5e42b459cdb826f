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
