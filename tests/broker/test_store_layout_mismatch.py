"""A store written with another commit log segment size is a set-up error: one ``config error:`` line naming
the key and the size found on disk, exit 2, no traceback (the real ``ferry broker`` process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ferrymq.store.errors import StoreConfigMismatchError
from ferrymq.store.message_store import check_segment_size

MIB = 1024 * 1024


def _segment(directory: Path, start: int, size: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{start:020d}", "wb") as fh:
        fh.truncate(size)


def test_broker_on_a_store_with_other_segment_size_exits_2_with_one_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _segment(store / "commitlog", 0, MIB)
    _segment(store / "commitlog", MIB, MIB)
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerName=b\nstorePathRootDir={store}\nlistenPort=0\nnamesrvAddr=127.0.0.1:1\n"
                    f"mappedFileSizeCommitLog={2 * MIB}\n")
    proc = subprocess.run([sys.executable, "-m", "ferrymq.broker", "-c", str(conf)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "config error" in line]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("config error: mappedFileSizeCommitLog:"), errors[0]
    assert str(MIB) in errors[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("sizes", "configured"), [
    ([MIB, MIB], 2 * MIB),      # smaller segments, two of them
    ([2 * MIB], MIB),           # one bigger segment
    ([MIB, MIB // 2], 2 * MIB),  # smaller segments, the newest torn
])
def test_check_segment_size_refuses_another_layout(tmp_path: Path, sizes: list[int], configured: int) -> None:
    for i, size in enumerate(sizes):
        _segment(tmp_path, i * size, size)
    with pytest.raises(StoreConfigMismatchError) as info:
        check_segment_size(str(tmp_path), configured)
    assert info.value.key == "mappedFileSizeCommitLog" and str(sizes[0]) in str(info.value)


@pytest.mark.parametrize("sizes", [[], [MIB], [MIB // 2], [1000, MIB]])  # nothing, right, torn only, damaged first
def test_check_segment_size_accepts_its_own_layout(tmp_path: Path, sizes: list[int]) -> None:
    """(A damaged segment among right-sized ones is for the loading to report as damage, not a config error.)"""
    for i, size in enumerate(sizes):
        _segment(tmp_path, i * MIB, size)
    check_segment_size(str(tmp_path), MIB)
    check_segment_size(str(tmp_path / "missing"), MIB)
