"""``ferry bench`` workload 13 (ferrymq beside Redis, RabbitMQ and NATS, interleaved): ratios are computed repeat
by repeat, targets judged on their median, missing peers skipped with the reason, and every row carries the
load average it was measured at, flagged above 1.0 per core."""

from __future__ import annotations

import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from ferrymq.cli.bench_impl import nats_peer, peers, rabbit_peer
from ferrymq.cli.bench_impl.report import load_cell
from ferrymq.cli.bench_impl.runner import Bench, Options, Row

ROOT = Path(__file__).resolve().parents[2]


def _rows(values: dict[str, list[float | None]]) -> dict[str, Row]:
    rows = {}
    for wid in ("13a", "13b", "13c", "13d", "13e", "13f", "13g", "13h", "13i"):
        r = Row(wid, wid, 1024, "msgs/s", "msgs/s")
        if wid in values:
            r.values = list(values[wid])
        else:
            r.error = "SKIPPED: not installed"
        rows[wid] = r
    return rows


def test_ratios_are_per_repeat_and_targets_judged_on_their_median() -> None:
    rows = _rows({
        "13a": [1000, 3000, 2000],
        "13b": [2000, 1000, 1000],   # per repeat 0.5 / 3.0 / 2.0 -> median 2.0 (the medians' ratio would be 2.0 too,
        "13d": [4000, 4000, 8000],   # but 13a vs 13d: 0.25 / 0.75 / 0.25 -> 0.25, medians 2000/4000 = 0.5)
        "13e": [1300, 1200, None],   # a failed repeat is left out of the pairs
        "13f": [1000, 1000, 1000],
        "13g": [900, 900, 900],
        "13h": [1000, 1000, 1000],
    })
    rows["13g"].extra["cpu_us_msg"] = [30.0, 20.0, 24.0]
    peers._evaluate(rows)
    a = rows["13a"]
    assert a.ratio == "2.00x of (13b), 0.25x of (13d)"
    assert "per repeat 0.50/3.00/2.00" in a.note and "per repeat 0.25/0.75/0.25" in a.note
    assert a.status == "MISS"  # the disk target (>= 0.5) is missed repeat by repeat, whatever the medians say
    e = rows["13e"]
    assert e.ratio == "1.25x of (13f)" and e.status == "MISS"
    assert "per repeat 1.30/1.20" in e.note
    g = rows["13g"]
    assert g.ratio == "0.90x of (13h)"  # 13i skipped: no ratio against it
    assert g.status == "PASS" and "25" in g.target  # broker CPU per message, median 24 us
    assert rows["13c"].status == "" and rows["13c"].ratio == ""


def test_missing_peers_are_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(rabbit_peer.os.path, "exists", lambda path: False)
    assert "nats-server not installed" in (nats_peer.available() or "")
    assert "rabbitmq-server not installed" in (rabbit_peer.available() or "")
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(rabbit_peer.os.path, "exists", lambda path: True)
    monkeypatch.setitem(sys.modules, "nats", None)
    monkeypatch.setitem(sys.modules, "aio_pika", None)
    assert "ferrymq[bench]" in (nats_peer.available() or "")
    assert "ferrymq[bench]" in (rabbit_peer.available() or "")


def test_bench_extra_declares_the_peer_clients() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower() for req in extras["bench"]}
    assert {"redis", "nats-py", "aio-pika"} <= names


def test_every_row_notes_the_load_average_of_its_repeats_and_flags_a_busy_machine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bench = Bench(Options(only=["13"]))
    one = bench.row("1", "one", 1024, "msgs/s", "msgs/s")
    two = bench.row("2", "two", 1024, "msgs/s", "msgs/s")
    loads = iter([0.5, 5.0])
    monkeypatch.setattr("os.getloadavg", lambda: (next(loads), 0.0, 0.0))
    one.values.append(100.0)
    bench.advance()
    one.values.append(110.0)
    two.values.append(7.0)
    bench.advance()
    assert one.extra["load1"] == [0.5, 5.0] and two.extra["load1"] == [5.0]
    assert load_cell(one, 2) == "5.0!"  # 2.5 per core
    assert load_cell(Row("x", "x", None, "", ""), 2) == ""
    quiet = Row("q", "q", None, "", "")
    quiet.extra["load1"] = [1.2, 1.9]
    assert load_cell(quiet, 2) == "1.9"


def test_workload_13_is_planned_in_the_step_count() -> None:
    assert "13" in Bench(Options()).o.only
    bench = Bench(Options(only=["13"], repeats=3))
    assert bench.total_steps() == peers.steps(3) == 27
