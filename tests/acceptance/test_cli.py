"""The ``ferry`` command line as a user meets it: config errors, help, and the quickstart."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
from procs import ProcessGroup, ferry_argv, free_port, write_properties

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]

#: a process refusing its config must exit within this
CONFIG_ERROR_TIMEOUT_S = 30
#: the quickstart must report success within this
QUICKSTART_TIMEOUT_S = 90
#: ... and exit this long after SIGINT
QUICKSTART_EXIT_TIMEOUT_S = 30
#: the quickstart's success line, printed once its round trip is done (src/ferrymq/cli/quickstart.py step 8)
QUICKSTART_READY = r"(?m)^quickstart ready: namesrv 127\.0\.0\.1:\d+"
#: its round-trip summary: N/N messages sent and consumed
QUICKSTART_ROUND_TRIP = re.compile(r"(?m)^round trip\s+(\d+)/(\d+) messages sent and consumed")


def run_ferry(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ferry_argv(*args), cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=CONFIG_ERROR_TIMEOUT_S)


def test_help_lists_the_server_commands(tmp_path: Path) -> None:
    cp = run_ferry("--help", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    for noun in ("namesrv", "broker", "quickstart"):
        assert noun in cp.stdout


def _valid_props(tmp_path: Path) -> dict[str, object]:
    return {
        "brokerClusterName": "DefaultCluster",
        "brokerName": "broker-cli",
        "brokerId": 0,
        "namesrvAddr": f"127.0.0.1:{free_port()}",
        "listenPort": free_port(broker=True),
        "brokerIP1": "127.0.0.1",
        "listenHost": "127.0.0.1",
        "storePathRootDir": str(tmp_path / "store"),
        "flushDiskType": "ASYNC_FLUSH",
        "brokerRole": "ASYNC_MASTER",
    }


@pytest.mark.parametrize(("key", "value"), [
    ("listenPort", "not-a-port"),
    ("listenPort", "70000"),
    ("flushDiskType", "SOMETIMES"),
    ("brokerRole", "BOSS"),
    ("brokerId", "minus-one"),
    ("mappedFileSizeCommitLog", "-1"),
    ("autoCreateTopicEnable", "maybe"),
])
def test_broker_config_error_exits_2_with_one_line_naming_the_key(tmp_path: Path, key: str, value: str) -> None:
    props = _valid_props(tmp_path)
    props[key] = value
    conf = write_properties(tmp_path / "broker.conf", props)
    cp = run_ferry("broker", "-c", str(conf), cwd=tmp_path)
    lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
    assert cp.returncode == 2, f"exit {cp.returncode}; stderr: {cp.stderr[-2000:]}"
    assert len(lines) == 1, f"expected one error line, got: {lines}"
    assert key in lines[0], f"error line does not name {key}: {lines[0]}"


def test_slave_with_broker_id_0_is_a_config_error(tmp_path: Path) -> None:
    props = _valid_props(tmp_path)
    props["brokerRole"] = "SLAVE"
    conf = write_properties(tmp_path / "broker.conf", props)
    cp = run_ferry("broker", "-c", str(conf), cwd=tmp_path)
    lines = [ln for ln in cp.stderr.splitlines() if ln.strip()]
    assert cp.returncode == 2, f"exit {cp.returncode}; stderr: {cp.stderr[-2000:]}"
    assert len(lines) == 1 and "brokerId" in lines[0], lines


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    cp = run_ferry("broker", "-c", str(tmp_path / "nope.conf"), cwd=tmp_path)
    assert cp.returncode == 2, cp.stderr
    assert "nope.conf" in cp.stderr


def test_namesrv_bad_listen_address_exits_2(tmp_path: Path) -> None:
    cp = run_ferry("namesrv", "--listen", "127.0.0.1:notaport", cwd=tmp_path)
    assert cp.returncode == 2, f"exit {cp.returncode}; stderr: {cp.stderr[-2000:]}"


def test_quickstart_smoke(procs: ProcessGroup, tmp_path: Path) -> None:
    """Run ``ferry quickstart``, wait for its success line, SIGINT it, expect exit code 0."""
    qs = procs.spawn("quickstart", ferry_argv("quickstart"), cwd=tmp_path, env={"HOME": str(tmp_path)})
    qs.wait_log(QUICKSTART_READY, timeout_s=QUICKSTART_TIMEOUT_S)
    m = QUICKSTART_ROUND_TRIP.search(qs.log_text())
    assert m is not None and m.group(1) == m.group(2) and int(m.group(1)) > 0, "round trip line missing or short"
    qs.signal(signal.SIGINT)
    rc = qs.wait_exit(QUICKSTART_EXIT_TIMEOUT_S)
    assert rc == 0, f"quickstart exited with {rc} after SIGINT"
