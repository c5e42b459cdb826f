"""Smoke runs of ``ferry bench --quick``: it runs, stops what it started and prints the table.
No timing assertions (figures from --quick are meaningless)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

SMOKE_TIMEOUT_S = 240


def _bench(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "ferrymq.cli", "bench", "--quick", "--json", str(out_json), "--dir",
         str(tmp_path / "work"), *args],
        capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out_json.read_text())


def test_bench_quick_limits_prints_table(tmp_path):
    proc, data = _bench(tmp_path, "--only", "11", "--producers", "2", "--client-procs", "1")
    assert "ferry bench" in proc.stdout
    for wid in ("11a", "11b", "11c", "11d", "11e"):
        assert f" {wid} " in proc.stdout
    assert data["machine"]["cores"] >= 1
    rows = {r["wid"]: r for r in data["rows"]}
    assert rows["11a"]["median"] is not None and rows["11a"]["error"] is None
    # the echo ceiling is the best of one and two load processes, repeat by repeat
    extra = rows["11a"]["extra"]
    assert rows["11a"]["values"] == [max(a, b) for a, b in zip(extra["load_procs_1"], extra["load_procs_2"],
                                                               strict=True)]
    # everything it started is gone, its work dir removed
    assert list((tmp_path / "work").iterdir()) == []


def _stack_available() -> bool:
    return all(importlib.util.find_spec(m) is not None
               for m in ("ferrymq.cli.broker", "ferrymq.cli.namesrv", "ferrymq.client.producer"))


@pytest.mark.acceptance
@pytest.mark.skipif(not _stack_available(), reason="broker/name server CLI not available yet")
def test_bench_quick_broker_workloads(tmp_path):
    proc, data = _bench(tmp_path, "--only", "1,2,3,4,6,8", "--producers", "2", "--client-procs", "1")
    for wid in ("1", "2", "3a", "3b", "4a", "4b", "6", "8"):
        assert f" {wid} " in proc.stdout
    assert {r["wid"] for r in data["rows"]} >= {"1", "2", "3a", "3b", "4a", "4b", "6", "8"}
    assert list((tmp_path / "work").iterdir()) == []


@pytest.mark.acceptance
@pytest.mark.skipif(not _stack_available(), reason="broker/name server CLI not available yet")
def test_bench_echo_ceiling_is_paired_with_workload_1(tmp_path):
    """With 1 and 11 selected, each repeat of the echo ceiling runs right before a repeat of (1) and the
    ratio of (1) is judged against it; the per-repeat ratios are shown."""
    proc, data = _bench(tmp_path, "--only", "1,11", "--producers", "2", "--repeats", "2")
    rows = {r["wid"]: r for r in data["rows"]}
    echo, send = rows["11a"], rows["1"]
    assert echo["paired_with"] == "1" and echo["error"] is None
    assert len(echo["values"]) == len(send["values"]) == 2
    assert send["ratio"].endswith("of (11a)") and "repeat/paired echo" in send["note"]
    assert rows["11b"]["paired_with"] == "" and len(rows["11b"]["values"]) == 2
    assert list((tmp_path / "work").iterdir()) == []


@pytest.mark.acceptance
@pytest.mark.skipif(not _stack_available(), reason="broker/name server CLI not available yet")
def test_bench_quick_peers_run_in_order_and_stop_everything(tmp_path):
    """Workload 13: every row is measured or skipped with the reason, the ferrymq rows carry the broker's CPU
    per message, the peers and the echo floor (13j) their server's, and every measured row its load average; every server it started (brokers, Redis, NATS,
    RabbitMQ and its port mapper) is gone afterwards, the work dir removed."""
    proc, data = _bench(tmp_path, "--only", "13")
    rows = {r["wid"]: r for r in data["rows"]}
    assert set(rows) == {f"13{c}" for c in "abcdefghij"}
    for wid, row in rows.items():
        assert row["median"] is not None or (row["error"] or "").startswith("SKIPPED: "), (wid, row["error"])
        if row["median"] is not None:
            assert row["extra"]["load1"], wid
    for wid in ("13a", "13e", "13g"):
        assert rows[wid]["error"] is None and rows[wid]["extra_median"]["cpu_us_msg"] > 0
    assert rows["13d"]["median"] > 0
    # every server's CPU per acknowledged message: the peers', the echo floor's, the SYNC_MASTER pair's
    for wid in ("13b", "13c", "13e", "13f", "13h", "13i", "13j"):
        if rows[wid]["median"] is not None:
            assert rows[wid]["extra_median"]["server_cpu_us_msg"] > 0, wid
    assert rows["13j"]["extra_median"]["p50_us"] > 0 and "floor: echo server CPU (13j)" in rows["13g"]["note"]
    assert list((tmp_path / "work").iterdir()) == []
