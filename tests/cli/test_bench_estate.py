"""Smoke run of ``ferry bench --estate --estate-scale small``: it runs real processes, reports every figure for
every step, judges the targets without failing on a miss, and stops what it started. No timing assertions (the
figures of a smoke run are meaningless)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ferrymq.cli.bench_impl.estate import OPS, EstateOptions, plan_steps

SMOKE_TIMEOUT_S = 60
#: figures every step reports (``loop_lag_max_s`` is null when the broker exports no loop-lag histogram)
STEP_FIGURES = ("topics", "groups", "queues_filled", "build_s", "stall_ms", "stall_groups_ms", "stall_build_ms",
                "broker_rss_bytes", "broker_rss_anon_bytes", "broker_fds", "cq_index_disk_bytes",
                "commitlog_disk_bytes", "namesrv_rss_bytes", "route_p99_ms", "restart_s", "stop_s")


def test_plan_steps_pairs_counts_and_ends_with_the_queue_fill():
    steps = plan_steps(EstateOptions(topics=(100, 1000, 10_000), groups=(100, 5000), queues=100_000))
    assert [(s.topics, s.groups, s.queues_filled) for s in steps] == [
        (100, 100, 0), (1000, 5000, 0), (10_000, 5000, 0), (12_500, 5000, 100_000)]
    assert plan_steps(EstateOptions(topics=(10,), groups=(10,), queues=0))[-1].queues_filled == 0


@pytest.mark.acceptance
def test_bench_estate_small_reports_every_figure(tmp_path):
    out_json = tmp_path / "estate.json"
    proc = subprocess.run(
        [sys.executable, "-m", "ferrymq.cli", "bench", "--estate", "--estate-scale", "small", "--json", str(out_json),
         "--dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ferry bench --estate" in proc.stdout and "targets" in proc.stdout
    data = json.loads(out_json.read_text())
    assert data["error"] is None
    steps = data["steps"]
    assert [s["queues_filled"] >= 200 for s in steps][-1] and len(steps) == 3
    for step in steps:
        for key in STEP_FIGURES:
            assert step[key] is not None, (step["name"], key)
        assert "loop_lag_max_s" in step and step["restart_error"] is None
        for op in OPS:
            figures = step["ops"][op]
            assert figures["samples"] == 20 and figures["p50_ms"] is not None and figures["p99_ms"] is not None, op
    assert len(data["targets"]) == len(OPS) + 3
    for target in data["targets"]:
        assert target["figure"] is not None and isinstance(target["met"], bool), target
    # everything it started is gone, its work dir removed
    assert list((tmp_path / "work").iterdir()) == []
