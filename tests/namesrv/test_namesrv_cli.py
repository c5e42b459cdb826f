"""``ferry namesrv``: foreground run, clean exit on SIGTERM/SIGINT, one-line usage errors."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from ferrymq.cli.namesrv import command, parse_listen

START_TIMEOUT_S = 20
STOP_TIMEOUT_S = 20
LISTENING = re.compile(r"name server listening on 127\.0\.0\.1:(\d+)")


@pytest.mark.parametrize("bad", ["nonsense", "127.0.0.1:", ":9876", "127.0.0.1:99999", "127.0.0.1:abc"])
def test_invalid_listen_is_one_line_exit_2(bad: str) -> None:
    result = CliRunner().invoke(command, ["--listen", bad])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("Error: invalid --listen")


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9876") == ("127.0.0.1", 9876)
    assert parse_listen("[::1]:0") == ("::1", 0)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_runs_until_signal_and_exits_0(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ferrymq.cli", "namesrv", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stderr is not None
        seen = threading.Event()
        lines: list[str] = []

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)
                if LISTENING.search(line):
                    seen.set()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        assert seen.wait(START_TIMEOUT_S), "".join(lines)
        proc.send_signal(sig)
        assert proc.wait(STOP_TIMEOUT_S) == 0, "".join(lines)
        reader.join(STOP_TIMEOUT_S)
        assert any("stopped" in line for line in lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
