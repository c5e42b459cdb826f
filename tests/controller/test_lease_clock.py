"""Leases and liveness are judged on the monotonic clock only: a wall-clock jump (NTP step, an operator's
`date -s`) neither extends nor cuts a master's lease, nor makes the controller declare a master dead. Checked
in the code that judges them (no ``time.time`` anywhere in it) and on the broker's lease itself."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

import ferrymq
from ferrymq.broker.controller_mode import ControllerRole
from ferrymq.controller.core import monotonic_ms

SRC = Path(ferrymq.__file__).parent
#: every module that judges a lease, a heartbeat's age or a replica's catch-up time
LEASE_MODULES = [SRC / "broker" / "controller_mode.py", SRC / "ha" / "auto_master.py", SRC / "ha" / "auto_client.py",
                 *sorted((SRC / "controller").glob("*.py"))]


@pytest.mark.parametrize("path", LEASE_MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_wall_clock_where_leases_are_judged(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    wall = [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in ("time", "time_ns")
            and isinstance(node.value, ast.Name) and node.value.id == "time"]
    assert not wall, f"{path.name} reads the wall clock at lines {wall}"


def test_a_wall_clock_jump_changes_no_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    role = ControllerRole.__new__(ControllerRole)  # the lease fields only (no broker needed)
    role.is_master = True
    role.lease_until = time.monotonic() + 60
    for jump_s in (-86_400.0, 86_400.0):
        monkeypatch.setattr(time, "time", lambda j=jump_s: 1_700_000_000.0 + j)
        assert role.can_ack()
    role.lease_until = time.monotonic() - 0.001
    monkeypatch.setattr(time, "time", lambda: 0.0)
    assert not role.can_ack()
    assert abs(monotonic_ms() - time.monotonic() * 1000) < 1000  # the controller's default clock
