"""Suite-wide pytest hooks (kept minimal; fixtures live next to the tests that use them)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    """Expose each phase's report as ``item.rep_setup`` / ``rep_call`` / ``rep_teardown``, so fixtures
    can dump process logs when the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
