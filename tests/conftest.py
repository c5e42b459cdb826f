"""Suite-wide pytest hooks. Fixtures live next to the tests that use them; those shared by several suites
are in the ``support`` package (``tests/support``), imported as ``from support.<module> import ...``."""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
# ``support`` (tests/support) is importable whatever pytest's import mode is
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

#: the in-process namesrv/broker fixtures (``namesrv``, ``broker``, ``broker_settings``)
pytest_plugins = ["support.inproc"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    """Expose each phase's report as ``item.rep_setup`` / ``rep_call`` / ``rep_teardown``, so fixtures
    can dump process logs when the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
