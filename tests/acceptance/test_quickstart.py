"""``ferry quickstart --data-dir DIR`` as a real process: ready line, round trip, replication status,
clean shutdown on SIGINT with exit 0 and no child process left behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from procs import ManagedProcess, ProcessGroup, ferry_argv, wait_for

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]

#: start-up of three processes + replication + demo round trip
READY_TIMEOUT_S = 90.0
#: SIGINT -> every child stopped (each gets SIGTERM, up to 10 s grace) -> exit
SHUTDOWN_TIMEOUT_S = 40.0
READY_RX = re.compile(
    r"quickstart ready: namesrv (127\.0\.0\.1:\d+), master (127\.0\.0\.1:\d+), "
    r"slave (127\.0\.0\.1:\d+) \(Ctrl-C to stop\)"
)
CHILD_RX = re.compile(r"started (namesrv|master|slave|console)\s+pid (\d+)")
DEMO_MESSAGES = 5


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _procs_using(data_dir: Path) -> list[int]:
    """Pids whose command line mentions ``data_dir`` (quickstart children carry their conf path there)."""
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            cmdline = (
                Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except OSError:
            continue
        if str(data_dir) in cmdline and _alive(int(entry)):
            out.append(int(entry))
    return out


def _child_pids(qs: ManagedProcess) -> list[int]:
    """Pids of the children quickstart logged as started."""
    return [int(p) for _, p in CHILD_RX.findall(qs.log_text())]


StartQuickstart = Callable[..., ManagedProcess]


@pytest.fixture
def quickstart(procs: ProcessGroup) -> Iterator[StartQuickstart]:
    """``quickstart(name, data_dir)`` spawns ``ferry quickstart --data-dir DIR``. At teardown, also on failure,
    it and every child it started (logged, or carrying ``data_dir`` in its command line) are SIGKILLed."""
    started: list[tuple[ManagedProcess, Path]] = []

    def start(name: str, data_dir: Path, *extra: str) -> ManagedProcess:
        qs = procs.spawn(name, ferry_argv("quickstart", "--data-dir", str(data_dir), *extra))
        started.append((qs, data_dir))
        return qs

    try:
        yield start
    finally:
        for qs, data_dir in started:
            qs.kill()
            for pid in {*_child_pids(qs), *_procs_using(data_dir)}:
                if _alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


def _assert_children_gone(child_pids: list[int], data_dir: Path) -> None:
    wait_for(
        lambda: not any(_alive(p) for p in child_pids), timeout_s=5, what="quickstart children to be gone"
    )
    assert _procs_using(data_dir) == []


def test_quickstart_round_trip_replication_and_clean_stop(quickstart: StartQuickstart, tmp_path: Path) -> None:
    data_dir = tmp_path / "qs-data"
    qs = quickstart("quickstart", data_dir)
    t0 = time.monotonic()
    m = qs.wait_log(READY_RX.pattern, timeout_s=READY_TIMEOUT_S)
    ready_s = time.monotonic() - t0
    ns_addr, master_addr, slave_addr = m.group(1), m.group(2), m.group(3)
    out = qs.log_text()
    child_pids = _child_pids(qs)
    assert sorted(n for n, _ in CHILD_RX.findall(out)) == ["console", "master", "namesrv", "slave"], out
    assert len({ns_addr, master_addr, slave_addr}) == 3
    # three separate processes, all alive while serving
    assert all(_alive(p) for p in child_pids), out
    assert qs.popen is not None and qs.popen.pid not in child_pids

    # round trip: every demo message sent SEND_OK and consumed
    assert len(re.findall(r"^sent\s+#\d+ -> SEND_OK", out, re.M)) == DEMO_MESSAGES, out
    consumed = re.findall(r"^consumed\s+queue \d+ queueOffset \d+: (hello ferrymq \S+ #\d+)$", out, re.M)
    assert len(set(consumed)) == DEMO_MESSAGES, out
    assert f"round trip    {DEMO_MESSAGES}/{DEMO_MESSAGES} messages sent and consumed" in out

    # replication status: the master's view with one slave, acked up to the master's max, no lag
    rm = re.search(
        r"replication   master (\S+) \(SYNC_MASTER\) commit log max offset (\d+), haSlaveCount (\d+)", out
    )
    assert rm is not None, out
    assert rm.group(1) == master_addr and int(rm.group(3)) == 1
    master_max = int(rm.group(2))
    assert master_max > 0
    sm = re.search(
        r"^  slave (\S+)(?: \(HA link \S+\))?: acked offset (-?\d+), lag (-?\d+) bytes$", out, re.M
    )
    assert sm is not None, out
    assert sm.group(1) == slave_addr
    assert int(sm.group(2)) == master_max and int(sm.group(3)) == 0
    assert ready_s < READY_TIMEOUT_S

    # the printed Prometheus endpoints and the console answer
    metrics = dict(re.findall(r"^metrics\s+(\w+)\s+(http://\S+/metrics)$", out, re.M))
    assert sorted(metrics) == ["master", "namesrv", "slave"], out
    for url in metrics.values():
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.status == 200 and b"# TYPE" in resp.read()
    console = re.search(r"^console\s+(http://\S+/)$", out, re.M)
    assert console is not None, out
    with urllib.request.urlopen(console.group(1), timeout=10) as resp:
        page = resp.read().decode()
    assert master_addr in page and slave_addr in page and "SYNC_MASTER" in page

    # Ctrl-C: exit 0, every child stopped
    qs.signal(signal.SIGINT)
    code = qs.wait_exit(SHUTDOWN_TIMEOUT_S)
    assert code == 0, qs.tail()
    _assert_children_gone(child_pids, data_dir)
    stopped = qs.log_text()
    for name in ("console", "slave", "master", "namesrv"):
        assert re.search(rf"stopped {name} \(pid \d+, exit code 0\)", stopped), stopped


def test_quickstart_keep_going_rehearses_master_down(quickstart: StartQuickstart, tmp_path: Path) -> None:
    """``--keep-going``: the master SIGKILLed, quickstart reports it and keeps the rest serving; the printed
    ``export NAMESRV_ADDR=...`` line is what ``ferry`` needs to reach it."""
    data_dir = tmp_path / "qs-keep"
    qs = quickstart("quickstart-keep", data_dir, "--keep-going")
    ns_addr = qs.wait_log(READY_RX.pattern, timeout_s=READY_TIMEOUT_S).group(1)
    exported = qs.wait_log(r"export NAMESRV_ADDR=(\S+)", timeout_s=5).group(1)
    assert exported == ns_addr
    pids = dict(CHILD_RX.findall(qs.log_text()))
    os.kill(int(pids["master"]), signal.SIGKILL)
    qs.wait_log(rf"master \(pid {pids['master']}\) exited with code -9; --keep-going", timeout_s=10)
    assert qs.popen is not None and qs.popen.poll() is None
    env = {**os.environ, "NAMESRV_ADDR": exported}
    def slave_only() -> bool:
        cp = subprocess.run(ferry_argv("cluster", "list", "--json"), env=env, capture_output=True, text=True,
                            timeout=30)
        return cp.returncode == 0 and [r["brokerId"] for r in json.loads(cp.stdout)] == [1]
    wait_for(slave_only, timeout_s=60, what="the name server to list the slave alone")
    qs.signal(signal.SIGINT)
    assert qs.wait_exit(SHUTDOWN_TIMEOUT_S) == 0, qs.tail()
    _assert_children_gone([int(p) for p in pids.values()], data_dir)


def test_quickstart_sigterm_during_startup_leaves_nothing(quickstart: StartQuickstart, tmp_path: Path) -> None:
    """A stop request while the processes are still starting stops the ones already started."""
    data_dir = tmp_path / "qs-early"
    qs = quickstart("quickstart-early", data_dir)
    qs.wait_log(r"started master\s+pid \d+", timeout_s=READY_TIMEOUT_S)
    qs.signal(signal.SIGTERM)
    code = qs.wait_exit(SHUTDOWN_TIMEOUT_S)
    assert code == 0, qs.tail()
    _assert_children_gone(_child_pids(qs), data_dir)


def test_quickstart_failover_shows_sends_resuming_on_a_new_master(procs: ProcessGroup, tmp_path: Path) -> None:
    """``ferry quickstart --failover``: a controller and three replicas; the master is SIGKILLed under load, sends
    resume on a newly elected master, the controller's status is printed, and everything it started stops."""
    qs = procs.spawn("quickstart-failover", ferry_argv("quickstart", "--failover", "--data-dir",
                                                       str(tmp_path / "qsf")))
    code = qs.wait_exit(READY_TIMEOUT_S + SHUTDOWN_TIMEOUT_S)
    out = qs.log_text()
    assert code == 0, out
    killed = re.search(r"SIGKILL\s+master replica (\d) \(pid \d+, (\S+)\)", out)
    assert killed is not None, out
    resumed = re.search(r"writes resumed ([\d.]+) s after the kill", out)
    assert resumed is not None, out
    after = out[killed.end():]
    stored = re.findall(r"SEND_OK stored by (\S+)", after)
    assert len(stored) >= 5 and killed.group(2) not in stored, out
    assert "epoch 2" in after and "stopped controller" in out
    pids = [int(p) for p in re.findall(r"started \S+\s+pid (\d+)", out)]
    assert len(pids) == 5  # namesrv, controller, three replicas
    for pid in pids:
        wait_for(lambda pid=pid: not _alive(pid), timeout_s=SHUTDOWN_TIMEOUT_S, what=f"pid {pid} gone")
