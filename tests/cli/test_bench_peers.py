"""``ferry bench`` workload 13 (ferrymq beside Redis, RabbitMQ and NATS, interleaved): ratios are computed repeat
by repeat, targets judged on their median, missing peers skipped with the reason, and every row carries the
load average it was measured at, flagged above 1.0 per core. The servers' CPU per message and the floors
(the echo server answering one client in lockstep) are put beside the targets."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from ferrymq.cli.bench_impl import echo, nats_peer, peers, rabbit_peer
from ferrymq.cli.bench_impl.report import _detail, load_cell
from ferrymq.cli.bench_impl.runner import Bench, Options, Row

ROOT = Path(__file__).resolve().parents[2]


def _rows(values: dict[str, list[float | None]]) -> dict[str, Row]:
    rows = {}
    for wid in peers.ROW_ORDER:
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
    assert bench.total_steps() == peers.steps(3) == 30


def test_cpu_per_message_of_the_broker_and_of_all_server_processes() -> None:
    c0 = {10: 1.0, 11: 2.0}
    c1 = {10: 1.5, 11: 2.25}
    # a master (pid 10) and its slave: the broker's own CPU and the pair's
    assert peers.cpu_per_message(c0, c1, 10_000, broker=10) == {"cpu_us_msg": 50.0, "server_cpu_us_msg": 75.0}
    # a broker alone: no second figure repeating the first
    assert peers.cpu_per_message({10: 1.0}, {10: 1.5}, 10_000, broker=10) == {"cpu_us_msg": 50.0}
    # a peer's processes: their sum
    assert peers.cpu_per_message(c0, c1, 25_000) == {"server_cpu_us_msg": 30.0}
    # nothing acknowledged: no figure (never a division by zero)
    assert peers.cpu_per_message(c0, c1, 0) == {}


def test_process_tree_follows_parents_down_from_the_root(tmp_path: Path) -> None:
    for pid, ppid, comm in ((1, 0, "init"), (50, 1, "rabbitmq-server"), (51, 50, "beam.smp"),
                            (52, 51, "erl_child_setup"), (53, 52, "inet_gethost"), (60, 1, "other")):
        (tmp_path / str(pid)).mkdir()
        # the command name may hold spaces and parentheses: the parent is the 2nd field after the last ")"
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm} (x) y) S {ppid} 1 1 0 -1\n")
    (tmp_path / "self").mkdir()
    (tmp_path / "77").mkdir()  # a process gone between the listing and the read
    assert sorted(peers.process_tree(50, str(tmp_path))) == [50, 51, 52, 53]
    assert peers.process_tree(60, str(tmp_path)) == [60]
    assert peers.process_tree(os.getpid())[0] == os.getpid()


def test_floors_are_put_beside_the_targets_repeat_by_repeat() -> None:
    rows = _rows({"13a": [4000, 4000], "13b": [3500, 3500], "13d": [9000, 9000], "13e": [5000, 5000],
                  "13f": [8000, 8000], "13g": [11000, 12000], "13h": [12000, 12000], "13i": [8000, 8000],
                  "13j": [40000, 42000]})
    rows["13g"].extra["cpu_us_msg"] = [50.0, 40.0]
    rows["13j"].extra["server_cpu_us_msg"] = [10.0, 8.0]
    rows["13h"].extra["server_cpu_us_msg"] = [16.0, 16.0]
    rows["13i"].extra["server_cpu_us_msg"] = [55.0, 57.0]
    rows["13j"].extra["p50_us"] = [20.0, 25.0]
    rows["13e"].extra["p50_us"] = [160.0, 150.0]
    rows["13a"].extra["p50_us"] = [240.0, 250.0]
    rows["13d"].extra["p50_us"] = [100.0, 100.0]
    peers._evaluate(rows)
    g = rows["13g"].note
    assert "floor: echo server CPU (13j) 9.0 us/req" in g and "13h 16.0, 13i 56.0 us/op" in g
    assert "broker/echo CPU per repeat 5.00/5.00" in g
    assert rows["13g"].status == "MISS"  # the target itself is judged as before
    e = rows["13e"].note
    assert "2 echo round trips (13j) p50 40/50 us" in e and "p50/floor per repeat 4.00/3.00" in e
    a = rows["13a"].note
    assert "fdatasync (13d) + echo round trip (13j) p50 120/125 us" in a and "per repeat 2.00/2.00" in a
    assert "server CPU 9.00 us/msg" in _detail(rows["13j"])


def test_no_floor_without_the_echo_row_or_its_partner() -> None:
    rows = _rows({"13a": [4000], "13e": [5000], "13g": [11000]})  # 13j, 13d skipped
    rows["13g"].extra["cpu_us_msg"] = [50.0]
    rows["13e"].extra["p50_us"] = [160.0]
    peers._evaluate(rows)
    assert "floor" not in rows["13g"].note and "floor" not in rows["13e"].note and "floor" not in rows["13a"].note
    rows = _rows({"13g": [11000], "13j": [40000]})
    rows["13j"].extra["server_cpu_us_msg"] = [10.0]  # 13g measured no CPU (nothing stored)
    peers._evaluate(rows)
    assert "floor" not in rows["13g"].note


class _Ctl:
    async def ready(self) -> None:
        return None


def test_lockstep_times_one_request_in_flight_against_the_echo_server() -> None:
    """The 13j worker against the real echo protocol: every reply of the run counted in ``acked`` (warm-up
    included), round trips only from the counted window, one per counted reply."""

    async def go() -> dict:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(echo.CodecEcho, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await echo.lockstep({"port": port, "body_bytes": 1024, "warmup_s": 0.05, "duration_s": 0.2},
                                       _Ctl())
        finally:
            server.close()
            await server.wait_closed()

    m = asyncio.run(go())
    assert m["count"] > 0 and m["acked"] >= m["count"]  # acked: the warm-up's replies too
    assert m["bytes"] == m["count"] * 1024 and m["errors"] == 0 and m["not_ok"] == 0
    # one round trip per reply of the counted window, and the window about as long as asked
    assert len(m["lat_ns"]) == m["count"]
    assert 0.15 < m["elapsed_s"] < 5.0
    assert all(x > 0 for x in m["lat_ns"]) and m["lat_ns"] == sorted(m["lat_ns"])


def test_a_peer_is_counted_before_its_cleanup_and_cleaned_up_when_its_run_fails() -> None:
    calls: list[str] = []
    counts = iter([100, 1100])
    m = {"count": 900, "bytes": 900 * 1024, "elapsed_s": 1.0, "lat_ns": [50_000], "errors": 0, "not_ok": 0,
         "first_error": None}

    def acked() -> int:
        calls.append("acked")
        return next(counts)

    def run() -> dict:
        calls.append("run")
        return m

    row = Row("13h", "13h", 1024, "ops/s", "ops/s")
    entry = peers._Entry(row, run, pids=lambda: [os.getpid()], acked=acked, cleanup=lambda: calls.append("cleanup"))
    peers._one(Bench(Options(only=["13"])), None, entry)  # type: ignore[arg-type]
    # the stream is counted before it is deleted, and its deletion is outside the CPU sample
    assert calls == ["acked", "run", "acked", "cleanup"]
    assert row.values == [900.0] and len(row.extra["server_cpu_us_msg"]) == 1  # 1,000 messages acknowledged

    def fail() -> dict:
        raise RuntimeError("worker died")

    calls.clear()
    entry = peers._Entry(Row("13f", "13f", 1024, "ops/s", "ops/s"), fail, pids=lambda: [os.getpid()],
                         cleanup=lambda: calls.append("cleanup"))
    with pytest.raises(RuntimeError, match="worker died"):
        peers._one(Bench(Options(only=["13"])), None, entry)  # type: ignore[arg-type]
    assert calls == ["cleanup"]
